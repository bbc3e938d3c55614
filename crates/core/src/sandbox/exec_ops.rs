//! The two request/response loops of ExecSandbox: one-shot execs (output capped, a
//! deadline, the process tree killed on timeout) and calls to the file helper.

use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::exec_sandbox::{ExecBackend, ExecSandbox};
use super::framed::FramedProcess;
use super::output::CappedBuffer;
use super::{ExecOutput, ExecRequest, OutputChunk, Sandbox, SandboxError, SpawnRequest};

impl<B: ExecBackend> ExecSandbox<B> {
    /// One request to the session's file helper, started on first use. Each call has a
    /// deadline: the helper runs as the sandbox user, so sandboxed code can stop it (SIGSTOP)
    /// or hand it something that blocks, and the host must not wait for ever.
    pub(super) async fn fs_call(
        &self,
        op: serde_json::Value,
        body: &[u8],
    ) -> Result<(serde_json::Value, bytes::Bytes), SandboxError> {
        self.watched(self.fs_call_once(op, body)).await
    }

    async fn fs_call_once(
        &self,
        op: serde_json::Value,
        body: &[u8],
    ) -> Result<(serde_json::Value, bytes::Bytes), SandboxError> {
        let max_body = self.limits.max_file_bytes() as usize + 4096;
        let mut guard = self.fs.lock().await;
        for attempt in 0..2 {
            if guard.as_ref().is_none_or(|(f, _)| !f.is_usable()) {
                let tag = format!("{:032x}", rand::random::<u128>());
                let mut req = SpawnRequest::new(super::helpers::argv("sandboxd_fs.py", &[]));
                for (k, v) in super::helpers::env() {
                    req = req.env(k, v);
                }
                let req = req.env("SANDBOXD_TAG", tag.clone());
                let process = self.backend.spawn(&req, true).await?;
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

    /// Runs one process to its end (or its deadline), keeping the head and tail of each stream.
    pub(super) async fn collect(
        &self,
        req: &ExecRequest,
        tag: &str,
    ) -> Result<ExecOutput, SandboxError> {
        if req.argv.is_empty() {
            return Err(SandboxError::InvalidRequest("empty command".into()));
        }
        let started = Instant::now();
        let mut spawn = SpawnRequest::new(req.argv.iter().cloned()).env("SANDBOXD_TAG", tag);
        spawn.env.splice(0..0, req.env.iter().cloned());
        spawn.env.splice(0..0, self.proxy.spawn_env());
        spawn.cwd = req.cwd.clone();
        let mut process = self.backend.spawn(&spawn, req.stdin.is_some()).await?;
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
