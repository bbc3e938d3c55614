//! Copy-out: a sandbox directory (normally /workspace) copied to a host directory, with the
//! host's memory bounded no matter what the sandbox holds.
//!
//! `tar` runs inside the sandbox and its stdout is streamed into an unlinked host temp file
//! (bounded on disk by the workspace size, never held in memory); its stderr, which sandboxed
//! code can flood through /proc/<pid>/fd/2, is capped at a few KiB. `--sparse` makes tar
//! store a sparse file's holes as a map instead of zeros, so 1000 MB of holes cost neither the
//! transfer nor the host anything, and the validator refuses the entry with its apparent size
//! instead of expanding it. The archive is then written by `tar_safety::extract_lenient`:
//! every entry the rules refuse (an absolute symlink in a venv, a hard link, a FIFO) is
//! skipped and listed, everything else is copied, nothing refused is written.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::tar_safety::{self, LenientSummary, TarLimits};
use super::{Sandbox, SandboxError, resolve_path, transfer};

pub use super::transfer::STDERR_CAP;

/// Per-entry overhead allowed on top of the workspace size: a 512-byte header and up to 511
/// bytes of padding per file, for the most entries an archive may have.
pub const ARCHIVE_SLACK: u64 = 128 << 20;

/// An archive streamed out of a sandbox into an unlinked host temp file.
pub struct ArchiveFile {
    pub file: std::fs::File,
    pub len: u64,
    /// tar's warnings (capped), e.g. "socket ignored"; empty when it had none.
    pub warnings: String,
    /// tar reported files it could not read (status 2): the archive is whole but lacks them.
    pub incomplete: bool,
}

/// What a copy-out did.
#[derive(Debug, Clone, Default)]
pub struct CopyReport {
    pub summary: LenientSummary,
    /// tar's own warnings inside the sandbox (capped).
    pub warnings: String,
    /// tar could not read some files (its warnings name them), so they are not in the copy.
    pub tar_incomplete: bool,
}

impl CopyReport {
    /// Whether something the user would expect is missing from the copy.
    pub fn is_partial(&self) -> bool {
        !self.summary.skipped.is_empty() || self.tar_incomplete
    }
}

/// Packs the directory `$1`, refusing one that is, or goes through, a symbolic link: `-C`
/// would follow it, and a link to /usr/lib would pack the image's libraries (a link *inside*
/// the directory is stored as a link, never followed).
const PACK: &str = r#"d=$1
[ -e "$d" ] || { echo "no such file or directory" >&2; exit 20; }
cd -P -- "$d" 2>/dev/null || { echo "not a directory, or not readable" >&2; exit 25; }
r=$(pwd -P)
[ "$r" = "$d" ] || { printf '%s' "$r" >&2; exit 24; }
exec tar --sparse -cf - ."#;

/// Streams `tar -cf - .` of `dir` in the sandbox into `into` (an empty host file, normally
/// unlinked), at most `max_bytes` of it. `dir` must not be, or go through, a symbolic link.
pub async fn tar_to_file(
    sandbox: &dyn Sandbox,
    dir: &str,
    into: File,
    max_bytes: u64,
    timeout: Duration,
) -> Result<ArchiveFile, SandboxError> {
    let dir = resolve_path(dir)?;
    let argv = transfer::bash(PACK, &[&dir]);
    let done = transfer::run(
        sandbox,
        argv,
        "download",
        &dir,
        None,
        Some((&into, max_bytes)),
        timeout,
    )
    .await?;
    match done.exit {
        // GNU tar: 1 = some files changed while being read, 2 = some could not be read at
        // all (a chmod 000 file) — in both cases it still writes a whole archive of the
        // rest, which the validator checks; one unreadable file must not cost the user
        // everything else.
        Some(0..=2) => {}
        Some(transfer::NOT_FOUND) => return Err(SandboxError::NotFound { path: dir }),
        Some(transfer::THROUGH_LINK) => {
            return Err(SandboxError::InvalidPath {
                reason: format!(
                    "it is, or goes through, a symbolic link (to {:?}); archives never follow a link in the path they are given: ask for the directory itself (links inside it are packed as links)",
                    done.stderr
                ),
                path: dir,
            });
        }
        _ => return Err(transfer::failed("download", &dir, &done)),
    }
    let mut file = into;
    let io = |e: std::io::Error| SandboxError::FileOp {
        operation: "download",
        path: dir.clone(),
        message: format!("host temp file: {e}"),
    };
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    Ok(ArchiveFile {
        file,
        len: done.out_len,
        incomplete: done.exit == Some(2),
        warnings: done.stderr,
    })
}

/// Copies `dir` of the sandbox into the existing host directory `dest`, skipping and listing
/// what the rules refuse. `workspace_bytes` bounds the archive (plus per-entry slack) and the
/// total of file data.
pub async fn copy_dir_out(
    sandbox: &dyn Sandbox,
    dir: &str,
    dest: &Path,
    workspace_bytes: u64,
    timeout: Duration,
) -> Result<CopyReport, SandboxError> {
    let temp = tempfile::tempfile().map_err(|e| SandboxError::FileOp {
        operation: "download",
        path: dir.to_string(),
        message: format!("host temp file: {e}"),
    })?;
    let archive = tar_to_file(
        sandbox,
        dir,
        temp,
        workspace_bytes.saturating_add(ARCHIVE_SLACK),
        timeout,
    )
    .await?;
    let limits = TarLimits {
        max_total_bytes: workspace_bytes.max(1),
        ..TarLimits::default()
    };
    let dest: PathBuf = dest.to_path_buf();
    let ArchiveFile {
        file,
        len,
        warnings,
        incomplete,
    } = archive;
    let summary =
        tokio::task::spawn_blocking(move || tar_safety::extract_lenient(file, len, &dest, &limits))
            .await
            .map_err(|e| {
                SandboxError::InvalidRequest(format!("the copy-out task failed: {e}"))
            })??;
    Ok(CopyReport {
        summary,
        warnings,
        tar_incomplete: incomplete,
    })
}
