//! The editor's undo history: per file, the bytes each edit replaced (or "did not exist" for a
//! create), kept for the life of the tool, which is the life of the session. In a kept
//! session it is also saved on the host after every change (`tools::saved`, the newest
//! versions up to `MAX_SAVED_BYTES`), so a later sandboxd process can undo an edit of an
//! earlier one.
//!
//! Undo restores the exact bytes an edit replaced, and undoing a create removes the file
//! (OpenManus wrote the created text back instead). The history is bounded so that a model
//! editing a large file in a loop cannot grow the host process without limit.

use std::collections::HashMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::{Outcome, StrReplaceEditor, model, text};
use crate::sandbox::SandboxError;

/// Undo history kept per session, in bytes; past it the oldest versions are dropped (a file's
/// newest version always stays, so one undo is always possible).
pub(super) const MAX_HISTORY_BYTES: usize = 64 << 20;

/// Per file: the versions before each edit, oldest first; `None` means "did not exist".
pub(super) type History = HashMap<String, Vec<Option<Vec<u8>>>>;

/// What of the history is saved for a later process, in bytes of file content: the newest
/// versions of every file first.
pub(super) const MAX_SAVED_BYTES: usize = 8 << 20;

/// The record kind in `tools::saved`.
pub(super) const RECORD: &str = "undo";

/// The saved form: per file, its versions oldest first, base64 (None: did not exist).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Saved {
    files: Vec<(String, Vec<Option<String>>)>,
}

/// The newest versions of `history` that fit `MAX_SAVED_BYTES`.
pub(super) fn to_saved(history: &History) -> Saved {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut budget = MAX_SAVED_BYTES;
    let mut files = Vec::new();
    for (path, versions) in history {
        let mut kept = Vec::new();
        for v in versions.iter().rev() {
            let size = v.as_ref().map_or(0, Vec::len);
            if size > budget {
                break;
            }
            budget -= size;
            kept.push(v.as_ref().map(|b| b64.encode(b)));
        }
        if !kept.is_empty() {
            kept.reverse();
            files.push((path.clone(), kept));
        }
    }
    Saved { files }
}

/// A saved history back in memory (entries that do not decode are skipped), under the cap.
pub(super) fn from_saved(saved: Saved) -> History {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut history = History::new();
    for (path, versions) in saved.files {
        if !path.starts_with('/') {
            continue;
        }
        for v in versions {
            let before = match v {
                None => None,
                Some(text) => match b64.decode(text) {
                    Ok(bytes) => Some(bytes),
                    Err(_) => continue,
                },
            };
            remember(&mut history, &path, before);
        }
    }
    history
}

/// Records the version an edit replaced, dropping the oldest versions past the history cap.
pub(super) fn remember(history: &mut History, path: &str, before: Option<Vec<u8>>) {
    history.entry(path.to_string()).or_default().push(before);
    let size = |v: &Option<Vec<u8>>| v.as_ref().map_or(0, Vec::len);
    let mut total: usize = history.values().flatten().map(size).sum();
    while total > MAX_HISTORY_BYTES {
        let Some(longest) = history
            .values_mut()
            .filter(|v| v.len() > 1)
            .max_by_key(|v| v.len())
        else {
            break;
        };
        total -= size(&longest.remove(0));
    }
}

impl StrReplaceEditor {
    pub(super) async fn undo(&self, path: &str) -> Outcome {
        let mut history = self.history().await;
        let mut key = path.to_string();
        if history.get(&key).is_none_or(Vec::is_empty)
            && let Ok((target, _)) = self.locate(path).await
        {
            // The edit went through a symlink and was recorded under its target.
            key = target;
        }
        let Some(before) = history.get_mut(&key).and_then(Vec::pop) else {
            return model(format!(
                "there is no edit of {path} to undo; undo_edit reverts only edits made with this tool in this session"
            ));
        };
        let restored = match &before {
            None => match self.sandbox.remove(&key, false).await {
                Err(SandboxError::NotFound { .. }) => Ok(()),
                other => other,
            },
            Some(bytes) => self.sandbox.write_file(&key, bytes).await,
        };
        if let Err(e) = restored {
            history.entry(key).or_default().push(before);
            return Err(e.into());
        }
        if history.get(&key).is_some_and(Vec::is_empty) {
            history.remove(&key);
        }
        self.persist(&history).await;
        Ok(match before {
            None => format!("Undid the creation of {path}: the file was removed."),
            Some(bytes) => format!(
                "Last edit to {path} undone. Here's the result of running `cat -n` on {path}:\n{}",
                text::numbered(&String::from_utf8_lossy(&bytes), 1)
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_saved_history_keeps_the_newest_versions() {
        let mut h = History::new();
        let big = |b: u8| Some(vec![b; MAX_SAVED_BYTES / 2 + 1]);
        remember(&mut h, "/a", None);
        remember(&mut h, "/a", big(1));
        remember(&mut h, "/a", big(2));
        remember(&mut h, "/a", Some(b"newest".to_vec()));
        let json = serde_json::to_vec(&to_saved(&h)).unwrap();
        let back = from_saved(serde_json::from_slice(&json).unwrap());
        // The oldest big version and everything before it did not fit.
        let firsts: Vec<Option<u8>> = back["/a"]
            .iter()
            .map(|v| v.as_ref().and_then(|b| b.first().copied()))
            .collect();
        assert_eq!(firsts, vec![Some(2), Some(b'n')]);
        assert!(
            from_saved(Saved {
                files: vec![("relative".into(), vec![None])]
            })
            .is_empty()
        );
    }

    #[test]
    fn the_history_is_bounded_but_keeps_each_files_newest_version() {
        let mut h = History::new();
        let chunk = || Some(vec![0u8; 30 << 20]);
        remember(&mut h, "/a", chunk());
        remember(&mut h, "/a", chunk());
        remember(&mut h, "/a", chunk());
        assert_eq!(h["/a"].len(), 2);
        remember(&mut h, "/b", Some(vec![0u8; 70 << 20]));
        assert_eq!((h["/a"].len(), h["/b"].len()), (1, 1));
        remember(&mut h, "/c", None);
        assert_eq!(h["/c"], vec![None]);
    }
}
