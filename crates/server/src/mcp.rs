//! /mcp on the service's listener: the MCP server of `sandboxd mcp` (same handlers, same
//! tools), authenticated by the users' API keys. Each user gets their own rmcp session
//! manager, so an `Mcp-Session-Id` (or a stateless `sandbox_id`) of one user means nothing
//! under another user's key: their MCP sessions and containers are theirs alone, and a
//! DELETE naming a session the caller does not have is a 404 (as every other method is).
//!
//! Every sandbox a user's MCP server makes, stateful or stateless, is owned by that user
//! (owner `serve-mcp-` + a digest of the user id) and admitted as one of their sessions
//! (mcp_quota.rs): same quota, same ceilings, a row in /v1/sessions and /v1/me. Removing the
//! user closes their MCP sessions and removes their sandboxes at once (`remove_user`; the
//! upkeep does the same for a user removed by `sandboxd users rm`).
//!
//! Across replicas (no sticky sessions): each MCP session is a row of the store
//! (`mcp_sessions`: owner, the client's `initialize`, its sandbox). A request for a session
//! this replica does not hold is restored by rmcp from that row (`StoredSessions`, the
//! `initialize` replayed; no new handshake for the client), and its first tool call attaches
//! the sandbox the row names (mcp_quota's admission, core's `LazySandbox::session_for`), so
//! the client keeps its files whichever replica answers. A stateless client's `sandbox_id`
//! is recorded the same way. Another user's session id is unknown (404) on every replica.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use rmcp::model::InitializeRequestParams;
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore, SessionStoreError,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::AppState;
use crate::auth::Caller;
use crate::backend::MCP_OWNER_PREFIX;
use crate::mcp_quota::{McpLedger, UserAdmission};
use sandboxd_core::config::Config;
use sandboxd_core::mcp::{SandboxServer, ServerState};
use sandboxd_core::sandbox::{Owner, SandboxError, SessionManager};
use sandboxd_core::store::{McpSessionRow, SessionRow, Store, User, now_ms};

type Service = StreamableHttpService<SandboxServer, LocalSessionManager>;

struct UserMcp {
    state: Arc<ServerState>,
    service: Service,
    /// rmcp's sessions of this user: what a DELETE may name, what removal closes.
    sessions: Arc<LocalSessionManager>,
    admission: Arc<UserAdmission>,
    /// Ends this user's streams and session workers (their removal; a child of shutdown).
    cancel: CancellationToken,
}

/// The MCP servers of the users who have used /mcp since the start. Their sessions live in
/// the one SessionManager and are reaped by its reaper; their rows are kept by the ledger.
pub struct McpUsers {
    manager: Arc<SessionManager>,
    config: Config,
    shutdown: CancellationToken,
    ledger: Arc<McpLedger>,
    users: Mutex<HashMap<String, Arc<UserMcp>>>,
}

impl McpUsers {
    pub fn new(
        manager: Arc<SessionManager>,
        config: Config,
        store: Arc<dyn Store>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            ledger: McpLedger::new(store, config.clone()),
            manager,
            config,
            shutdown,
            users: Mutex::new(HashMap::new()),
        }
    }

    pub fn ledger(&self) -> &Arc<McpLedger> {
        &self.ledger
    }

    /// The manager's owner of every sandbox of a user's MCP server.
    pub fn owner_of(user_id: &str) -> Owner {
        Owner::from_secret(MCP_OWNER_PREFIX.trim_end_matches(':'), user_id.as_bytes())
    }

    async fn of(&self, user: &Arc<User>) -> Arc<UserMcp> {
        let mut users = self.users.lock().await;
        if let Some(u) = users.get(&user.id) {
            // The quota as of this request: a change applies to the next sandbox.
            u.admission.update(user.clone());
            return u.clone();
        }
        let admission = UserAdmission::new(self.ledger.clone(), user.clone());
        let state = ServerState::for_user(
            self.manager.clone(),
            self.config.clone(),
            Self::owner_of(&user.id),
            admission.clone(),
        );
        let mut sessions = LocalSessionManager::default();
        // rmcp ends a session on which nothing passed for this long, dropping its handler
        // and so its container; the manager's reaper removes an idle one's container sooner.
        sessions.session_config.keep_alive =
            Some(crate::mcp_http::session_keep_alive(&self.config));
        let sessions = Arc::new(sessions);
        let cancel = self.shutdown.child_token();
        // The service's own Host check (the DNS-rebinding guard) runs for every route
        // before this, so rmcp's copy is off; its streams end when the server shuts down.
        let mut config = StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_max_request_body_bytes(crate::mcp_http::MAX_BODY_BYTES)
            .with_cancellation_token(cancel.clone());
        // A session made on another replica is restored from the store (its client's
        // `initialize` replayed) when a request for it lands here; another user's is unknown.
        config.session_store = Some(Arc::new(StoredSessions {
            store: self.ledger.store().clone(),
            user_id: user.id.clone(),
        }));
        let factory_state = state.clone();
        let service = StreamableHttpService::new(
            move || Ok(SandboxServer::new(factory_state.clone())),
            sessions.clone(),
            config,
        );
        let u = Arc::new(UserMcp {
            state,
            service,
            sessions,
            admission,
            cancel,
        });
        users.insert(user.id.clone(), u.clone());
        u
    }

    /// The user is gone: their MCP sessions are closed and every sandbox of theirs removed
    /// now, not at its idle timeout. Their rows were ended with the user.
    pub async fn remove_user(&self, user_id: &str) {
        let taken = self.users.lock().await.remove(user_id);
        if let Some(u) = &taken {
            u.cancel.cancel();
            let ids: Vec<_> = u.sessions.sessions.read().await.keys().cloned().collect();
            for id in ids {
                if let Err(e) = u.sessions.close_session(&id).await {
                    tracing::warn!(session = %id, error = %e, "could not close a removed user's MCP session");
                }
            }
            u.state.stateless.clear().await;
        }
        // Also what a handler still holds, or what was made before this process knew the
        // user: everything the manager has under their owner.
        let owner = Self::owner_of(user_id);
        for s in self.manager.live().await {
            if s.owner == owner
                && let Err(e) = self.manager.remove(&owner, &s.id).await
            {
                tracing::warn!(session = %s.id, error = %e, "could not remove a removed user's MCP sandbox");
            }
        }
    }

    /// Removes the sandbox of one of a user's `mcp` session rows (DELETE /v1/sessions/{id}):
    /// a stateless client's `sandbox_id` then answers "no sandbox", a session's next tool
    /// call gets a new sandbox, admitted anew.
    pub async fn end_session(&self, row: &SessionRow, reason: &str, who: &crate::audit::Who) {
        self.ledger.end(row, reason, who).await;
        let Some(rt) = &row.runtime_id else { return };
        match self.manager.remove(&Self::owner_of(&row.owner), rt).await {
            Ok(()) | Err(SandboxError::SessionNotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(session = %row.id, error = %e, "could not remove an MCP sandbox")
            }
        }
    }

    /// Upkeep: closes the MCP things of users removed elsewhere (`sandboxd users rm`).
    pub async fn remove_gone_users(&self, store: &dyn Store) {
        let ids: Vec<String> = self.users.lock().await.keys().cloned().collect();
        let Some(gone) = crate::mcp_quota::removed_users(store, &ids).await else {
            return;
        };
        for id in gone {
            tracing::info!(user = %id, "closing the MCP sessions of a removed user");
            self.remove_user(&id).await;
        }
    }

    /// Closes every stateless sandbox (shutdown); session handlers end with the token.
    pub async fn close_all(&self) {
        let all: Vec<Arc<UserMcp>> = self.users.lock().await.values().cloned().collect();
        for u in all {
            u.state.stateless.clear().await;
        }
    }
}

/// rmcp's answer for a session it does not know, on every method but DELETE.
fn unknown_session() -> Response {
    (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}

/// One user's MCP sessions in the store, as rmcp's `SessionStore`: what lets any replica
/// serve a session another one began. A session of another user is not found.
struct StoredSessions {
    store: Arc<dyn Store>,
    user_id: String,
}

impl StoredSessions {
    async fn row(&self, id: &str) -> Result<Option<McpSessionRow>, SessionStoreError> {
        let row = self.store.mcp_session(id).await?;
        Ok(row.filter(|r| r.owner == self.user_id))
    }
}

#[async_trait::async_trait]
impl SessionStore for StoredSessions {
    async fn load(&self, id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let Some(row) = self.row(id).await? else {
            return Ok(None);
        };
        // A stateless client's `sandbox_id` has no `initialize`: it is no session.
        Ok(serde_json::from_str::<InitializeRequestParams>(&row.init)
            .ok()
            .map(SessionState::new))
    }

    async fn store(&self, id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let now = now_ms();
        self.store
            .put_mcp_session(McpSessionRow {
                id: id.to_string(),
                owner: self.user_id.clone(),
                init: serde_json::to_string(&state.initialize_params)?,
                sandbox: None,
                created_at: now,
                last_used_at: now,
            })
            .await?;
        Ok(())
    }

    async fn delete(&self, id: &str) -> Result<(), SessionStoreError> {
        if self.row(id).await?.is_some() {
            self.store.remove_mcp_session(id).await?;
        }
        Ok(())
    }
}

/// Any method on /mcp: handed to the caller's own MCP server.
pub async fn handle(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    req: Request<Body>,
) -> Response {
    let user = st.mcp.of(&caller.user).await;
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let Some(id) = session else {
        return user.service.handle(req).await.into_response();
    };
    if req.method() == Method::DELETE {
        return close(&st, &user, &caller, &id, req).await;
    }
    // The session's last use, for the replica whose keep-alive of it runs out meanwhile
    // (mcp_quota's `release`); not awaited, and only a session of this user is touched.
    let store = st.store.clone();
    let (touched, owner) = (id.clone(), caller.user.id.clone());
    tokio::spawn(async move {
        if let Ok(Some(row)) = store.mcp_session(&touched).await
            && row.owner == owner
            && let Err(e) = store.touch_mcp_session(&touched, now_ms()).await
        {
            tracing::debug!(mcp_session = %touched, error = %e, "could not record an MCP session's use");
        }
    });
    user.service.handle(req).await.into_response()
}

/// DELETE of an MCP session: the record goes first (so the handler dropped by the close
/// removes its sandbox, `release`), then rmcp closes the session if this replica holds it;
/// one only another replica holds is closed here through the store, its sandbox removed.
/// rmcp answers 202 to a DELETE of any id, closing nothing when it is not this user's; the
/// MCP spec's answer for an unknown session is 404, as on the other methods.
async fn close(
    st: &AppState,
    user: &UserMcp,
    caller: &Caller,
    id: &str,
    req: Request<Body>,
) -> Response {
    let user_id = caller.user.id.as_str();
    let held = user.sessions.has_session(&id.into()).await.unwrap_or(false);
    let stored = match st.store.mcp_session(id).await {
        Ok(row) => row.filter(|r| r.owner == user_id),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    if stored.is_some()
        && let Err(e) = st.store.remove_mcp_session(id).await
    {
        return crate::error::ApiError::from(e).into_response();
    }
    if held {
        return user.service.handle(req).await.into_response();
    }
    let Some(row) = stored else {
        return unknown_session();
    };
    if let Some(sandbox) = row.sandbox
        && let Ok(Some(sandbox_row)) = st.store.session(&sandbox.row).await
    {
        st.mcp
            .end_session(&sandbox_row, "its MCP session was closed", &caller.who)
            .await;
    }
    StatusCode::ACCEPTED.into_response()
}
