//! Talking to the Docker engine about images: the rootfs tar imported as the image (streamed
//! from disk, never held in memory) and the images of earlier recipes untagged after a build.

use std::io;
use std::path::Path;
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::CreateImageOptionsBuilder;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use tokio::io::AsyncReadExt;

use super::recipe::recipe_hash;
use super::{BuildProgress, IMAGE_REPO, ImageError};

/// Import sends ~1 GB through the daemon before it answers; bollard's default 120 s timeout
/// for response headers is too short for that on a slow disk.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const IMPORT_CHUNK_BYTES: usize = 1 << 20;

/// Untags images of earlier recipes (`sandboxd/sandbox:<16 hex>`), ~1 GB each, so upgrades do
/// not fill the disk. Other tags (`latest`, tags users made) are left alone, and an image a
/// container still uses only loses its tag; failures are reported, never fatal.
pub(super) async fn prune_stale(
    docker: &Docker,
    current: &str,
    progress: &(dyn Fn(BuildProgress) + Send + Sync),
) {
    untag_where(docker, progress, |t| {
        t != current
            && t.strip_prefix(IMAGE_REPO)
                .and_then(|rest| rest.strip_prefix(':'))
                .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    })
    .await;
}

/// Untags every tag of `IMAGE_REPO` that `stale` picks.
async fn untag_where(
    docker: &Docker,
    progress: &(dyn Fn(BuildProgress) + Send + Sync),
    stale: impl Fn(&str) -> bool,
) {
    let filters = std::collections::HashMap::from([("reference", vec![IMAGE_REPO])]);
    let options = bollard::query_parameters::ListImagesOptionsBuilder::default()
        .filters(&filters)
        .build();
    let Ok(images) = docker.list_images(Some(options)).await else {
        return;
    };
    let stale = images
        .iter()
        .flat_map(|i| i.repo_tags.iter())
        .filter(|t| stale(t.as_str()));
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

/// Untags the images of earlier versions of template `name` (`sandboxd/sandbox:tpl-<name>-<16
/// hex>`) other than `current`; other templates' images and the default's are left alone.
pub(super) async fn prune_template(
    docker: &Docker,
    name: &str,
    current: &str,
    progress: &(dyn Fn(BuildProgress) + Send + Sync),
) {
    let prefix = format!("{IMAGE_REPO}:tpl-{name}-");
    untag_where(docker, progress, |t| {
        t != current
            && t.strip_prefix(&prefix)
                .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    })
    .await;
}

/// `docker import` of the rootfs tar as `IMAGE_REPO:suffix` with the image configuration
/// `changes`, streamed from disk rather than loaded into memory.
pub(super) async fn import_rootfs(
    docker: &Docker,
    rootfs: &Path,
    suffix: &str,
    changes: Vec<String>,
) -> Result<(), ImageError> {
    let tag = format!("{IMAGE_REPO}:{suffix}");
    let file = tokio::fs::File::open(rootfs)
        .await
        .map_err(|source| ImageError::Workspace {
            path: rootfs.to_owned(),
            source,
        })?;
    let options = CreateImageOptionsBuilder::default()
        .from_src("-")
        .repo(IMAGE_REPO)
        .tag(suffix)
        .message(&format!("sandboxd image build, recipe {}", recipe_hash()))
        .changes(changes)
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
                tag: tag.clone(),
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
