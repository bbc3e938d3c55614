//! `sandboxd bench e2b`: the E2B-compatible API through the unmodified SDK (the Python
//! `e2b-code-interpreter`, driven line by line by e2b_driver.py in its venv) against the same
//! operations through /v1, interleaved on one server whose warm pool is full before every
//! create: create → first `commands.run("true")` (/v1: POST /v1/sessions, then POST exec
//! `true`), `commands.run("true")`'s round trip (/v1: POST exec), `run_code("1+1")` (/v1: the
//! python tool's call). The SDK's times include its own client work (httpx, JSON, Connect's
//! framing), as a user of the SDK sees them.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::server::{BenchServer, tempfile_dir};
use sandboxd_core::config::Config;
use sandboxd_core::sandbox::SessionManager;

const DRIVER: &str = include_str!("e2b_driver.py");

/// Each operation's times through the SDK and through /v1, unsorted.
#[derive(Default)]
pub struct E2bBench {
    pub sdk_create: Vec<Duration>,
    pub v1_create: Vec<Duration>,
    pub sdk_run: Vec<Duration>,
    pub v1_run: Vec<Duration>,
    pub sdk_code: Vec<Duration>,
    pub v1_code: Vec<Duration>,
}

/// Runs the benchmark against a server over `manager` (whose warm pool of `pool` sandboxes
/// its caller keeps refilling); `python` has the SDKs installed.
pub async fn bench_e2b(
    manager: Arc<SessionManager>,
    pool: usize,
    config: Config,
    python: &Path,
    samples: usize,
) -> anyhow::Result<E2bBench> {
    let server = BenchServer::start(manager.clone(), config, 1).await?;
    let result = async {
        let key = server
            .keys
            .first()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("the benchmark server has no user"))?;
        let mut driver = Driver::start(python, &server, &key).await?;
        let v1 = V1 {
            server: &server,
            key: &key,
        };
        let out = measure(&mut driver, &v1, &manager, pool, samples).await;
        let _ = driver.child.kill().await;
        let _ = std::fs::remove_dir_all(&driver.dir);
        out
    }
    .await;
    server.stop().await;
    result
}

async fn measure(
    driver: &mut Driver,
    v1: &V1<'_>,
    manager: &SessionManager,
    pool: usize,
    samples: usize,
) -> anyhow::Result<E2bBench> {
    let mut out = E2bBench::default();
    // One of each first, unmeasured (the SDK's imports and connections, the first claims).
    for i in 0..=samples {
        full_pool(manager, pool).await?;
        let sdk = driver.timed("create").await?;
        full_pool(manager, pool).await?;
        let ours = v1.create_and_run().await?;
        if i > 0 {
            out.sdk_create.push(sdk);
            out.v1_create.push(ours);
        }
    }
    driver.ask("open").await?;
    let session = v1.server.session(v1.key).await?;
    let result = async {
        for i in 0..=samples {
            let (a, b) = (driver.timed("run").await?, v1.run(&session).await?);
            let (c, d) = (driver.timed("code").await?, v1.code(&session).await?);
            if i > 0 {
                out.sdk_run.push(a);
                out.v1_run.push(b);
                out.sdk_code.push(c);
                out.v1_code.push(d);
            }
        }
        anyhow::Ok(())
    }
    .await;
    let _ = driver.ask("close").await;
    v1.server.delete_session(v1.key, &session).await;
    result.map(|()| out)
}

/// Waits (not timed) until the pool is full again and the last removal has settled, as
/// between real creates.
async fn full_pool(manager: &SessionManager, size: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while manager.pool_ready() < size {
        anyhow::ensure!(Instant::now() < deadline, "the pool did not refill");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

/// The SDK in its own python process.
struct Driver {
    child: Child,
    /// Where its script was written.
    dir: std::path::PathBuf,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Driver {
    async fn start(python: &Path, server: &BenchServer, key: &str) -> anyhow::Result<Driver> {
        let dir = tempfile_dir()?;
        let script = dir.join("e2b_driver.py");
        std::fs::write(&script, DRIVER)?;
        let mut child = tokio::process::Command::new(python)
            .arg(&script)
            .env("E2B_API_URL", format!("{}/e2b", server.base))
            .env("E2B_SANDBOX_URL", format!("{}/e2b/sandbox", server.base))
            .env("E2B_API_KEY", key)
            .env("E2B_HTTP_VERSION", "1.1")
            .env_remove("E2B_DOMAIN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", python.display()))?;
        let stdin = child.stdin.take().context("the driver's stdin")?;
        let stdout = child.stdout.take().context("the driver's stdout")?;
        Ok(Driver {
            child,
            dir,
            stdin,
            lines: BufReader::new(stdout).lines(),
        })
    }

    async fn ask(&mut self, command: &str) -> anyhow::Result<Value> {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        let line = self
            .lines
            .next_line()
            .await?
            .context("the SDK driver ended (its stderr says why)")?;
        let v: Value = serde_json::from_str(&line)?;
        if let Some(e) = v.get("error") {
            anyhow::bail!("the SDK's {command}: {e}");
        }
        Ok(v)
    }

    async fn timed(&mut self, command: &str) -> anyhow::Result<Duration> {
        let v = self.ask(command).await?;
        let ms = v["ms"].as_f64().context("the driver answered no time")?;
        Ok(Duration::from_secs_f64(ms / 1e3))
    }
}

/// The same operations through /v1.
struct V1<'a> {
    server: &'a BenchServer,
    key: &'a str,
}

impl V1<'_> {
    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        Ok(self
            .server
            .http
            .post(format!("{}{path}", self.server.base))
            .bearer_auth(self.key)
            .json(&body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    async fn exec_true(&self, id: &str) -> anyhow::Result<()> {
        let out = self
            .post(
                &format!("/v1/sessions/{id}/exec"),
                json!({"command": "true"}),
            )
            .await?;
        anyhow::ensure!(out["exit_code"] == 0, "exec true answered {out}");
        Ok(())
    }

    async fn create_and_run(&self) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let id = self.server.session(self.key).await?;
        let ran = self.exec_true(&id).await;
        let took = t.elapsed();
        self.server.delete_session(self.key, &id).await;
        ran.map(|()| took)
    }

    async fn run(&self, id: &str) -> anyhow::Result<Duration> {
        let t = Instant::now();
        self.exec_true(id).await?;
        Ok(t.elapsed())
    }

    async fn code(&self, id: &str) -> anyhow::Result<Duration> {
        let t = Instant::now();
        let out = self
            .post(
                &format!("/v1/sessions/{id}/tools/python"),
                json!({"code": "1+1"}),
            )
            .await?;
        let took = t.elapsed();
        anyhow::ensure!(
            out["output"].as_str().is_some_and(|o| o.contains('2')),
            "the python tool answered {out}"
        );
        Ok(took)
    }
}
