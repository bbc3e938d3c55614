//! /mcp sandboxes as their user's sessions: each one is a session row of kind `mcp`,
//! reserved in the same `reserve_session` transaction (and so the same quota) as API
//! sessions, made with the user's limit ceilings, and ended when the sandbox goes.
//!
//! `UserAdmission` is the `Admission` of one user's MCP server. `McpLedger` keeps the rows of
//! the sandboxes alive now (by the manager's session id) and ends a row however its sandbox
//! goes: closed by the client (the admission hears it), or removed by the manager itself
//! (the idle reaper, the memory budget: `on_end`, fed by the manager's end events, ends.rs);
//! the periodic `sweep` catches anything both missed (a lagged event, a sandbox another
//! replica held). MCP sandboxes never outlive the replica that serves them: the start-up
//! sweep (attach.rs) ends the `mcp` rows no live replica holds.
//!
//! Across replicas: the admission records which sandbox each MCP session (or stateless
//! `sandbox_id`) holds in the store (`mcp_sessions`), owned by the user, so the replica that
//! restores a session attaches the same sandbox (core's `LazySandbox::session_for`); a
//! replica whose keep-alive of a session runs out keeps the sandbox when the store says the
//! session was used since on another replica (`release`); and `sweep` carries the last use
//! between the `sessions` row and every replica holding the sandbox, so each one's idle
//! reaper sees the use made through the others.
//!
//! Egress: an MCP sandbox's row gets the policy a `POST /v1/sessions` without `egress` gets
//! (`[egress] default` within the user's quota and `[egress] widest`); once its sandbox
//! exists here (made, or attached from another replica's record) `egress_proxies::follow`
//! brings it in line with its row, before any tool of it is made, and the upkeep keeps it
//! so (reconcile.rs), exactly as for API sessions.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;

use crate::AppState;
use crate::audit::Who;
use crate::quota::Quota;
use sandboxd_core::config::egress::EgressPolicy;
use sandboxd_core::config::{Config, LimitRequest};
use sandboxd_core::mcp::admission::{Admission, Recorded, Ticket};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::{SandboxError, SessionManager};
use sandboxd_core::store::{
    McpSandbox, McpSessionRow, SessionCaps, SessionKind, SessionRow, SessionState, Store,
    StoreError, User, now_ms,
};

/// A row still `creating` after this long belongs to a create that never finished.
const CREATING_GRACE: Duration = Duration::from_secs(600);
/// A use of an MCP session recorded this long before another replica's keep-alive ran out
/// still counts as after its last request there (the replicas' clocks and the spawned
/// touches are not exact).
const USE_SLACK_MS: i64 = 30_000;

/// The rows of this process's live /mcp sandboxes.
pub struct McpLedger {
    store: Arc<dyn Store>,
    config: Config,
    /// Manager session id -> session row id, for the sandboxes made and not yet ended.
    open: Mutex<HashMap<String, String>>,
    /// The service, once it exists (it holds this ledger): what a sandbox's egress follows.
    app: OnceLock<Weak<AppState>>,
}

impl McpLedger {
    pub fn new(store: Arc<dyn Store>, config: Config) -> Arc<Self> {
        Arc::new(Self {
            store,
            config,
            open: Mutex::new(HashMap::new()),
            app: OnceLock::new(),
        })
    }

    /// The service this ledger's sandboxes belong to (set once, when it is made).
    pub fn set_app(&self, app: Weak<AppState>) {
        let _ = self.app.set(app);
    }

    /// Brings the sandbox of row `row_id`, now `session` here, in line with its row's
    /// egress (proxy variables, proxy, credentials: egress_proxies::follow).
    async fn follow_egress(&self, row_id: &str, session: &Session) {
        let Some(st) = self.app.get().and_then(Weak::upgrade) else {
            return;
        };
        match self.store.session(row_id).await {
            Ok(Some(row)) if row.state != SessionState::Ended => {
                crate::egress_proxies::follow(&st, session, &row).await
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(session = %row_id, error = %e, "the store failed while reading an MCP sandbox's egress; the upkeep tries again")
            }
        }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // Every update is one map operation: a poisoned lock is still consistent.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends a row (audited: `audit::end_session`) by the service itself.
    async fn end_row(&self, row_id: &str, reason: &str) {
        self.end_row_by(row_id, reason, &Who::system()).await;
    }

    async fn end_row_by(&self, row_id: &str, reason: &str, who: &Who) {
        let audit = &self.config.audit;
        let ended = crate::audit::end_session(self.store.as_ref(), audit, who, row_id, reason);
        if let Err(e) = ended.await {
            tracing::warn!(session = %row_id, error = %e, "could not end an MCP sandbox's row");
        }
    }

    /// The manager ended session `runtime_id` (its sandbox is gone): end its row, if it is one.
    pub async fn on_end(&self, runtime_id: &str) {
        let row = self.open().remove(runtime_id);
        if let Some(row) = row {
            self.end_row(
                &row,
                "its sandbox was removed (idle, over the memory budget, or its user removed)",
            )
            .await;
        }
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// How long an MCP session on which nothing passes lives in one process (rmcp's
    /// keep-alive).
    fn keep_alive_ms(&self) -> i64 {
        crate::mcp_http::session_keep_alive(&self.config).as_millis() as i64
    }

    /// Upkeep: ends the active `mcp` rows whose sandbox is gone (or whose create never
    /// finished), keeps the last use of the others in step between the store and this
    /// process (a sandbox several replicas hold is idle only when idle on all of them), and
    /// purges the records of MCP sessions no client has used for twice their keep-alive.
    pub async fn sweep(&self, manager: &SessionManager) {
        let rows = match self.store.active_sessions().await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "the store failed while checking MCP sandboxes");
                return;
            }
        };
        let live: HashMap<String, Arc<Session>> = manager
            .live()
            .await
            .into_iter()
            .map(|s| (s.id.clone(), s))
            .collect();
        let now = now_ms();
        for row in rows.into_iter().filter(|r| r.kind == SessionKind::Mcp) {
            let reason = match (&row.runtime_id, row.state) {
                (Some(rt), _) => match live.get(rt) {
                    Some(s) => {
                        self.sync_use(&row, s, now).await;
                        continue;
                    }
                    // Not held here: another replica's, or gone; the engine tells which.
                    None => match manager.runtime().find(rt).await {
                        Ok(None) => {
                            self.open().remove(rt);
                            "its sandbox is gone"
                        }
                        Ok(Some(_)) => continue,
                        Err(e) => {
                            tracing::warn!(session = %row.id, error = %e, "could not look for an MCP sandbox");
                            continue;
                        }
                    },
                },
                (None, SessionState::Creating)
                    if now.saturating_sub(row.created_at) < CREATING_GRACE.as_millis() as i64 =>
                {
                    continue;
                }
                (None, _) => "its sandbox was never made",
            };
            self.end_row(&row.id, reason).await;
        }
        let cutoff = now.saturating_sub(self.keep_alive_ms().saturating_mul(2));
        if let Err(e) = self.store.purge_mcp_sessions(cutoff).await {
            tracing::warn!(error = %e, "could not purge old MCP sessions");
        }
    }

    /// The later of this process's last use of `s` and the row's (which other replicas
    /// holding the same sandbox record) goes to the other side.
    async fn sync_use(&self, row: &SessionRow, s: &Session, now: i64) {
        let used_here = now.saturating_sub(s.idle_for().as_millis() as i64);
        if row.last_used_at > used_here {
            s.used_ago(Duration::from_millis(
                now.saturating_sub(row.last_used_at).max(0) as u64,
            ));
        } else if row.last_used_at < used_here {
            let _ = self.store.touch_session(&row.id, used_here).await;
        }
    }

    /// Ends the row of one sandbox now (its sandbox is being removed).
    pub async fn end(&self, row: &SessionRow, reason: &str, who: &Who) {
        self.open().retain(|_, r| *r != row.id);
        self.end_row_by(&row.id, reason, who).await;
    }

    /// Ends every row this process still holds open (shutdown, after the sandboxes went).
    pub async fn end_all(&self, reason: &str) {
        let rows: Vec<String> = self.open().drain().map(|(_, row)| row).collect();
        for row in rows {
            self.end_row(&row, reason).await;
        }
    }
}

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
        self.ledger.open().insert(session.id.clone(), row.clone());
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
        // A sandbox attached from another replica's record gets its egress here (one made
        // here got it at `started`; a second follow changes nothing).
        self.ledger.follow_egress(row, session).await;
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

/// The user ids among `ids` that the store no longer knows (removed by `sandboxd users rm`
/// in another process); None when the store cannot tell now.
pub async fn removed_users(store: &dyn Store, ids: &[String]) -> Option<Vec<String>> {
    if ids.is_empty() {
        return Some(Vec::new());
    }
    let known: HashSet<String> = match store.users().await {
        Ok(users) => users.into_iter().map(|u| u.id).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "the store failed while checking /mcp users");
            return None;
        }
    };
    Some(
        ids.iter()
            .filter(|id| !known.contains(*id))
            .cloned()
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxd_core::store::{NewUser, QuotaOverride};
    use sandboxd_sqlite::SqliteStore;

    /// One place left: the first sandbox is admitted with the user's ceiling, the second is
    /// refused in words that say what to do, and a sandbox never made gives its place back.
    #[tokio::test]
    async fn admission_reserves_in_the_users_quota_with_their_ceilings() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("s.db")).await.unwrap());
        let (_, key) = crate::auth::new_key(None);
        let quota = QuotaOverride {
            sessions: Some(1),
            memory_mb: Some(256),
            ..Default::default()
        };
        let user = store
            .add_user(NewUser {
                name: "ann".into(),
                admin: false,
                key,
                quota,
            })
            .await
            .unwrap();
        let ledger = McpLedger::new(store.clone(), Config::default());
        let admission = UserAdmission::new(ledger, Arc::new(user.clone()));

        let first = admission.admit().await.unwrap();
        assert_eq!(first.limits.memory_mb, Some(256));
        let row = store
            .session(first.record.as_deref().unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((row.kind, row.limits.memory_mb), (SessionKind::Mcp, 256));
        let usage = store.usage(&user.id, now_ms()).await.unwrap();
        assert_eq!((usage.active_sessions, usage.active_mcp_sessions), (1, 1));

        let refused = admission.admit().await.unwrap_err().to_string();
        assert!(
            refused.contains("quota of 1 session is in use") && refused.contains("end one"),
            "{refused}"
        );
        admission.failed(&first).await;
        let again = admission.admit().await.unwrap();
        admission.ended(&again, "closed").await;
        assert_eq!(
            store
                .usage(&user.id, now_ms())
                .await
                .unwrap()
                .active_sessions,
            0
        );
    }
}
