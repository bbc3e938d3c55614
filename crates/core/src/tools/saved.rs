//! A kept session's tool records as its tools see them: typed values (the browser's DevTools
//! endpoint and tabs, the editor's undo history, the plans), each wrapped with the session
//! and owner it belongs to and used only when both match. Where the bytes live is the
//! manager's `SessionRecords` (sandbox/records.rs), which also deletes them when the session
//! ends; one that is malformed is ignored (the tool starts empty, as a new session's would).
//! The tools read their record on first use (a session's tools are made in sync code) and
//! save under their own lock, so the records follow the order of the changes.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::datadir::is_plain_id;
use crate::sandbox::records::SessionRecords;

/// One session's tool records.
#[derive(Clone)]
pub struct SavedTools {
    records: Arc<dyn SessionRecords>,
    session_id: String,
    owner: String,
}

impl std::fmt::Debug for SavedTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavedTools")
            .field("session_id", &self.session_id)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    session_id: String,
    owner: String,
    value: T,
}

impl SavedTools {
    /// Records of `session_id` in `records`; None for an id that is not a plain name.
    pub fn new(records: Arc<dyn SessionRecords>, session_id: &str, owner: &str) -> Option<Self> {
        is_plain_id(session_id).then(|| Self {
            records,
            session_id: session_id.to_string(),
            owner: owner.to_string(),
        })
    }

    /// The `kind` record, if one of this session and owner is there and readable.
    pub async fn load<T: DeserializeOwned>(&self, kind: &str) -> Option<T> {
        let bytes = self.records.load(&self.session_id, kind).await?;
        match serde_json::from_slice::<Envelope<T>>(&bytes) {
            Ok(e) if e.session_id == self.session_id && e.owner == self.owner => Some(e.value),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(session = %self.session_id, kind, error = %e, "tool record unreadable; ignored");
                None
            }
        }
    }

    /// Replaces the `kind` record. A failure costs only what a later process could restore,
    /// so it is logged, not returned.
    pub async fn save<T: Serialize>(&self, kind: &str, value: &T) {
        // Serialized first: nothing borrowed from `value` is held across the write.
        let bytes = serde_json::to_vec(&Envelope {
            session_id: self.session_id.clone(),
            owner: self.owner.clone(),
            value,
        });
        let written = match bytes {
            Ok(bytes) => self.records.save(&self.session_id, kind, &bytes).await,
            Err(e) => Err(std::io::Error::other(e)),
        };
        if let Err(e) = written {
            tracing::warn!(session = %self.session_id, kind, error = %e, "could not save a tool record");
        }
    }

    /// Removes the `kind` record (the state it described is gone).
    pub async fn clear(&self, kind: &str) {
        self.records.clear(&self.session_id, kind).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::records::FileRecords;

    #[tokio::test]
    async fn records_come_back_only_to_their_session_and_owner() {
        let dir = tempfile::tempdir().unwrap();
        let records: Arc<dyn SessionRecords> = Arc::new(FileRecords::new(dir.path()));
        let a = SavedTools::new(records.clone(), "s1", "alice").unwrap();
        a.save("x", &vec![1, 2, 3]).await;
        assert_eq!(a.load::<Vec<i32>>("x").await, Some(vec![1, 2, 3]));
        let other_owner = SavedTools::new(records.clone(), "s1", "bob").unwrap();
        assert_eq!(other_owner.load::<Vec<i32>>("x").await, None);
        assert_eq!(a.load::<Vec<i32>>("y").await, None);
        a.clear("x").await;
        assert_eq!(a.load::<Vec<i32>>("x").await, None);
        assert!(SavedTools::new(records, "../etc", "alice").is_none());
    }
}
