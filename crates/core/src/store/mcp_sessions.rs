//! The MCP sessions of serve's /mcp, in the store: who owns each `Mcp-Session-Id`, what its
//! client sent in `initialize` (so any replica can restore the session without the client
//! initializing again), and which sandbox it holds (so the replica that restores it attaches
//! the same container instead of making a new one).

use async_trait::async_trait;

use super::StoreError;

/// One MCP session as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpSessionRow {
    /// The `Mcp-Session-Id` the client sends.
    pub id: String,
    /// The owning user's id: another user's session is unknown to them.
    pub owner: String,
    /// The client's `initialize` parameters (JSON, opaque to the store).
    pub init: String,
    /// The sandbox the session holds: its session row's id and the manager's id for it.
    pub sandbox: Option<McpSandbox>,
    pub created_at: i64,
    pub last_used_at: i64,
}

/// The sandbox of an MCP session: its row in `sessions` and the manager's (runtime's) id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpSandbox {
    pub row: String,
    pub runtime_id: String,
}

#[async_trait]
pub trait McpSessions: Send + Sync {
    /// Records a new session (or replaces the `initialize` parameters of one with this id).
    async fn put_mcp_session(&self, row: McpSessionRow) -> Result<(), StoreError>;
    /// The session `id`, whoever owns it (the caller compares the owner).
    async fn mcp_session(&self, id: &str) -> Result<Option<McpSessionRow>, StoreError>;
    /// Records the sandbox the session now holds (None: it holds none) and its use at `now`.
    async fn set_mcp_sandbox(
        &self,
        id: &str,
        sandbox: Option<McpSandbox>,
        now: i64,
    ) -> Result<(), StoreError>;
    /// Records a use of the session at `now` (kept only if later than the one recorded).
    async fn touch_mcp_session(&self, id: &str, now: i64) -> Result<(), StoreError>;
    /// Forgets the session (closed); whether it was there.
    async fn remove_mcp_session(&self, id: &str) -> Result<bool, StoreError>;
    /// Forgets the sessions unused since before `cutoff` (their clients are gone); how many.
    async fn purge_mcp_sessions(&self, cutoff: i64) -> Result<u64, StoreError>;
}
