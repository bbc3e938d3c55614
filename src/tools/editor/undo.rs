//! The editor's undo history: per file, the bytes each edit replaced (or "did not exist" for a
//! create), kept for the life of the tool, which is the life of the session.
//!
//! Undo restores the exact bytes an edit replaced, and undoing a create removes the file
//! (OpenManus wrote the created text back instead). The history is bounded so that a model
//! editing a large file in a loop cannot grow the host process without limit.

use std::collections::HashMap;

use super::{Outcome, StrReplaceEditor, model, text};
use crate::sandbox::SandboxError;

/// Undo history kept per session, in bytes; past it the oldest versions are dropped (a file's
/// newest version always stays, so one undo is always possible).
pub(super) const MAX_HISTORY_BYTES: usize = 64 << 20;

/// Per file: the versions before each edit, oldest first; `None` means "did not exist".
pub(super) type History = HashMap<String, Vec<Option<Vec<u8>>>>;

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
        let mut history = self.history.lock().await;
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
