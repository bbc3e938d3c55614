//! `sandboxd serve`: the multi-user HTTP service. One axum server: the API under /v1, the
//! MCP endpoint at /mcp (same users' keys), /healthz and /readyz, and the web UI at `/`
//! (`ui`).
//!
//! Layout: `error` (the error shape and extractors), `auth` (keys, bearer check, throttle),
//! `proxies` (the client address behind trusted proxies), `streams` (open streams by user
//! and credential: revocation and the per-user cap), `http` (Host allow-list, time limits,
//! access log), `listen` (connections), `backend` (the adapter over the SessionManager),
//! `sessions`/`files`/`admin`/`health` (handlers), `mcp` (per-user MCP servers) and `mcp_quota` (their sandboxes as the user's
//! sessions), `reconcile` (start-up and periodic agreement of store and engine), `ends`
//! (the rows of the sessions the manager ended, with why), `openapi`.
//!
//! Connections (`listen`): header and idle timeouts, a cap on open connections that closes
//! stalled ones first, and the open-file limit raised at start (`listen::nofile`).
//!
//! Shutdown: the token stops the listener from accepting, ends rmcp's streams (and, with
//! runs, every event stream: each one selects on it, so an open stream cannot hold the
//! drain), and requests in flight get `[server] drain_secs` before the server returns anyway.
//! API sessions' containers are kept for the next start to re-attach; /mcp sandboxes go,
//! and their session rows end (mcp_quota.rs).
//!
//! The warm pool: `serve`'s manager has a pool scoped to its service (`pool_owner_for`),
//! so API sessions (kept) claim from it as /mcp sessions do; the claim is recorded in the
//! store (the session's runtime id), which is how the next start re-adopts a claimed
//! sandbox and removes the rest of the scope (reconcile.rs). The pool fills while serving
//! and is closed, its warm sandboxes removed, on shutdown.

pub mod a2a;
pub mod accounts;
pub mod admin;
pub mod attach;
pub mod audit;
pub mod auth;
pub mod backend;
pub mod cpu_quota;
pub mod e2b;
pub mod egress;
pub mod egress_credentials;
pub mod egress_proxies;
pub mod ends;
pub mod error;
pub mod exec_stream;
pub mod file_paths;
pub mod files;
pub mod health;
pub mod hibernate;
pub mod http;
pub mod listen;
pub mod mcp;
pub mod mcp_http;
pub mod mcp_quota;
pub mod metering;
pub mod metrics;
pub mod openapi;
pub mod processes;
pub use sandboxd_core::config::proxies;
pub mod quota;
pub mod reconcile;
pub mod replica;
pub mod resume;
pub mod runs;
pub mod session_end;
pub mod sessions;
pub mod spool;
pub mod sso;
pub mod streams;
pub mod transfers;
pub mod types;
pub mod ui;
pub mod usage;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{any, get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi as _;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};
use utoipa_axum::routes;

pub use sandboxd_core::config::{QuotasConfig, ServerConfig};

use sandboxd_core::config::Config;
use sandboxd_core::sandbox::{Owner, SandboxError, SessionManager};
use sandboxd_core::store::Store;

/// The owner-label prefix of a serve's warm sandboxes.
pub const POOL_OWNER_PREFIX: &str = "serve-pool:";

/// The owner label of the warm sandboxes of the serve whose data directory is `data_dir`:
/// the prefix and a digest of the directory's path, so that serves with their own data
/// directories sharing an engine each know their own pool and leave the others' alone.
pub fn pool_owner(data_dir: &Path) -> Result<Owner, SandboxError> {
    use sha2::{Digest, Sha256};
    let path = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let digest = Sha256::digest(path.as_os_str().as_encoded_bytes());
    Owner::new(format!("{POOL_OWNER_PREFIX}{}", &hex::encode(digest)[..16]))
}

/// The owner label of the warm sandboxes of the service configured by `config`: with a
/// shared store (`[store] url`), a digest of its URL, so every replica of the service knows
/// the scope (a session that claimed a warm sandbox is attached by whichever replica serves
/// it); with the embedded store, `pool_owner` of the data directory, as before.
pub fn pool_owner_for(config: &Config) -> Result<Owner, SandboxError> {
    use sha2::{Digest, Sha256};
    let url = config.store.url.trim();
    if url.is_empty() {
        return pool_owner(&config.data_dir());
    }
    let digest = Sha256::digest(url.as_bytes());
    Owner::new(format!("{POOL_OWNER_PREFIX}{}", &hex::encode(digest)[..16]))
}

/// Everything the handlers share.
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub backend: backend::Backend,
    pub config: Config,
    pub throttle: auth::Throttle,
    pub mcp: mcp::McpUsers,
    /// The tools every session offers (names, descriptions, schemas).
    pub tool_specs: Vec<types::ToolInfo>,
    /// Cancelled on SIGTERM: stop accepting, end streams.
    pub shutdown: CancellationToken,
    /// Agent and plan runs (the runs API).
    pub runs: Arc<runs::RunService>,
    /// `[server] trusted_proxies`: whose X-Forwarded-For names the client.
    pub proxies: Arc<proxies::TrustedProxies>,
    /// Open streams and long requests by user and credential (revocation, per-user cap).
    pub streams: Arc<streams::Streams>,
    /// How many file and archive transfers may run at once, and where they spool.
    pub transfers: transfers::Transfers,
    /// This process as a replica: its id and its lease in the store's registry.
    pub replica: Arc<replica::Replica>,
    /// The egress proxies of the sessions this replica holds.
    pub egress_proxies: egress_proxies::Proxies,
    /// This process's metrics (`/metrics`).
    pub metrics: Arc<metrics::Metrics>,
    /// `[sso]`: the web UI's OpenID Connect provider, when configured.
    pub sso: Option<Arc<sso::Provider>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {addr}: no user exists yet, so nobody could authenticate and the address is reachable from other hosts. Create one with `sandboxd users add NAME --admin`, or listen on 127.0.0.1"
    )]
    NoUsersOffLoopback { addr: SocketAddr },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

type Shared = Arc<AppState>;

/// What the service's parts reach it back through, once it exists (weakly: it holds them):
/// the manager's hibernator, and the /mcp ledger, whose sandboxes follow their rows' egress
/// as API sessions do (mcp_quota.rs).
fn link_back(state: &Shared) {
    state
        .backend
        .manager()
        .set_hibernator(Arc::new(hibernate::ServeHibernator(Arc::downgrade(state))));
    state.mcp.ledger().set_app(Arc::downgrade(state));
}

/// Wraps one route's handlers in the layers of its group.
#[derive(Clone, Copy)]
enum Group {
    /// Bookkeeping: a JSON body limit and the short time limit.
    Short,
    /// Runs commands or moves files: the command time limit on top.
    Long,
    /// Uploads: the upload body limit and the long time limit.
    Upload,
    /// Event streams: the JSON body limit and no time limit (they end with the run or at
    /// shutdown).
    Stream,
}

fn layered(
    config: &Config,
    group: Group,
    r: UtoipaMethodRouter<Shared>,
) -> UtoipaMethodRouter<Shared> {
    let s = &config.server;
    let short = Duration::from_secs(s.request_timeout_secs.max(1));
    let long = short + Duration::from_secs(config.limits.max_timeout_secs);
    let (limit, time) = match group {
        Group::Short => (s.body_limit_kb.saturating_mul(1024), short),
        Group::Long => (s.body_limit_kb.saturating_mul(1024), long),
        Group::Upload => (s.upload_limit_mb.saturating_mul(1 << 20), long),
        Group::Stream => {
            let (schemas, paths, method) = r;
            let method = method.layer(DefaultBodyLimit::max(
                s.body_limit_kb.saturating_mul(1024) as usize
            ));
            return (schemas, paths, method);
        }
    };
    let (schemas, paths, method) = r;
    let method = method
        .layer(DefaultBodyLimit::max(limit as usize))
        .layer(from_fn_with_state(http::Deadline(time), http::deadline));
    (schemas, paths, method)
}

/// The documented routes (without state, auth or global layers).
pub fn routes(config: &Config) -> OpenApiRouter<Shared> {
    use Group::*;
    let l = |g, r| layered(config, g, r);
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(l(
            Short,
            routes!(sessions::create_session, sessions::list_sessions),
        ))
        .routes(l(
            Short,
            routes!(sessions::get_session, session_end::delete_session),
        ))
        .routes(l(Short, routes!(egress::get_egress, egress::put_egress)))
        .routes(l(Short, routes!(egress_credentials::list_credentials)))
        .routes(l(
            Short,
            routes!(
                egress_credentials::put_credential,
                egress_credentials::delete_credential
            ),
        ))
        .routes(l(Short, routes!(session_end::delete_history)))
        .routes(l(Long, routes!(resume::hibernate_session)))
        .routes(l(Long, routes!(resume::resume_session)))
        .routes(l(Long, routes!(sessions::exec)))
        .routes(l(Long, routes!(exec_stream::exec_stream)))
        .routes(l(
            Short,
            routes!(processes::start_process, processes::list_processes),
        ))
        .routes(l(Stream, routes!(processes::stream_process)))
        .routes(l(Short, routes!(processes::process_stdin)))
        .routes(l(Long, routes!(processes::signal_process)))
        .routes(l(Short, routes!(sessions::list_tools)))
        .routes(l(Long, routes!(sessions::call_tool)))
        .routes(l(Short, routes!(files::list_dir)))
        .routes(l(Long, routes!(files::download_file)))
        .routes(l(Upload, routes!(files::upload_file)))
        .routes(l(Long, routes!(files::download_archive)))
        .routes(l(Upload, routes!(files::upload_archive)))
        .routes(l(
            Short,
            routes!(runs::routes::create_run, runs::routes::list_runs),
        ))
        .routes(l(Short, routes!(runs::agents::list_agents)))
        .routes(l(Short, routes!(runs::routes::get_run)))
        .routes(l(Short, routes!(runs::routes::cancel_run)))
        .routes(l(Short, routes!(runs::routes::answer_run)))
        .routes(l(Stream, routes!(runs::routes::run_events)))
        .routes(l(Short, routes!(runs::routes::run_image)))
        .routes(l(Short, routes!(admin::me)))
        .routes(l(Short, routes!(admin::users, admin::create_user)))
        .routes(l(Short, routes!(admin::delete_user)))
        .routes(l(Short, routes!(admin::rotate_user)))
        .routes(l(Short, routes!(audit::list_audit)))
        .routes(l(Short, routes!(usage::get_usage)))
}

fn health_routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
}

async fn openapi_json() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        openapi::document_json(),
    )
        .into_response()
}

/// The whole application: API, MCP, health, and the global layers.
pub fn app(state: Shared) -> Router {
    let auth = from_fn_with_state(state.clone(), auth::require_user);
    let (api, _) = routes(&state.config)
        .route("/v1/openapi.json", get(openapi_json))
        .route("/mcp", any(mcp::handle))
        .route(metrics::http::PATH, get(metrics::http::admin_scrape))
        .route(
            a2a::card::PATH,
            post(a2a::handle).layer(DefaultBodyLimit::max(
                state.config.server.body_limit_kb.saturating_mul(1024) as usize,
            )),
        )
        .split_for_parts();
    let api = api.merge(e2b::router(&state)).route_layer(auth);
    let (health, _) = health_routes().split_for_parts();
    let mut app = api
        .merge(health)
        .route(a2a::card::WELL_KNOWN, get(a2a::agent_card))
        .merge(ui::router())
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .with_state(state.clone());
    if let Some(cors) = cors_layer(&state.config.server.cors_origins) {
        app = app.layer(cors);
    }
    app.layer(from_fn(ui::security_headers))
        .layer(from_fn_with_state(
            http::HostAllowList::new(&state.config.server.allowed_hosts),
            http::check_host,
        ))
        .layer(from_fn_with_state(state.proxies.clone(), http::access_log))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            http::panic_response,
        ))
        .layer(from_fn_with_state(
            state.metrics.clone(),
            metrics::http::track,
        ))
}

/// CORS only for configured origins, without credentials (keys travel in a header).
fn cors_layer(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::{HeaderValue, Method, header};
    let origins: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o.trim()).ok())
        .collect();
    if origins.is_empty() {
        return None;
    }
    Some(
        tower_http::cors::CorsLayer::new()
            .allow_origin(origins)
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .max_age(Duration::from_secs(600)),
    )
}

/// The tools every session offers, as `GET /v1/tools` lists them (read off a session that is
/// never made).
fn tool_specs(
    manager: &Arc<SessionManager>,
    config: &Config,
) -> Result<Vec<types::ToolInfo>, sandboxd_core::sandbox::SandboxError> {
    let probe_owner = sandboxd_core::sandbox::Owner::new("serve-probe")?;
    let probe = sandboxd_core::mcp::lazy::LazySandbox::new(manager.clone(), probe_owner);
    Ok(
        sandboxd_core::tools::session::server_tools(probe, &config.limits, config)
            .specs()
            .into_iter()
            .map(|s| types::ToolInfo {
                name: s.name,
                description: s.description,
                parameters: s.parameters,
            })
            .collect(),
    )
}

/// The LLM and config runs use, or why there is none (runs are then refused).
fn run_context(config: &Config) -> Result<sandboxd_core::agent::RunContext, String> {
    sandboxd_core::llm::LlmClient::from_config(&config.llm)
        .map(|llm| sandboxd_core::agent::RunContext {
            llm: Arc::new(llm),
            config: config.clone(),
            // The store keeps runs' events and conversations; no transcript files.
            transcripts: None,
        })
        .map_err(|e| e.to_string())
}

/// The connection bounds of the configured `[server]`, the cap lowered (with a warning) to
/// half the open-file limit.
fn connection_bounds(server: &ServerConfig) -> listen::Bounds {
    let nofile = listen::nofile::soft_limit();
    let bounds = listen::Bounds::new(server, nofile);
    if (bounds.max_connections as u64) < server.max_connections {
        tracing::warn!(
            configured = server.max_connections,
            cap = bounds.max_connections,
            open_file_limit = nofile,
            "[server] max_connections is lowered to half the open-file limit; raise LimitNOFILE= to allow more"
        );
    }
    bounds
}

/// Binds `[server] metrics_listen` (None when empty; checked at load).
async fn bind_metrics(text: &str) -> anyhow::Result<Option<TcpListener>> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let addr: SocketAddr = text
        .parse()
        .map_err(|e| anyhow::anyhow!("[server] metrics_listen {text:?}: {e}"))?;
    let l = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    tracing::info!(addr = %addr, "serving GET /metrics without authentication on [server] metrics_listen");
    Ok(Some(l))
}

/// A bound server, reconciled with the engine, not yet serving.
pub struct Server {
    pub state: Shared,
    listener: TcpListener,
    pub addr: SocketAddr,
    pub reconciled: reconcile::Reconciled,
    /// `[server] metrics_listen`, bound.
    metrics_listener: Option<TcpListener>,
}

impl Server {
    /// Checks the address, reconciles the store with the engine, then binds.
    pub async fn start(
        config: Config,
        store: Arc<dyn Store>,
        manager: Arc<SessionManager>,
        addr: SocketAddr,
    ) -> anyhow::Result<Server> {
        if !addr.ip().is_loopback() && store.user_count().await? == 0 {
            return Err(ServeError::NoUsersOffLoopback { addr }.into());
        }
        let shutdown = CancellationToken::new();
        let tool_specs = tool_specs(&manager, &config)?;
        let run_ctx = run_context(&config);
        let replica = replica::Replica::register(
            store.as_ref(),
            Duration::from_secs(config.server.lease_secs),
        )
        .await?;
        // Sessions shared with the other replicas (attach.rs): gone neighbours on this host
        // buried, the manager's reaper and reconciler on the store's books, this process's
        // shells tagged with its replica id.
        attach::join(&store, &manager, &config, replica.id()).await;
        // Only dead replicas' runs: a live replica's are its own (the sweep gets the rest
        // once their replica's lease runs out).
        let interrupted = runs::RunService::interrupt_orphans(&store, replica.id()).await?;
        if !interrupted.is_empty() {
            tracing::info!(runs = ?interrupted, "runs of stopped replicas are marked interrupted");
        }
        let runs = runs::RunService::new(
            store.clone(),
            run_ctx,
            Duration::from_secs(config.server.question_timeout_secs.max(1)),
            replica.clone(),
        );
        // Checked at load; parsed again here so a hand-built config fails as clearly.
        let proxies = Arc::new(proxies::TrustedProxies::parse(
            &config.server.trusted_proxies,
        )?);
        let transfers = transfers::Transfers::new(
            config.server.transfers_per_user,
            config.server.transfers,
            config.data_dir().join("spool"),
        )
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot create the transfer spool directory {}: {e}; check that the data directory is writable",
                config.data_dir().join("spool").display()
            )
        })?;
        let mcp = mcp::McpUsers::new(
            manager.clone(),
            config.clone(),
            store.clone(),
            shutdown.clone(),
        );
        let throttle = auth::Throttle::new(config.server.auth_failures_per_minute, store.clone());
        let metrics = metrics::install(&config.runtime.backend, config.pool.size);
        let metrics_listener = bind_metrics(&config.server.metrics_listen).await?;
        let sso = sso::Provider::from_config(&config.sso)?;
        let state = Arc::new(AppState {
            sso,
            replica,
            transfers,
            runs,
            proxies,
            egress_proxies: Default::default(),
            streams: streams::Streams::new(config.server.streams_per_user),
            store,
            backend: backend::Backend::new(manager),
            throttle,
            mcp,
            tool_specs,
            shutdown,
            config,
            metrics,
        });
        link_back(&state);
        let reconciled = reconcile::at_start(&state).await?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ServeError::Bind { addr, source })?;
        Ok(Server {
            state,
            listener,
            addr,
            reconciled,
            metrics_listener,
        })
    }

    /// Serves until `stop` resolves, then drains for at most `[server] drain_secs`.
    pub async fn serve(
        self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let state = self.state;
        let shutdown = state.shutdown.clone();
        let on_stop = shutdown.clone();
        let runs = state.runs.clone();
        let run_drain = Duration::from_secs(state.config.server.drain_secs);
        tokio::spawn(async move {
            stop.await;
            on_stop.cancel();
            // Runs end `interrupted`; a cancel request waiting on one is answered.
            runs.shutdown(run_drain).await;
        });
        // The lease first: everything below acts on what this replica holds.
        let beats = state.replica.spawn_beats(state.store.clone());
        // Cancel requests and answers for this replica's runs, and dead replicas' runs.
        let control = state.runs.spawn_control(shutdown.clone());
        let upkeep = reconcile::spawn_upkeep(state.clone());
        metering::spawn_sampler(state.clone()); // usage samples; ends itself on shutdown
        // Credentials revoked by another process (`sandboxd users rotate|rm`) end their streams.
        let recheck = state
            .streams
            .spawn_recheck(state.store.clone(), shutdown.clone());
        // The rows of the sessions the manager itself removes (idle, memory budget) and of
        // those whose sandboxes went outside sandboxd end as they go, with why (ends.rs).
        let ends = ends::spawn_listener(state.clone());
        // The manager's one reaper: idle API and /mcp sessions alike, each after its own
        // timeout (an API session's is its row's).
        let reaper = state.backend.manager().spawn_reaper();
        // The warm pool fills once the start-up reconcile is done (it must not take a fresh
        // warm sandbox for an orphan) and is closed by `remove_mcp_sessions` below.
        let pool = state.backend.manager().spawn_pool();
        // Timeouts, the connection cap and TCP_NODELAY: see listen.rs.
        let bounds = connection_bounds(&state.config.server);
        if let Some(l) = self.metrics_listener {
            tokio::spawn(metrics::http::serve_open(
                l,
                state.clone(),
                shutdown.clone(),
            ));
        }
        let server = listen::serve(self.listener, app(state.clone()), bounds, shutdown.clone());
        let drain = Duration::from_secs(state.config.server.drain_secs);
        let bound = async {
            shutdown.cancelled().await;
            tokio::time::sleep(drain).await;
        };
        tokio::select! {
            _ = server => {}
            _ = bound => tracing::warn!(seconds = drain.as_secs(), "requests still open after the drain bound; closing them"),
        }
        state.runs.shutdown(drain).await;
        control.abort();
        upkeep.abort();
        recheck.abort();
        reaper.abort();
        if let Some(pool) = pool {
            pool.abort();
        }
        // The egress proxies of this replica's sessions: another replica starts its own
        // when it next attaches them.
        state.egress_proxies.stop_all().await;
        state.mcp.close_all().await;
        state.backend.remove_mcp_sessions().await;
        ends.abort();
        state
            .mcp
            .ledger()
            .end_all("sandboxd stopped (MCP sandboxes do not outlive the service)")
            .await;
        // Last: the runs' endings above were written under the lease.
        beats.abort();
        state.replica.leave(state.store.as_ref()).await;
        attach::forget_local(&state.config.data_dir(), state.replica.id());
        Ok(())
    }
}
