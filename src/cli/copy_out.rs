//! The end of `sandboxd run`: /workspace copied to a host directory, through the
//! hostile-tar rules (`tar_safety::extract_archive`). The only host-side write a run makes.

use std::path::Path;

use anyhow::Context as _;
use sandboxd::sandbox::tar_safety::{TarLimits, extract_archive};
use sandboxd::sandbox::{Sandbox, WORKSPACE};

/// Refuses an output directory that exists and is not empty (nothing is overwritten).
pub fn check_output_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Err(_) => Ok(()),
        Ok(m) if m.is_dir() && std::fs::read_dir(dir)?.next().is_none() => Ok(()),
        Ok(_) => anyhow::bail!(
            "the output directory {} exists and is not empty; choose another with --output",
            dir.display()
        ),
    }
}

/// Copies /workspace into `dest` (created), validating the archive as hostile input.
/// Returns how many entries were written.
pub async fn copy_out(sandbox: &dyn Sandbox, dest: &Path) -> anyhow::Result<usize> {
    let archive = sandbox.download_tar(WORKSPACE).await?;
    std::fs::create_dir_all(dest).with_context(|| format!("cannot create {}", dest.display()))?;
    let dest = dest.to_path_buf();
    let summary = tokio::task::spawn_blocking(move || {
        extract_archive(&archive, &dest, &TarLimits::default())
    })
    .await??;
    Ok(summary.entries.saturating_sub(1))
}
