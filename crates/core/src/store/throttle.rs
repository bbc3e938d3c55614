//! Failed authentications per source, in the store: every replica on one store counts into
//! the same rows, so an attacker who spreads guesses over the replicas behind a load
//! balancer gets no more tries than against one process.
//!
//! A source's window starts at its first failure and lasts `window_ms`; a failure after it
//! starts a new window. Only failures are counted (the server asks after a credential was
//! refused), so a valid credential costs no store write and is never refused. Rows of ended
//! windows are purged by the next failure, and at most `max_sources` rows are kept (the
//! oldest windows go first), so the table stays small whatever an attacker sends.

use async_trait::async_trait;

use super::StoreError;

/// The window of one source after a failure was counted in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthWindow {
    /// Failures in the window, this one included.
    pub failures: u32,
    /// When the window ends (unix ms): the source's count starts again after it.
    pub ends_at: i64,
}

#[async_trait]
pub trait AuthFailures: Send + Sync {
    /// Counts one failed authentication of `source` at `now` and returns its window. Atomic:
    /// concurrent calls for one source (from any replica) each get a distinct count.
    async fn auth_failed(
        &self,
        source: &str,
        now: i64,
        window_ms: i64,
        max_sources: u32,
    ) -> Result<AuthWindow, StoreError>;
}
