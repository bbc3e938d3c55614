//! The exec plumbing of DockerSandbox: attached execs as AttachedProcess streams, one-shot
//! execs with capped output and timeouts, and the file helper's channel.

use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::docker::{SANDBOX_USER, docker_err};
use super::docker_sandbox::DockerSandbox;
use super::framed::FramedProcess;
use super::output::CappedBuffer;
use super::{AttachedProcess, ExecOutput, ExecRequest, OutputChunk, Sandbox, SandboxError};

impl DockerSandbox {
    pub(super) async fn start_exec(
        &self,
        argv: &[String],
        cwd: Option<&str>,
        env: &[(String, String)],
        stdin: bool,
    ) -> Result<(String, AttachedProcess), SandboxError> {
        if argv.is_empty() {
            return Err(SandboxError::InvalidRequest("empty command".into()));
        }
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let exec = self
            .docker
            .create_exec(
                &self.container_id,
                ExecConfig {
                    attach_stdin: Some(stdin),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(false),
                    cmd: Some(argv.to_vec()),
                    env: Some(env),
                    working_dir: Some(cwd.unwrap_or(super::WORKSPACE).to_string()),
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
            return Err(SandboxError::Docker {
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
        let exit_code: super::ExitProbe =
            Box::new(move || Box::pin(exec_exit_code(docker, exec_id)));
        let started = Box::pin(exec_started(self.docker.clone(), exec.id.clone()));
        let stdin = Box::pin(StdinGuard {
            inner: input,
            started: Some(started),
        });
        Ok((
            exec.id,
            AttachedProcess {
                stdin,
                output,
                exit_code,
            },
        ))
    }

    /// One request to the session's file helper, started on first use. Each call has a
    /// deadline: the helper runs as the sandbox user, so sandboxed code can stop it (SIGSTOP)
    /// or hand it something that blocks, and the host must not wait for ever.
    pub(super) async fn fs_call(
        &self,
        op: serde_json::Value,
        body: &[u8],
    ) -> Result<(serde_json::Value, bytes::Bytes), SandboxError> {
        let max_body = self.limits.max_file_bytes() as usize + 4096;
        let mut guard = self.fs.lock().await;
        for attempt in 0..2 {
            if guard.as_ref().is_none_or(|(f, _)| !f.is_usable()) {
                let tag = format!("{:032x}", rand::random::<u128>());
                let argv = [
                    "python3".to_string(),
                    format!("{}/sandboxd_fs.py", super::HELPERS_DIR),
                ];
                let env = [("SANDBOXD_TAG".to_string(), tag.clone())];
                let (_, process) = self.start_exec(&argv, None, &env, true).await?;
                let mut framed = FramedProcess::new("sandboxd_fs", process, max_body);
                match tokio::time::timeout(FS_TIMEOUT, framed.recv()).await {
                    Ok(hello) => hello?,
                    Err(_) => {
                        self.kill_tagged(&tag).await?;
                        return Err(fs_timeout());
                    }
                };
                *guard = Some((framed, tag));
            }
            let Some((framed, tag)) = guard.as_mut() else {
                continue;
            };
            match tokio::time::timeout(FS_TIMEOUT, framed.call(&op, body)).await {
                Ok(Ok(resp)) => return Ok(resp),
                Ok(Err(e)) if attempt == 0 && !framed.is_usable() => {
                    tracing::warn!(session = %self.session_id, error = %e, "file helper failed; restarting it");
                    *guard = None;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    let tag = tag.clone();
                    *guard = None;
                    self.kill_tagged(&tag).await?;
                    return Err(fs_timeout());
                }
            }
        }
        Err(SandboxError::Protocol {
            helper: "sandboxd_fs".into(),
            message: "the file helper failed twice in a row".into(),
        })
    }

    pub(super) async fn collect(
        &self,
        req: &ExecRequest,
        tag: &str,
    ) -> Result<ExecOutput, SandboxError> {
        let started = Instant::now();
        let mut env = req.env.clone();
        env.push(("SANDBOXD_TAG".into(), tag.into()));
        let (_, mut process) = self
            .start_exec(&req.argv, req.cwd.as_deref(), &env, req.stdin.is_some())
            .await?;
        let writer = req.stdin.clone().map(|data| {
            let mut stdin = process.stdin;
            tokio::spawn(async move {
                let _ = stdin.write_all(&data).await;
                let _ = stdin.shutdown().await;
            })
        });
        let mut out = CappedBuffer::new(req.output_cap);
        let mut err = CappedBuffer::new(req.output_cap);
        let read = async {
            while let Some(chunk) = process.output.next().await {
                match chunk? {
                    OutputChunk::Stdout(b) => out.push(&b),
                    OutputChunk::Stderr(b) => err.push(&b),
                }
            }
            Ok::<(), SandboxError>(())
        };
        let timed_out = match tokio::time::timeout(req.timeout, read).await {
            Ok(res) => {
                res?;
                false
            }
            Err(_) => true,
        };
        if let Some(w) = writer {
            w.abort();
        }
        if timed_out {
            self.kill_tagged(tag).await?;
        }
        let exit_code = if timed_out {
            None
        } else {
            (process.exit_code)().await
        };
        let (stdout, stdout_truncated) = out.finish();
        let (stderr, stderr_truncated) = err.finish();
        Ok(ExecOutput {
            exit_code,
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            timed_out,
            duration: started.elapsed(),
        })
    }
}

/// How long one file operation may take; 100 MiB moves in about a second here.
const FS_TIMEOUT: Duration = Duration::from_secs(60);

fn fs_timeout() -> SandboxError {
    SandboxError::Timeout {
        what: "the file operation (the in-sandbox file helper stopped answering and was restarted)"
            .into(),
        after: FS_TIMEOUT,
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
