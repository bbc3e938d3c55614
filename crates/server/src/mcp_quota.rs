//! /mcp sandboxes as their user's sessions: each one is a session row of kind `mcp`,
//! reserved in the same `reserve_session` transaction (and so the same quota) as API
//! sessions, made with the user's limit ceilings, and ended when the sandbox goes.
//!
//! `UserAdmission` is the `Admission` of one user's MCP server. `McpLedger` keeps the rows of
//! the sandboxes alive now (by the manager's session id) and ends a row however its sandbox
//! goes: closed by the client (the admission hears it), removed by the manager itself (the
//! idle reaper, the memory budget: `on_end`, fed by the manager's end events, ends.rs), or
//! ended outside sandboxd (removed, evicted, OOM-killed: the vanish watch's end event, whose
//! reason the row keeps);
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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::AppState;
use crate::audit::Who;
use sandboxd_core::config::Config;
use sandboxd_core::sandbox::SessionManager;
use sandboxd_core::sandbox::ends::{EndReason, Ended};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::store::{SessionKind, SessionRow, SessionState, Store, now_ms};

mod admission;
pub use admission::{UserAdmission, quota_refusal};

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

    /// The manager ended a session (its sandbox is gone): end its row, if it is one, with
    /// why when the sandbox went outside sandboxd (removed, evicted, OOM-killed).
    pub async fn on_end(&self, ended: &Ended) {
        let row = self.open().remove(&ended.id);
        let Some(row) = row else {
            return;
        };
        let reason = match &ended.reason {
            why @ EndReason::Vanished(_) => why.to_string(),
            _ => "its sandbox was removed (idle, over the memory budget, or its user removed)"
                .to_string(),
        };
        self.end_row(&row, &reason).await;
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
                            // Why, if this replica's manager heard it (a vanish it missed
                            // the event of).
                            manager.end_of(rt).map_or_else(
                                || "its sandbox is gone".to_string(),
                                |r| r.to_string(),
                            )
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
                (None, _) => "its sandbox was never made".to_string(),
            };
            self.end_row(&row.id, &reason).await;
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
    use sandboxd_core::mcp::admission::Admission;
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
