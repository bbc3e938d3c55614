//! The store's side of a session's egress: its policy (on the session row, so every replica
//! reads a change at once), its log of connections (`EgressRecord`s, newest kept, pruned
//! with the session) and the counters of everything that left, kept on the row so a reader
//! never sums the log.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::config::egress::EgressPolicy;
use crate::egress::EgressRecord;

/// The most records one session's log keeps: older ones are dropped as new ones come (the
/// counters keep counting). A sandbox can open connections as fast as the caps allow, and
/// the store must stay bounded whatever it does.
pub const MAX_RECORDS_PER_SESSION: u64 = 2_000;

/// The longest host or reason a record keeps (characters): both come from the sandbox.
pub const MAX_RECORD_TEXT: usize = 512;

/// Everything that went through a session's proxy so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EgressCounters {
    /// Connections allowed.
    pub connections: u64,
    /// Connections refused.
    pub refused: u64,
    /// Bytes from the sandbox to the outside.
    pub bytes_up: u64,
    /// Bytes from the outside to the sandbox.
    pub bytes_down: u64,
}

impl EgressCounters {
    /// The counters after `record`.
    pub fn add(&mut self, record: &EgressRecord) {
        if record.allowed {
            self.connections += 1;
        } else {
            self.refused += 1;
        }
        self.bytes_up = self.bytes_up.saturating_add(record.bytes_up);
        self.bytes_down = self.bytes_down.saturating_add(record.bytes_down);
    }
}

/// A record cut to what the store keeps (the sandbox names hosts; the reason may quote it).
pub fn bounded(record: &EgressRecord) -> EgressRecord {
    let cut = |s: &str| -> String { s.chars().take(MAX_RECORD_TEXT).collect() };
    EgressRecord {
        session: cut(&record.session),
        owner: cut(&record.owner),
        method: record.method.chars().take(32).collect(),
        host: cut(&record.host),
        rule: cut(&record.rule),
        reason: record.reason.as_deref().map(cut),
        ..record.clone()
    }
}

/// The egress rows of the store. Every method is one short transaction.
#[async_trait]
pub trait EgressLog: Send + Sync {
    /// Replaces the policy of a session that has not ended; false when there is none.
    async fn set_session_egress(&self, id: &str, policy: &EgressPolicy)
    -> Result<bool, StoreError>;
    /// Appends `record` to its session's log and adds it to the session's counters, in one
    /// transaction; the oldest records past `MAX_RECORDS_PER_SESSION` go. A record of a
    /// session the store does not know is dropped (Ok).
    async fn add_egress_record(&self, record: &EgressRecord) -> Result<(), StoreError>;
    /// The session's counters (zero for a session without traffic or without a row).
    async fn egress_counters(&self, session: &str) -> Result<EgressCounters, StoreError>;
    /// The session's newest records, newest first, at most `limit`; with `since` (unix ms),
    /// only those started at or after it.
    async fn egress_records(
        &self,
        session: &str,
        since: Option<i64>,
        limit: u32,
    ) -> Result<Vec<EgressRecord>, StoreError>;
}
