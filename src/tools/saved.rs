//! What a kept session's tools leave on the host for a later sandboxd process: the browser's
//! DevTools endpoint and tabs (`browser`), the editor's undo history (`undo`). Each is one
//! private file next to the session's conversation pointer,
//! `<data>/runs/sessions/<session-id>.<kind>.json`, written whole through a temporary file.
//!
//! Host-side on purpose: nothing here is read from the sandbox, so a later process never
//! learns an endpoint from a file sandboxed code could write. A record names its session
//! and owner and is used only when both match; one that is too large or malformed is
//! ignored (the tool starts empty, as a new session's would).
//!
//! The records end with their session: `end_hook` is the session manager's end hook, so
//! however a session is destroyed (removed, reaped, reconciled), `forget` deletes them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::agent::transcript::{is_plain_id, write_private};
use crate::sandbox::manager::EndHook;

/// The largest record read back; the writers keep theirs well below it.
const MAX_RECORD_BYTES: u64 = 32 << 20;

/// Where one session's tool records live.
#[derive(Debug, Clone)]
pub struct SavedTools {
    dir: PathBuf,
    session_id: String,
    owner: String,
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    session_id: String,
    owner: String,
    value: T,
}

impl SavedTools {
    /// Records of `session_id` under `<data>/runs/sessions`; None for an id that is not a
    /// plain name (it would not make a safe file name).
    pub fn new(data_dir: &Path, session_id: &str, owner: &str) -> Option<Self> {
        is_plain_id(session_id).then(|| Self {
            dir: records_dir(data_dir),
            session_id: session_id.to_string(),
            owner: owner.to_string(),
        })
    }

    fn path(&self, kind: &str) -> PathBuf {
        self.dir.join(format!("{}.{kind}.json", self.session_id))
    }

    /// The `kind` record, if one of this session and owner is there and readable.
    pub fn load<T: DeserializeOwned>(&self, kind: &str) -> Option<T> {
        let path = self.path(kind);
        let len = std::fs::metadata(&path).ok()?.len();
        if len > MAX_RECORD_BYTES {
            tracing::warn!(path = %path.display(), len, "tool record too large; ignored");
            return None;
        }
        let bytes = std::fs::read(&path).ok()?;
        match serde_json::from_slice::<Envelope<T>>(&bytes) {
            Ok(e) if e.session_id == self.session_id && e.owner == self.owner => Some(e.value),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "tool record unreadable; ignored");
                None
            }
        }
    }

    /// Replaces the `kind` record. A failure costs only what a later process could restore,
    /// so it is logged, not returned.
    pub fn save<T: Serialize>(&self, kind: &str, value: &T) {
        let envelope = Envelope {
            session_id: self.session_id.clone(),
            owner: self.owner.clone(),
            value,
        };
        let path = self.path(kind);
        let written = serde_json::to_vec(&envelope)
            .map_err(std::io::Error::other)
            .and_then(|bytes| write_private(&path, &bytes));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "could not save a tool record");
        }
    }

    /// Removes the `kind` record (the state it described is gone).
    pub fn clear(&self, kind: &str) {
        let _ = std::fs::remove_file(self.path(kind));
    }
}

fn records_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("runs").join("sessions")
}

/// Deletes every tool record of `session_id` (each `<id>.<kind>.json`, whatever tool wrote
/// it), because the session is gone. The conversation pointer `<id>.json` is not a tool
/// record and stays with the transcripts it points into.
pub fn forget(data_dir: &Path, session_id: &str) {
    if !is_plain_id(session_id) {
        return;
    }
    let dir = records_dir(data_dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list tool records");
            return;
        }
    };
    let prefix = format!("{session_id}.");
    for entry in entries.flatten() {
        let name = entry.file_name();
        let kind = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|n| n.strip_suffix(".json"));
        if !kind.is_some_and(is_plain_id) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => tracing::debug!(session = %session_id, file = ?name, "tool record removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %entry.path().display(), error = %e, "could not remove a tool record")
            }
        }
    }
}

/// The session manager's end hook that `forget`s each ended session's records under
/// `data_dir` (set it on every manager whose sessions may be kept).
pub fn end_hook(data_dir: PathBuf) -> EndHook {
    Arc::new(move |session_id: &str| forget(&data_dir, session_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_only_to_their_session_and_owner() {
        let dir = tempfile::tempdir().unwrap();
        let a = SavedTools::new(dir.path(), "s1", "alice").unwrap();
        a.save("x", &vec![1, 2, 3]);
        assert_eq!(a.load::<Vec<i32>>("x"), Some(vec![1, 2, 3]));
        let other_owner = SavedTools::new(dir.path(), "s1", "bob").unwrap();
        assert_eq!(other_owner.load::<Vec<i32>>("x"), None);
        assert_eq!(a.load::<Vec<i32>>("y"), None);
        a.clear("x");
        assert_eq!(a.load::<Vec<i32>>("x"), None);
        assert!(SavedTools::new(dir.path(), "../etc", "alice").is_none());
    }

    #[test]
    fn forget_removes_every_record_of_the_session_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let a = SavedTools::new(dir.path(), "s1", "alice").unwrap();
        let b = SavedTools::new(dir.path(), "s10", "alice").unwrap();
        for kind in ["browser", "undo", "some_future_tool"] {
            a.save(kind, &1);
            b.save(kind, &2);
        }
        let sessions = records_dir(dir.path());
        std::fs::write(sessions.join("s1.json"), b"{}").unwrap();
        forget(dir.path(), "s1");
        for kind in ["browser", "undo", "some_future_tool"] {
            assert_eq!(a.load::<i32>(kind), None, "{kind}");
            assert_eq!(b.load::<i32>(kind), Some(2), "another session's {kind}");
        }
        assert!(
            sessions.join("s1.json").exists(),
            "the conversation pointer"
        );
        forget(dir.path(), "..");
        forget(&dir.path().join("missing"), "s1");
    }
}
