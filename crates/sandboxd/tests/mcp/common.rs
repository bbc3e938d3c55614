//! Shared plumbing of the MCP tests: the sandboxd binary as an MCP server (stdio entry or
//! `mcp --listen` child), the Python SDK virtualenv, and guards that remove containers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use sandboxd_core::mcp::config::{ServerConfig, Transport};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub const TOKEN: &str = "test-token-0123456789abcdef";

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_sandboxd")
}

/// Variables the sandboxd child needs (its environment is otherwise empty).
pub fn child_env() -> Vec<(String, String)> {
    ["SANDBOXD_DOCKER_IMAGE", "DOCKER_HOST", "SANDBOXD_LOG"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect()
}

/// `sandboxd mcp` over stdio as an mcp.json entry.
pub fn stdio_self(name: &str) -> ServerConfig {
    ServerConfig {
        name: name.into(),
        transport: Transport::Stdio {
            command: bin().into(),
            args: vec!["mcp".into()],
            env: child_env(),
            host: true,
        },
        keep_names: false,
        refresh_every: 5,
    }
}

/// The Python interpreter of the venv with the official `mcp` SDK:
/// SANDBOXD_TEST_MCP_PYTHON, else .venv-mcp in the repo, else /work/.venv-mcp.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("SANDBOXD_TEST_MCP_PYTHON") {
        return PathBuf::from(p);
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv-mcp/bin/python");
    if repo.exists() {
        return repo;
    }
    let shared = PathBuf::from("/work/.venv-mcp/bin/python");
    assert!(
        shared.exists(),
        "the Python MCP SDK is missing: python3 -m venv .venv-mcp && .venv-mcp/bin/pip install 'mcp==2.3.0'"
    );
    shared
}

pub fn script(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp")
        .join(name)
        .display()
        .to_string()
}

/// The third-party Python server as an mcp.json entry.
pub fn py_server(name: &str, keep_names: bool) -> ServerConfig {
    ServerConfig {
        name: name.into(),
        transport: Transport::Stdio {
            command: python().display().to_string(),
            args: vec![script("server_sdk.py")],
            env: vec![("GREETING".into(), "hi".into())],
            host: true,
        },
        keep_names,
        refresh_every: 5,
    }
}

/// Removes the listed containers on drop (ids learnt from `hostname` inside them).
#[derive(Default)]
pub struct Containers(pub Vec<String>);

impl Containers {
    pub fn add(&mut self, id: &str) {
        self.0.push(id.trim().to_string());
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        for id in &self.0 {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", id])
                .output();
        }
    }
}

pub fn container_exists(id: &str) -> bool {
    std::process::Command::new("docker")
        .args(["inspect", "--format", "{{.State.Status}}", id.trim()])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Waits until the container is gone; false after `limit`.
pub async fn wait_gone(id: &str, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if !container_exists(id) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// A running `sandboxd mcp --listen 127.0.0.1:0`.
pub struct Listener {
    pub child: Child,
    pub url: String,
    pub stderr_lines: Vec<String>,
}

impl Listener {
    pub async fn start(token: Option<&str>) -> Listener {
        Self::start_with_env(token, &[]).await
    }

    pub async fn start_with_env(token: Option<&str>, env: &[(&str, &str)]) -> Listener {
        let mut cmd = Command::new(bin());
        cmd.envs(env.iter().copied());
        cmd.args(["mcp", "--listen", "127.0.0.1:0"])
            .env_remove("SANDBOXD_MCP_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(t) = token {
            cmd.env("SANDBOXD_MCP_TOKEN", t);
        }
        let mut child = cmd.spawn().expect("start sandboxd mcp --listen");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let mut seen = Vec::new();
        let url = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.expect("read stderr") {
                seen.push(line.clone());
                if let Some(rest) = line.split("listening on ").nth(1) {
                    return rest.trim().to_string();
                }
            }
            panic!("sandboxd mcp exited before listening: {seen:?}");
        })
        .await
        .expect("sandboxd mcp --listen did not start within 60 s");
        // Keep draining stderr so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Listener {
            child,
            url,
            stderr_lines: Vec::new(),
        }
    }

    /// SIGTERM, then wait: the server removes its sandboxes on the way out.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }
}
