//! The code interpreter's `/execute` (`E2b-Sandbox-Port: 49999`) on the session's stateful
//! python, the same interpreter as the python tool (`Python::run_cell`), or a created
//! context's (contexts.rs): variables persist between calls. `/execute` answers E2B's
//! line-delimited JSON as the cell runs: stdout and stderr lines as the cell prints them
//! (up to the tool's output cap per stream; past it, a marker and the tail at the end), then
//! a result with the final expression's repr as `text` (the main result) and one with the PNG
//! of each matplotlib figure, an error with name, value and traceback, and the execution
//! count. A caller that leaves interrupts the cell (KeyboardInterrupt; the state is kept).
//! What sandboxd must tell the caller (the request resumed a paused sandbox, the context's
//! interpreter was lost and started afresh) comes first as a stderr line `sandboxd: …`.
//!
//! Languages other than python are refused, saying so.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::E2bError;
use super::contexts::python_of;
use crate::AppState;
use crate::auth::Caller;
use crate::streams::Kind;
use sandboxd_core::tools::ToolError;
use sandboxd_core::tools::python::{Cell, CellOutput, LiveOutput, Stream};

/// Cells run through the code interpreter in a session (E2B's `execution_count`).
#[derive(Default)]
struct Executions(AtomicU64);

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ExecuteBody {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<std::collections::BTreeMap<String, String>>,
}

pub(super) fn check_language(language: Option<&str>) -> Result<(), E2bError> {
    match language {
        None | Some("python") | Some("python3") | Some("") => Ok(()),
        Some(other) => Err(E2bError::invalid(format!(
            "language '{other}' is not available: sandboxd's code interpreter runs python only"
        ))),
    }
}

pub(super) async fn execute(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Json(body): Json<ExecuteBody>,
) -> Result<Response, E2bError> {
    let (live, _) = super::target(&st, &caller, &headers).await?;
    check_language(body.language.as_deref())?;
    // The session's owner's quota: the CPU is metered to them, whoever asks.
    crate::cpu_quota::admit_owner(&st, &caller, &live.owner).await?;
    // Refused before the context is looked up: taking it over (another replica's connection)
    // and its one-time note belong to a call that runs.
    if body.env_vars.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err(E2bError::invalid(
            "per-execution env_vars are not applied by sandboxd's interpreter: set os.environ in the code, or pass envs to commands.run",
        ));
    }
    let (python, note) = python_of(&st, &live, body.context_id.as_deref()).await?;
    let guard = st.streams.open(&caller, Kind::Request, &st.shutdown)?;
    let in_use = live.hold();
    let timeout = Duration::from_secs(live.limits.max_timeout_secs.max(1));
    let cancel: CancellationToken = guard.token().child_token();
    let executions = live.session().slots.get_or_insert_with(Executions::default);
    let (sink, chunks) = LiveOutput::channel();
    let stop = cancel.clone();
    let cell = tokio::spawn(async move {
        let (_guard, _in_use) = (guard, in_use);
        let ran = python
            .run_cell(&body.code, timeout, &cancel, Some(sink))
            .await;
        let count = executions.0.fetch_add(1, Ordering::Relaxed) + 1;
        final_lines(ran, count)
    });
    let state = Lines {
        first: note.map(|n| ndjson(&[note_line(&n)])),
        chunks,
        cell: Some(cell),
        carry: [Vec::new(), Vec::new()],
        _stop: stop.drop_guard(),
    };
    let body = Body::from_stream(futures::stream::unfold(state, Lines::next));
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}

/// The lines of a running cell: its output as it is printed, then its end. Dropping it (the
/// caller left) interrupts the cell.
struct Lines {
    /// What the caller is told before the cell's output (a context started afresh).
    first: Option<Bytes>,
    chunks: UnboundedReceiver<(Stream, Bytes)>,
    cell: Option<JoinHandle<Vec<Value>>>,
    /// Per stream, the start of a UTF-8 character a chunk ended in the middle of.
    carry: [Vec<u8>; 2],
    _stop: DropGuard,
}

impl Lines {
    async fn next(mut self) -> Option<(Result<Bytes, Infallible>, Self)> {
        if let Some(first) = self.first.take() {
            return Some((Ok(first), self));
        }
        while let Some((stream, data)) = self.chunks.recv().await {
            let text = take_text(&mut self.carry[stream as usize], &data);
            if !text.is_empty() {
                let line = log_line(stream, &text);
                return Some((Ok(ndjson(&[line])), self));
            }
        }
        // The cell has ended (its sink is dropped): what a chunk left half, then the end.
        let cell = self.cell.take()?;
        let mut lines = Vec::new();
        for stream in [Stream::Stdout, Stream::Stderr] {
            let rest = std::mem::take(&mut self.carry[stream as usize]);
            if !rest.is_empty() {
                lines.push(log_line(stream, &String::from_utf8_lossy(&rest)));
            }
        }
        lines.extend(cell.await.unwrap_or_else(|e| {
            vec![json!({"type": "error", "name": "InterpreterError", "value": e.to_string(), "traceback": e.to_string()})]
        }));
        Some((Ok(ndjson(&lines)), self))
    }
}

fn ndjson(lines: &[Value]) -> Bytes {
    let mut text = String::new();
    for l in lines {
        text.push_str(&l.to_string());
        text.push('\n');
    }
    Bytes::from(text)
}

/// A note of sandboxd's to the caller (an interpreter started afresh, a sandbox resumed),
/// on stderr, where the SDK keeps it in the execution's logs.
fn note_line(note: &str) -> Value {
    json!({"type": "stderr", "text": format!("sandboxd: {note}\n"), "timestamp": now_ms()})
}

fn log_line(stream: Stream, text: &str) -> Value {
    let kind = match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    json!({"type": kind, "text": text, "timestamp": now_ms()})
}

/// The text of `carry` and `data` up to the last whole UTF-8 character (invalid bytes are
/// replaced); an unfinished character at the end stays in `carry` for the next chunk.
fn take_text(carry: &mut Vec<u8>, data: &[u8]) -> String {
    carry.extend_from_slice(data);
    let rest = carry.split_off(carry.len() - unfinished_tail(carry));
    let text = String::from_utf8_lossy(carry).into_owned();
    *carry = rest;
    text
}

/// How many bytes at the end of `b` are the start of a UTF-8 character still missing bytes.
fn unfinished_tail(b: &[u8]) -> usize {
    for k in 1..=b.len().min(3) {
        let lead = b[b.len() - k];
        if lead & 0xC0 == 0x80 {
            continue; // a continuation byte: its lead is further back
        }
        let need = match lead {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if need > k { k } else { 0 };
    }
    0
}

/// The lines a cell ends with: sandboxd's notes (a fresh interpreter was started), what it
/// printed that was not sent live, its results and error, and the execution count.
fn final_lines(ran: Result<(Cell, Vec<String>), ToolError>, count: u64) -> Vec<Value> {
    let notes: Vec<Value> = match &ran {
        Ok((_, notes)) => notes.iter().map(String::as_str).map(note_line).collect(),
        Err(_) => Vec::new(),
    };
    let mut lines = notes;
    lines.extend(match ran {
        Ok((Cell::Ran(out, timed_out), _)) => output_lines(out, timed_out),
        Ok((Cell::Failed(result), _)) => vec![json!({
            "type": "error",
            "name": "InterpreterError",
            "value": result.error.clone().unwrap_or_else(|| result.output.clone()),
            "traceback": result.error.unwrap_or(result.output),
        })],
        Err(e) => {
            let why = e.to_string();
            vec![json!({"type": "error", "name": "SandboxError", "value": why, "traceback": why})]
        }
    });
    lines.push(json!({"type": "number_of_executions", "execution_count": count}));
    lines
}

fn now_ms() -> i64 {
    sandboxd_core::store::now_ms()
}

/// A cell's output as E2B's lines.
fn output_lines(out: CellOutput, timed_out: Option<u64>) -> Vec<Value> {
    let mut lines = Vec::new();
    for (kind, data) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        if !data.is_empty() {
            let text = String::from_utf8_lossy(data);
            lines.push(json!({"type": kind, "text": text, "timestamp": now_ms()}));
        }
    }
    for png in &out.images {
        let png = base64::engine::general_purpose::STANDARD.encode(png);
        lines.push(
            json!({"type": "result", "png": png, "text": "<Figure>", "is_main_result": false}),
        );
    }
    if let Some(value) = out.value {
        lines.push(json!({"type": "result", "text": value, "is_main_result": true}));
    }
    let error = match (out.error, timed_out) {
        (Some(tb), _) => Some(tb),
        (None, Some(secs)) => Some(format!(
            "TimeoutError: the cell ran past {secs}s and was interrupted"
        )),
        (None, None) => None,
    };
    if let Some(tb) = error {
        let (name, value) = error_name(&tb);
        lines.push(json!({"type": "error", "name": name, "value": value, "traceback": tb}));
    }
    lines
}

/// The exception's name and message from a traceback's last line (`Name: message`).
fn error_name(tb: &str) -> (String, String) {
    let last = tb.trim_end().lines().last().unwrap_or("").trim();
    match last.split_once(':') {
        Some((name, value))
            if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '.') =>
        {
            (name.to_string(), value.trim().to_string())
        }
        _ if !last.is_empty() && last.chars().all(|c| c.is_alphanumeric() || c == '_') => {
            (last.to_string(), String::new())
        }
        _ => ("Error".to_string(), last.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::{error_name, take_text};

    #[test]
    fn error_names_come_from_the_last_line() {
        let tb = "Traceback (most recent call last):\n  File \"<cell>\", line 1\nZeroDivisionError: division by zero\n";
        assert_eq!(
            error_name(tb),
            ("ZeroDivisionError".into(), "division by zero".into())
        );
        assert_eq!(
            error_name("KeyboardInterrupt\n"),
            ("KeyboardInterrupt".into(), String::new())
        );
        assert_eq!(error_name("odd: (x)"), ("odd".into(), "(x)".into()));
        assert_eq!(error_name("a b: c").0, "Error");
    }

    #[test]
    fn a_character_split_across_chunks_comes_whole() {
        let mut carry = Vec::new();
        let euro = "€".as_bytes();
        assert_eq!(take_text(&mut carry, &[b'a', euro[0], euro[1]]), "a");
        assert_eq!(take_text(&mut carry, &[euro[2], b'b']), "€b");
        assert!(carry.is_empty());
        assert_eq!(take_text(&mut carry, &[0xff, b'c']), "\u{fffd}c");
        assert_eq!(take_text(&mut carry, &[0xf0, 0x9f]), "");
        assert_eq!(carry, [0xf0, 0x9f]);
    }
}
