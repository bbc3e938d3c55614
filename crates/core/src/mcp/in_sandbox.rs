//! A stdio MCP server started inside the session's sandbox instead of on the host: its
//! command runs through the sandbox's `spawn` (as the sandbox user, in /workspace, with the
//! sandbox's limits, no network device and none of the host's files), and its stdin and
//! stdout become the MCP transport.
//!
//! The process's output arrives as one stream of stdout and stderr chunks; a small task
//! splits it into two bounded pipes, stdout to rmcp's line transport (which caps a message
//! at 16 MiB) and stderr to the server's stderr tail. When the connection is dropped the
//! pipes close, the task ends and drops the output stream, which closes the exec: the
//! server reads EOF, and whatever is left dies with the sandbox.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use crate::sandbox::{OutputChunk, Sandbox, SpawnRequest};

/// Chunks of each stream buffered ahead of their reader; the exec waits when they are full.
const PIPE_CHUNKS: usize = 16;

/// The server's stdout (for the transport) and stderr (for the tail), and its stdin.
pub(super) struct Pipes {
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    pub stderr: Box<dyn AsyncRead + Send + Unpin>,
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
}

pub(super) async fn start(
    sandbox: &Arc<dyn Sandbox>,
    command: &str,
    args: &[String],
    env: &[(String, String)],
) -> Result<Pipes, String> {
    let mut req =
        SpawnRequest::new(std::iter::once(command.to_string()).chain(args.iter().cloned()));
    req.env = env.to_vec();
    let process = sandbox
        .spawn(req)
        .await
        .map_err(|e| format!("cannot start {command:?} inside the sandbox: {e}"))?;
    let (out_tx, out_rx) = mpsc::channel::<std::io::Result<Bytes>>(PIPE_CHUNKS);
    let (err_tx, err_rx) = mpsc::channel::<std::io::Result<Bytes>>(PIPE_CHUNKS);
    let mut output = process.output;
    tokio::spawn(async move {
        while let Some(chunk) = output.next().await {
            let sent = match chunk {
                Ok(OutputChunk::Stdout(b)) => out_tx.send(Ok(b)).await.is_ok(),
                // The tail is only for error messages: a full stderr pipe drops, never blocks.
                Ok(OutputChunk::Stderr(b)) => {
                    let _ = err_tx.try_send(Ok(b));
                    true
                }
                Err(e) => {
                    let _ = out_tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    false
                }
            };
            if !sent {
                break;
            }
        }
    });
    Ok(Pipes {
        stdout: Box::new(reader(out_rx)),
        stderr: Box::new(reader(err_rx)),
        stdin: Box::new(process.stdin),
    })
}

fn reader(rx: mpsc::Receiver<std::io::Result<Bytes>>) -> ChannelReader {
    ChannelReader {
        rx,
        current: Bytes::new(),
    }
}

/// An `AsyncRead` over a channel of chunks (tokio-util's `StreamReader` would need its `io`
/// feature, and with it a rebuild of every crate that uses tokio-util, for these few lines).
struct ChannelReader {
    rx: mpsc::Receiver<std::io::Result<Bytes>>,
    current: Bytes,
}

impl AsyncRead for ChannelReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        while self.current.is_empty() {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(chunk))) => self.current = chunk,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                // The writer is gone: end of file.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = self.current.len().min(buf.remaining());
        let chunk = self.current.split_to(n);
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}
