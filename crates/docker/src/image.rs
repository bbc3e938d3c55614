//! The sandbox image: built offline on this host and tagged by the hash of its recipe.
//!
//! There is no registry to pull from, so `sandboxd` carries the recipe (`images/sandbox/`,
//! embedded by `build.rs`) and builds the image itself: the recipe's script runs mmdebstrap
//! against the host's own Debian apt sources to produce a rootfs tar, which is imported into
//! Docker with the image configuration from `image.conf`. The tag is
//! `sandboxd/sandbox:<first 16 hex of the recipe's sha256>`, so "is the image up to date?" is
//! one inspect call, and any change to the recipe makes the next build a real one.

use std::collections::VecDeque;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::{CreateImageOptionsBuilder, TagImageOptionsBuilder};
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::{Mutex, mpsc};

include!(concat!(env!("OUT_DIR"), "/image_files.rs"));

/// Repository every sandbox image is tagged into.
pub const IMAGE_REPO: &str = "sandboxd/sandbox";

/// Extra tag pointing at the most recently built image, for humans and `docker run`.
const LATEST_TAG: &str = "latest";
/// Recipe entry point, relative to the recipe root.
const BUILD_SCRIPT: &str = "build.sh";
/// Dockerfile-style instructions applied at import, one per line.
const IMAGE_CONFIG: &str = "image.conf";
/// How many lines of build output an error carries: enough for apt's or dpkg's complaint and
/// the mmdebstrap line that gave up.
const LOG_TAIL_LINES: usize = 40;
/// Import sends ~1 GB through the daemon before it answers; bollard's default 120 s timeout
/// for response headers is too short for that on a slow disk.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const IMPORT_CHUNK_BYTES: usize = 1 << 20;

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
         fix the cause shown there (host apt sources, free disk space, running as root) and run \
         `sandboxd image build` again"
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
         (`docker system df`) and run `sandboxd image build` again"
    )]
    ImportFailed {
        tag: String,
        #[source]
        source: DockerError,
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
    fn from_docker(action: impl Into<String>, source: DockerError) -> Self {
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

/// sha256 over the embedded recipe (each file's path and contents), first 16 hex digits.
pub fn recipe_hash() -> String {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        let mut hasher = Sha256::new();
        for (path, contents) in IMAGE_FILES {
            // Length prefixes keep ("ab", "c") and ("a", "bc") from hashing alike.
            hasher.update((path.len() as u64).to_le_bytes());
            hasher.update(path.as_bytes());
            hasher.update((contents.len() as u64).to_le_bytes());
            hasher.update(contents);
        }
        let mut hex = hex::encode(hasher.finalize());
        hex.truncate(16);
        hex
    })
    .clone()
}

/// The tag of the image the embedded recipe builds: `sandboxd/sandbox:<recipe hash>`.
pub fn image_tag() -> String {
    format!("{IMAGE_REPO}:{}", recipe_hash())
}

/// Whether the engine already has the image for this recipe.
pub async fn image_present(docker: &Docker) -> Result<bool, ImageError> {
    let tag = image_tag();
    match docker.inspect_image(&tag).await {
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
    // Tests and sessions in one process may all ask for the image at once; one build is enough,
    // and the others find its result when they get the lock.
    static BUILD_LOCK: Mutex<()> = Mutex::const_new(());
    let _guard = BUILD_LOCK.lock().await;

    let tag = image_tag();
    if !force && image_present(docker).await? {
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
    import_rootfs(docker, &rootfs, &tag).await?;
    drop(workspace);

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

    // Several checkouts of different recipes (git worktrees, a CI clone beside a dev tree)
    // share one engine; each would untag the others' images, so they may opt out.
    if std::env::var_os(KEEP_OLD_ENV).is_none_or(|v| v.is_empty() || v == "0") {
        prune_stale(docker, &tag, progress).await;
    }

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

/// Untags images of earlier recipes (`sandboxd/sandbox:<16 hex>`), ~1 GB each, so upgrades do
/// not fill the disk. Other tags (`latest`, tags users made) are left alone, and an image a
/// container still uses only loses its tag; failures are reported, never fatal.
async fn prune_stale(
    docker: &Docker,
    current: &str,
    progress: &(dyn Fn(BuildProgress) + Send + Sync),
) {
    let filters = std::collections::HashMap::from([("reference", vec![IMAGE_REPO])]);
    let options = bollard::query_parameters::ListImagesOptionsBuilder::default()
        .filters(&filters)
        .build();
    let Ok(images) = docker.list_images(Some(options)).await else {
        return;
    };
    let stale = images.iter().flat_map(|i| i.repo_tags.iter()).filter(|t| {
        t.as_str() != current
            && t.strip_prefix(IMAGE_REPO)
                .and_then(|rest| rest.strip_prefix(':'))
                .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    for tag in stale {
        match docker
            .remove_image(
                tag,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await
        {
            Ok(_) => progress(BuildProgress::Step(format!(
                "removed the image of an earlier recipe, {tag}"
            ))),
            Err(e) => progress(BuildProgress::Step(format!("kept {tag}: {e}"))),
        }
    }
}

/// The image configuration from `image.conf`, plus a label naming the recipe it came from.
fn image_changes() -> Vec<String> {
    let config = IMAGE_FILES
        .iter()
        .find(|(path, _)| *path == IMAGE_CONFIG)
        .map(|(_, contents)| String::from_utf8_lossy(contents))
        .unwrap_or_default();
    config
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .chain(std::iter::once(format!(
            "LABEL sandboxd.recipe={}",
            recipe_hash()
        )))
        .collect()
}

/// The embedded paths come from our own build script, but they decide where files are
/// written, so anything that could leave the recipe directory is refused rather than trusted.
fn write_recipe(dir: &Path) -> Result<(), ImageError> {
    for (relative, contents) in IMAGE_FILES {
        let relative = Path::new(relative);
        let target = dir.join(relative);
        let escapes = relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_)));
        let result = if escapes {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "recipe path leaves the recipe directory",
            ))
        } else {
            target
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::write(&target, contents))
        };
        result.map_err(|source| ImageError::Workspace {
            path: target,
            source,
        })?;
    }
    Ok(())
}

/// Runs the recipe's build script, streaming its output lines to `progress` as they come.
async fn run_recipe(
    recipe_dir: &Path,
    rootfs: &Path,
    cwd: &Path,
    progress: &(dyn Fn(BuildProgress) + Send + Sync),
) -> Result<(), ImageError> {
    let script = recipe_dir.join(BUILD_SCRIPT);
    let mut child = Command::new("bash")
        .arg(&script)
        .arg(rootfs)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ImageError::RecipeSpawn {
            script: script.clone(),
            source,
        })?;

    // Two readers feed one channel so lines reach `progress` (which is not 'static and so
    // cannot move into a task) in the order they arrive.
    let (lines_tx, mut lines_rx) = mpsc::unbounded_channel();
    if let Some(stdout) = child.stdout.take() {
        tokio::spawn(forward_lines(stdout, lines_tx.clone()));
    }
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(forward_lines(stderr, lines_tx.clone()));
    }
    drop(lines_tx);

    let mut tail = VecDeque::with_capacity(LOG_TAIL_LINES);
    while let Some(line) = lines_rx.recv().await {
        if tail.len() == LOG_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line.clone());
        match line.strip_prefix("I: ") {
            Some(step) => progress(BuildProgress::Step(step.to_owned())),
            None => progress(BuildProgress::Log(line)),
        }
    }

    let status = child
        .wait()
        .await
        .map_err(|source| ImageError::RecipeSpawn { script, source })?;
    if status.success() && rootfs.is_file() {
        return Ok(());
    }
    Err(ImageError::BuildFailed {
        status: describe_status(status, rootfs),
        log_tail: Vec::from(tail).join("\n"),
    })
}

fn describe_status(status: ExitStatus, rootfs: &Path) -> String {
    if status.success() {
        format!("the recipe exited 0 but wrote no {}", rootfs.display())
    } else {
        status.to_string()
    }
}

/// Sends each line of `reader` (lossily decoded; progress bars' `\r` redraws reduced to their
/// final state) until EOF or the receiver goes away.
async fn forward_lines(reader: impl AsyncRead + Unpin, lines: mpsc::UnboundedSender<String>) {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&buf);
        let line = text
            .trim_end()
            .rsplit('\r')
            .find(|part| !part.trim().is_empty())
            .unwrap_or("");
        if !line.trim().is_empty() && lines.send(line.to_owned()).is_err() {
            return;
        }
    }
}

/// `docker import` of the rootfs tar, streamed from disk rather than loaded into memory.
async fn import_rootfs(docker: &Docker, rootfs: &Path, tag: &str) -> Result<(), ImageError> {
    let file = tokio::fs::File::open(rootfs)
        .await
        .map_err(|source| ImageError::Workspace {
            path: rootfs.to_owned(),
            source,
        })?;
    let hash = recipe_hash();
    let options = CreateImageOptionsBuilder::default()
        .from_src("-")
        .repo(IMAGE_REPO)
        .tag(&hash)
        .message(&format!("sandboxd image build, recipe {hash}"))
        .changes(image_changes())
        .build();
    let docker = docker.clone().with_timeout(IMPORT_TIMEOUT);
    let mut events = docker.create_image(
        Some(options),
        Some(bollard::body_try_stream(file_chunks(file))),
        None,
    );
    while let Some(event) = events.next().await {
        event.map_err(|source| match ImageError::from_docker("import", source) {
            ImageError::Docker { source, .. } => ImageError::ImportFailed {
                tag: tag.to_owned(),
                source,
            },
            unreachable => unreachable,
        })?;
    }
    Ok(())
}

fn file_chunks(file: tokio::fs::File) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
    futures::stream::try_unfold(file, |mut file| async move {
        let mut buf = BytesMut::with_capacity(IMPORT_CHUNK_BYTES);
        let read = file.read_buf(&mut buf).await?;
        Ok((read > 0).then(|| (buf.freeze(), file)))
    })
}

fn find_program(program: &str, search_path: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(search_path)
        .map(|dir| dir.join(program))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// A private build directory, removed when dropped (also when a build fails half way).
///
/// The recipe is executed as root from here, so the directory is created fresh with mode
/// 0700: nobody else on the host can swap a script in between writing and running it.
struct TempDir(PathBuf);

impl TempDir {
    fn create() -> Result<Self, ImageError> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!(
            "sandboxd-image-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| ImageError::Workspace {
                path: path.clone(),
                source,
            })?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(path = %self.0.display(), error = %e, "could not remove the image build directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_is_embedded_with_its_entry_points() {
        let paths: Vec<&str> = IMAGE_FILES.iter().map(|(p, _)| *p).collect();
        for required in [BUILD_SCRIPT, IMAGE_CONFIG, "packages.txt", "helpers/.keep"] {
            assert!(
                paths.contains(&required),
                "{required} missing from {paths:?}"
            );
        }
        assert!(
            paths.windows(2).all(|w| w[0] < w[1]),
            "not sorted: {paths:?}"
        );
    }

    #[test]
    fn hash_and_tag_are_stable_and_well_formed() {
        let hash = recipe_hash();
        assert_eq!(hash.len(), 16);
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(hash, recipe_hash());
        assert_eq!(image_tag(), format!("sandboxd/sandbox:{hash}"));
    }

    #[test]
    fn changes_come_from_image_conf_plus_the_recipe_label() {
        let changes = image_changes();
        assert!(changes.contains(&"USER 1000:1000".to_owned()));
        assert!(changes.iter().all(|c| !c.starts_with('#')));
        assert_eq!(
            changes.last(),
            Some(&format!("LABEL sandboxd.recipe={}", recipe_hash()))
        );
    }

    #[test]
    fn programs_are_found_only_where_the_search_path_says() {
        let system = std::ffi::OsStr::new("/usr/bin:/bin");
        assert!(find_program("sh", system).is_some());
        assert!(find_program("sh", std::ffi::OsStr::new("/nonexistent")).is_none());
        assert!(find_program("no-such-program-here", system).is_none());
    }

    fn fake_recipe(script: &str) -> (TempDir, PathBuf) {
        let dir = TempDir::create().expect("temp dir");
        let recipe = dir.path().join("recipe");
        std::fs::create_dir(&recipe).expect("recipe dir");
        std::fs::write(recipe.join(BUILD_SCRIPT), script).expect("script");
        (dir, recipe)
    }

    #[tokio::test]
    async fn a_failing_recipe_reports_its_exit_status_and_last_lines() {
        let (dir, recipe) = fake_recipe(
            "for i in $(seq 1 50); do echo \"line $i\" >&2; done\n\
             printf 'I: a step\\n'\n\
             exit 3\n",
        );
        let seen = std::sync::Mutex::new(Vec::new());
        let record = |p: BuildProgress| seen.lock().expect("lock").push(p);
        let rootfs = dir.path().join("rootfs.tar");
        let err = run_recipe(&recipe, &rootfs, dir.path(), &record)
            .await
            .expect_err("the recipe fails");
        let ImageError::BuildFailed { status, log_tail } = err else {
            panic!("unexpected error: {err}");
        };
        assert!(status.contains('3'), "{status}");
        let tail: Vec<&str> = log_tail.lines().collect();
        assert_eq!(tail.len(), LOG_TAIL_LINES);
        assert!(tail.contains(&"line 50") && tail.contains(&"I: a step"));
        assert!(!tail.contains(&"line 1"));
        let seen = seen.into_inner().expect("lock");
        assert_eq!(seen.len(), 51);
        assert!(seen.contains(&BuildProgress::Step("a step".to_owned())));
        assert!(seen.contains(&BuildProgress::Log("line 1".to_owned())));
    }

    #[tokio::test]
    async fn a_recipe_that_exits_0_without_output_is_a_failure() {
        let (dir, recipe) = fake_recipe("exit 0\n");
        let rootfs = dir.path().join("rootfs.tar");
        let err = run_recipe(&recipe, &rootfs, dir.path(), &|_| {})
            .await
            .expect_err("no rootfs was written");
        assert!(matches!(err, ImageError::BuildFailed { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_recipe_that_writes_the_rootfs_succeeds() {
        let (dir, recipe) = fake_recipe("echo 'progress bar 10%\rprogress bar 100%'\n: > \"$1\"\n");
        let rootfs = dir.path().join("rootfs.tar");
        let seen = std::sync::Mutex::new(Vec::new());
        let record = |p: BuildProgress| seen.lock().expect("lock").push(p);
        run_recipe(&recipe, &rootfs, dir.path(), &record)
            .await
            .expect("recipe succeeds");
        assert!(rootfs.is_file());
        assert_eq!(
            seen.into_inner().expect("lock"),
            vec![BuildProgress::Log("progress bar 100%".to_owned())]
        );
    }

    #[test]
    fn recipe_is_written_out_byte_for_byte() {
        let dir = TempDir::create().expect("temp dir");
        write_recipe(dir.path()).expect("write recipe");
        for (path, contents) in IMAGE_FILES {
            let written = std::fs::read(dir.path().join(path)).expect("read back");
            assert_eq!(&written[..], *contents, "{path}");
        }
    }
}
