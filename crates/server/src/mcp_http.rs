//! `sandboxd mcp --listen ADDR`: the MCP server over streamable HTTP at /mcp, behind a bearer
//! token compared in constant time.
//!
//! The token comes from `[mcp] token` or SANDBOXD_MCP_TOKEN. Without one, a loopback address
//! gets a random token printed on stderr (any local user could otherwise drive the
//! sandboxes), and any other address is refused. rmcp's Host allow-list (DNS-rebinding
//! guard) stays on: loopback names plus the listen address itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use sandboxd_core::mcp::server::{SandboxServer, ServerState, VerifiedClient};

/// Largest POST body: a whole file written through write_file must fit.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// How long rmcp keeps a session on which nothing passes. A tool call sends nothing until it
/// ends and may take up to `[limits] max_timeout_secs`, so that (and a minute for the call's
/// own cleanup) is added to the idle timeout: a call in flight is never cut off with its
/// container, and an idle session's container still goes after `[sessions]
/// idle_timeout_secs`, by the manager's reaper (which never takes one in use).
pub fn session_keep_alive(config: &sandboxd_core::config::Config) -> Duration {
    let idle = config.sessions.idle_timeout_secs.max(1);
    let call = config.limits.max_timeout_secs.saturating_add(60);
    Duration::from_secs(idle.saturating_add(call))
}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error(
        "refusing to listen on {addr} without a token: it is not a loopback address, so anyone who can reach it could run code. Set [mcp] token in the config or SANDBOXD_MCP_TOKEN"
    )]
    NoTokenOffLoopback { addr: SocketAddr },
    #[error("the MCP token is too short ({len} characters); use at least 16 random characters")]
    WeakToken { len: usize },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Decides the token to require: the configured one, or a fresh random one on loopback.
/// Returns the token and whether it was generated (and so must be shown to the user).
pub fn resolve_token(addr: SocketAddr, configured: &str) -> Result<(String, bool), ListenError> {
    let configured = configured.trim();
    if !configured.is_empty() {
        if configured.len() < 16 {
            return Err(ListenError::WeakToken {
                len: configured.len(),
            });
        }
        return Ok((configured.to_string(), false));
    }
    if !addr.ip().is_loopback() {
        return Err(ListenError::NoTokenOffLoopback { addr });
    }
    let random: [u8; 24] = rand::random();
    Ok((hex::encode(random), true))
}

/// Equal-length digests compared without an early exit, so timing says nothing about the token.
pub fn token_matches(given: &[u8], expected: &[u8]) -> bool {
    let a = Sha256::digest(given);
    let b = Sha256::digest(expected);
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[derive(Clone)]
struct Auth {
    token: Arc<String>,
}

async fn require_bearer(State(auth): State<Auth>, mut req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match given {
        Some(t) if token_matches(t.as_bytes(), auth.token.as_bytes()) => {
            let client = VerifiedClient(Sha256::digest(auth.token.as_bytes()).into());
            req.extensions_mut().insert(client);
            next.run(req).await
        }
        _ => {
            let mut resp = (
                StatusCode::UNAUTHORIZED,
                "a valid bearer token is required\n",
            )
                .into_response();
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sandboxd-mcp\""),
            );
            resp
        }
    }
}

/// A bound, not yet serving, HTTP MCP server.
pub struct HttpServer {
    listener: TcpListener,
    pub addr: SocketAddr,
    token: String,
}

impl HttpServer {
    pub async fn bind(addr: SocketAddr, token: String) -> Result<Self, ListenError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ListenError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ListenError::Bind { addr, source })?;
        Ok(Self {
            listener,
            addr,
            token,
        })
    }

    /// Serves until `shutdown` is cancelled, then removes every sandbox it created.
    pub async fn serve(
        self,
        state: Arc<ServerState>,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let mut sessions = LocalSessionManager::default();
        // rmcp ends a session on which nothing passed for this long, dropping its handler
        // and so its container; the manager's reaper removes an idle one's container sooner.
        sessions.session_config.keep_alive = Some(session_keep_alive(&state.config));
        let mut hosts = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ];
        if !self.addr.ip().is_loopback() && !self.addr.ip().is_unspecified() {
            hosts.push(self.addr.ip().to_string());
        }
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(hosts)
            .with_max_request_body_bytes(MAX_BODY_BYTES)
            .with_cancellation_token(shutdown.child_token());
        let factory_state = state.clone();
        let service = StreamableHttpService::new(
            move || Ok(SandboxServer::new(factory_state.clone())),
            Arc::new(sessions),
            config,
        );
        let auth = Auth {
            token: Arc::new(self.token),
        };
        let app = axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn_with_state(auth, require_bearer));

        // The manager's one reaper removes idle sessions of every kind, stateless ones too.
        let reaper = state.manager.spawn_reaper();
        // A sandbox that ends outside sandboxd ends its session at once: the client's next
        // call says why (lazy.rs) instead of failing on a dead container.
        let vanish = state.manager.spawn_vanish_watch();
        let pool = state.manager.spawn_pool();

        let stop = shutdown.clone();
        let result = axum::serve(self.listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        reaper.abort();
        vanish.abort();
        if let Some(pool) = pool {
            pool.abort();
        }
        state.shutdown().await;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Bearer T`, `bearer T` and `Bearer  T` are one client: the owner is the verified token.
    #[tokio::test]
    async fn the_client_is_the_verified_token_not_the_header_spelling() {
        let auth = Auth {
            token: Arc::new("0123456789abcdef0123".into()),
        };
        let app = axum::Router::new()
            .route(
                "/",
                axum::routing::get(|req: Request| async move {
                    let client = req.extensions().get::<VerifiedClient>().copied();
                    format!("{:?}", client.map(|c| c.0))
                }),
            )
            .layer(axum::middleware::from_fn_with_state(auth, require_bearer));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let http = reqwest::Client::new();
        let mut seen = Vec::new();
        for header in [
            "Bearer 0123456789abcdef0123",
            "bearer 0123456789abcdef0123",
            "Bearer  0123456789abcdef0123",
        ] {
            let resp = http
                .get(format!("http://{addr}/"))
                .header("authorization", header)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{header}");
            seen.push(resp.text().await.unwrap());
        }
        assert!(seen[0].starts_with("Some("), "{seen:?}");
        assert!(seen.iter().all(|s| *s == seen[0]), "{seen:?}");
        server.abort();
    }

    #[test]
    fn tokens() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abc", b"abd"));
        assert!(!token_matches(b"", b"abc"));
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let (t, generated) = resolve_token(lo, "").unwrap();
        assert!(generated && t.len() == 48);
        assert!(matches!(
            resolve_token(any, ""),
            Err(ListenError::NoTokenOffLoopback { .. })
        ));
        assert!(matches!(
            resolve_token(any, "short"),
            Err(ListenError::WeakToken { .. })
        ));
        assert_eq!(
            resolve_token(any, "0123456789abcdef0").unwrap(),
            ("0123456789abcdef0".to_string(), false)
        );
    }
}
