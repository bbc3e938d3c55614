//! ExecSandbox: the Sandbox trait for any backend that can start processes in a sandbox.
//!
//! Everything a session needs beyond starting a process is built here on top of that one
//! ability, the same for every backend: one-shot execs with capped output and timeouts, the
//! persistent shell, files through the in-sandbox file helper, archives through `tar` over
//! exec streams (an archive API fails on a read-only root) and killing by SANDBOXD_TAG. A
//! backend implements only `ExecBackend`: spawn a process, and say whether the sandbox lives.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::Mutex;

use super::framed::FramedProcess;
use super::fs_client;
use super::proxy_env::{ProxyEnvState, ProxySwitch};
use super::shell::PersistentShell;
use super::tar_safety::{self, TarLimits};
use super::{
    AttachedProcess, DirEntry, ExecOutput, ExecRequest, FileStat, Sandbox, SandboxError,
    ShellOptions, ShellOutput, ShellStream, SpawnRequest, resolve_path,
};
use crate::config::Limits;

/// What a backend provides for one sandbox.
#[async_trait]
pub trait ExecBackend: Send + Sync + 'static {
    /// Starts `req.argv` as the sandbox user (uid 1000) in `req.cwd` (default /workspace),
    /// stdout and stderr attached, stdin attached when `attach_stdin`. Failures to reach a
    /// sandbox that is gone are `SandboxError::SandboxGone`.
    async fn spawn(
        &self,
        req: &SpawnRequest,
        attach_stdin: bool,
    ) -> Result<AttachedProcess, SandboxError>;

    /// Whether the sandbox still runs; a cheap query of the backend.
    async fn is_alive(&self) -> bool;

    /// Whether the backend answered that the sandbox no longer runs (or no longer exists).
    /// Unlike `!is_alive()`, a query that failed is not a stop: it decides whether a call
    /// still waiting is cut off (watch.rs), so only a definite answer may.
    async fn is_stopped(&self) -> bool {
        !self.is_alive().await
    }

    /// Why a sandbox that no longer runs stopped, in words for the model and the user, when
    /// the backend knows (gVisor's out-of-memory or process-limit stop); None when it does not.
    async fn stop_reason(&self) -> Option<String> {
        None
    }

    /// The stdin of the sandbox's main process, once, where it was made to take a resume's
    /// archive there (`SandboxSpec::restore_bytes`; the image's init.sh unpacks it and hands
    /// its status to the shell, shell_restore.rs); None: the shell takes the archive itself.
    fn take_main_stdin(&self) -> Option<std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>> {
        None
    }
}

/// One session's sandbox over an exec backend.
pub struct ExecSandbox<B> {
    pub(super) backend: B,
    pub(super) session_id: String,
    pub(super) limits: Limits,
    shell: PersistentShell,
    /// The file helper's channel and the SANDBOXD_TAG that can kill it.
    pub(super) fs: Mutex<Option<(FramedProcess, String)>>,
    /// Whether processes see the egress proxy's variables.
    pub(super) proxy: ProxySwitch,
}

impl<B: ExecBackend> ExecSandbox<B> {
    pub fn new(backend: B, session_id: String, limits: Limits) -> Self {
        Self {
            backend,
            session_id,
            limits,
            shell: PersistentShell::new(),
            fs: Mutex::new(None),
            proxy: ProxySwitch::default(),
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// A failure of a sandbox that no longer runs is the sandbox being gone. When a container
    /// is removed under a call, the engine answers with a refusal, or writes its own error
    /// into the process's stream (Docker: "task … not found", "cannot exec in a stopped
    /// state", "OCI runtime exec failed"), which reads as a helper breaking its protocol;
    /// neither is sandboxd failing. The engine may report the dying container as running for
    /// a moment after such an error, so a running answer is checked once more.
    async fn gone_if_dead<T>(&self, r: Result<T, SandboxError>) -> Result<T, SandboxError> {
        match r {
            Err(
                e @ (SandboxError::Protocol { .. }
                | SandboxError::Backend { .. }
                | SandboxError::KillUnconfirmed { .. }),
            ) if !self.still_running().await => Err(self
                .gone(&format!("it stopped running during the call ({e})"))
                .await),
            other => other,
        }
    }

    /// Runs one call of the sandbox, watching that the sandbox keeps running under it
    /// (watch.rs): a sandbox found stopped while the call waits ends the call at once as
    /// gone, with the backend's reason, and the call's own failure is checked with
    /// `gone_if_dead`.
    pub(super) async fn watched<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, SandboxError>>,
    ) -> Result<T, SandboxError> {
        let r = super::watch::while_alive(self, call).await;
        match self.gone_if_dead(r).await {
            Err(SandboxError::SandboxGone { session, message }) => {
                // The call may have been dropped in the middle of a frame or a command: nothing
                // of its channels may be used again, whatever the next call finds.
                *self.fs.lock().await = None;
                self.shell.discard().await;
                // However the end was seen (the watch, or the shell's own stream closing, as
                // runsc sometimes does), it carries the backend's reason once.
                let message = match self.backend.stop_reason().await {
                    Some(why) if !message.contains(&why) => format!("{message}: {why}"),
                    _ => message,
                };
                Err(SandboxError::SandboxGone { session, message })
            }
            other => other,
        }
    }

    async fn gone(&self, what: &str) -> SandboxError {
        SandboxError::SandboxGone {
            session: self.session_id.clone(),
            message: match self.backend.stop_reason().await {
                Some(why) => format!("{what}: {why}"),
                None => what.to_string(),
            },
        }
    }

    async fn still_running(&self) -> bool {
        if self.backend.is_stopped().await {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        !self.backend.is_stopped().await
    }
}

pub(super) fn fs_error(
    op: &'static str,
    path: &str,
    resp: &serde_json::Value,
    limit: u64,
) -> SandboxError {
    let message = resp["message"].as_str().unwrap_or("failed").to_string();
    match resp["kind"].as_str() {
        Some("not_found") => SandboxError::NotFound { path: path.into() },
        Some("too_large") => SandboxError::FileTooLarge {
            path: path.into(),
            size: resp["size"].as_u64().unwrap_or(0),
            limit,
        },
        _ => SandboxError::FileOp {
            operation: op,
            path: path.into(),
            message,
        },
    }
}

#[async_trait]
impl<B: ExecBackend> Sandbox for ExecSandbox<B> {
    fn session_id(&self) -> &str {
        &self.session_id
    }

    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError> {
        let tag = format!("{:032x}", rand::random::<u128>());
        let mut req = req;
        req.timeout = req
            .timeout
            .min(Duration::from_secs(self.limits.max_timeout_secs));
        self.watched(self.collect(&req, &tag)).await
    }

    async fn spawn(&self, req: SpawnRequest) -> Result<AttachedProcess, SandboxError> {
        if req.argv.is_empty() {
            return Err(SandboxError::InvalidRequest("empty command".into()));
        }
        let mut req = req;
        req.env.splice(0..0, self.proxy.spawn_env());
        self.backend.spawn(&req, true).await
    }

    fn set_proxy_env(&self, on: bool) {
        self.proxy.set(on);
    }

    fn set_session_env(&self, env: Vec<(String, String)>) {
        self.proxy.set_session_env(env);
    }

    fn set_egress_trust(&self, on: bool) {
        self.proxy.set_trust(on);
    }

    fn proxy_env_state(&self) -> Option<ProxyEnvState> {
        Some(self.proxy.state())
    }

    async fn shell(&self, command: &str, opts: ShellOptions) -> Result<ShellOutput, SandboxError> {
        let mut opts = opts;
        opts.timeout = opts
            .timeout
            .min(Duration::from_secs(self.limits.max_timeout_secs));
        self.watched(self.shell.run(self, command, &opts)).await
    }

    async fn shell_stream(
        &self,
        command: &str,
        opts: ShellOptions,
        to: ShellStream,
    ) -> Result<ShellOutput, SandboxError> {
        let mut opts = opts;
        opts.timeout = opts
            .timeout
            .min(Duration::from_secs(self.limits.max_timeout_secs));
        self.watched(self.shell.run_streamed(self, command, &opts, &to))
            .await
    }

    async fn restart_shell(&self) -> Result<(), SandboxError> {
        self.shell.restart(self).await;
        Ok(())
    }

    async fn read_file(&self, path: &str) -> Result<Vec<u8>, SandboxError> {
        let path = resolve_path(path)?;
        let limit = self.limits.max_file_bytes();
        let (resp, body) = self
            .fs_call(json!({"op": "read", "path": path, "limit": limit}), &[])
            .await?;
        if resp["ok"] == true {
            Ok(body.to_vec())
        } else {
            Err(fs_error("read", &path, &resp, limit))
        }
    }

    async fn read_head(&self, path: &str, max: usize) -> Result<(Vec<u8>, u64), SandboxError> {
        let path = resolve_path(path)?;
        let limit = self.limits.max_file_bytes();
        let head = (max as u64).min(limit);
        let (resp, body) = self
            .fs_call(
                json!({"op": "read", "path": path, "limit": limit, "head": head}),
                &[],
            )
            .await?;
        if resp["ok"] != true {
            return Err(fs_error("read", &path, &resp, limit));
        }
        // The helper is hostile too: never keep more than was asked for.
        let mut data = body.to_vec();
        data.truncate(max);
        let size = resp["size"].as_u64().unwrap_or(0).max(data.len() as u64);
        Ok((data, size))
    }

    async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), SandboxError> {
        let path = resolve_path(path)?;
        let limit = self.limits.max_file_bytes();
        if data.len() as u64 > limit {
            return Err(SandboxError::FileTooLarge {
                path,
                size: data.len() as u64,
                limit,
            });
        }
        let (resp, _) = self
            .fs_call(json!({"op": "write", "path": path}), data)
            .await?;
        if resp["ok"] == true {
            Ok(())
        } else {
            Err(fs_error("write", &path, &resp, limit))
        }
    }

    async fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, SandboxError> {
        let path = resolve_path(path)?;
        let (resp, _) = self
            .fs_call(json!({"op": "list", "path": path}), &[])
            .await?;
        if resp["ok"] != true {
            return Err(fs_error("list", &path, &resp, 0));
        }
        serde_json::from_value(resp["entries"].clone()).map_err(|e| SandboxError::Protocol {
            helper: "sandboxd_fs".into(),
            message: e.to_string(),
        })
    }

    async fn stat(&self, path: &str) -> Result<FileStat, SandboxError> {
        let path = resolve_path(path)?;
        let (resp, _) = self
            .fs_call(json!({"op": "stat", "path": path}), &[])
            .await?;
        fs_client::parse_stat(&path, &resp).ok_or_else(|| fs_error("stat", &path, &resp, 0))
    }

    async fn mkdir(&self, path: &str) -> Result<(), SandboxError> {
        let path = resolve_path(path)?;
        let (resp, _) = self
            .fs_call(json!({"op": "mkdir", "path": path}), &[])
            .await?;
        if resp["ok"] == true {
            Ok(())
        } else {
            Err(fs_error("mkdir", &path, &resp, 0))
        }
    }

    async fn remove(&self, path: &str, recursive: bool) -> Result<(), SandboxError> {
        let path = resolve_path(path)?;
        let (resp, _) = self
            .fs_call(
                json!({"op": "remove", "path": path, "recursive": recursive}),
                &[],
            )
            .await?;
        if resp["ok"] == true {
            Ok(())
        } else {
            Err(fs_error("remove", &path, &resp, 0))
        }
    }

    async fn upload_tar(&self, dir: &str, archive: &[u8]) -> Result<(), SandboxError> {
        let dir = resolve_path(dir)?;
        let limits = TarLimits {
            max_total_bytes: (self.limits.workspace_mb).saturating_mul(1 << 20),
            ..TarLimits::default()
        };
        tar_safety::validate_archive(archive, &limits)?;
        let out = self
            .exec(
                ExecRequest::new([
                    "bash",
                    "-c",
                    "mkdir -p -- \"$1\" && exec tar -C \"$1\" -xf - --no-same-owner --no-same-permissions",
                    "upload",
                    &dir,
                ])
                .stdin(archive.to_vec())
                .timeout(Duration::from_secs(self.limits.max_timeout_secs)),
            )
            .await?;
        if out.success() {
            Ok(())
        } else {
            Err(SandboxError::FileOp {
                operation: "upload",
                path: dir,
                message: out.stderr_lossy().trim().to_string(),
            })
        }
    }

    async fn download_tar(&self, dir: &str) -> Result<Vec<u8>, SandboxError> {
        // Streamed through a bounded temp file with tar's stderr capped (copy_out.rs); only
        // the finished archive is read into memory, once.
        let cap = self.limits.workspace_mb.saturating_mul(1 << 20) + (1 << 20);
        let timeout = Duration::from_secs(self.limits.max_timeout_secs);
        let temp = tempfile::tempfile().map_err(|e| SandboxError::FileOp {
            operation: "download",
            path: dir.to_string(),
            message: format!("host temp file: {e}"),
        })?;
        let mut archive = super::copy_out::tar_to_file(self, dir, temp, cap, timeout).await?;
        let mut bytes = Vec::with_capacity(archive.len as usize);
        std::io::Read::read_to_end(&mut archive.file, &mut bytes).map_err(|e| {
            SandboxError::FileOp {
                operation: "download",
                path: dir.to_string(),
                message: e.to_string(),
            }
        })?;
        Ok(bytes)
    }

    async fn kill_tagged(&self, tag: &str) -> Result<(), SandboxError> {
        let mut req = SpawnRequest::new(super::helpers::argv("killtree.py", &["--tag", tag]));
        for (k, v) in super::helpers::env() {
            req = req.env(k, v);
        }
        let mut process = self.backend.spawn(&req, false).await?;
        let mut stderr = super::output::CappedBuffer::new(1024);
        let drain = async {
            while let Some(Ok(chunk)) = process.output.next().await {
                if let super::OutputChunk::Stderr(b) = chunk {
                    stderr.push(&b);
                }
            }
        };
        let drained = tokio::time::timeout(Duration::from_secs(10), drain).await;
        let exit = match drained {
            Ok(()) => (process.exit_code)().await,
            Err(_) => None,
        };
        if super::helpers::kill_confirmed(exit) {
            return Ok(());
        }
        let detail = String::from_utf8_lossy(&stderr.finish().0)
            .trim()
            .to_string();
        Err(SandboxError::KillUnconfirmed {
            what: format!("the processes tagged {tag}"),
            detail: if detail.is_empty() {
                format!("killtree ended with status {exit:?}")
            } else {
                detail
            },
        })
    }

    async fn is_alive(&self) -> bool {
        self.backend.is_alive().await
    }

    async fn check_alive(&self) -> Result<(), SandboxError> {
        if self.backend.is_stopped().await {
            Err(self.gone("it stopped running").await)
        } else {
            Ok(())
        }
    }

    async fn restore_in_shell(
        &self,
        archive: &std::fs::File,
        len: u64,
        timeout: Duration,
    ) -> Result<bool, SandboxError> {
        // Taken only when the shell is started here: else init.sh keeps waiting for it.
        let start = async {
            let main_stdin = self.backend.take_main_stdin();
            super::shell_restore::start_restoring(self, archive, len, main_stdin, timeout).await
        };
        self.watched(async {
            match self.shell.start_first(start).await {
                Some(started) => started.map(|()| true),
                None => Ok(false),
            }
        })
        .await
    }

    /// The shell and the file helper start concurrently: each is one attached process, and
    /// the engine starts execs in parallel.
    async fn warm_up(&self) -> Result<(), SandboxError> {
        let shell = async {
            let out = self.shell("true", ShellOptions::default()).await?;
            match out.exit_code {
                Some(0) => Ok(()),
                _ => Err(SandboxError::Protocol {
                    helper: "bash".into(),
                    message: "the shell did not answer its first command".into(),
                }),
            }
        };
        tokio::try_join!(shell, self.stat(super::WORKSPACE)).map(|_| ())
    }
}
