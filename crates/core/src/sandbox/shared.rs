//! Sessions shared by several processes (replicas of `serve` on one store and one engine):
//! what the manager asks of whoever keeps the shared books before it acts on a session
//! another process may be using too.
//!
//! The manager stays the one registry of the sessions this process holds and its reaper the
//! one that ends idle ones; with a `SharedSessions` set (`SessionManager::share`), the reaper
//! ends a session idle by this process's clock only if the shared books agree (its last use
//! recorded by any replica is older than its timeout, and ending it there succeeded for this
//! replica alone), the reconciler leaves the sandboxes of live replicas alone, and a sandbox
//! reported gone ends its session only if the books still have it live (another replica's
//! hibernation or end removes the sandbox too, and is not this replica's to announce). Without
//! one (the CLI, the MCP server, a single serve before issue 22) nothing changes.

use std::time::Duration;

use async_trait::async_trait;

use super::manager::Session;

/// What the shared books say of a session this process found idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReapVerdict {
    /// End it: the books recorded its end for this process (or it had already ended), so its
    /// sandbox goes now.
    Reap,
    /// Keep it: another process used it `ago` back; its idle time goes on from there.
    UsedAgo(Duration),
    /// The books cannot tell now (the store is unreachable): keep it and ask again later.
    Unknown,
}

/// The shared books the manager consults (serve: its store's session rows and replicas).
#[async_trait]
pub trait SharedSessions: Send + Sync {
    /// Before the reaper ends `session`, idle for more than `timeout` here.
    async fn vet_idle(&self, session: &Session, timeout: Duration) -> ReapVerdict;

    /// The ids of the replicas alive now; None when that cannot be told (then no sandbox a
    /// replica recorded is taken for an orphan).
    async fn live_replicas(&self) -> Option<Vec<String>>;

    /// Before the manager ends `session`, whose sandbox was reported gone: whether it is
    /// still live in the books (or is not the books' at all), so that its end is this
    /// replica's to announce.
    async fn vet_vanished(&self, session: &Session) -> VanishVerdict;
}

/// What the shared books say of a session whose sandbox ended outside this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VanishVerdict {
    /// End it here: its row is still active and not hibernated, so the sandbox went behind
    /// everyone's back.
    End,
    /// Only forget it here (as `SessionManager::forget_held`): another replica hibernated or
    /// ended it, or the books cannot tell now. No end is announced and its records, which
    /// are shared, stay.
    Forget,
}

/// The tag of the persistent shells a replica starts (`SANDBOXD_TAG`): whoever finds the
/// replica dead kills what its shells left running in a session with this tag.
pub fn shell_tag_of(replica: &str) -> String {
    format!("{}-{replica}", super::shell::SHELL_TAG)
}
