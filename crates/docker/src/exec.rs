//! The Docker exec backend: a process in a session container as an AttachedProcess (an
//! attached `docker exec`), and the container's liveness. Everything else a sandbox does is
//! built on these two in exec_sandbox.rs.

use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use bollard::query_parameters::InspectContainerOptions;
use futures::StreamExt;
use tokio::io::AsyncWrite;

use crate::{BACKEND, SANDBOX_USER, docker_err};
use sandboxd_core::sandbox::exec_sandbox::{ExecBackend, ExecSandbox};
use sandboxd_core::sandbox::{AttachedProcess, OutputChunk, SandboxError, SpawnRequest};

/// The Sandbox on one Docker container.
pub type DockerSandbox = ExecSandbox<DockerExec>;

/// One session container, reached through exec and attached streams.
pub struct DockerExec {
    pub(super) docker: Docker,
    pub(super) container_id: String,
    /// For error messages: which session's container failed.
    pub(super) session_id: String,
    /// A resume's container: its main process's stdin, until the restore takes it
    /// (restore.rs).
    pub(super) main_stdin: std::sync::Mutex<Option<Pin<Box<dyn AsyncWrite + Send>>>>,
}

impl DockerExec {
    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    /// Whether a resume's archive can still go to the main process (restore.rs): made for
    /// one, and not yet taken.
    pub fn main_stdin_pending(&self) -> bool {
        self.main_stdin
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

#[async_trait]
impl ExecBackend for DockerExec {
    async fn spawn(
        &self,
        req: &SpawnRequest,
        attach_stdin: bool,
    ) -> Result<AttachedProcess, SandboxError> {
        let env: Vec<String> = req.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let exec = self
            .docker
            .create_exec(
                &self.container_id,
                ExecConfig {
                    attach_stdin: Some(attach_stdin),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(false),
                    cmd: Some(req.argv.clone()),
                    env: Some(env),
                    working_dir: Some(
                        req.cwd
                            .as_deref()
                            .unwrap_or(sandboxd_core::sandbox::WORKSPACE)
                            .to_string(),
                    ),
                    user: Some(SANDBOX_USER.into()),
                    privileged: Some(false),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| docker_err("start a process", &self.session_id, e))?;
        let started = self
            .docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: Some(64 * 1024),
                }),
            )
            .await
            .map_err(|e| docker_err("attach to a process", &self.session_id, e))?;
        let StartExecResults::Attached { output, input } = started else {
            return Err(SandboxError::Backend {
                backend: BACKEND,
                operation: "attach to a process".into(),
                message: "the engine started it detached".into(),
            });
        };
        let session = self.session_id.clone();
        let output = output
            .filter_map(move |item| {
                let mapped = match item {
                    Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                        Some(Ok(OutputChunk::Stdout(message)))
                    }
                    Ok(LogOutput::StdErr { message }) => Some(Ok(OutputChunk::Stderr(message))),
                    Ok(LogOutput::StdIn { .. }) => None,
                    Err(e) => Some(Err(docker_err("read process output", &session, e))),
                };
                futures::future::ready(mapped)
            })
            .boxed();
        let docker = self.docker.clone();
        let exec_id = exec.id.clone();
        let exit_code: sandboxd_core::sandbox::ExitProbe =
            Box::new(move || Box::pin(exec_exit_code(docker, exec_id)));
        let started = Box::pin(exec_started(self.docker.clone(), exec.id.clone()));
        let stdin = Box::pin(StdinGuard {
            inner: input,
            started: Some(started),
        });
        Ok(AttachedProcess {
            stdin,
            output,
            exit_code,
        })
    }

    /// The attached stdin of a resume's container (restore.rs), once.
    fn take_main_stdin(&self) -> Option<Pin<Box<dyn AsyncWrite + Send>>> {
        self.main_stdin
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Running, and not being removed: during `docker rm -f` the engine may still say
    /// `running` for a moment while the status already reads `removing`.
    async fn is_alive(&self) -> bool {
        use bollard::models::ContainerStateStatusEnum as S;
        let info = self
            .docker
            .inspect_container(&self.container_id, None::<InspectContainerOptions>)
            .await;
        let Ok(info) = info else {
            return false;
        };
        let Some(state) = info.state else {
            return false;
        };
        state.running == Some(true)
            && !matches!(state.status, Some(S::REMOVING | S::DEAD | S::STOPPING))
    }

    async fn is_stopped(&self) -> bool {
        use bollard::models::ContainerStateStatusEnum as S;
        match self
            .docker
            .inspect_container(&self.container_id, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => info.state.is_none_or(|state| {
                state.running != Some(true) || matches!(state.status, Some(S::REMOVING | S::DEAD))
            }),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => true,
            // The engine did not answer: that says nothing about the container.
            Err(_) => false,
        }
    }

    /// Only gVisor's stops are explained: there the whole sandbox ends when it runs out of
    /// memory or reaches its process limit. Under runc an out-of-memory kill takes one
    /// process, and Docker's OOMKilled stays set after it, so it says nothing about a later stop.
    async fn stop_reason(&self) -> Option<String> {
        let info = self
            .docker
            .inspect_container(&self.container_id, None::<InspectContainerOptions>)
            .await
            .ok()?;
        let host = info.host_config.unwrap_or_default();
        if !host.runtime.as_deref().is_some_and(crate::is_gvisor) {
            return None;
        }
        let state = info.state.unwrap_or_default();
        if state.running == Some(true) {
            return None;
        }
        let limit = host.memory.unwrap_or(0) >> 20;
        Some(if state.oom_killed == Some(true) {
            format!(
                "it ran out of memory (limit {limit} MiB) and, under gVisor (runsc), that kills the whole sandbox, not only the process that asked: gVisor's kernel is the process the host's out-of-memory killer takes. Start a new session with a higher memory limit, or use the runc runtime, where only that process is killed"
            )
        } else {
            format!(
                "gVisor's kernel stopped (exit code {}); under gVisor (runsc) the whole sandbox stops when it reaches its process limit (a fork bomb, or too many processes) or its memory limit. Start a new session with fewer processes, or use the runc runtime, where only the new process is refused",
                state.exit_code.unwrap_or(-1)
            )
        })
    }
}

/// Waits until the engine reports the exec's process as started (or already finished).
async fn exec_started(docker: Docker, exec_id: String) {
    for _ in 0..400 {
        match docker.inspect_exec(&exec_id).await {
            Ok(info) if info.running == Some(true) || info.exit_code.is_some() => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(_) => return,
        }
    }
}

/// The stdin of an attached exec. Docker 20.10 answers a stdin close that arrives before the
/// process has started with "task … not found" instead of EOF, so shutdown waits for the start.
struct StdinGuard {
    inner: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    started: Option<futures::future::BoxFuture<'static, ()>>,
}

impl tokio::io::AsyncWrite for StdinGuard {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.inner.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.inner.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if let Some(started) = self.started.as_mut() {
            if started.as_mut().poll(cx).is_pending() {
                return std::task::Poll::Pending;
            }
            self.started = None;
        }
        self.inner.as_mut().poll_shutdown(cx)
    }
}

async fn exec_exit_code(docker: Docker, exec_id: String) -> Option<i64> {
    // The output can end a moment before the engine marks the exec finished.
    for _ in 0..100 {
        match docker.inspect_exec(&exec_id).await {
            Ok(info) if info.running == Some(false) => return info.exit_code,
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(_) => return None,
        }
    }
    None
}
