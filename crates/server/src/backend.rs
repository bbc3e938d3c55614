//! The server's thin adapter over the SessionManager: the live sandboxes of API sessions,
//! by API session id. Everything `serve` asks of the runtime goes through here.
//!
//! API sessions are created with `keep`, so their containers outlive this process (a
//! restart re-attaches them, with the limits the manager recorded on them); their manager
//! owner is `serve:<user id>`, which is how the reconciler tells them from CLI and MCP
//! sessions. Ownership is checked by the callers against the store first; the manager checks
//! the typed owner again on every lookup and removal.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use sandboxd_core::config::{Config, LimitRequest, Limits};
use sandboxd_core::sandbox::in_use::InUse;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::shell::SHELL_TAG;
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

/// One API session whose container is running.
pub struct Live {
    /// The API id (the store's key).
    pub id: String,
    /// The owning user's id.
    pub owner: String,
    /// The manager's owner of the session: `serve:<user id>`.
    manager_owner: Owner,
    /// The runtime's session id (the container's `sandboxd.session` label).
    pub runtime_id: String,
    /// The backend's handle of the sandbox (what the store records as the container).
    pub handle: String,
    pub sandbox: Arc<dyn Sandbox>,
    pub limits: Limits,
    pub idle_timeout: Duration,
    /// The manager's session: its use clock is the one the idle checks read, its slots
    /// hold the tools its runs use.
    session: Arc<Session>,
}

impl Live {
    /// Marks a moment of use.
    pub fn touch(&self) {
        self.session.touch();
    }

    /// Holds the session in use (never idle) until the guard is dropped: a request that
    /// may last longer than the idle timeout (an exec, a tool call, a streamed command).
    pub fn hold(&self) -> InUse<Arc<Session>> {
        InUse::new(self.session.clone())
    }

    /// How long the session has been unused; zero while a run or a request holds it.
    pub fn idle_for(&self) -> Duration {
        self.session.idle_for()
    }

    /// When it was last used, in unix milliseconds (now while it is in use).
    pub fn last_used_ms(&self) -> i64 {
        now_ms().saturating_sub(self.idle_for().as_millis() as i64)
    }

    /// What the MCP server offers, over the session's own tools: the python interpreter,
    /// browser and undo history its runs use too (made once per session).
    pub fn tools(&self, config: &Config) -> Arc<ToolRegistry> {
        SessionTools::server_registry(&self.session, config)
    }
}

pub struct Backend {
    manager: Arc<SessionManager>,
    live: Mutex<HashMap<String, Arc<Live>>>,
}

impl Backend {
    pub fn new(manager: Arc<SessionManager>) -> Self {
        Self {
            manager,
            live: Mutex::new(HashMap::new()),
        }
    }

    pub fn manager(&self) -> &Arc<SessionManager> {
        &self.manager
    }

    /// The manager's owner of a user's API sessions.
    pub fn owner_of(user_id: &str) -> Result<Owner, SandboxError> {
        Owner::new(format!("{OWNER_PREFIX}{user_id}"))
    }

    /// Makes the container of a reserved session; `request` is already within the user's
    /// ceilings and the manager lowers the admin's limits to it.
    pub async fn create(
        &self,
        row: &SessionRow,
        request: &LimitRequest,
    ) -> Result<Arc<Live>, SandboxError> {
        let owner = Self::owner_of(&row.owner)?;
        let session = self
            .manager
            .create(&owner, request, CreateOptions { keep: true })
            .await?;
        Ok(self.insert(row, owner, session).await)
    }

    /// Re-attaches a stored session whose container is still running, with the limits the
    /// manager recorded on it, after killing what the previous process left running in it.
    pub async fn reattach(
        &self,
        row: &SessionRow,
        runtime_id: &str,
    ) -> Result<Arc<Live>, SandboxError> {
        let owner = Self::owner_of(&row.owner)?;
        let session = self.manager.get(&owner, runtime_id).await?;
        // Whatever the process that held it left running in its shell (a run's command, an
        // exec) has lost its timeout and kill-tree with that process: nobody would ever stop
        // it. Kill the old shell and everything it started before this process runs anything
        // there. A kill that cannot be confirmed fails the re-attach, and the caller then
        // ends the session and removes its container: nothing is left unsupervised.
        session.sandbox.kill_tagged(SHELL_TAG).await?;
        // Its idle time goes on from the last use the store recorded, not from this start.
        let ago = now_ms().saturating_sub(row.last_used_at).max(0);
        session.used_ago(Duration::from_millis(ago as u64));
        Ok(self.insert(row, owner, session).await)
    }

    async fn insert(
        &self,
        row: &SessionRow,
        manager_owner: Owner,
        session: Arc<Session>,
    ) -> Arc<Live> {
        let live = Arc::new(Live {
            id: row.id.clone(),
            owner: row.owner.clone(),
            manager_owner,
            runtime_id: session.id.clone(),
            handle: session.handle.clone(),
            sandbox: session.sandbox.clone(),
            limits: session.limits.clone(),
            idle_timeout: Duration::from_secs(row.idle_timeout_secs),
            session,
        });
        self.live.lock().await.insert(row.id.clone(), live.clone());
        live
    }

    /// The live session, marked as used (on the manager's session: its reaper and
    /// `serve`'s upkeep read the same clock).
    pub async fn get(&self, id: &str) -> Option<Arc<Live>> {
        let live = self.live.lock().await.get(id).cloned()?;
        live.touch();
        Some(live)
    }

    /// Removes the session's container; a missing one is not an error.
    pub async fn remove(&self, id: &str, row: Option<&SessionRow>) -> Result<(), SandboxError> {
        let taken = self.live.lock().await.remove(id);
        let target = match (&taken, row) {
            (Some(l), _) => Some((l.manager_owner.clone(), l.runtime_id.clone())),
            (None, Some(r)) => match &r.runtime_id {
                Some(rt) => Some((Self::owner_of(&r.owner)?, rt.clone())),
                None => None,
            },
            (None, None) => None,
        };
        match target {
            Some((owner, rt)) => match self.manager.remove(&owner, &rt).await {
                Ok(()) | Err(SandboxError::SessionNotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            },
            None => Ok(()),
        }
    }

    /// The manager's session behind a live API session (what a run runs in).
    pub async fn session(
        &self,
        live: &Live,
    ) -> Result<Arc<sandboxd_core::sandbox::manager::Session>, SandboxError> {
        self.manager
            .get(&live.manager_owner, &live.runtime_id)
            .await
    }

    /// Every live API session.
    pub async fn all(&self) -> Vec<Arc<Live>> {
        self.live.lock().await.values().cloned().collect()
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
