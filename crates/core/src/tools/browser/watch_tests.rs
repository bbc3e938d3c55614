//! The browser under the sandbox's watch, on a sandbox whose processes never answer and that
//! dies on demand: what gVisor's runsc does after an out-of-memory kill. Chromium is started
//! there but never announces its endpoint, so without the watch the action would wait for
//! the start's own 20 s limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;

use super::BrowserUse;
use crate::sandbox::{
    AttachedProcess, DirEntry, ExecOutput, ExecRequest, FileStat, Sandbox, SandboxError,
    ShellOptions, ShellOutput, SpawnRequest,
};
use crate::tools::{Tool, ToolContext, ToolError};

/// A sandbox whose file calls succeed and whose spawned processes stay silent forever.
struct Silent {
    alive: Arc<AtomicBool>,
    /// Set when the last spawned process's output stream is dropped (nobody reads it any more).
    released: Arc<AtomicBool>,
}

/// Sets its flag when dropped.
struct OnDrop(Arc<AtomicBool>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn refused(operation: &str) -> SandboxError {
    SandboxError::Backend {
        backend: "the fake backend",
        operation: operation.into(),
        message: "not offered".into(),
    }
}

#[async_trait]
impl Sandbox for Silent {
    fn session_id(&self) -> &str {
        "s1"
    }
    async fn exec(&self, _: ExecRequest) -> Result<ExecOutput, SandboxError> {
        Err(refused("exec"))
    }
    async fn spawn(&self, _: SpawnRequest) -> Result<AttachedProcess, SandboxError> {
        self.released.store(false, Ordering::SeqCst);
        let held = OnDrop(self.released.clone());
        Ok(AttachedProcess {
            stdin: Box::pin(tokio::io::sink()),
            output: Box::pin(futures::stream::poll_fn(move |_| {
                let _held = &held;
                Poll::Pending
            })),
            exit_code: Box::new(|| Box::pin(async { None })),
        })
    }
    async fn shell(&self, _: &str, _: ShellOptions) -> Result<ShellOutput, SandboxError> {
        Err(refused("shell"))
    }
    async fn restart_shell(&self) -> Result<(), SandboxError> {
        Ok(())
    }
    async fn read_file(&self, _: &str) -> Result<Vec<u8>, SandboxError> {
        Err(refused("read"))
    }
    async fn write_file(&self, _: &str, _: &[u8]) -> Result<(), SandboxError> {
        Err(refused("write"))
    }
    async fn list_dir(&self, _: &str) -> Result<Vec<DirEntry>, SandboxError> {
        Err(refused("list"))
    }
    async fn stat(&self, _: &str) -> Result<FileStat, SandboxError> {
        Err(refused("stat"))
    }
    async fn mkdir(&self, _: &str) -> Result<(), SandboxError> {
        Err(refused("mkdir"))
    }
    async fn remove(&self, _: &str, _: bool) -> Result<(), SandboxError> {
        Ok(())
    }
    async fn upload_tar(&self, _: &str, _: &[u8]) -> Result<(), SandboxError> {
        Err(refused("upload"))
    }
    async fn download_tar(&self, _: &str) -> Result<Vec<u8>, SandboxError> {
        Err(refused("download"))
    }
    async fn kill_tagged(&self, _: &str) -> Result<(), SandboxError> {
        Ok(())
    }
    async fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
    async fn check_alive(&self) -> Result<(), SandboxError> {
        if self.is_alive().await {
            Ok(())
        } else {
            Err(SandboxError::SandboxGone {
                session: "s1".into(),
                message: "it stopped running: it ran out of memory".into(),
            })
        }
    }
}

fn tool(alive: &Arc<AtomicBool>) -> (BrowserUse, Arc<AtomicBool>) {
    let released = Arc::new(AtomicBool::new(false));
    let sandbox = Silent {
        alive: alive.clone(),
        released: released.clone(),
    };
    (BrowserUse::new(Arc::new(sandbox)), released)
}

async fn go(tool: &BrowserUse) -> Result<crate::tools::ToolResult, ToolError> {
    tool.execute(
        json!({"action": "go_to_url", "url": "about:blank"}),
        &ToolContext::default(),
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_that_dies_under_the_browser_ends_the_action_with_the_reason() {
    let alive = Arc::new(AtomicBool::new(true));
    let (tool, released) = tool(&alive);
    let killer = {
        let alive = alive.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            alive.store(false, Ordering::SeqCst);
        })
    };
    let started = tokio::time::Instant::now();
    let err = go(&tool).await.expect_err("a dead sandbox cannot browse");
    // Virtual time: two looks a second apart after the death, not the start's 20 s limit.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(5) && waited <= Duration::from_secs(8),
        "{waited:?}"
    );
    match err {
        ToolError::Sandbox(SandboxError::SandboxGone { message, .. }) => {
            assert!(message.contains("ran out of memory"), "{message}")
        }
        other => panic!("not gone: {other}"),
    }
    // The start that was dropped half-way reads Chromium's stderr no longer.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(released.load(Ordering::SeqCst), "the stderr reader leaked");
    killer.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_live_sandbox_lets_a_slow_browser_start_run_to_its_own_limit() {
    let alive = Arc::new(AtomicBool::new(true));
    let (tool, _released) = tool(&alive);
    let started = tokio::time::Instant::now();
    let err = go(&tool)
        .await
        .expect_err("Chromium never announced itself");
    assert!(started.elapsed() >= Duration::from_secs(19));
    match err {
        ToolError::Internal(message) => {
            assert!(message.contains("no DevTools endpoint"), "{message}")
        }
        other => panic!("not the start's own failure: {other}"),
    }
}
