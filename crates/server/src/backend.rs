//! The server's thin adapter over the SessionManager: API sessions as views of the manager's
//! sessions. Everything `serve` asks of the runtime goes through here.
//!
//! It keeps no table of its own: the manager is the one registry of sessions (an API
//! session is the manager's session its store row names, `runtime_id`, looked up per
//! request as a `Live` view, attached on demand by attach.rs when this replica does not
//! hold it yet) and its reaper the one that ends idle ones, each after the timeout its row
//! recorded (`Session::set_idle_timeout`, set on create and attach).
//!
//! API sessions are created with `keep`, so their containers outlive this process (a
//! restart re-attaches them, with the limits the manager recorded on them); their manager
//! owner is `serve:<user id>`, which is how the reconciler tells them from CLI and MCP
//! sessions. Ownership is checked by the callers against the store first; the manager checks
//! the typed owner again on every lookup and removal.

use std::sync::Arc;
use std::time::Duration;

use sandboxd_core::config::{Config, LimitRequest, Limits};
use sandboxd_core::sandbox::in_use::InUse;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::{
    CreateOptions, Owner, Sandbox, SandboxError, SessionInfo, SessionManager, Viewer,
};
use sandboxd_core::store::{SessionRow, now_ms};
use sandboxd_core::tools::ToolRegistry;
use sandboxd_core::tools::session::SessionTools;

/// The label prefix of containers that belong to API sessions.
pub const OWNER_PREFIX: &str = "serve:";
/// The label prefix of containers of `/mcp` sessions.
pub const MCP_OWNER_PREFIX: &str = "serve-mcp:";

/// One API session whose container is running: its row's names over the manager's session,
/// made per request (it holds nothing the manager does not).
pub struct Live {
    /// The API id (the store's key).
    pub id: String,
    /// The owning user's id.
    pub owner: String,
    /// The runtime's session id (the container's `sandboxd.session` label).
    pub runtime_id: String,
    /// The backend's handle of the sandbox (what the store records as the container).
    pub handle: String,
    pub sandbox: Arc<dyn Sandbox>,
    pub limits: Limits,
    /// Set when this lookup resumed the session from hibernation: what the caller tells
    /// the user (its files are back, its processes and python variables are not).
    pub resumed: Option<String>,
    /// The manager's session: its use clock is the one the reaper reads, its slots hold the
    /// tools its runs use.
    session: Arc<Session>,
}

impl Live {
    pub(crate) fn new(row: &SessionRow, session: Arc<Session>) -> Self {
        Live {
            id: row.id.clone(),
            owner: row.owner.clone(),
            runtime_id: session.id.clone(),
            handle: session.handle.clone(),
            sandbox: session.sandbox.clone(),
            limits: session.limits.clone(),
            resumed: None,
            session,
        }
    }

    /// The manager's session behind it (what a run runs in).
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Marks a moment of use.
    pub fn touch(&self) {
        self.session.touch();
    }

    /// Holds the session in use (never idle) until the guard is dropped: a request that
    /// may last longer than the idle timeout (an exec, a tool call, a streamed command).
    pub fn hold(&self) -> InUse<Arc<Session>> {
        InUse::new(self.session.clone())
    }

    /// When it was last used, in unix milliseconds (now while it is in use).
    pub fn last_used_ms(&self) -> i64 {
        last_used_ms(&self.session)
    }

    /// What the MCP server offers, over the session's own tools: the python interpreter,
    /// browser and undo history its runs use too (made once per session).
    pub fn tools(&self, config: &Config) -> Arc<ToolRegistry> {
        SessionTools::server_registry(&self.session, config)
    }
}

/// When a manager's session was last used, in unix milliseconds (now while it is in use).
pub fn last_used_ms(session: &Session) -> i64 {
    now_ms().saturating_sub(session.idle_for().as_millis() as i64)
}

pub struct Backend {
    manager: Arc<SessionManager>,
    /// One lock per session for hibernating, resuming and attaching it (hibernate.rs).
    pub transitions: crate::hibernate::Transitions,
    /// When each session's use was last written to its row (`use_due`).
    use_written: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl Backend {
    pub fn new(manager: Arc<SessionManager>) -> Self {
        Self {
            manager,
            transitions: Default::default(),
            use_written: Default::default(),
        }
    }

    /// Whether a use of session `runtime_id` is due to be written to its row (none was in
    /// the last `every`); if so, it counts as written now. Forgets sessions no longer held.
    pub fn use_due(&self, runtime_id: &str, every: Duration) -> bool {
        let now = std::time::Instant::now();
        let mut written = self.use_written.lock().unwrap_or_else(|p| p.into_inner());
        if written.len() > 4096 {
            written.retain(|_, at| now.duration_since(*at) < every);
        }
        match written.get(runtime_id) {
            Some(at) if now.duration_since(*at) < every => false,
            _ => {
                written.insert(runtime_id.to_string(), now);
                true
            }
        }
    }

    pub fn manager(&self) -> &Arc<SessionManager> {
        &self.manager
    }

    /// The manager's owner of a user's API sessions.
    pub fn owner_of(user_id: &str) -> Result<Owner, SandboxError> {
        Owner::new(format!("{OWNER_PREFIX}{user_id}"))
    }

    /// Makes the container of a reserved session, from `image` (a template's; None: the
    /// default); `request` is already within the user's ceilings and the manager lowers the
    /// admin's limits to it. It idles out after the row's timeout.
    pub async fn create(
        &self,
        row: &SessionRow,
        request: &LimitRequest,
        image: Option<String>,
    ) -> Result<Arc<Live>, SandboxError> {
        let owner = Self::owner_of(&row.owner)?;
        let keep = CreateOptions { keep: true };
        let session = self
            .manager
            .create_from(&owner, request, keep, image)
            .await?;
        session.set_idle_timeout(idle_timeout(row));
        Ok(Arc::new(Live::new(row, session)))
    }

    /// Attaches a stored session whose container runs (one this replica does not hold, or
    /// holds already) with the limits the manager recorded on it and the row's idle timeout,
    /// after killing the processes tagged `kill_tags` in it (the shells of replicas that are
    /// gone). A claimed warm sandbox (labelled with the pool scope, not the user) is
    /// adopted for the row's owner. A kill that cannot be confirmed fails the attach: the
    /// caller then ends the session and removes its container.
    pub async fn attach(
        &self,
        row: &SessionRow,
        runtime_id: &str,
        kill_tags: &[String],
    ) -> Result<Arc<Live>, SandboxError> {
        let owner = Self::owner_of(&row.owner)?;
        let session = match self.manager.get(&owner, runtime_id).await {
            Err(SandboxError::SessionNotFound { .. }) => {
                self.manager.adopt(&owner, runtime_id, &row.limits).await?
            }
            other => other?,
        };
        // Before this replica starts any process in it (a sandbox made on another replica,
        // or before a restart, has no environment in this process).
        session.sandbox.set_session_env(row.env.vars());
        session.set_idle_timeout(idle_timeout(row));
        let live = Arc::new(Live::new(row, session.clone()));
        self.kill_tags(&live, kill_tags).await?;
        // Its idle time goes on from the last use the store recorded, not from now (unless
        // it was used here since).
        let ago = Duration::from_millis(now_ms().saturating_sub(row.last_used_at).max(0) as u64);
        session.used_ago(ago.min(session.idle_for()));
        Ok(live)
    }

    /// Kills the processes tagged with each of `tags` in the session: whatever a shell
    /// whose replica is gone left running has lost its timeout and kill-tree with it.
    pub async fn kill_tags(&self, live: &Live, tags: &[String]) -> Result<(), SandboxError> {
        for tag in tags {
            live.sandbox.kill_tagged(tag).await?;
        }
        Ok(())
    }

    /// The session the row names if this replica holds it, not marked as used.
    pub fn get_quiet(&self, row: &SessionRow) -> Option<Arc<Live>> {
        let runtime_id = row.runtime_id.as_deref()?;
        let owner = Self::owner_of(&row.owner).ok()?;
        let session = self.manager.held(&owner, runtime_id)?;
        Some(Arc::new(Live::new(row, session)))
    }

    /// The live session the row names, marked as used, if this replica holds it (else
    /// `attach::live` attaches it on demand), of the row's owner.
    pub async fn get(&self, row: &SessionRow) -> Option<Arc<Live>> {
        let runtime_id = row.runtime_id.as_deref()?;
        let owner = Self::owner_of(&row.owner).ok()?;
        let session = self.manager.held(&owner, runtime_id)?;
        session.touch();
        Some(Arc::new(Live::new(row, session)))
    }

    /// Removes the container of the user's session `runtime_id` (none: nothing was made);
    /// a missing one is not an error.
    pub async fn remove(
        &self,
        user_id: &str,
        runtime_id: Option<&str>,
    ) -> Result<(), SandboxError> {
        let Some(runtime_id) = runtime_id else {
            return Ok(());
        };
        match self
            .manager
            .remove(&Self::owner_of(user_id)?, runtime_id)
            .await
        {
            Ok(()) | Err(SandboxError::SessionNotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The manager's sessions of API sessions, live in this process.
    pub async fn all(&self) -> Vec<Arc<Session>> {
        let mut all = self.manager.live().await;
        all.retain(|s| s.owner.as_str().starts_with(OWNER_PREFIX));
        all
    }

    /// Every managed container on the engine.
    pub async fn containers(&self) -> Result<Vec<SessionInfo>, SandboxError> {
        self.manager.list(&Viewer::Admin).await
    }

    /// Removes a container by its runtime session id (reconciliation).
    pub async fn remove_runtime(&self, runtime_id: &str) -> Result<(), SandboxError> {
        match self.manager.admin_remove(runtime_id).await {
            Ok(()) | Err(SandboxError::SessionNotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The manager's own reconcile: containers whose creating process is gone and that
    /// were not kept.
    pub async fn reconcile_unkept(&self) -> Result<Vec<String>, SandboxError> {
        self.manager.reconcile().await
    }

    /// Removes the containers of `/mcp` sessions (shutdown): every session not kept. API
    /// sessions are kept, for the next start to re-attach.
    pub async fn remove_mcp_sessions(&self) {
        self.manager.remove_all().await;
    }
}

/// The idle timeout a session's row recorded (at least a second).
pub fn idle_timeout(row: &SessionRow) -> Duration {
    Duration::from_secs(row.idle_timeout_secs.max(1))
}
