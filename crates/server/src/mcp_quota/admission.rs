//! `UserAdmission`: the `Admission` of one user's MCP server (their quota, their ceilings,
//! their rows; the ledger in the parent module keeps the rows of the sandboxes alive now).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{McpLedger, USE_SLACK_MS};
use crate::audit::Who;
use crate::quota::Quota;
use sandboxd_core::config::LimitRequest;
use sandboxd_core::config::egress::EgressPolicy;
use sandboxd_core::mcp::admission::{Admission, Recorded, Ticket};
use sandboxd_core::sandbox::SandboxError;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::store::{
    McpSandbox, McpSessionRow, SessionCaps, SessionKind, SessionRow, SessionState, StoreError,
    User, now_ms,
};

/// The admission of one user's /mcp sandboxes: their quota, their ceilings, their rows.
pub struct UserAdmission {
    ledger: Arc<McpLedger>,
    /// The user as of their latest /mcp request (a changed quota applies from the next one).
    user: Mutex<Arc<User>>,
}

impl UserAdmission {
    pub fn new(ledger: Arc<McpLedger>, user: Arc<User>) -> Arc<Self> {
        Arc::new(Self {
            ledger,
            user: Mutex::new(user),
        })
    }

    /// The user as their latest request found them.
    pub fn update(&self, user: Arc<User>) {
        *self.user.lock().unwrap_or_else(|p| p.into_inner()) = user;
    }

    fn user(&self) -> Arc<User> {
        self.user.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The `session.create` entry of an MCP sandbox, as `POST /v1/sessions` records one.
    async fn audit_created(&self, row_id: &str, session: &Session) {
        let (user, config) = (self.user(), &self.ledger.config);
        let row = self.ledger.store.session(row_id).await.ok().flatten();
        let details = serde_json::json!({
            "owner": user.id,
            "kind": SessionKind::Mcp,
            "limits": row.as_ref().map(|r| &r.limits),
            "backend": config.runtime.backend,
            "handle": session.handle,
            "runtime_id": session.id,
            "egress": row.as_ref().map(|r| r.egress.to_string()),
        });
        let who = Who {
            actor: user.name.clone(),
            ..Who::default()
        };
        let store = self.ledger.store.as_ref();
        crate::audit::record_in(
            store,
            &config.audit,
            &who,
            "session.create",
            row_id,
            details,
        )
        .await;
    }
}

/// What a client is told when the quota is full: the number, and how to free a place.
pub fn quota_refusal(limit: u32, active: u32) -> String {
    let noun = if limit == 1 { "session" } else { "sessions" };
    format!(
        "your quota of {limit} {noun} is in use ({active} alive: API sessions and MCP sandboxes count alike), so no sandbox was made; end one you no longer need (sandbox_close, closing an MCP session, or DELETE /v1/sessions/{{id}}; GET /v1/sessions lists them) and call again, or ask the admin to raise the quota"
    )
}

#[async_trait]
impl Admission for UserAdmission {
    async fn admit(&self) -> Result<Ticket, SandboxError> {
        if let Some(message) = self.cpu_refusal().await {
            return Err(SandboxError::Refused { message });
        }
        let user = self.user();
        let config = &self.ledger.config;
        let quota = Quota::resolve(&config.quotas, &user.quota, &config.limits);
        let filled = quota.fill(&LimitRequest::default());
        let limits = config
            .limits
            .lowered(&filled)
            .map_err(|e| SandboxError::InvalidRequest(e.to_string()))?;
        let id = format!("ses_{}", uuid::Uuid::new_v4().simple());
        // As a POST /v1/sessions without `egress`: the default, within both limits.
        let egress = crate::egress::for_new_session(&config.egress, &user.quota, None)
            .unwrap_or(EgressPolicy::Off);
        let row = SessionRow::creating(
            id.clone(),
            user.id.clone(),
            limits,
            BTreeMap::new(),
            config.sessions.idle_timeout_secs.max(1),
            now_ms(),
        )
        .with_kind(SessionKind::Mcp)
        .with_egress(egress);
        // The global cap too, counted in the store across replicas with the owner's.
        let caps = SessionCaps {
            per_owner: quota.sessions,
            total: u32::try_from(config.sessions.max).unwrap_or(u32::MAX),
            holder: None,
        };
        match self.ledger.store.reserve_session_within(row, caps).await {
            Ok(()) => Ok(Ticket {
                record: Some(id),
                limits: filled,
            }),
            Err(StoreError::SessionQuota { limit, active }) => Err(SandboxError::Refused {
                message: quota_refusal(limit, active),
            }),
            Err(StoreError::SessionsFull { limit, .. }) => Err(SandboxError::TooManySessions {
                limit: limit as usize,
            }),
            Err(e) => Err(SandboxError::Refused {
                message: format!("sandboxd could not record the new sandbox ({e}); try again"),
            }),
        }
    }

    async fn started(&self, ticket: &Ticket, session: &Session) {
        let Some(row) = &ticket.record else { return };
        self.ledger.open().insert(session.id.clone(), row.clone());
        if let Err(e) = self
            .ledger
            .store
            .session_started(row, &session.id, &session.handle)
            .await
        {
            tracing::warn!(session = %row, error = %e, "could not record an MCP sandbox as running");
        }
        self.audit_created(row, session).await;
        self.ledger.follow_egress(row, session).await;
    }

    async fn refusal(&self, _session: &Session) -> Option<String> {
        self.cpu_refusal().await
    }

    async fn tool_called(&self, session: &Session) {
        let row = self.ledger.open().get(&session.id).cloned();
        if let Some(row) = row {
            crate::metering::tool_call(self.ledger.store.as_ref(), &row).await;
        }
    }

    async fn failed(&self, ticket: &Ticket) {
        if let Some(row) = &ticket.record
            && let Err(e) = self.ledger.store.delete_session(row).await
        {
            tracing::warn!(session = %row, error = %e, "could not drop the row of an MCP sandbox never made");
        }
    }

    async fn ended(&self, ticket: &Ticket, reason: &str) {
        let Some(row) = &ticket.record else { return };
        self.ledger.open().retain(|_, r| r != row);
        self.ledger.end_row(row, reason).await;
    }

    async fn recorded(&self, key: &str) -> Option<Recorded> {
        let mcp = self.mcp_row(key).await?;
        let sandbox = mcp.sandbox?;
        // A sandbox whose row ended is no longer counted in the quota: never attached.
        let limits = match self.ledger.store.session(&sandbox.row).await {
            Ok(Some(row)) if row.state != SessionState::Ended => row.limits,
            Ok(row) => {
                tracing::debug!(mcp_session = %key, session = %sandbox.row, state = ?row.map(|r| r.state), "an MCP session's recorded sandbox has no active row; not attached");
                return None;
            }
            Err(e) => {
                tracing::warn!(session = %sandbox.row, error = %e, "the store failed while looking up an MCP sandbox");
                return None;
            }
        };
        let ticket = Ticket {
            record: Some(sandbox.row),
            limits: LimitRequest::default(),
        };
        Some(Recorded {
            ticket,
            session_id: sandbox.runtime_id,
            limits: Some(limits),
        })
    }

    async fn record(&self, key: &str, ticket: &Ticket, session: &Session) {
        let Some(row) = &ticket.record else { return };
        // Not in the ledger yet: attached from another replica's record, not made here
        // (`started` put it there and brought its egress in line already).
        let attached = self
            .ledger
            .open()
            .insert(session.id.clone(), row.clone())
            .is_none();
        let sandbox = McpSandbox {
            row: row.clone(),
            runtime_id: session.id.clone(),
        };
        let store = &self.ledger.store;
        let now = now_ms();
        let done = match store.mcp_session(key).await {
            Ok(Some(mcp)) if mcp.owner == self.user().id => {
                store.set_mcp_sandbox(key, Some(sandbox), now).await
            }
            // Never another user's record (ids are random; this is only defence).
            Ok(Some(_)) => return,
            // A stateless `sandbox_id`: the record is made here (no `initialize` to keep).
            Ok(None) => {
                store
                    .put_mcp_session(McpSessionRow {
                        id: key.to_string(),
                        owner: self.user().id.clone(),
                        init: String::new(),
                        sandbox: Some(sandbox),
                        created_at: now,
                        last_used_at: now,
                    })
                    .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = done {
            tracing::warn!(mcp_session = %key, error = %e, "could not record an MCP session's sandbox; another replica serving it will make its own");
        }
        if attached {
            self.ledger.follow_egress(row, session).await;
        }
    }

    async fn forget(&self, key: &str) {
        if self.mcp_row(key).await.is_some()
            && let Err(e) = self.ledger.store.remove_mcp_session(key).await
        {
            tracing::warn!(mcp_session = %key, error = %e, "could not forget a closed MCP sandbox");
        }
    }

    async fn release(&self, key: &str, session_id: &str) -> bool {
        let Some(mcp) = self.mcp_row(key).await else {
            return true;
        };
        let ours = mcp.sandbox.is_some_and(|s| s.runtime_id == session_id);
        // Used after this process's keep-alive began: another replica serves it now.
        let used_since = now_ms().saturating_sub(self.ledger.keep_alive_ms()) + USE_SLACK_MS;
        !(ours && mcp.last_used_at > used_since)
    }
}

impl UserAdmission {
    /// Why no new sandbox or tool call of this user may start: their daily CPU quota is
    /// spent (cpu_quota.rs, the check the HTTP routes make), or the store cannot say.
    async fn cpu_refusal(&self) -> Option<String> {
        let user = self.user();
        let limit = crate::cpu_quota::limit_of(&self.ledger.config, &user.quota);
        match crate::cpu_quota::spent(self.ledger.store.as_ref(), limit, &user.id).await {
            Ok(spent) => spent.map(|s| s.message()),
            // As the HTTP routes refuse (cpu_quota.rs): no new work on an unknown figure.
            Err(e) => Some(format!(
                "{} ({e}); try again in a few seconds",
                crate::cpu_quota::unreadable_message()
            )),
        }
    }

    /// The stored MCP session `key`, if it is this user's.
    async fn mcp_row(&self, key: &str) -> Option<McpSessionRow> {
        match self.ledger.store.mcp_session(key).await {
            Ok(Some(row)) if row.owner == self.user().id => Some(row),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(mcp_session = %key, error = %e, "the store failed while looking up an MCP session");
                None
            }
        }
    }
}
