//! /mcp on the service's listener: the MCP server of `sandboxd mcp` (same handlers, same
//! tools), authenticated by the users' API keys. Each user gets their own rmcp session
//! manager, so an `Mcp-Session-Id` (or a stateless `sandbox_id`) of one user means nothing
//! under another user's key: their MCP sessions and containers are theirs alone.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::AppState;
use super::auth::Caller;
use super::backend::MCP_OWNER_PREFIX;
use crate::config::Config;
use crate::mcp::{SandboxServer, ServerState};
use crate::sandbox::{Owner, SessionManager};

type Service = StreamableHttpService<SandboxServer, LocalSessionManager>;

struct UserMcp {
    state: Arc<ServerState>,
    service: Service,
}

/// The MCP servers of the users who have used /mcp since the start. Their sessions live in
/// the one SessionManager (owner `serve-mcp-` + a hash of the user id; stateless clients'
/// sessions are owned by their key's hash) and are reaped by its reaper.
pub struct McpUsers {
    manager: Arc<SessionManager>,
    config: Config,
    shutdown: CancellationToken,
    users: Mutex<HashMap<String, Arc<UserMcp>>>,
}

impl McpUsers {
    pub fn new(manager: Arc<SessionManager>, config: Config, shutdown: CancellationToken) -> Self {
        Self {
            manager,
            config,
            shutdown,
            users: Mutex::new(HashMap::new()),
        }
    }

    async fn of(&self, user_id: &str) -> Arc<UserMcp> {
        let mut users = self.users.lock().await;
        if let Some(u) = users.get(user_id) {
            return u.clone();
        }
        let owner = Owner::from_secret(MCP_OWNER_PREFIX.trim_end_matches(':'), user_id.as_bytes());
        let state = ServerState::new(self.manager.clone(), self.config.clone(), owner);
        let mut sessions = LocalSessionManager::default();
        // rmcp ends a session on which nothing passed for this long, dropping its handler
        // and so its container; the manager's reaper removes an idle one's container sooner.
        sessions.session_config.keep_alive =
            Some(crate::mcp::http::session_keep_alive(&self.config));
        // The service's own Host check (the DNS-rebinding guard) runs for every route
        // before this, so rmcp's copy is off; its streams end when the server shuts down.
        let config = StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_max_request_body_bytes(crate::mcp::http::MAX_BODY_BYTES)
            .with_cancellation_token(self.shutdown.child_token());
        let factory_state = state.clone();
        let service = StreamableHttpService::new(
            move || Ok(SandboxServer::new(factory_state.clone())),
            Arc::new(sessions),
            config,
        );
        let u = Arc::new(UserMcp { state, service });
        users.insert(user_id.to_string(), u.clone());
        u
    }

    /// Closes every stateless sandbox (shutdown); session handlers end with the token.
    pub async fn close_all(&self) {
        let all: Vec<Arc<UserMcp>> = self.users.lock().await.values().cloned().collect();
        for u in all {
            u.state.stateless.clear().await;
        }
    }
}

/// Any method on /mcp: handed to the caller's own MCP server.
pub async fn handle(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    req: Request<Body>,
) -> Response {
    let user = st.mcp.of(caller.id()).await;
    user.service.handle(req).await.into_response()
}
