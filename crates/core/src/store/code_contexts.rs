//! The code interpreter's contexts (E2B's `/contexts`) in the store: each created context of
//! a session is a row (its id, language and working directory), so every replica lists,
//! uses, restarts and removes the same ones, and the cap is counted in the store, atomically
//! per session. The interpreter behind a context is a process of the sandbox, started on
//! demand by whichever replica serves a call (server/src/e2b/contexts.rs).
//!
//! The store keeps two promises of its own: a session's contexts go when the session ends
//! (or its row is deleted), and a hibernation marks them `lost` (the container, and with it
//! every interpreter, is gone): the first use after it takes the mark, exactly once, and
//! tells the caller that the variables did not survive. Which replica connected to a
//! context's interpreter last is recorded too (`holder`): the interpreter serves one
//! connection at a time, the newest, so a replica that is not the holder connects anew.

use async_trait::async_trait;

use super::StoreError;

/// One created code context of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeContextRow {
    /// The API session (the sandbox) it belongs to.
    pub session_id: String,
    /// Its id ([a-z0-9]{1,32}, the name its interpreter's files are made from).
    pub id: String,
    pub language: String,
    /// The directory its interpreter starts in.
    pub cwd: String,
    pub created_at: i64,
    /// Its interpreter was lost since it was last used (the session was hibernated).
    pub lost: bool,
    /// The replica that connected to its interpreter last: another replica's connection to
    /// it was taken over since, so that replica connects again before its next use.
    pub holder: Option<String>,
}

/// What `add_code_context` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextAdded {
    Added,
    /// The session has `cap` contexts already; nothing was added.
    Full,
    /// The session is not running (ended, or no such row); nothing was added.
    NoSession,
}

#[async_trait]
pub trait CodeContexts: Send + Sync {
    /// Adds `row` (its `lost` is ignored) unless its session is not running or already has
    /// `cap` contexts: counted and added in one step, so concurrent adds on any replicas
    /// never pass the cap.
    async fn add_code_context(
        &self,
        row: CodeContextRow,
        cap: u32,
    ) -> Result<ContextAdded, StoreError>;
    /// The contexts of a session, oldest first.
    async fn code_contexts(&self, session_id: &str) -> Result<Vec<CodeContextRow>, StoreError>;
    /// One context of a session.
    async fn code_context(
        &self,
        session_id: &str,
        id: &str,
    ) -> Result<Option<CodeContextRow>, StoreError>;
    /// Removes a context; whether it was there.
    async fn remove_code_context(&self, session_id: &str, id: &str) -> Result<bool, StoreError>;
    /// Records `replica` as the one connected to the context's interpreter; whether the
    /// context is there.
    async fn hold_code_context(
        &self,
        session_id: &str,
        id: &str,
        replica: &str,
    ) -> Result<bool, StoreError>;
    /// Clears the context's `lost` mark; whether this call did (of concurrent callers,
    /// exactly one gets true).
    async fn take_code_context_loss(&self, session_id: &str, id: &str) -> Result<bool, StoreError>;
}
