//! The sandbox image: built offline on this host and tagged by the hash of its recipe.
//!
//! There is no registry to pull from, so `sandboxd` carries the recipe (`images/sandbox/`,
//! embedded by `build.rs`) and builds the image itself: the recipe's script runs mmdebstrap
//! against the host's own Debian apt sources to produce a rootfs tar, which is imported into
//! Docker with the image configuration from `image.conf`. The tag is
//! `sandboxd/sandbox:<first 16 hex of the recipe's sha256>`, so "is the image up to date?" is
//! one inspect call, and any change to the recipe makes the next build a real one.
//!
//! This file is the public face (the errors, the tag, "is it there?", "make sure it is", the
//! build in order); the parts live beside it: `recipe.rs` what the image is (the embedded
//! recipe, its hash, its configuration), `build.rs` making the rootfs (running the recipe in a
//! private directory), `engine.rs` talking to the Docker engine (import, pruning old tags),
//! `template.rs` the admin's `[[templates]]`: the same recipe plus their additions.

mod build;
mod engine;
mod recipe;
mod template;

use std::io;
use std::path::PathBuf;
use std::time::Instant;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::TagImageOptionsBuilder;
use tokio::sync::Mutex;

use build::{TempDir, find_program, run_recipe};
use engine::{import_rootfs, prune_stale, prune_template};
pub use recipe::recipe_hash;
use recipe::{image_changes, write_recipe};
use sandboxd_core::config::TemplateConfig;
pub use template::template_tag;

/// Repository every sandbox image is tagged into.
pub const IMAGE_REPO: &str = "sandboxd/sandbox";

/// Extra tag pointing at the most recently built image, for humans and `docker run`.
const LATEST_TAG: &str = "latest";

/// Why the sandbox image could not be checked or built, and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(
        "mmdebstrap is not installed on this host, and the sandbox image is built with it; \
         install it: apt-get install mmdebstrap"
    )]
    MmdebstrapMissing,

    #[error(
        "cannot prepare the image build directory {path}; make sure TMPDIR points at a writable \
         directory with about 3 GB free"
    )]
    Workspace {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("cannot start the image recipe ({script}); is bash installed on this host?")]
    RecipeSpawn {
        script: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "building the image rootfs failed ({status}); last lines of its output:\n{log_tail}\n\
         fix the cause shown there (host apt sources, free disk space, running as root) and \
         build the image again"
    )]
    BuildFailed { status: String, log_tail: String },

    #[error(
        "Docker is unreachable; start the Docker daemon or point DOCKER_HOST at it, then retry"
    )]
    DockerUnreachable {
        #[source]
        source: DockerError,
    },

    #[error(
        "importing the rootfs into Docker as {tag} failed; check the daemon's free disk space \
         (`docker system df`) and build the image again"
    )]
    ImportFailed {
        tag: String,
        #[source]
        source: DockerError,
    },

    #[error(
        "cannot read {path}, which a template in the config names (a wheel or a file to copy \
         in); fix the path in [[templates]] or the file's permissions"
    )]
    TemplateInput {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("Docker refused to {action}")]
    Docker {
        action: String,
        #[source]
        source: DockerError,
    },
}

impl ImageError {
    /// Connection-level failures get their own variant because the fix is on the host
    /// (start the daemon), not in the request.
    pub(super) fn from_docker(action: impl Into<String>, source: DockerError) -> Self {
        match source {
            DockerError::SocketNotFoundError(_)
            | DockerError::HyperLegacyError { .. }
            | DockerError::IOError { .. }
            | DockerError::RequestTimeoutError => ImageError::DockerUnreachable { source },
            source => ImageError::Docker {
                action: action.into(),
                source,
            },
        }
    }
}

/// What `build_image` is doing, reported as it happens so a build of a minute or two is not silent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildProgress {
    /// A stage started (ours, or an `I:` line from mmdebstrap); worth showing even when quiet.
    Step(String),
    /// One line of output from mmdebstrap, apt or dpkg.
    Log(String),
}

/// The result of a successful `build_image`.
#[derive(Debug, Clone, PartialEq)]
pub enum BuildOutcome {
    /// Nothing was built: an image for exactly this recipe is already in the engine.
    UpToDate { tag: String },
    /// A new image was built and imported (and tagged `latest` as well).
    Built {
        tag: String,
        size_bytes: u64,
        seconds: f64,
    },
}

/// The tag of the image the embedded recipe builds: `sandboxd/sandbox:<recipe hash>`.
pub fn image_tag() -> String {
    format!("{IMAGE_REPO}:{}", recipe_hash())
}

/// Whether the engine already has the image for this recipe.
pub async fn image_present(docker: &Docker) -> Result<bool, ImageError> {
    tag_present(docker, &image_tag()).await
}

/// Whether the engine has the image `tag`.
pub async fn tag_present(docker: &Docker, tag: &str) -> Result<bool, ImageError> {
    match docker.inspect_image(tag).await {
        Ok(_) => Ok(true),
        Err(DockerError::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(false),
        Err(e) => Err(ImageError::from_docker(format!("inspect image {tag}"), e)),
    }
}

/// Returns the tag of the sandbox image, building it first if the engine does not have it.
pub async fn ensure_image(
    docker: &Docker,
    progress: &(dyn Fn(BuildProgress) + Send + Sync),
) -> Result<String, ImageError> {
    if image_present(docker).await? {
        return Ok(image_tag());
    }
    match build_image(docker, false, progress).await? {
        BuildOutcome::UpToDate { tag } | BuildOutcome::Built { tag, .. } => Ok(tag),
    }
}

/// Builds the sandbox image from the embedded recipe and imports it into the engine.
///
/// Without `force` this is a no-op when the image for this recipe exists already. The build
/// needs mmdebstrap, root (or unshare) privileges and the host's Debian bookworm apt sources.
pub async fn build_image(
    docker: &Docker,
    force: bool,
    progress: &(dyn Fn(BuildProgress) + Send + Sync),
) -> Result<BuildOutcome, ImageError> {
    build(docker, None, force, progress).await
}

/// Builds the image of template `t` (the recipe plus its additions), the same way.
pub async fn build_template(
    docker: &Docker,
    t: &TemplateConfig,
    force: bool,
    progress: &(dyn Fn(BuildProgress) + Send + Sync),
) -> Result<BuildOutcome, ImageError> {
    build(docker, Some(t), force, progress).await
}

async fn build(
    docker: &Docker,
    template: Option<&TemplateConfig>,
    force: bool,
    progress: &(dyn Fn(BuildProgress) + Send + Sync),
) -> Result<BuildOutcome, ImageError> {
    // Tests and sessions in one process may all ask for the image at once; one build is enough,
    // and the others find its result when they get the lock.
    static BUILD_LOCK: Mutex<()> = Mutex::const_new(());
    let _guard = BUILD_LOCK.lock().await;

    let tag = match template {
        Some(t) => template_tag(t)?,
        None => image_tag(),
    };
    if !force && tag_present(docker, &tag).await? {
        return Ok(BuildOutcome::UpToDate { tag });
    }
    let search_path = std::env::var_os("PATH").unwrap_or_default();
    if find_program("mmdebstrap", &search_path).is_none() {
        return Err(ImageError::MmdebstrapMissing);
    }

    let started = Instant::now();
    let workspace = TempDir::create()?;
    let recipe_dir = workspace.path().join("recipe");
    write_recipe(&recipe_dir)?;
    let mut changes = image_changes();
    if let Some(t) = template {
        template::add_to_recipe(&recipe_dir, t)?;
        changes.push(format!("LABEL sandboxd.template={}", t.name));
    }
    let rootfs = workspace.path().join("rootfs.tar");

    progress(BuildProgress::Step(format!(
        "building the rootfs for {tag} with mmdebstrap (a minute or two)"
    )));
    run_recipe(&recipe_dir, &rootfs, workspace.path(), progress).await?;

    let size = std::fs::metadata(&rootfs)
        .map_err(|source| ImageError::Workspace {
            path: rootfs.clone(),
            source,
        })?
        .len();
    progress(BuildProgress::Step(format!(
        "importing the rootfs ({} MB) into Docker as {tag}",
        size / 1_000_000
    )));
    let suffix = tag.rsplit_once(':').map_or(tag.as_str(), |(_, s)| s);
    import_rootfs(docker, &rootfs, suffix, changes).await?;
    drop(workspace);
    // Several checkouts of different recipes (git worktrees, a CI clone beside a dev tree)
    // share one engine; each would untag the others' images, so they may opt out.
    let prune = std::env::var_os(KEEP_OLD_ENV).is_none_or(|v| v.is_empty() || v == "0");
    if let Some(t) = template {
        if prune {
            prune_template(docker, &t.name, &tag, progress).await;
        }
        return built(docker, tag, started).await;
    }

    docker
        .tag_image(
            &tag,
            Some(
                TagImageOptionsBuilder::default()
                    .repo(IMAGE_REPO)
                    .tag(LATEST_TAG)
                    .build(),
            ),
        )
        .await
        .map_err(|e| ImageError::from_docker(format!("tag {tag} as {IMAGE_REPO}:latest"), e))?;

    if prune {
        prune_stale(docker, &tag, progress).await;
    }
    built(docker, tag, started).await
}

/// What a build that imported `tag` reports.
async fn built(docker: &Docker, tag: String, started: Instant) -> Result<BuildOutcome, ImageError> {
    let inspect = docker
        .inspect_image(&tag)
        .await
        .map_err(|e| ImageError::from_docker(format!("inspect image {tag}"), e))?;
    let size_bytes = inspect
        .size
        .and_then(|s| u64::try_from(s).ok())
        .unwrap_or(0);
    Ok(BuildOutcome::Built {
        tag,
        size_bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Set (to anything but `0`) to keep the images of other recipes after a build.
pub const KEEP_OLD_ENV: &str = "SANDBOXD_IMAGE_KEEP_OLD";
