//! The in-process serve of the server's tests: `Server` over the fake runtime and a real
//! SQLite store on a loopback port, each `Setup` with its own data directory. A `Setup` can
//! be served again on the same store, data directory and runtime (the engine outlives the
//! process), after a graceful stop or after a crash (`start_crashable`: the server's own
//! tokio runtime dropped with every task in flight, nothing recorded on the way out, as
//! `kill -9` leaves it), and can point runs at a fake LLM. Several servers can serve one
//! `Setup` at once (`start_with`), as replicas on one store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use sandboxd_core::config::Config;
use sandboxd_core::sandbox::SessionManager;
use sandboxd_core::sandbox::records::NoRecords;
use sandboxd_core::store::{QuotaOverride, Store};
use sandboxd_server::{Server, accounts};
use sandboxd_sqlite::SqliteStore;
use sandboxd_testkit::fake_llm::FakeLlm;
use sandboxd_testkit::fake_runtime::FakeRuntime;
use serde_json::{Value, json};

/// What a server is made of; cloning shares the data directory, the store's file and the
/// runtime, so a clone serves the same service again.
#[derive(Clone)]
pub struct Setup {
    dir: Arc<tempfile::TempDir>,
    pub runtime: Arc<FakeRuntime>,
    llm: Option<String>,
    /// `[sessions] reap_interval_secs`, if not the default.
    reap_secs: Option<u64>,
    /// `[sessions] max`, if not the default.
    max_sessions: Option<usize>,
    lease_secs: Option<u64>,
}

impl Setup {
    pub fn new() -> Setup {
        Setup {
            dir: Arc::new(tempfile::tempdir().unwrap()),
            runtime: FakeRuntime::new(),
            llm: None,
            reap_secs: None,
            max_sessions: None,
            lease_secs: None,
        }
    }

    /// Serves with `[server] lease_secs = secs` (how soon other replicas notice one died).
    pub fn lease(self, secs: u64) -> Setup {
        Setup {
            lease_secs: Some(secs),
            ..self
        }
    }

    /// Another service (its own data directory and store) on the same engine.
    pub fn beside(other: &Setup) -> Setup {
        Setup {
            runtime: other.runtime.clone(),
            ..Setup::new()
        }
    }

    /// The managers' reapers and the upkeep look every `secs`.
    pub fn reaping_every(mut self, secs: u64) -> Setup {
        self.reap_secs = Some(secs);
        self
    }

    /// `[sessions] max`: the global cap.
    pub fn with_max_sessions(mut self, max: usize) -> Setup {
        self.max_sessions = Some(max);
        self
    }

    /// The store every server of this setup shares, opened once more.
    pub async fn store(&self) -> Arc<dyn Store> {
        Arc::new(
            SqliteStore::open(&self.dir.path().join("s.db"))
                .await
                .unwrap(),
        )
    }

    /// Runs ask `llm`.
    pub fn with_llm(llm: &FakeLlm) -> Setup {
        Setup {
            llm: Some(llm.base_url()),
            ..Setup::new()
        }
    }

    /// A new handle of the setup's store (the SQLite file in its data directory).
    pub async fn open_store(&self) -> Arc<dyn Store> {
        Arc::new(
            SqliteStore::open(&self.dir.path().join("s.db"))
                .await
                .unwrap(),
        )
    }

    fn config(&self) -> Config {
        let mut config = Config::load_with_env(None, &[]).unwrap();
        config.data_dir = Some(self.dir.path().to_path_buf());
        config.server.drain_secs = 2;
        if let Some(secs) = self.reap_secs {
            config.sessions.reap_interval_secs = secs;
        }
        if let Some(max) = self.max_sessions {
            config.sessions.max = max;
        }
        if let Some(secs) = self.lease_secs {
            config.server.lease_secs = secs;
        }
        if let Some(url) = &self.llm {
            config.llm.base_url = url.clone();
            config.llm.model = "fake-model".into();
            config.llm.api_key = "sk-fake".into();
            config.llm.max_retries = 1;
            // The queueing test holds three runs in flight (the default quota is two).
            config.quotas.runs = 4;
        }
        config
    }
}

pub struct Serve {
    pub base: String,
    /// The server's shared state (its replica, its runs).
    pub state: Arc<sandboxd_server::AppState>,
    pub http: reqwest::Client,
    /// What the start-up reconcile did.
    pub reconciled: sandboxd_server::reconcile::Reconciled,
    /// This server's manager.
    pub manager: Arc<SessionManager>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _setup: Setup,
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A server with the users `(name, sessions quota)`; their keys, in order.
pub async fn start(users: &[(&str, Option<u32>)]) -> (Serve, Vec<String>) {
    start_on(&Setup::new(), users).await
}

/// Serves `setup` (again), first adding the users `(name, sessions quota)`; their keys.
pub async fn start_on(setup: &Setup, users: &[(&str, Option<u32>)]) -> (Serve, Vec<String>) {
    start_with(setup, setup.open_store().await, users).await
}

/// Serves `setup` on `store` (a handle of its store's file), first adding the users; their
/// keys. Two servers started with one handle share its wake-ups, as replicas on one Postgres
/// do; with two handles they share only the file.
pub async fn start_with(
    setup: &Setup,
    store: Arc<dyn Store>,
    users: &[(&str, Option<u32>)],
) -> (Serve, Vec<String>) {
    let config = setup.config();
    let mut keys = Vec::new();
    for (name, sessions) in users {
        let quota = QuotaOverride {
            sessions: *sessions,
            ..Default::default()
        };
        let (_, key) = accounts::add(store.as_ref(), name, false, None, quota)
            .await
            .unwrap();
        keys.push(key);
    }
    let manager = SessionManager::new(
        setup.runtime.clone(),
        config.limits.clone(),
        config.sessions.clone(),
        Arc::new(NoRecords),
    );
    let server = Server::start(
        config,
        store,
        manager.clone(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let base = format!("http://{}", server.addr);
    let reconciled = server.reconciled.clone();
    let state = server.state.clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server.serve(async move {
        let _ = rx.await;
    }));
    let serve = Serve {
        base,
        state,
        http: reqwest::Client::new(),
        reconciled,
        manager,
        stop: Some(tx),
        served: Some(served),
        _setup: setup.clone(),
    };
    (serve, keys)
}

/// A server on a tokio runtime of its own, which `crash` drops with every task in flight.
pub struct Crashable {
    rt: Option<tokio::runtime::Runtime>,
    pub serve: Serve,
}

impl Drop for Crashable {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Crashable {
    /// Ends the server as `kill -9` would: its tasks stop where they are.
    pub fn crash(mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }

    /// Stops the server as SIGTERM does and waits until it has drained.
    pub async fn stop(mut self) {
        self.serve.drain().await;
    }
}

pub async fn start_crashable(setup: &Setup, users: &[&str]) -> (Crashable, Vec<String>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (setup, users) = (setup.clone(), users.iter().map(|u| u.to_string()));
    let users: Vec<String> = users.collect();
    let (serve, keys) = rt
        .spawn(async move {
            let users: Vec<(&str, Option<u32>)> =
                users.iter().map(|u| (u.as_str(), None)).collect();
            start_on(&setup, &users).await
        })
        .await
        .unwrap();
    (
        Crashable {
            rt: Some(rt),
            serve,
        },
        keys,
    )
}

impl Serve {
    /// Stops the server as SIGTERM does and waits until it has drained.
    pub async fn stop(mut self) {
        self.drain().await;
    }

    /// Stops the server as SIGTERM does and waits until it has drained.
    async fn drain(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(served) = self.served.take() {
            served.await.unwrap().unwrap();
        }
    }

    pub async fn call(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn session(&self, key: &str) -> String {
        let (s, v) = self
            .call(key, Method::POST, "/v1/sessions", Some(json!({})))
            .await;
        assert_eq!(s, 201, "{v}");
        v["id"].as_str().unwrap().to_string()
    }

    /// GET `path` until `done` holds for its answer (at most 30 s); that answer.
    pub async fn until(&self, key: &str, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (s, v) = self.call(key, Method::GET, path, None).await;
            assert_eq!(s, 200, "GET {path}: {v}");
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "GET {path}: still {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or_default()
}
