//! Where a kept session's tool records live for a later process: the browser's DevTools
//! endpoint and tabs, the editor's undo history, the session's plans. One home, installed
//! when the `SessionManager` is built (its constructors take it), handed to the tools with
//! each session, and emptied by the manager whenever a session ends or turns out orphaned —
//! so no entry point can forget to install, read or delete them.
//!
//! Records are opaque bytes per (session, kind); the tools' typed view, with the owner check,
//! is `tools::saved::SavedTools`. Everything here is host-side on purpose: nothing is read
//! from the sandbox, so a later process never learns an endpoint from a file sandboxed code
//! could write. `FileRecords` keeps them in a data directory (the CLI's and today's serve's);
//! a store-backed implementation is what several replicas need.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::datadir::{is_plain_id, write_private};

/// The largest record read back; the writers keep theirs well below it.
pub const MAX_RECORD_BYTES: u64 = 32 << 20;

/// A home for kept sessions' tool records. Calls may block (file or store work): from async
/// code, the manager runs the sweeping ones on the blocking pool.
pub trait SessionRecords: Send + Sync {
    /// The `kind` record of `session_id`, if there is a readable one.
    fn load(&self, session_id: &str, kind: &str) -> Option<Vec<u8>>;
    /// Replaces the `kind` record of `session_id`.
    fn save(&self, session_id: &str, kind: &str, bytes: &[u8]) -> std::io::Result<()>;
    /// Removes the `kind` record of `session_id` (the state it described is gone).
    fn clear(&self, session_id: &str, kind: &str);
    /// Removes every record of `session_id`; returns the kinds removed, sorted.
    fn forget(&self, session_id: &str) -> Vec<String>;
    /// The ids of the sessions that have records (for the sweep of orphans).
    fn sessions(&self) -> BTreeSet<String>;
}

/// No records: a process whose sessions are never kept, or that must not write any.
pub struct NoRecords;

impl SessionRecords for NoRecords {
    fn load(&self, _: &str, _: &str) -> Option<Vec<u8>> {
        None
    }
    fn save(&self, _: &str, _: &str, _: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
    fn clear(&self, _: &str, _: &str) {}
    fn forget(&self, _: &str) -> Vec<String> {
        Vec::new()
    }
    fn sessions(&self) -> BTreeSet<String> {
        BTreeSet::new()
    }
}

/// Records as private files, `<data>/runs/sessions/<session-id>.<kind>.json`, next to the
/// session's conversation pointer `<session-id>.json` (which is not a record), each written
/// whole through a temporary file.
pub struct FileRecords {
    dir: PathBuf,
}

impl FileRecords {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            dir: data_dir.join("runs").join("sessions"),
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
}

/// The session id and kind of a record's file name (`<id>.<kind>.json`); None for anything
/// else (the conversation pointer `<id>.json`, a temporary `.<name>.tmp`).
fn record_name(name: &str) -> Option<(&str, &str)> {
    let (id, kind) = name.strip_suffix(".json")?.split_once('.')?;
    (is_plain_id(id) && is_plain_id(kind)).then_some((id, kind))
}

impl SessionRecords for FileRecords {
    fn load(&self, session_id: &str, kind: &str) -> Option<Vec<u8>> {
        let path = self.path(session_id, kind)?;
        let len = std::fs::metadata(&path).ok()?.len();
        if len > MAX_RECORD_BYTES {
            tracing::warn!(path = %path.display(), len, "tool record too large; ignored");
            return None;
        }
        std::fs::read(&path).ok()
    }

    fn save(&self, session_id: &str, kind: &str, bytes: &[u8]) -> std::io::Result<()> {
        let path = self.path(session_id, kind).ok_or_else(|| {
            std::io::Error::other(format!("{session_id:?}/{kind:?} cannot name a record"))
        })?;
        write_private(&path, bytes)
    }

    fn clear(&self, session_id: &str, kind: &str) {
        if let Some(path) = self.path(session_id, kind) {
            let _ = std::fs::remove_file(path);
        }
    }

    fn forget(&self, session_id: &str) -> Vec<String> {
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

    fn sessions(&self) -> BTreeSet<String> {
        self.names()
            .iter()
            .filter_map(|n| record_name(n).map(|(id, _)| id.to_string()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forget_removes_every_record_of_the_session_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let records = FileRecords::new(dir.path());
        for kind in ["browser", "undo", "some_future_tool"] {
            records.save("s1", kind, b"1").unwrap();
            records.save("s10", kind, b"2").unwrap();
        }
        let sessions = dir.path().join("runs").join("sessions");
        std::fs::write(sessions.join("s1.json"), b"{}").unwrap();
        assert_eq!(
            records.sessions().into_iter().collect::<Vec<_>>(),
            ["s1", "s10"]
        );
        assert_eq!(
            records.forget("s1"),
            ["browser", "some_future_tool", "undo"]
        );
        for kind in ["browser", "undo", "some_future_tool"] {
            assert_eq!(records.load("s1", kind), None, "{kind}");
            assert_eq!(
                records.load("s10", kind).as_deref(),
                Some(&b"2"[..]),
                "{kind}"
            );
        }
        assert!(
            sessions.join("s1.json").exists(),
            "the conversation pointer"
        );
        assert!(records.forget("..").is_empty());
        assert!(
            FileRecords::new(&dir.path().join("missing"))
                .forget("s1")
                .is_empty()
        );
        assert!(records.save("../etc", "x", b"1").is_err());
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
