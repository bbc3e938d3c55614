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
//! A session whose sandbox went without sandboxd (`docker rm -f`) leaves its records behind;
//! `sessions rm ID` drops them, and so does `forget_orphans`, the sweep of a whole data
//! directory that `sessions gc`, every command's start-up reconcile and `serve`'s start run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::datadir::{is_plain_id, write_private};
use crate::sandbox::manager::EndHook;
use crate::sandbox::{SandboxError, SessionManager, Viewer};

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

/// The session id and kind of a tool record's file name (`<id>.<kind>.json`); None for
/// anything else (the conversation pointer `<id>.json`, a temporary `.<name>.tmp`).
fn record_name(name: &str) -> Option<(&str, &str)> {
    let (id, kind) = name.strip_suffix(".json")?.split_once('.')?;
    (is_plain_id(id) && is_plain_id(kind)).then_some((id, kind))
}

/// The names in the records directory; empty when there is none (or it cannot be read).
fn names(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list tool records");
            Vec::new()
        }
    }
}

/// Deletes every tool record of `session_id` (each `<id>.<kind>.json`, whatever tool wrote
/// it), because the session is gone, and returns the kinds it deleted. The conversation
/// pointer `<id>.json` is not a tool record and stays with the transcripts it points into.
/// Blocking file work: from async code, use `forget_blocking`.
pub fn forget(data_dir: &Path, session_id: &str) -> Vec<String> {
    let mut removed = Vec::new();
    if !is_plain_id(session_id) {
        return removed;
    }
    let dir = records_dir(data_dir);
    for name in names(&dir) {
        let Some((id, kind)) = record_name(&name).filter(|(id, _)| *id == session_id) else {
            continue;
        };
        let path = dir.join(&name);
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

/// `forget` on the blocking pool, awaited (the kinds deleted, sorted).
pub async fn forget_blocking(data_dir: &Path, session_id: &str) -> Vec<String> {
    let (dir, id) = (data_dir.to_path_buf(), session_id.to_string());
    tokio::task::spawn_blocking(move || forget(&dir, &id))
        .await
        .unwrap_or_default()
}

/// Deletes the records of every session under `data_dir` that has no sandbox on the backend
/// (its container was removed outside sandboxd), and returns those sessions' ids, sorted.
///
/// Only for callers trusted with the whole data directory (`sessions gc`, a command's
/// start-up reconcile, `serve`'s start): nothing a client names reaches it, so no owner is
/// checked; the test is the engine's own listing, whoever the session belonged to.
///
/// The records are listed before the sandboxes, so a session created meanwhile cannot lose
/// its records: a record is written only while its sandbox exists, so every record listed
/// first belongs to a sandbox the later listing shows, unless that sandbox is gone by then.
/// A failed listing deletes nothing. (A data directory shared by processes on different
/// engines would lose the other engine's records; they are only what a later process could
/// restore, so that costs an undo history or a browser tab, never a session.)
pub async fn forget_orphans(
    data_dir: &Path,
    manager: &SessionManager,
) -> Result<Vec<String>, SandboxError> {
    let dir = records_dir(data_dir);
    let recorded: BTreeSet<String> = tokio::task::spawn_blocking(move || {
        names(&dir)
            .iter()
            .filter_map(|n| record_name(n).map(|(id, _)| id.to_string()))
            .collect()
    })
    .await
    .unwrap_or_default();
    if recorded.is_empty() {
        return Ok(Vec::new());
    }
    let mut alive: BTreeSet<String> = manager
        .list(&Viewer::Admin)
        .await?
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    alive.extend(manager.live().await.into_iter().map(|s| s.id.clone()));
    let orphans: Vec<String> = recorded.difference(&alive).cloned().collect();
    let data_dir = data_dir.to_path_buf();
    let ids = orphans.clone();
    tokio::task::spawn_blocking(move || {
        for id in &ids {
            let kinds = forget(&data_dir, id);
            tracing::info!(session = %id, ?kinds, "removed the tool records of a session whose sandbox is gone");
        }
    })
    .await
    .map_err(|e| SandboxError::Protocol {
        helper: "the tool records".into(),
        message: format!("the sweep of orphaned records failed: {e}"),
    })?;
    Ok(orphans)
}

/// The session manager's end hook that `forget`s each ended session's records under
/// `data_dir` (set it on every manager whose sessions may be kept). The manager runs it on
/// the blocking pool.
pub fn end_hook(data_dir: PathBuf) -> EndHook {
    Arc::new(move |session_id: &str| {
        forget(&data_dir, session_id);
    })
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
        assert_eq!(
            forget(dir.path(), "s1"),
            ["browser", "some_future_tool", "undo"]
        );
        for kind in ["browser", "undo", "some_future_tool"] {
            assert_eq!(a.load::<i32>(kind), None, "{kind}");
            assert_eq!(b.load::<i32>(kind), Some(2), "another session's {kind}");
        }
        assert!(
            sessions.join("s1.json").exists(),
            "the conversation pointer"
        );
        assert!(forget(dir.path(), "..").is_empty());
        assert!(forget(&dir.path().join("missing"), "s1").is_empty());
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
