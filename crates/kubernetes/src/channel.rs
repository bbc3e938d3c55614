//! One exec as an `AttachedProcess`, over kube's upgraded WebSocket, with our own loop on
//! the channel protocol (rather than kube's `AttachedProcess`) so that what an operator
//! needs to know is decided here: frames are `[channel, bytes…]` with 0 stdin, 1 stdout,
//! 2 stderr, 3 the exit `Status` (JSON) and, on `v5.channel.k8s.io` only, 255 "close
//! channel N". Shutting stdin down sends `[255, 0]` on v5; a v4-only API server cannot close
//! stdin alone (only the whole socket, losing the output), so there the shutdown fails, and
//! the process's output ends, with an error that says so instead of hanging. Everything from the server is hostile: output
//! goes through a bounded channel (a slow reader stops the socket's reads, not memory), a
//! status frame is parsed once and bounded, unknown channels are dropped.

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::client::Connection;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use sandboxd_core::sandbox::{AttachedProcess, OutputChunk, SandboxError};

use crate::BACKEND;

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;
/// Output messages waiting for the reader; past this the socket is not read.
const OUTPUT_QUEUE: usize = 16;
/// A status object larger than this is not ours to parse.
const MAX_STATUS: usize = 64 * 1024;
/// Largest stdin frame sent at once.
const STDIN_FRAME: usize = 64 * 1024;

const V4_STDIN: &str = "the Kubernetes API server speaks only the v4.channel.k8s.io exec protocol, which cannot close a process's stdin without closing its output too (v5.channel.k8s.io can, from Kubernetes 1.30 with the WebSocket transport); a process that needs end of input cannot run there";

enum Stdin {
    Data(Bytes),
    Close,
}

/// Starts the loop of one exec connection and returns the process as the seam sees it.
pub(crate) fn attach(conn: Connection, session: String) -> AttachedProcess {
    let v5 = conn.supports_stream_close();
    let (stdin_tx, stdin_rx) = mpsc::channel::<Stdin>(4);
    let (out_tx, out_rx) = mpsc::channel(OUTPUT_QUEUE);
    let (code_tx, code_rx) = oneshot::channel();
    tokio::spawn(pump(conn, stdin_rx, out_tx, code_tx, session));
    let output = futures::stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .boxed();
    AttachedProcess {
        stdin: Box::pin(StdinWriter {
            tx: tokio_util::sync::PollSender::new(stdin_tx),
            v5,
            closed: false,
        }),
        output,
        exit_code: Box::new(move || Box::pin(async move { code_rx.await.ok().flatten() })),
    }
}

type Out = Result<OutputChunk, SandboxError>;

/// What one message from the server means for the process.
enum Inbound {
    Output(Out),
    /// The exit status came: the process has ended (an error when it could not run).
    Exit(Result<Option<i64>, String>),
    /// The socket ended or failed: the output ends with this error.
    End(String),
    Ignore,
}

fn inbound(msg: Option<Result<Message, WsError>>, session: &str) -> Inbound {
    match msg {
        Some(Ok(Message::Binary(b))) if b.len() > 1 => match b[0] {
            STDOUT => Inbound::Output(Ok(OutputChunk::Stdout(b.slice(1..)))),
            STDERR => Inbound::Output(Ok(OutputChunk::Stderr(b.slice(1..)))),
            STATUS => Inbound::Exit(exit_code(&b[1..])),
            _ => Inbound::Ignore,
        },
        // A kubelet that loses the container (evicted, deleted, OOM-killed pod) ends the
        // stream without a status: an error, which the sandbox checks against the pod's
        // state (gone, with the reason) before anyone sees it.
        Some(Ok(Message::Close(_))) | None => {
            Inbound::End("the exec stream ended without the process's exit status".into())
        }
        Some(Ok(_)) => Inbound::Ignore,
        Some(Err(e)) => Inbound::End(format!("the exec stream of session {session} failed: {e}")),
    }
}

/// The frame to send for one stdin event: Ok(None) sends nothing, Err ends the process's
/// output with the reason. v4 cannot say end of input, and the process would wait for it
/// forever, so a shutdown there ends the output with why (the writer's shutdown fails with
/// it too, which callers that ignore it would never see). Dropped without a shutdown: end of
/// input where the protocol can say it.
fn stdin_frame(input: Option<Stdin>, v5: bool) -> Result<Option<Vec<u8>>, String> {
    match input {
        Some(Stdin::Data(d)) => Ok(Some([&[STDIN][..], &d].concat())),
        Some(Stdin::Close) if !v5 => Err(V4_STDIN.into()),
        Some(Stdin::Close) | None => Ok(v5.then(|| vec![CLOSE, STDIN])),
    }
}

/// Reads frames into `out` and writes stdin frames, until the status frame or the end of
/// the socket. One output message is held at most while `out` is full, and stdin keeps
/// flowing meanwhile (a process blocked on input must not block its output's reader).
async fn pump(
    conn: Connection,
    mut stdin: mpsc::Receiver<Stdin>,
    out: mpsc::Sender<Out>,
    code: oneshot::Sender<Option<i64>>,
    session: String,
) {
    let v5 = conn.supports_stream_close();
    let (mut sink, mut stream) = conn.into_stream().split();
    let mut pending: Option<Out> = None;
    let mut stdin_open = true;
    let mut exit = None;
    loop {
        tokio::select! {
            permit = out.reserve(), if pending.is_some() => {
                let Ok(permit) = permit else { break };
                if let Some(item) = pending.take() {
                    permit.send(item);
                }
            }
            msg = stream.next(), if pending.is_none() => match inbound(msg, &session) {
                Inbound::Output(item) => pending = Some(item),
                Inbound::Exit(Ok(c)) => {
                    exit = c;
                    break;
                }
                Inbound::Exit(Err(why)) | Inbound::End(why) => {
                    pending = Some(Err(backend_err(why)));
                    break;
                }
                Inbound::Ignore => {}
            },
            input = stdin.recv(), if stdin_open => {
                let last = !matches!(input, Some(Stdin::Data(_)));
                match stdin_frame(input, v5) {
                    Err(why) => {
                        if let Some(item) = pending.replace(Err(backend_err(why))) {
                            let _ = out.send(item).await;
                        }
                        break;
                    }
                    Ok(frame) => {
                        let sent = match frame {
                            Some(f) => sink.send(Message::binary(f)).await.is_ok(),
                            None => true,
                        };
                        stdin_open = sent && !last;
                    }
                }
            }
        }
    }
    if let Some(item) = pending.take() {
        let _ = out.send(item).await;
    }
    let _ = sink.close().await;
    let _ = code.send(exit);
}

/// The exit code a status frame gives: `Success` is 0, `NonZeroExitCode` carries it in a
/// cause `ExitCode`; any other failure (the command could not start) is an error.
fn exit_code(raw: &[u8]) -> Result<Option<i64>, String> {
    if raw.len() > MAX_STATUS {
        return Err("the exec status was larger than any status".into());
    }
    let status: Status =
        serde_json::from_slice(raw).map_err(|e| format!("an unreadable exec status: {e}"))?;
    if status.status.as_deref() == Some("Success") {
        return Ok(Some(0));
    }
    if status.reason.as_deref() == Some("NonZeroExitCode") {
        let code = status
            .details
            .and_then(|d| d.causes)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.reason.as_deref() == Some("ExitCode"))
            .and_then(|c| c.message)
            .and_then(|m| m.trim().parse::<i64>().ok());
        return Ok(code);
    }
    let message: String = status
        .message
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .take(500)
        .collect();
    Err(format!("the process could not run: {message}"))
}

fn backend_err(message: String) -> SandboxError {
    SandboxError::Backend {
        backend: BACKEND,
        operation: "run a process".into(),
        message,
    }
}

/// The stdin of an exec: writes become stdin frames; shutdown closes stdin (v5) or fails
/// saying why it cannot (v4).
struct StdinWriter {
    tx: tokio_util::sync::PollSender<Stdin>,
    v5: bool,
    closed: bool,
}

impl StdinWriter {
    fn gone() -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "the process's exec stream has ended",
        )
    }
}

impl tokio::io::AsyncWrite for StdinWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        if self.closed {
            return Poll::Ready(Err(Self::gone()));
        }
        match self.tx.poll_reserve(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(_)) => return Poll::Ready(Err(Self::gone())),
            Poll::Ready(Ok(())) => {}
        }
        let n = buf.len().min(STDIN_FRAME);
        let data = Bytes::copy_from_slice(&buf[..n]);
        match self.tx.send_item(Stdin::Data(data)) {
            Ok(()) => Poll::Ready(Ok(n)),
            Err(_) => Poll::Ready(Err(Self::gone())),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        if self.closed {
            return Poll::Ready(Ok(()));
        }
        match self.tx.poll_reserve(cx) {
            Poll::Pending => Poll::Pending,
            // The loop has ended: the process is gone, and so is its stdin.
            Poll::Ready(Err(_)) => {
                self.closed = true;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Ok(())) => {
                self.closed = true;
                let _ = self.tx.send_item(Stdin::Close);
                if self.v5 {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::Unsupported,
                        V4_STDIN,
                    )))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_from_status_frames() {
        assert_eq!(exit_code(br#"{"status":"Success"}"#), Ok(Some(0)));
        let failed = br#"{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        assert_eq!(exit_code(failed), Ok(Some(3)));
        let cannot = br#"{"status":"Failure","reason":"InternalError","message":"exec: \"nope\": executable file not found\u001b[31m"}"#;
        let e = exit_code(cannot).unwrap_err();
        assert!(
            e.contains("executable file not found") && !e.contains('\u{1b}'),
            "{e}"
        );
        assert!(exit_code(b"{not json").is_err());
        assert!(exit_code(&vec![b' '; MAX_STATUS + 1]).is_err());
    }
}
