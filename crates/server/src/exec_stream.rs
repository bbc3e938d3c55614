//! POST /v1/sessions/{id}/exec/stream: a shell command in the session's persistent bash, its
//! output streamed as Server-Sent Events while it runs, then one `exit` event.
//!
//! SSE rather than NDJSON: the runs' event routes speak SSE, so a client needs one parser for
//! both; `event:` names each piece without a wrapper object; comment lines keep idle
//! connections alive through proxies; `curl -N` shows it readably. (EventSource cannot POST;
//! the stream is meant for fetch-based readers and scripts.)
//!
//! It runs in the same persistent shell as the sync exec (same cwd, exports and
//! serialization with it) and keeps the same caps: per stream, the first half of the output
//! cap goes out live, then a `holding` event, and when the command ends a `cut` event (bytes
//! dropped from the middle) and the kept tail. Every piece is at most `MAX_PIECE` bytes of
//! output. Output is hostile bytes: it is decoded as UTF-8 with invalid bytes replaced
//! (U+FFFD), a character split across pieces kept whole, and always sent as a JSON string.
//!
//! The command runs on its own task; the response stream holds a guard whose drop (client
//! gone, server shutting down) stops it, and the shell kills its process tree as on a timeout.
//! The stream selects on its `StreamGuard`'s token (a child of the shutdown token), so an
//! open stream never holds the drain, and a revoked credential (rotated key, removed user,
//! sign-out) ends it with a `credential_revoked` error and kills the command.
//!
//! Across replicas there is no final state to share, so none is stored: the replica that took
//! the POST runs the command and sends its `exit` (or `error`) on that same response, and
//! nowhere else. The stream has no id and no route returns its end later, and the command is
//! not meant to outlive its stream: a client that leaves kills it (the drop guard here), and
//! a replica that dies takes the stream with it, whatever the command left running being
//! killed by the next process that attaches the session (`shell::SHELL_TAG`). So no replica
//! holds the end of a command another could be asked about. A client cut off between the end and
//! the `exit` event cannot learn the exit code anywhere, on one replica as on several; making
//! that recoverable means detached execs with ids, a feature, not a replica's concern.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::Caller;
use crate::backend::Live;
use crate::error::{ApiError, ApiJson, ApiPath, ErrorBody, ErrorCode, ErrorResponses};
use crate::sessions::{TIMEOUT_HEADER, exec_target, sandbox_failed};
use crate::streams::{Kind, StreamGuard};
use crate::types::ExecBody;
use sandboxd_core::sandbox::in_use::InUse;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::{
    MAX_PIECE, SandboxError, ShellOutput, ShellPiece, ShellStream, StdStream,
};

/// Pieces in flight between the shell and the response: with `MAX_PIECE` each, the most a
/// slow client makes the host hold for one stream.
const CHANNEL: usize = 16;
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One event as an SSE parser hands it over: `event` is the type, `data` one line of JSON
/// (`ExecText` for stdout/stderr, `ExecHolding`, `ExecCut`, `ExecExit`, or `ErrorBody` for
/// error). The stream ends after `exit` or `error`.
#[derive(Debug, Clone, ToSchema)]
pub struct ExecStreamEvent {
    pub event: ExecEventType,
    /// The event's JSON payload, on one line.
    pub data: String,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecEventType {
    Stdout,
    Stderr,
    Holding,
    Cut,
    Exit,
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StreamName {
    Stdout,
    Stderr,
}

impl From<StdStream> for StreamName {
    fn from(s: StdStream) -> Self {
        match s {
            StdStream::Stdout => StreamName::Stdout,
            StdStream::Stderr => StreamName::Stderr,
        }
    }
}

/// `stdout`/`stderr`: output text, in order (invalid UTF-8 replaced by U+FFFD).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExecText {
    pub text: String,
}

/// `holding`: the stream passed half the output cap; the rest of it is kept as a tail and
/// sent (after `cut`, if anything was dropped) when the command ends.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExecHolding {
    pub stream: StreamName,
}

/// `cut`: `bytes` were dropped from the middle of the stream here; its kept tail follows.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExecCut {
    pub stream: StreamName,
    pub bytes: u64,
}

/// `exit`: the command ended; the fields of the sync exec's answer without the output.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExecExit {
    /// None when the command was killed (timeout) or the shell restarted.
    pub exit_code: Option<i32>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    pub duration_ms: u64,
    /// What sandboxd did besides running the command (a restarted shell, an OOM kill).
    pub note: Option<String>,
    /// The timeout the command ran under, in seconds (also the `Sandboxd-Timeout` header).
    pub timeout: u64,
}

impl ExecExit {
    fn new(o: &ShellOutput, timeout: u64) -> Self {
        ExecExit {
            exit_code: o.exit_code,
            stdout_truncated: o.stdout_truncated,
            stderr_truncated: o.stderr_truncated,
            timed_out: o.timed_out,
            duration_ms: o.duration.as_millis() as u64,
            note: o.note.clone(),
            timeout,
        }
    }
}

#[utoipa::path(post, path = "/v1/sessions/{id}/exec/stream", tag = "sessions", request_body = ExecBody,
    params(("id" = String, Path, description = "The session id")),
    responses(
        (status = 200, description = "The command started; its output follows as Server-Sent Events (`stdout`, `stderr`, `holding`, `cut`), then `exit` (or `error`), then the stream ends. Comment lines `: keep-alive` come every 15 s. Closing the connection kills the command.",
            content_type = "text/event-stream", body = ExecStreamEvent,
            headers(("Sandboxd-Timeout" = u64, description = "The timeout the command runs under, in seconds"))),
        ErrorResponses),
    security(("bearer" = [])))]
pub async fn exec_stream(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ExecBody>,
) -> Result<Response, ApiError> {
    let (live, opts) = exec_target(&st, &caller, &id, &body).await?;
    let timeout = opts.timeout.as_secs();
    // Counted against the caller's streams and ended when their credential is revoked; taken
    // before the command starts, so a refusal is an HTTP status.
    let guard = st.streams.open(&caller, Kind::Stream, &st.shutdown)?;
    // In use until the stream is dropped: the command may outlast the idle timeout.
    let in_use = live.hold();
    let (tx, mut rx) = mpsc::channel(CHANNEL);
    let cancel = CancellationToken::new();
    // Made before anything can fail or be dropped: a client that leaves while the command
    // waits for the shell stops it too.
    let stop = cancel.clone().drop_guard();
    let to = ShellStream { tx, cancel };
    let sandbox = live.sandbox.clone();
    let command = body.command;
    let mut task = tokio::spawn(async move { sandbox.shell_stream(&command, opts, to).await });
    // Answer with an HTTP status until the command is in the shell, so a session that cannot
    // run it (container gone, shell broken) gets the same error as the sync exec.
    let first = tokio::select! {
        first = rx.recv() => first,
        _ = guard.token().cancelled() => {
            return Err(match guard.revoked() {
                Some(why) => why.error(),
                None => ApiError::new(ErrorCode::ShuttingDown, "the server is shutting down; retry against the next one"),
            });
        }
    };
    let mut peeked = None;
    match first {
        Some(ShellPiece::Started) => {}
        Some(other) => peeked = Some(other),
        None => {
            let out = match (&mut task).await {
                Ok(Ok(out)) => out,
                Ok(Err(e)) => return Err(sandbox_failed(&st, &live, e).await),
                Err(e) => return Err(ApiError::internal(e)),
            };
            task = tokio::spawn(async move { Ok(out) });
        }
    }
    let feed = Feed {
        st: st.clone(),
        live,
        rx,
        task: Some(task),
        peeked,
        timeout,
        text: [Utf8Carry::default(), Utf8Carry::default()],
        ready: VecDeque::new(),
        done: false,
        _stop: stop,
        _in_use: in_use,
        guard,
    };
    let events = futures::stream::unfold(feed, |mut feed| async move {
        let event = feed.next().await?;
        Some((Ok::<Event, std::convert::Infallible>(event), feed))
    });
    let mut resp = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response();
    // Proxies (nginx) would otherwise buffer the stream.
    resp.headers_mut().insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    resp.headers_mut()
        .insert(TIMEOUT_HEADER, axum::http::HeaderValue::from(timeout));
    Ok(resp)
}

/// The response stream's state: pieces from the shell in, SSE events out.
struct Feed {
    st: Arc<AppState>,
    live: Arc<Live>,
    rx: mpsc::Receiver<ShellPiece>,
    task: Option<JoinHandle<Result<ShellOutput, SandboxError>>>,
    peeked: Option<ShellPiece>,
    /// The timeout the command runs under, in seconds, for the `exit` event.
    timeout: u64,
    /// Per stream (stdout, stderr): the start of a character split across pieces.
    text: [Utf8Carry; 2],
    ready: VecDeque<Event>,
    done: bool,
    /// Dropped with the stream: stops the command.
    _stop: DropGuard,
    /// Dropped with the stream: the session's idle time starts again.
    _in_use: InUse<Arc<Session>>,
    /// The stream's slot; its token is cancelled at shutdown or when the credential is revoked.
    guard: StreamGuard,
}

fn json_event(kind: &str, data: &impl Serialize) -> Event {
    Event::default()
        .event(kind)
        .json_data(data)
        .unwrap_or_else(|_| Event::default().event("error").data("{}"))
}

fn error_event(e: &ApiError) -> Event {
    json_event(
        "error",
        &ErrorBody {
            error: e.detail.clone(),
        },
    )
}

fn slot(s: StdStream) -> usize {
    match s {
        StdStream::Stdout => 0,
        StdStream::Stderr => 1,
    }
}

impl Feed {
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Some(e);
            }
            if self.done {
                return None;
            }
            let piece = match self.peeked.take() {
                Some(p) => Some(p),
                None => tokio::select! {
                    p = self.rx.recv() => p,
                    _ = self.guard.token().cancelled() => {
                        // Ending the stream drops `_stop`, which kills the command.
                        self.done = true;
                        return Some(match self.guard.revoked() {
                            Some(why) => error_event(&why.error()),
                            None => error_event(&ApiError::new(
                                ErrorCode::ShuttingDown,
                                "the server is shutting down, so the command was stopped",
                            )),
                        });
                    }
                },
            };
            match piece {
                Some(ShellPiece::Started) => {}
                Some(ShellPiece::Output(stream, data)) => self.output(stream, data.to_vec()),
                Some(ShellPiece::Holding(stream)) => self.ready.push_back(json_event(
                    "holding",
                    &ExecHolding {
                        stream: stream.into(),
                    },
                )),
                Some(ShellPiece::Cut { stream, bytes }) => {
                    self.flush_text(stream);
                    self.ready.push_back(json_event(
                        "cut",
                        &ExecCut {
                            stream: stream.into(),
                            bytes,
                        },
                    ));
                }
                None => self.end().await,
            }
        }
    }

    /// Coalesces the pieces of one stream that are already waiting (up to `MAX_PIECE`
    /// bytes), so a flood of tiny writes does not become a flood of events.
    fn output(&mut self, stream: StdStream, mut data: Vec<u8>) {
        while data.len() < MAX_PIECE {
            match self.rx.try_recv() {
                Ok(ShellPiece::Output(s, more))
                    if s == stream && data.len() + more.len() <= MAX_PIECE =>
                {
                    data.extend_from_slice(&more)
                }
                Ok(other) => {
                    self.peeked = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let text = self.text[slot(stream)].decode(&data);
        self.push_text(stream, text);
    }

    fn push_text(&mut self, stream: StdStream, text: String) {
        if text.is_empty() {
            return;
        }
        let kind = match stream {
            StdStream::Stdout => "stdout",
            StdStream::Stderr => "stderr",
        };
        self.ready.push_back(json_event(kind, &ExecText { text }));
    }

    fn flush_text(&mut self, stream: StdStream) {
        let text = self.text[slot(stream)].flush();
        self.push_text(stream, text);
    }

    /// The shell call ended (its sender is gone): the last text, then `exit` or `error`.
    async fn end(&mut self) {
        self.done = true;
        self.flush_text(StdStream::Stdout);
        self.flush_text(StdStream::Stderr);
        let Some(task) = self.task.take() else {
            return;
        };
        let event = match task.await {
            Ok(Ok(out)) => json_event("exit", &ExecExit::new(&out, self.timeout)),
            Ok(Err(e)) => error_event(&sandbox_failed(&self.st, &self.live, e).await),
            Err(e) => error_event(&ApiError::internal(e)),
        };
        self.ready.push_back(event);
    }
}

/// Decodes one stream's bytes as UTF-8 with invalid bytes replaced, holding back a character
/// that is split across pieces: the result equals decoding the whole stream at once.
#[derive(Default)]
struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    fn decode(&mut self, data: &[u8]) -> String {
        let mut bytes = std::mem::take(&mut self.pending);
        bytes.extend_from_slice(data);
        let held = incomplete_tail(&bytes);
        self.pending = bytes.split_off(bytes.len() - held);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn flush(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }
}

/// How many bytes at the end start a UTF-8 sequence that is not complete yet (0–3).
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let c = b[b.len() - back];
        if c & 0xC0 == 0x80 {
            continue;
        }
        let need = match c {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if back < need { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_characters_and_invalid_bytes_decode_as_the_whole_would() {
        let mut whole = "héllo wörld ✓ 𝄞 ".repeat(3).into_bytes();
        whole.extend_from_slice(&[0xff, b'a', 0xe2, 0x82, b'b', 0xf0, 0x9f, 0x98]);
        whole.extend_from_slice("end €".as_bytes());
        whole.push(0xe2);
        let expected = String::from_utf8_lossy(&whole).into_owned();
        for size in 1..8 {
            let mut carry = Utf8Carry::default();
            let mut got = String::new();
            for piece in whole.chunks(size) {
                got.push_str(&carry.decode(piece));
            }
            got.push_str(&carry.flush());
            assert_eq!(got, expected, "pieces of {size}");
        }
    }

    #[test]
    fn a_complete_tail_is_not_held() {
        assert_eq!(incomplete_tail("a€".as_bytes()), 0);
        assert_eq!(incomplete_tail(&[b'a', 0xe2, 0x82]), 2);
        assert_eq!(incomplete_tail(&[0xf0]), 1);
        assert_eq!(incomplete_tail(&[0x80, 0x80, 0x80]), 0);
    }
}
