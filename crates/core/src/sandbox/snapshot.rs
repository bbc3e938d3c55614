//! A hibernated session's /workspace on the host: a tar archive saved atomically and checked
//! both when it is saved and before it is restored.
//!
//! `save` streams `tar` of /workspace out of the sandbox (copy_out.rs: bounded by the
//! workspace size plus per-entry slack, never in memory) into a temporary file in the
//! snapshot directory, refuses an archive tar could not make whole or that the upload rules
//! would refuse (an absolute symlink in a venv, a hard link, a FIFO: such a session stays
//! live rather than lose a file at its resume), fsyncs it, renames it to its final name and
//! fsyncs the directory. Only then may the caller record it: a crash before leaves at most a
//! temporary file (`sweep_temporaries`), never a snapshot that looks complete.
//!
//! A restore checks the file again before anything reaches the sandbox (`open`, then
//! `check_opened`: the host file could have been damaged or replaced since): its size against the session's
//! workspace, then every entry by the rules of uploads (`tar_safety`: no absolute paths, no
//! `..`, no link leaving the tree, no device; the total within the workspace); only the
//! checked file is unpacked (`unpack`), into /workspace only. The steps are separate so a
//! resume opens the file before it makes a container (a file this replica cannot read costs
//! no container) and checks it while the container is being made.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::copy_out::{ARCHIVE_SLACK, tar_to_file};
use super::tar_safety::{self, ArchiveSummary, TarError, TarLimits};
use super::{Sandbox, SandboxError, WORKSPACE, transfer};

/// The prefix of snapshot files being written; anything with it is not a snapshot.
pub const TEMP_PREFIX: &str = ".tmp-";

/// Set (to a directory) only by tests: a save writes an empty file named after the snapshot
/// there once its archive is on disk, then waits forever before the rename, so a test can
/// kill the process in the middle of a save.
pub const PAUSE_ENV: &str = "SANDBOXD_TEST_HIBERNATE_PAUSE";

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("the snapshot file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("the snapshot is refused: {0}")]
    Refused(#[from] TarError),
    #[error("the snapshot is {len} bytes, over the {max} bytes its session's workspace may hold")]
    TooLarge { len: u64, max: u64 },
    #[error("tar could not read every file of /workspace, so nothing was saved: {0}")]
    Incomplete(String),
    #[error("the snapshot name {0:?} is not one sandboxd makes")]
    BadName(String),
    /// Not in this process's snapshot directory: another replica saved it into a directory
    /// this one does not share. Nothing is wrong with the session. (The directory is the
    /// host's: logged, never told to a client.)
    #[error("its snapshot {name} is not in this replica's snapshot directory")]
    Missing { name: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `name` can be a snapshot file's name: ours are `<session id>.<hex>.tar`.
pub fn plain_name(name: &str) -> bool {
    !name.starts_with('.')
        && name.len() <= 200
        && name.ends_with(".tar")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

/// The path of snapshot `name` in `dir`, if `name` is one of ours.
pub fn path_of(dir: &Path, name: &str) -> Result<PathBuf, SnapshotError> {
    if plain_name(name) {
        Ok(dir.join(name))
    } else {
        Err(SnapshotError::BadName(name.to_string()))
    }
}

/// The limits a snapshot of a workspace of `workspace_bytes` is checked against.
fn limits(workspace_bytes: u64) -> TarLimits {
    TarLimits {
        max_total_bytes: workspace_bytes.max(1),
        ..TarLimits::default()
    }
}

/// Checks the first `len` bytes of `file` by the rules of uploads, on the blocking pool.
async fn check(
    file: &File,
    len: u64,
    workspace_bytes: u64,
) -> Result<ArchiveSummary, SnapshotError> {
    let file = file.try_clone().map_err(io(Path::new("(snapshot)")))?;
    let limits = limits(workspace_bytes);
    tokio::task::spawn_blocking(move || tar_safety::validate_archive_file(&file, len, &limits))
        .await
        .map_err(|e| SandboxError::InvalidRequest(format!("the snapshot check failed: {e}")))?
        .map_err(SnapshotError::from)
}

/// Saves /workspace of `sandbox` as `dir/name` (see the module doc); the bytes saved.
pub async fn save(
    sandbox: &dyn Sandbox,
    dir: &Path,
    name: &str,
    workspace_bytes: u64,
    timeout: Duration,
) -> Result<u64, SnapshotError> {
    let path = path_of(dir, name)?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let temp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .tempfile_in(dir)
        .map_err(io(dir))?;
    let into = temp.as_file().try_clone().map_err(io(temp.path()))?;
    let max = workspace_bytes.saturating_add(ARCHIVE_SLACK);
    let archive = tar_to_file(sandbox, WORKSPACE, into, max, timeout).await?;
    if archive.incomplete {
        return Err(SnapshotError::Incomplete(archive.warnings));
    }
    check(&archive.file, archive.len, workspace_bytes).await?;
    archive.file.sync_all().map_err(io(temp.path()))?;
    if let Some(pause) = std::env::var_os(PAUSE_ENV) {
        let _ = std::fs::write(Path::new(&pause).join(name), b"");
        std::future::pending::<()>().await;
    }
    temp.persist(&path).map_err(|e| SnapshotError::Io {
        path: path.clone(),
        source: e.error,
    })?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(archive.len)
}

/// A snapshot file opened, its size within the session's workspace (`open`), not yet
/// checked entry by entry (`check_opened`).
pub struct Opened {
    file: File,
    len: u64,
    workspace_bytes: u64,
}

/// A snapshot file opened and checked, ready to unpack (`open`, `check_opened`, then
/// `unpack`: a resume opens it first, then checks it while the container is being made
/// again, see the module doc).
pub struct Checked {
    file: File,
    len: u64,
    /// What it holds.
    pub summary: ArchiveSummary,
}

/// Opens snapshot `dir/name` and checks its size against a workspace of `workspace_bytes`,
/// on the blocking pool (a shared volume may be slow to answer); nothing reaches a sandbox.
pub async fn open(dir: &Path, name: &str, workspace_bytes: u64) -> Result<Opened, SnapshotError> {
    let path = path_of(dir, name)?;
    let name = name.to_string();
    tokio::task::spawn_blocking(move || {
        let file = match File::open(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SnapshotError::Missing { name });
            }
            other => other.map_err(io(&path))?,
        };
        let len = file.metadata().map_err(io(&path))?.len();
        let max = workspace_bytes.saturating_add(ARCHIVE_SLACK);
        if len > max {
            return Err(SnapshotError::TooLarge { len, max });
        }
        Ok(Opened {
            file,
            len,
            workspace_bytes,
        })
    })
    .await
    .map_err(|e| SnapshotError::Io {
        path: dir.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?
}

impl Opened {
    /// The snapshot's size in bytes, as opened.
    pub fn bytes(&self) -> u64 {
        self.len
    }
}

/// Checks an opened snapshot by the rules of uploads (see the module doc).
pub async fn check_opened(opened: Opened) -> Result<Checked, SnapshotError> {
    let summary = check(&opened.file, opened.len, opened.workspace_bytes).await?;
    Ok(Checked {
        file: opened.file,
        len: opened.len,
        summary,
    })
}

/// Whether a restore that failed with `e` must end the session: the snapshot itself is
/// refused (damaged, too large, hostile, not one of ours). Anything else (the engine, a
/// file that cannot be read here now) leaves the session and its snapshot for a retry.
pub fn refused(e: &SnapshotError) -> bool {
    matches!(
        e,
        SnapshotError::Refused(_) | SnapshotError::TooLarge { .. } | SnapshotError::BadName(_)
    )
}

/// Unpacks a checked snapshot into /workspace of `sandbox`, through the persistent shell as
/// it starts where the sandbox has one (`Sandbox::restore_in_shell`: no process of its own),
/// else with a `tar` process; what it held.
pub async fn unpack(
    sandbox: &dyn Sandbox,
    checked: Checked,
    timeout: Duration,
) -> Result<ArchiveSummary, SnapshotError> {
    let (file, len) = (&checked.file, checked.len);
    if !sandbox.restore_in_shell(file, len, timeout).await? {
        transfer::unpack_tar_from(sandbox, WORKSPACE, file, len, timeout).await?;
    }
    Ok(checked.summary)
}

/// Deletes snapshot `dir/name`; a missing one is not an error.
pub fn delete(dir: &Path, name: &str) {
    let Ok(path) = path_of(dir, name) else {
        return;
    };
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "could not delete a snapshot"),
    }
}

/// The files in `dir` not modified for `older_than`: snapshots (by name) and temporaries (of
/// saves that stopped), for the caller's sweep of what no session names any more.
pub fn stale_files(dir: &Path, older_than: Duration) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= older_than)
        })
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| plain_name(n) || n.starts_with(TEMP_PREFIX))
        .collect()
}

/// Deletes `dir/name` whatever it is named (a temporary too), if it is a plain file name.
pub fn delete_file(dir: &Path, name: &str) {
    if name.contains('/') || name == "." || name == ".." || name.is_empty() {
        return;
    }
    if let Err(e) = std::fs::remove_file(dir.join(name))
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(file = name, error = %e, "could not delete a stale snapshot file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_names_are_snapshots() {
        assert!(plain_name("ses_0123abcd.9f8e.tar"));
        for bad in [
            "../x.tar",
            "/etc/x.tar",
            ".tmp-abc",
            "a/b.tar",
            "x.tar.gz",
            "",
            ".tar",
        ] {
            assert!(!plain_name(bad), "{bad}");
        }
        assert!(path_of(Path::new("/d"), "../../etc/passwd").is_err());
    }
}
