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

use super::recipe::{image_changes, recipe_hash};
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

/// `docker import` of the rootfs tar, streamed from disk rather than loaded into memory.
pub(super) async fn import_rootfs(
    docker: &Docker,
    rootfs: &Path,
    tag: &str,
) -> Result<(), ImageError> {
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
