//! `Server` in this process over the fake runtime: serve has one session registry and one
//! idle reaper, the manager's. An API session idles out after its own `idle_timeout` (its
//! row's), ended by the manager's reaper, and its row says why; a session with the
//! configured timeout stays; a session re-attached by a restart keeps its row's timeout.
//! Real time (a real server's reaper ticks every second), a deadline on every wait.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use sandboxd_core::config::Config;
use sandboxd_core::sandbox::SessionManager;
use sandboxd_core::sandbox::records::NoRecords;
use sandboxd_core::store::{QuotaOverride, Store};
use sandboxd_server::{Server, accounts};
use sandboxd_sqlite::SqliteStore;
use sandboxd_testkit::fake_runtime::FakeRuntime;
use serde_json::{Value, json};

struct Serve {
    base: String,
    key: String,
    http: reqwest::Client,
    manager: Arc<SessionManager>,
    /// The ids of the stored sessions the start-up reconcile re-attached.
    reattached: Vec<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A server with one user whose manager's reaper looks every second; the configured idle
/// timeout is ten minutes.
async fn start() -> (Serve, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let serve = start_on(dir.path(), &FakeRuntime::new(), None, 1).await;
    (serve, dir)
}

/// A server over the data directory `dir` and `runtime` (both kept across a restart), for
/// a new user `ann` or the one whose key is given; its reaper looks every `reap_secs`.
async fn start_on(
    dir: &std::path::Path,
    runtime: &Arc<FakeRuntime>,
    key: Option<String>,
    reap_secs: u64,
) -> Serve {
    let mut config = Config::load_with_env(None, &[]).unwrap();
    config.data_dir = Some(dir.to_path_buf());
    config.sessions.reap_interval_secs = reap_secs;
    config.sessions.idle_timeout_secs = 600;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("s.db")).await.unwrap());
    let key = match key {
        Some(key) => key,
        None => {
            let quota = QuotaOverride::default();
            accounts::add(store.as_ref(), "ann", false, None, quota)
                .await
                .unwrap()
                .1
        }
    };
    let manager = SessionManager::new(
        runtime.clone(),
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
    let reattached = server.reconciled.reattached.clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server.serve(async move {
        let _ = rx.await;
    }));
    Serve {
        base,
        key,
        http: reqwest::Client::new(),
        manager,
        reattached,
        stop: Some(tx),
        served: Some(served),
    }
}

impl Serve {
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn session(&self, body: Value) -> Value {
        let (s, v) = self.call(Method::POST, "/v1/sessions", Some(body)).await;
        assert_eq!(s, 201, "{v}");
        v
    }

    /// Stops the server and waits until it has shut down.
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(served) = self.served.take() {
            served.await.unwrap().unwrap();
        }
    }

    /// Polls the list until the session has ended (20 s at most); its row then.
    async fn until_ended(&self, id: &str) -> Value {
        let t = Instant::now();
        loop {
            let row = self.listed(id).await;
            if row["state"] == "ended" {
                return row;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "never idled out: {row}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The session as the list shows it: a store read, which is no use of the session.
    async fn listed(&self, id: &str) -> Value {
        let (s, v) = self
            .call(Method::GET, "/v1/sessions?include_ended=true", None)
            .await;
        assert_eq!(s, 200, "{v}");
        v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("session {id} is not listed: {v}"))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_session_idles_out_after_its_own_timeout_by_the_managers_reaper() {
    let (serve, _dir) = start().await;
    let quick = serve.session(json!({"idle_timeout": 1})).await;
    assert_eq!(quick["idle_timeout"], 1, "{quick}");
    let quick = quick["id"].as_str().unwrap().to_string();
    let slow = serve.session(json!({})).await;
    assert_eq!(slow["idle_timeout"], 600, "the configured timeout: {slow}");
    let slow = slow["id"].as_str().unwrap().to_string();
    assert_eq!(
        serve.manager.live().await.len(),
        2,
        "both in the manager's table"
    );

    let t = Instant::now();
    let row = serve.until_ended(&quick).await;
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "ended before its timeout: {row}"
    );
    let (s, got) = serve
        .call(Method::GET, &format!("/v1/sessions/{quick}"), None)
        .await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got["state"], "ended", "{got}");
    assert_eq!(got["end_reason"], "idle for more than 1 s", "{got}");
    // The manager removed its sandbox: it holds only the other session now.
    let live: Vec<String> = serve
        .manager
        .live()
        .await
        .iter()
        .map(|s| s.id.clone())
        .collect();
    assert_eq!(live.len(), 1, "{live:?}");
    let (s, v) = serve
        .call(
            Method::POST,
            &format!("/v1/sessions/{quick}/exec"),
            Some(json!({"command": "true"})),
        )
        .await;
    assert_eq!(s, 409, "an ended session runs nothing: {v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("idle for more than 1 s"),
        "{v}"
    );

    // The other, with the configured ten minutes, is still running after several reaps.
    let row = serve.listed(&slow).await;
    assert_eq!(row["state"], "running", "{row}");
    assert!(row["end_reason"].is_null(), "{row}");
}

/// A session re-attached after a restart idles out after its row's timeout too: the new
/// process's manager learns it from the row, not from its own configuration.
#[tokio::test(flavor = "multi_thread")]
async fn a_reattached_api_session_keeps_its_own_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = FakeRuntime::new();
    // The first process never reaps (its reaper would look after an hour).
    let first = start_on(dir.path(), &runtime, None, 3600).await;
    let quick = first.session(json!({"idle_timeout": 1})).await;
    let quick = quick["id"].as_str().unwrap().to_string();
    let key = first.key.clone();
    first.stop().await;
    assert_eq!(
        runtime.sessions().len(),
        1,
        "an API session's sandbox is kept"
    );

    let second = start_on(dir.path(), &runtime, Some(key), 1).await;
    assert_eq!(second.reattached, vec![quick.clone()]);
    let row = second.until_ended(&quick).await;
    assert_eq!(row["end_reason"], "idle for more than 1 s", "{row}");
    assert!(runtime.sessions().is_empty(), "its sandbox is removed");
}
