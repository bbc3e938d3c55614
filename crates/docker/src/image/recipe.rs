//! What the image is: the recipe `build.rs` embeds from `images/sandbox/`, the hash that names
//! the image, the configuration applied at import, and the recipe written out for a build.
//!
//! Everything here is a pure function of the embedded files, so the tag can be known (and
//! checked against the engine) without building anything.

use std::io;
use std::path::{Component, Path};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::ImageError;

include!(concat!(env!("OUT_DIR"), "/image_files.rs"));

/// Recipe entry point, relative to the recipe root.
pub(super) const BUILD_SCRIPT: &str = "build.sh";
/// Dockerfile-style instructions applied at import, one per line.
const IMAGE_CONFIG: &str = "image.conf";

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

/// The image configuration from `image.conf`, plus a label naming the recipe it came from.
pub(super) fn image_changes() -> Vec<String> {
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
pub(super) fn write_recipe(dir: &Path) -> Result<(), ImageError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::build::TempDir;
    use crate::image::image_tag;

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
    fn recipe_is_written_out_byte_for_byte() {
        let dir = TempDir::create().expect("temp dir");
        write_recipe(dir.path()).expect("write recipe");
        for (path, contents) in IMAGE_FILES {
            let written = std::fs::read(dir.path().join(path)).expect("read back");
            assert_eq!(&written[..], *contents, "{path}");
        }
    }
}
