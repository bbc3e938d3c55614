//! The audit log: who did what to which object, when, from where, under which request.
//! Append-only from the API's point of view (no route edits or removes an entry); the store
//! bounds it on every append (entries older than the retention, and past the row cap, go).
//!
//! An entry's `details` are JSON the caller builds from what it knows is not secret (names,
//! limits, policies, handles: never a key, a token, a credential's value or a command's
//! text); `actor` is a user's name (`-` when nobody authenticated, `system` for the service
//! itself, `cli` for `sandboxd users` on the host). Every text field is cut to
//! `MAX_AUDIT_TEXT` characters (NUL replaced by U+FFFD) and the details to
//! `MAX_AUDIT_DETAILS` bytes, so a hostile string cannot grow a row.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreError;

/// The longest actor, action, target, request id or client address an entry keeps.
pub const MAX_AUDIT_TEXT: usize = 256;
/// The largest `details` an entry keeps (bytes of its JSON); larger ones are replaced by a
/// note saying so.
pub const MAX_AUDIT_DETAILS: usize = 8 * 1024;
/// The most entries one page holds.
pub const MAX_AUDIT_PAGE: u32 = 1000;

/// An entry to append.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewAudit {
    /// Unix ms.
    pub at: i64,
    pub actor: String,
    /// What happened, dotted: `user.create`, `session.end`, `sign_in.failed`, …
    pub action: String,
    /// The object acted on (a user's name, a session id, `host` of a credential …).
    pub target: String,
    /// The `x-request-id` of the request that did it (empty outside a request).
    pub request_id: String,
    /// The client's address (behind trusted proxies, the forwarded one).
    pub client: String,
    pub details: serde_json::Value,
}

/// A stored entry: its sequence number (increasing, the cursor) and the entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub seq: i64,
    #[serde(flatten)]
    pub entry: NewAudit,
}

/// How long and how many entries the log keeps (`[audit]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditBound {
    /// Entries at or before this time (unix ms) go.
    pub before: i64,
    /// At most this many entries stay (the oldest go first).
    pub max_rows: u64,
}

/// Which page: oldest first after `after`, or newest first before `before`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditQuery {
    pub after: Option<i64>,
    pub before: Option<i64>,
    pub newest_first: bool,
    pub limit: u32,
}

impl NewAudit {
    /// The entry as the store keeps it: text fields and details cut to their bounds.
    pub fn bounded(&self) -> NewAudit {
        // NUL is replaced: PostgreSQL's text refuses it, and no reader needs it.
        let cut = |s: &str| -> String {
            s.chars()
                .take(MAX_AUDIT_TEXT)
                .map(|c| if c == '\0' { '\u{FFFD}' } else { c })
                .collect()
        };
        let details = match serde_json::to_string(&self.details) {
            Ok(text) if text.len() <= MAX_AUDIT_DETAILS => self.details.clone(),
            _ => serde_json::json!({"note": "the details were too large to keep"}),
        };
        NewAudit {
            at: self.at,
            actor: cut(&self.actor),
            action: cut(&self.action),
            target: cut(&self.target),
            request_id: cut(&self.request_id),
            client: cut(&self.client),
            details,
        }
    }
}

/// The audit rows of the store. Every method is one short transaction.
#[async_trait]
pub trait Audit: Send + Sync {
    /// Appends `entry` (bounded) and, in the same transaction, removes what `bound` says
    /// goes; returns the new entry's sequence number.
    async fn append_audit(&self, entry: &NewAudit, bound: AuditBound) -> Result<i64, StoreError>;
    /// One page of entries (at most `MAX_AUDIT_PAGE`).
    async fn audit_page(&self, q: AuditQuery) -> Result<Vec<AuditEntry>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_cut_to_their_bounds() {
        let e = NewAudit {
            at: 1,
            actor: "a".repeat(1000),
            action: "x".into(),
            target: "\u{1F600}".repeat(300),
            request_id: String::new(),
            client: "10.0.0.1".into(),
            details: serde_json::json!({"big": "y".repeat(MAX_AUDIT_DETAILS)}),
        };
        let b = e.bounded();
        assert_eq!(b.actor.chars().count(), MAX_AUDIT_TEXT);
        assert_eq!(b.target.chars().count(), MAX_AUDIT_TEXT);
        assert_eq!(b.details["note"], "the details were too large to keep");
        assert_eq!(b.client, "10.0.0.1");
    }
}
