//! Helpers of serve_mcp_quota.rs: a raw JSON-RPC client of /mcp (a session, or stateless
//! 2026-07-28 calls) with one user's key, and looks at the store's rows and the containers.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::serve::{Api, Env, Serve};

/// The body of an MCP answer: plain JSON, or the last `data:` line of an SSE stream.
pub fn parse(text: &str) -> Value {
    if let Ok(v) = serde_json::from_str(text) {
        return v;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .rfind(|v| v.get("id").is_some())
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {text:?}"))
}

/// One client of /mcp with one user's key: a session (`open`) or stateless calls.
pub struct Mcp {
    http: reqwest::Client,
    url: String,
    key: String,
    pub sid: Option<String>,
    /// Stateless: every request names protocol 2026-07-28 (none has a session).
    stateless: bool,
}

impl Mcp {
    /// A session: `initialize`, then `notifications/initialized`.
    pub async fn open(serve: &Serve, key: &str) -> Mcp {
        let mut m = Mcp {
            http: reqwest::Client::new(),
            url: serve.url("/mcp"),
            key: key.to_string(),
            sid: None,
            stateless: false,
        };
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "quota-test", "version": "1"}}});
        let r = m.post(&init).await;
        assert_eq!(r.status().as_u16(), 200);
        m.sid = Some(r.headers()["mcp-session-id"].to_str().unwrap().to_string());
        let r = m
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert!(r.status().is_success(), "{}", r.status());
        m
    }

    /// A client of session `sid` (begun elsewhere: on another replica) with `key`, sending
    /// no `initialize` of its own.
    pub fn join(serve: &Serve, key: &str, sid: &str) -> Mcp {
        Mcp {
            http: reqwest::Client::new(),
            url: serve.url("/mcp"),
            key: key.to_string(),
            sid: Some(sid.to_string()),
            stateless: false,
        }
    }

    /// Stateless (2026-07-28) calls: no session, the protocol in every request.
    pub fn stateless(serve: &Serve, key: &str) -> Mcp {
        Mcp {
            http: reqwest::Client::new(),
            url: serve.url("/mcp"),
            key: key.to_string(),
            sid: None,
            stateless: true,
        }
    }

    pub async fn post(&self, body: &Value) -> reqwest::Response {
        let mut r = self
            .http
            .post(&self.url)
            .bearer_auth(&self.key)
            .header("accept", "application/json, text/event-stream")
            .json(body);
        if let Some(s) = &self.sid {
            r = r
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-06-18");
        }
        if self.stateless {
            // 2026-07-28 repeats the method and tool name in headers.
            r = r
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", body["method"].as_str().unwrap_or_default());
            if let Some(name) = body["params"]["name"].as_str() {
                r = r.header("mcp-name", name);
            }
        }
        r.send().await.expect("POST /mcp")
    }

    /// tools/call: whether it is an error, and its text.
    pub async fn call(&self, name: &str, args: Value) -> (bool, String) {
        let mut params = json!({"name": name, "arguments": args});
        if self.stateless {
            params["_meta"] = json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}});
        }
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params});
        let r = self.post(&body).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "tools/call {name}: {text}");
        let v = parse(&text);
        let result = &v["result"];
        assert!(result.is_object(), "tools/call {name}: {v}");
        let text = result["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n");
        (result["isError"].as_bool().unwrap_or(false), text)
    }

    /// bash in the session's sandbox (or the stateless sandbox `id`), which must succeed.
    pub async fn bash(&self, command: &str, sandbox: Option<&str>) -> String {
        let mut args = json!({"command": command});
        if let Some(id) = sandbox {
            args["sandbox_id"] = json!(id);
        }
        let (err, text) = self.call("bash", args).await;
        assert!(!err, "bash {command:?}: {text}");
        text
    }

    /// sandbox_create, which must succeed: the new sandbox_id.
    pub async fn create(&self) -> String {
        let (err, text) = self.call("sandbox_create", json!({})).await;
        assert!(!err, "sandbox_create: {text}");
        text.split_whitespace().nth(1).unwrap().to_string()
    }

    /// DELETE /mcp naming `sid` (this client's session by default): the status.
    pub async fn delete(&self, sid: Option<&str>) -> u16 {
        let sid = sid.or(self.sid.as_deref()).unwrap();
        self.http
            .delete(&self.url)
            .bearer_auth(&self.key)
            .header("mcp-session-id", sid)
            .header("mcp-protocol-version", "2025-06-18")
            .send()
            .await
            .expect("DELETE /mcp")
            .status()
            .as_u16()
    }
}

/// The caller's sessions (running ones), as GET /v1/sessions lists them.
pub async fn sessions(api: &Api) -> Vec<Value> {
    let (s, v) = api.json(Method::GET, "/v1/sessions", None).await;
    assert_eq!(s, 200, "{v}");
    v["sessions"].as_array().unwrap().clone()
}

/// The containers (as the store records them) of the caller's running sessions of kind `mcp`.
pub async fn mcp_containers(env: &Env, api: &Api) -> Vec<String> {
    let mut out = Vec::new();
    for s in sessions(api).await {
        if s["kind"] == "mcp" && s["state"] == "running" {
            out.push(env.container(s["id"].as_str().unwrap()).await);
        }
    }
    out
}

/// `docker inspect -f FORMAT` of a container, which must be there.
pub fn inspect(container: &str, format: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", format, container])
        .output()
        .unwrap();
    assert!(out.status.success(), "no container {container}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Waits (bounded) until `check` holds.
pub async fn wait_until<F: AsyncFnMut() -> bool>(what: &str, limit: Duration, mut check: F) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether none of `containers` exists any more (running or not).
pub async fn gone(containers: &[String]) -> bool {
    containers.iter().all(|c| {
        !std::process::Command::new("docker")
            .args(["inspect", c])
            .output()
            .unwrap()
            .status
            .success()
    })
}

/// Removes leftover containers (a failed test must not leak them), by container id.
pub struct Cleanup(pub Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for container in &self.0 {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", container])
                .output();
        }
    }
}

/// The owner label of a user's /mcp sandboxes (`McpUsers::owner_of`).
pub fn mcp_owner(user_id: &str) -> String {
    sandboxd_core::sandbox::Owner::from_secret("serve-mcp", user_id.as_bytes()).to_string()
}

pub async fn me(api: &Api) -> Value {
    let (s, v) = api.json(Method::GET, "/v1/me", None).await;
    assert_eq!(s, 200, "{v}");
    v
}
