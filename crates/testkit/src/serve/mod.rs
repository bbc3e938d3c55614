//! A real `sandboxd serve` process for tests, and a client of its API with one user's key.
//!
//! The process is whatever `Command` the caller built (only the sandboxd package's tests have
//! the binary's path, `env!("CARGO_BIN_EXE_sandboxd")`, and they know its config): `spawn`
//! captures its stderr as the log, waits for the "listening on http://ADDR" line, and kills
//! the process when dropped. `Api` speaks JSON to any base URL with a bearer key, so it serves
//! a process as well as an in-process `Server` on a loopback port; `runs` reads the runs API
//! (starting runs, their SSE events) through it.

pub mod runs;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running serve process: its base URL and everything it wrote on stderr so far.
pub struct Serve {
    child: Child,
    pub base: String,
    pub log: Arc<Mutex<String>>,
}

impl Serve {
    /// Spawns `cmd` (a `serve --listen 127.0.0.1:0` command line) with stderr captured, and
    /// waits (up to two minutes) until it says where it listens.
    pub fn spawn(mut cmd: Command) -> Serve {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("serve did not start: {}", log.lock().unwrap()));
        Serve {
            child,
            base: format!("http://{addr}"),
            log,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Waits until the log has a line containing `text` (bounded, so a bug cannot hang).
    pub fn wait_for_log(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.log.lock().unwrap().contains(text) {
            assert!(
                Instant::now() < deadline,
                "serve never logged {text:?}: {}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and returns how long the process took to exit.
    pub fn sigterm(&mut self, limit: Duration) -> Duration {
        let start = Instant::now();
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return start.elapsed();
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                panic!(
                    "serve did not exit within {limit:?} of SIGTERM: {}",
                    self.log.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client for one user's key.
#[derive(Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
    pub key: String,
}

impl Api {
    pub fn new(serve: &Serve, key: &str) -> Api {
        Api::at(&serve.base, key)
    }

    /// A client of the API at `base` (`http://ADDR`), e.g. a `Server` started in-process.
    pub fn at(base: &str, key: &str) -> Api {
        Api {
            http: reqwest::Client::new(),
            base: base.to_string(),
            key: key.to_string(),
        }
    }

    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key)
    }

    /// The status and the body (JSON, or the text as a JSON string when it is not JSON).
    pub async fn json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut r = self.req(method, path);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let v = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        (status, v)
    }

    /// Creates a session and returns its id.
    pub async fn session(&self) -> String {
        self.session_with(serde_json::json!({})).await
    }

    /// Creates a session from `body` (the create request) and returns its id.
    pub async fn session_with(&self, body: serde_json::Value) -> String {
        let (s, v) = self
            .json(reqwest::Method::POST, "/v1/sessions", Some(body))
            .await;
        assert_eq!(s, 201, "create session: {v}");
        v["id"].as_str().unwrap().to_string()
    }

    pub async fn exec(&self, id: &str, command: &str) -> serde_json::Value {
        let (s, v) = self
            .json(
                reqwest::Method::POST,
                &format!("/v1/sessions/{id}/exec"),
                Some(serde_json::json!({ "command": command })),
            )
            .await;
        assert_eq!(s, 200, "exec: {v}");
        v
    }
}

/// The error code of an error body.
pub fn code(v: &serde_json::Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}
