//! `Server` in this process over the fake runtime: serve has one session registry and one
//! idle reaper, the manager's. An API session idles out after its own `idle_timeout` (its
//! row's), ended by the manager's reaper, and its row says why; a session with the
//! configured timeout stays. Real time (a real server's reaper ticks every second), a
//! deadline on every wait.

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
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
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
async fn start() -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::load_with_env(None, &[]).unwrap();
    config.data_dir = Some(dir.path().to_path_buf());
    config.sessions.reap_interval_secs = 1;
    config.sessions.idle_timeout_secs = 600;
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&dir.path().join("s.db")).await.unwrap());
    let (_, key) = accounts::add(store.as_ref(), "ann", false, None, QuotaOverride::default())
        .await
        .unwrap();
    let manager = SessionManager::new(
        FakeRuntime::new(),
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
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.serve(async move {
        let _ = rx.await;
    }));
    Serve {
        base,
        key,
        http: reqwest::Client::new(),
        manager,
        stop: Some(tx),
        _dir: dir,
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
    let serve = start().await;
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
    let row = loop {
        let row = serve.listed(&quick).await;
        if row["state"] == "ended" {
            break row;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "never idled out: {row}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
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
