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

use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::output::CappedBuffer;
use super::tar_safety::{self, LenientSummary, TarLimits};
use super::{OutputChunk, Sandbox, SandboxError, SpawnRequest, helpers, resolve_path};

/// How much of tar's stderr is kept: enough for its warnings, never a flood.
pub const STDERR_CAP: usize = 4096;

/// Per-entry overhead allowed on top of the workspace size: a 512-byte header and up to 511
/// bytes of padding per file, for the most entries an archive may have.
const ARCHIVE_SLACK: u64 = 128 << 20;

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

/// Streams `tar -C dir -cf - .` from the sandbox into a temp file of at most `max_bytes`.
pub async fn tar_to_file(
    sandbox: &dyn Sandbox,
    dir: &str,
    max_bytes: u64,
    timeout: Duration,
) -> Result<ArchiveFile, SandboxError> {
    let dir = resolve_path(dir)?;
    let tag = format!("{:032x}", rand::random::<u128>());
    let mut req = SpawnRequest::new(["tar", "--sparse", "-C", &dir, "-cf", "-", "."]);
    for (k, v) in helpers::env() {
        req = req.env(k, v);
    }
    let req = req.env("SANDBOXD_TAG", &tag);
    let io = |e: std::io::Error| SandboxError::FileOp {
        operation: "download",
        path: dir.clone(),
        message: format!("host temp file: {e}"),
    };
    let temp = tempfile::tempfile().map_err(io)?;
    let mut out = tokio::fs::File::from_std(temp.try_clone().map_err(io)?);
    let mut process = sandbox.spawn(req).await?;
    drop(process.stdin);
    let mut stderr = CappedBuffer::new(STDERR_CAP);
    let mut len: u64 = 0;
    let pump = async {
        while let Some(chunk) = process.output.next().await {
            match chunk? {
                OutputChunk::Stdout(bytes) => {
                    len += bytes.len() as u64;
                    if len > max_bytes {
                        return Err(SandboxError::FileTooLarge {
                            path: dir.clone(),
                            size: len,
                            limit: max_bytes,
                        });
                    }
                    out.write_all(&bytes).await.map_err(io)?;
                }
                OutputChunk::Stderr(bytes) => stderr.push(&bytes),
            }
        }
        out.flush().await.map_err(io)?;
        Ok(())
    };
    // Watched: under gVisor a sandbox that died keeps the exec's stream open.
    let watched = super::watch::while_alive(sandbox, pump);
    let pumped = match tokio::time::timeout(timeout, watched).await {
        Ok(Err(gone @ SandboxError::SandboxGone { .. })) => return Err(gone),
        Ok(r) => r,
        Err(_) => Err(SandboxError::Timeout {
            what: format!("packing {dir}"),
            after: timeout,
        }),
    };
    if let Err(e) = pumped {
        let _ = sandbox.kill_tagged(&tag).await;
        return Err(e);
    }
    let exit = (process.exit_code)().await;
    let warnings = String::from_utf8_lossy(&stderr.finish().0)
        .trim()
        .to_string();
    // GNU tar: 1 = some files changed while being read, 2 = some could not be read at all
    // (a chmod 000 file) — in both cases it still writes a whole archive of the rest, which
    // the validator checks; one unreadable file must not cost the user everything else.
    if !matches!(exit, Some(0..=2)) {
        return Err(SandboxError::FileOp {
            operation: "download",
            path: dir,
            message: format!("tar ended with status {exit:?}: {warnings}"),
        });
    }
    let mut file = temp;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    Ok(ArchiveFile {
        file,
        len,
        warnings,
        incomplete: exit == Some(2),
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
    let archive = tar_to_file(
        sandbox,
        dir,
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
