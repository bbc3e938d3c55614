//! Where a kept session's tool records live for a later process: the browser's DevTools
//! endpoint and tabs, the editor's undo history, the session's plans. One home, installed
//! when the `SessionManager` is built (its constructors take it), handed to the tools with
//! each session, and emptied by the manager whenever a session ends or turns out orphaned —
//! so no entry point can forget to install, read or delete them.
//!
//! Records are opaque bytes per (session, kind), at most `MAX_RECORD_BYTES` each; the tools'
//! typed view, with the owner check, is `tools::saved::SavedTools`. Everything here is
//! host-side on purpose: nothing is read from the sandbox, so a later process never learns an
//! endpoint from a file sandboxed code could write. Two homes: `FileRecords`, private files
//! in a data directory (the CLI's and the MCP server's), and `store::StoreRecords`, rows of
//! the `Store` (serve's, so that several replicas on one store see the same records).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::datadir::{is_plain_id, write_private};

/// The largest record kept or read back; the writers keep theirs well below it.
pub const MAX_RECORD_BYTES: u64 = 32 << 20;

/// A home for kept sessions' tool records. Failures to read or delete are logged and read
/// as "no record": a record only lets a later process carry on where an earlier one left.
#[async_trait]
pub trait SessionRecords: Send + Sync {
    /// The `kind` record of `session_id`, if there is a readable one.
    async fn load(&self, session_id: &str, kind: &str) -> Option<Vec<u8>>;
    /// Replaces the `kind` record of `session_id`; more than `MAX_RECORD_BYTES` is refused.
    async fn save(&self, session_id: &str, kind: &str, bytes: &[u8]) -> std::io::Result<()>;
    /// Removes the `kind` record of `session_id` (the state it described is gone).
    async fn clear(&self, session_id: &str, kind: &str);
    /// Removes every record of `session_id`; returns the kinds removed, sorted.
    async fn forget(&self, session_id: &str) -> Vec<String>;
    /// The ids of the sessions that have records (for the sweep of orphans).
    async fn sessions(&self) -> BTreeSet<String>;
}

/// The error of a record over `MAX_RECORD_BYTES`.
pub fn too_large(session_id: &str, kind: &str, len: usize) -> std::io::Error {
    std::io::Error::other(format!(
        "the {kind:?} record of session {session_id:?} is {len} bytes, over the {MAX_RECORD_BYTES}-byte limit"
    ))
}

/// No records: a process whose sessions are never kept, or that must not write any.
pub struct NoRecords;

#[async_trait]
impl SessionRecords for NoRecords {
    async fn load(&self, _: &str, _: &str) -> Option<Vec<u8>> {
        None
    }
    async fn save(&self, _: &str, _: &str, _: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
    async fn clear(&self, _: &str, _: &str) {}
    async fn forget(&self, _: &str) -> Vec<String> {
        Vec::new()
    }
    async fn sessions(&self) -> BTreeSet<String> {
        BTreeSet::new()
    }
}

/// Records as private files, `<data>/runs/sessions/<session-id>.<kind>.json`, next to the
/// session's conversation pointer `<session-id>.json` (which is not a record), each written
/// whole through a temporary file. The file work runs on the blocking pool.
#[derive(Clone)]
pub struct FileRecords {
    dir: PathBuf,
}

impl FileRecords {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            dir: data_dir.join("runs").join("sessions"),
        }
    }

    /// Every (session id, kind) with a record file, sorted (serve's start moves an earlier
    /// version's files into its store).
    pub async fn entries(&self) -> Vec<(String, String)> {
        self.blocking(Vec::new(), |d| {
            let mut all: Vec<(String, String)> = d
                .names()
                .iter()
                .filter_map(|n| record_name(n).map(|(id, kind)| (id.into(), kind.into())))
                .collect();
            all.sort();
            all
        })
        .await
    }

    /// Runs `work` on a copy of this home on the blocking pool; `failed` if it panicked.
    async fn blocking<T: Send + 'static>(
        &self,
        failed: T,
        work: impl FnOnce(&FileRecords) -> T + Send + 'static,
    ) -> T {
        let dir = self.clone();
        match tokio::task::spawn_blocking(move || work(&dir)).await {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "tool record file work failed");
                failed
            }
        }
    }

    /// None for an id or kind that would not make a safe file name.
    fn path(&self, session_id: &str, kind: &str) -> Option<PathBuf> {
        (is_plain_id(session_id) && is_plain_id(kind))
            .then(|| self.dir.join(format!("{session_id}.{kind}.json")))
    }

    /// The names in the records directory; empty when there is none (or it cannot be read).
    fn names(&self) -> Vec<String> {
        match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot list tool records");
                Vec::new()
            }
        }
    }

    fn load_now(&self, session_id: &str, kind: &str) -> Option<Vec<u8>> {
        let path = self.path(session_id, kind)?;
        let len = std::fs::metadata(&path).ok()?.len();
        if len > MAX_RECORD_BYTES {
            tracing::warn!(path = %path.display(), len, "tool record too large; ignored");
            return None;
        }
        std::fs::read(&path).ok()
    }

    fn forget_now(&self, session_id: &str) -> Vec<String> {
        let mut removed = Vec::new();
        if !is_plain_id(session_id) {
            return removed;
        }
        for name in self.names() {
            let Some((id, kind)) = record_name(&name).filter(|(id, _)| *id == session_id) else {
                continue;
            };
            let path = self.dir.join(&name);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::debug!(session = %id, file = %name, "tool record removed");
                    removed.push(kind.to_string());
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove a tool record")
                }
            }
        }
        removed.sort();
        removed
    }
}

/// The session id and kind of a record's file name (`<id>.<kind>.json`); None for anything
/// else (the conversation pointer `<id>.json`, a temporary `.<name>.tmp`).
fn record_name(name: &str) -> Option<(&str, &str)> {
    let (id, kind) = name.strip_suffix(".json")?.split_once('.')?;
    (is_plain_id(id) && is_plain_id(kind)).then_some((id, kind))
}

#[async_trait]
impl SessionRecords for FileRecords {
    async fn load(&self, session_id: &str, kind: &str) -> Option<Vec<u8>> {
        let (id, kind) = (session_id.to_string(), kind.to_string());
        self.blocking(None, move |d| d.load_now(&id, &kind)).await
    }

    async fn save(&self, session_id: &str, kind: &str, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(too_large(session_id, kind, bytes.len()));
        }
        let path = self.path(session_id, kind).ok_or_else(|| {
            std::io::Error::other(format!("{session_id:?}/{kind:?} cannot name a record"))
        })?;
        let bytes = bytes.to_vec();
        let failed = Err(std::io::Error::other("the record's write did not finish"));
        self.blocking(failed, move |_| write_private(&path, &bytes))
            .await
    }

    async fn clear(&self, session_id: &str, kind: &str) {
        if let Some(path) = self.path(session_id, kind) {
            self.blocking((), move |_| {
                let _ = std::fs::remove_file(path);
            })
            .await;
        }
    }

    async fn forget(&self, session_id: &str) -> Vec<String> {
        let id = session_id.to_string();
        self.blocking(Vec::new(), move |d| d.forget_now(&id)).await
    }

    async fn sessions(&self) -> BTreeSet<String> {
        self.blocking(BTreeSet::new(), |d| {
            d.names()
                .iter()
                .filter_map(|n| record_name(n).map(|(id, _)| id.to_string()))
                .collect()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn forget_removes_every_record_of_the_session_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let records = FileRecords::new(dir.path());
        for kind in ["browser", "undo", "some_future_tool"] {
            records.save("s1", kind, b"1").await.unwrap();
            records.save("s10", kind, b"2").await.unwrap();
        }
        let sessions = dir.path().join("runs").join("sessions");
        std::fs::write(sessions.join("s1.json"), b"{}").unwrap();
        assert_eq!(
            records.sessions().await.into_iter().collect::<Vec<_>>(),
            ["s1", "s10"]
        );
        assert_eq!(records.entries().await.len(), 6, "the pointer is no record");
        assert_eq!(
            records.forget("s1").await,
            ["browser", "some_future_tool", "undo"]
        );
        for kind in ["browser", "undo", "some_future_tool"] {
            assert_eq!(records.load("s1", kind).await, None, "{kind}");
            assert_eq!(
                records.load("s10", kind).await.as_deref(),
                Some(&b"2"[..]),
                "{kind}"
            );
        }
        assert!(
            sessions.join("s1.json").exists(),
            "the conversation pointer"
        );
        assert!(records.forget("..").await.is_empty());
        assert!(
            FileRecords::new(&dir.path().join("missing"))
                .forget("s1")
                .await
                .is_empty()
        );
        assert!(records.save("../etc", "x", b"1").await.is_err());
    }

    #[tokio::test]
    async fn records_are_private_files_written_whole_and_bounded() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let records = FileRecords::new(dir.path());
        records.save("s1", "undo", &[0xff, 0, 1]).await.unwrap();
        let path = dir.path().join("runs/sessions/s1.undo.json");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        assert_eq!(
            records.load("s1", "undo").await.as_deref(),
            Some(&[0xff, 0, 1][..])
        );
        let names = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
        assert_eq!(names, 1, "no temporary file is left");
        let big = vec![b'x'; MAX_RECORD_BYTES as usize + 1];
        let e = records.save("s1", "undo", &big).await.unwrap_err();
        assert!(e.to_string().contains("over the"), "{e}");
        assert_eq!(
            records.load("s1", "undo").await.as_deref(),
            Some(&[0xff, 0, 1][..]),
            "a refused save changes nothing"
        );
        records.clear("s1", "undo").await;
        assert_eq!(records.load("s1", "undo").await, None);
        assert!(!path.exists());
    }

    #[test]
    fn only_tool_records_are_named_as_records() {
        assert_eq!(record_name("s1.undo.json"), Some(("s1", "undo")));
        assert_eq!(record_name("s1.json"), None, "the conversation pointer");
        assert_eq!(record_name(".s1.undo.json.tmp"), None);
        assert_eq!(record_name("s1.a.b.json"), None);
        assert_eq!(record_name("s1..json"), None);
    }
}
