//! Admission: what the front end that serves MCP decides around each sandbox's life.
//!
//! The MCP server makes sandboxes on its own (the first tool call of a session,
//! `sandbox_create`), so the rules of whoever runs it are asked here: before a sandbox is
//! made (`admit`: may it be, and with which limits), once it exists (`started`), before
//! each tool call in it (`refusal`), and when it goes (`ended`) or never came (`failed`).
//! `sandboxd mcp` admits everything with the admin's limits (`Open`); `serve` counts each
//! sandbox as a session of its user, in the same quota and with the same ceilings as API
//! sessions, and refuses a user whose daily CPU quota is spent (server/mcp_quota.rs).
//!
//! Several processes may serve one MCP session (serve's replicas, which restore a session
//! from the store when a request for it lands on them): `record` and `recorded` let the
//! front end keep which sandbox a session (or a stateless `sandbox_id`) holds, so the
//! process that serves it next attaches that sandbox instead of making another, and
//! `release` lets it keep a sandbox that another process still serves.

use std::sync::Arc;

use async_trait::async_trait;

use crate::config::{LimitRequest, Limits};
use crate::sandbox::manager::Session;
use crate::sandbox::{CreateOptions, Owner, SandboxError, SessionManager};

/// One admitted sandbox: what to make it with, and the front end's own name for it.
#[derive(Debug, Clone, Default)]
pub struct Ticket {
    /// The front end's record of it (`serve`: the session row's id); None when it keeps none.
    pub record: Option<String>,
    /// What the sandbox is made with: the manager lowers the admin's limits to it.
    pub limits: LimitRequest,
}

#[async_trait]
pub trait Admission: Send + Sync {
    /// Before a sandbox is made: a ticket, or a refusal (`SandboxError::Refused`) whose
    /// message tells the client what is in use and what to do.
    async fn admit(&self) -> Result<Ticket, SandboxError>;
    /// The sandbox exists, as `session`.
    async fn started(&self, ticket: &Ticket, session: &Session);
    /// A tool is about to run in `session`, one of this admission's: None to run it, or why
    /// not, which the client gets as the tool's error (serve: the user's daily CPU quota is
    /// spent).
    async fn refusal(&self, _session: &Session) -> Option<String> {
        None
    }
    /// A tool ran in `session`, one of this admission's (usage metering counts it).
    async fn tool_called(&self, _session: &Session) {}
    /// The sandbox could not be made: the ticket is given back as if never issued.
    async fn failed(&self, ticket: &Ticket);
    /// The sandbox is gone (closed, idled out, its user removed). Idempotent.
    async fn ended(&self, ticket: &Ticket, reason: &str);

    /// The sandbox the front end recorded for `key` (an `Mcp-Session-Id`, or a stateless
    /// client's `sandbox_id`), whichever process made it: its ticket and the manager's
    /// session id. This is how a session another process served finds its sandbox; None
    /// when nothing is recorded (or the front end keeps no records).
    async fn recorded(&self, _key: &str) -> Option<Recorded> {
        None
    }

    /// `key` now holds `session`, admitted with `ticket` (made here, or found `recorded`).
    async fn record(&self, _key: &str, _ticket: &Ticket, _session: &Session) {}

    /// The client closed `key` (`sandbox_close`): its record goes.
    async fn forget(&self, _key: &str) {}

    /// This process's handler of `key` is going (its client closed the session, or nothing
    /// passed on it here for the keep-alive) while it holds sandbox `session_id`: whether to
    /// remove the sandbox. False when the session lives on and another process may be
    /// serving it with this sandbox now.
    async fn release(&self, _key: &str, _session_id: &str) -> bool {
        true
    }
}

/// A sandbox the front end recorded for an MCP session: its ticket, the manager's id for it
/// and, when known, the limits it was made with (what a warm sandbox another process
/// claimed is attached with: its labels cannot say).
#[derive(Debug, Clone)]
pub struct Recorded {
    pub ticket: Ticket,
    pub session_id: String,
    pub limits: Option<Limits>,
}

/// Attaches the sandbox `r` names for `owner`: one labelled with the owner (made cold), or
/// one another process's warm pool made and that process claimed (`adopt_claimed`).
pub async fn attach_recorded(
    manager: &SessionManager,
    owner: &Owner,
    r: &Recorded,
) -> Result<Arc<Session>, SandboxError> {
    match (manager.get(owner, &r.session_id).await, &r.limits) {
        (Err(SandboxError::SessionNotFound { .. }), Some(limits)) => {
            manager.adopt_claimed(owner, &r.session_id, limits).await
        }
        (got, _) => got,
    }
}

/// Admits every sandbox with the admin's limits and keeps no records (`sandboxd mcp`: the
/// manager's global and per-owner caps are the only bounds).
pub struct Open;

#[async_trait]
impl Admission for Open {
    async fn admit(&self) -> Result<Ticket, SandboxError> {
        Ok(Ticket::default())
    }

    async fn started(&self, _ticket: &Ticket, _session: &Session) {}

    async fn failed(&self, _ticket: &Ticket) {}

    async fn ended(&self, _ticket: &Ticket, _reason: &str) {}
}

/// Makes a sandbox through `admission`: admitted first, then made with the ticket's limits,
/// then reported started (or failed, giving the ticket back). It runs on its own task, so a
/// caller that gives up half-way (a cancelled tool call) cannot leave a ticket neither
/// started nor given back: a sandbox made for nobody is then reaped like any idle one, and
/// its end reported.
pub async fn create_admitted(
    admission: Arc<dyn Admission>,
    manager: Arc<SessionManager>,
    owner: Owner,
) -> Result<(Arc<Session>, Ticket), SandboxError> {
    let made = tokio::spawn(async move {
        let ticket = admission.admit().await?;
        match manager
            .create(&owner, &ticket.limits, CreateOptions::default())
            .await
        {
            Ok(session) => {
                admission.started(&ticket, &session).await;
                Ok((session, ticket))
            }
            Err(e) => {
                admission.failed(&ticket).await;
                Err(e)
            }
        }
    });
    made.await.map_err(|e| SandboxError::Protocol {
        helper: "the MCP server".into(),
        message: format!("the sandbox creation task failed: {e}"),
    })?
}
