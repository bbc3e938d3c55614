//! Kept sessions' tool records in the store (the browser's endpoint and tabs, the editor's
//! undo history, the plans; see `sandbox::records`): the `ToolRecords` part of the `Store`
//! contract, and `StoreRecords`, the records home over a store that `serve` installs, so
//! that every process on one store (several replicas, a restarted one) sees the same
//! records. The store keeps the bytes exactly as given, at most `MAX_RECORD_BYTES` each.
//!
//! Records are keyed by the session id the `SessionManager` knows (a stored session's
//! `runtime_id`), not by the sessions table's id: the manager writes and deletes them, and
//! ending or deleting a session row leaves them to the manager.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;

use super::{Store, StoreError};
use crate::sandbox::records::{MAX_RECORD_BYTES, SessionRecords};

/// The store's records. Every method is one short transaction.
#[async_trait]
pub trait ToolRecords: Send + Sync {
    /// The `kind` record of session `session_id`, byte for byte as stored.
    async fn record(&self, session_id: &str, kind: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Replaces the `kind` record of `session_id`. More than `MAX_RECORD_BYTES` is
    /// `StoreError::RecordTooLarge` (see `check_record_size`) and changes nothing.
    async fn put_record(
        &self,
        session_id: &str,
        kind: &str,
        bytes: Vec<u8>,
    ) -> Result<(), StoreError>;
    /// Deletes the `kind` record of `session_id`; whether there was one.
    async fn clear_record(&self, session_id: &str, kind: &str) -> Result<bool, StoreError>;
    /// Deletes every record of `session_id`; returns the kinds deleted, sorted.
    async fn forget_records(&self, session_id: &str) -> Result<Vec<String>, StoreError>;
    /// The ids of the sessions that have records, sorted, each once.
    async fn record_sessions(&self) -> Result<Vec<String>, StoreError>;
}

/// The size check every store makes before it writes a record.
pub fn check_record_size(session_id: &str, kind: &str, len: usize) -> Result<(), StoreError> {
    if len as u64 > MAX_RECORD_BYTES {
        return Err(StoreError::RecordTooLarge {
            session: session_id.to_string(),
            kind: kind.to_string(),
            len: len as u64,
            max: MAX_RECORD_BYTES,
        });
    }
    Ok(())
}

/// Kept sessions' tool records as rows of a store. Failures to read or delete are logged
/// and read as "no record", as `SessionRecords` asks.
pub struct StoreRecords {
    store: Arc<dyn Store>,
}

impl StoreRecords {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }
}

#[async_trait]
impl SessionRecords for StoreRecords {
    async fn load(&self, session_id: &str, kind: &str) -> Option<Vec<u8>> {
        match self.store.record(session_id, kind).await {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(session = %session_id, kind, error = %e, "cannot read a tool record");
                None
            }
        }
    }

    async fn save(&self, session_id: &str, kind: &str, bytes: &[u8]) -> std::io::Result<()> {
        self.store
            .put_record(session_id, kind, bytes.to_vec())
            .await
            .map_err(std::io::Error::other)
    }

    async fn clear(&self, session_id: &str, kind: &str) {
        if let Err(e) = self.store.clear_record(session_id, kind).await {
            tracing::warn!(session = %session_id, kind, error = %e, "cannot delete a tool record");
        }
    }

    async fn forget(&self, session_id: &str) -> Vec<String> {
        self.store
            .forget_records(session_id)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(session = %session_id, error = %e, "cannot delete the tool records");
                Vec::new()
            })
    }

    async fn sessions(&self) -> BTreeSet<String> {
        match self.store.record_sessions().await {
            Ok(ids) => ids.into_iter().collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the tool records");
                BTreeSet::new()
            }
        }
    }
}
