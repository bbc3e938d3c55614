//! The end of `sandboxd run`: /workspace copied to a host directory (sandbox::copy_out:
//! streamed, bounded, each refused entry skipped and listed). The only host-side write a run
//! makes; a partial copy makes the run exit with `COPY_INCOMPLETE`.

use std::path::Path;

use std::io::Write as _;

use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::copy_out::copy_dir_out;
use sandboxd_core::sandbox::{Sandbox, WORKSPACE};

use super::render::sayln;

/// Refuses an output directory that exists and is not empty (nothing is overwritten).
pub(crate) fn check_output_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Err(_) => Ok(()),
        Ok(m) if m.is_dir() && std::fs::read_dir(dir)?.next().is_none() => Ok(()),
        Ok(_) => anyhow::bail!(
            "the output directory {} exists and is not empty; choose another with --output",
            dir.display()
        ),
    }
}

/// The exit status of a run whose agent succeeded but whose copy-out was partial or failed.
pub(crate) const COPY_INCOMPLETE: u8 = 3;

/// Copies /workspace into `dest` (created), validating the archive as hostile input, and
/// tells the user what was copied and what was skipped. Returns whether the copy is complete.
pub(crate) async fn copy_out(sandbox: &dyn Sandbox, limits: &Limits, dest: &Path) -> bool {
    if let Err(e) = std::fs::create_dir_all(dest) {
        sayln!(
            "sandboxd: could not copy /workspace out: cannot create {}: {e}",
            dest.display()
        );
        return false;
    }
    let workspace = limits.workspace_mb.saturating_mul(1 << 20);
    let timeout = std::time::Duration::from_secs(limits.max_timeout_secs.max(60));
    let report = match copy_dir_out(sandbox, WORKSPACE, dest, workspace, timeout).await {
        Ok(r) => r,
        Err(e) => {
            sayln!("sandboxd: could not copy /workspace out: {e}");
            return false;
        }
    };
    let written = report.summary.written;
    if written == 0 && !report.is_partial() {
        sayln!("sandboxd: /workspace was empty; nothing copied");
    } else {
        sayln!(
            "sandboxd: /workspace copied to {} ({written} entries, {} bytes)",
            dest.display(),
            report.summary.bytes
        );
    }
    if !report.warnings.is_empty() {
        sayln!("sandboxd: tar said: {}", report.warnings.escape_debug());
    }
    if report.tar_incomplete {
        sayln!(
            "sandboxd: the copy is INCOMPLETE: tar could not read some files inside the sandbox (see what it said above)"
        );
    }
    let skipped = &report.summary.skipped;
    if !skipped.is_empty() {
        sayln!(
            "sandboxd: the copy is INCOMPLETE: {} entries were skipped (nothing of them was written):",
            skipped.len()
        );
        for s in skipped.iter().take(50) {
            // Names come from the sandbox: escaped so they cannot forge terminal output.
            sayln!("  {}: {}", s.path.escape_debug(), s.reason.escape_debug());
        }
        if skipped.len() > 50 {
            sayln!("  … and {} more", skipped.len() - 50);
        }
    }
    !report.is_partial()
}
