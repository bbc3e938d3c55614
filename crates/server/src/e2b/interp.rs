//! The code interpreter's `/execute` and `/contexts` (`E2b-Sandbox-Port: 49999`) on the
//! session's stateful python, the same interpreter as the python tool (`Python::run_cell`):
//! variables persist between calls. `/execute` answers E2B's line-delimited JSON: stdout,
//! stderr, a result with the final expression's repr as `text` (the main result) and one
//! with the PNG of each matplotlib figure, an error with name, value and traceback, and the
//! execution count. The lines come when the cell ends, not as it prints; each figure the cell
//! showed is one PNG result.
//!
//! One interpreter per sandbox: the default context is it; creating another is refused,
//! saying so. Languages other than python are refused the same way.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::E2bError;
use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::streams::Kind;
use sandboxd_core::tools::python::{Cell, CellOutput};
use sandboxd_core::tools::session::SessionTools;

/// The one context: the session's interpreter.
const DEFAULT_CONTEXT: &str = "default";
const CWD: &str = "/workspace";

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

fn check_language(language: Option<&str>) -> Result<(), E2bError> {
    match language {
        None | Some("python") | Some("python3") | Some("") => Ok(()),
        Some(other) => Err(E2bError::invalid(format!(
            "language '{other}' is not available: sandboxd's code interpreter runs python only"
        ))),
    }
}

fn check_context(id: Option<&str>) -> Result<(), E2bError> {
    match id {
        None | Some(DEFAULT_CONTEXT) => Ok(()),
        Some(other) => Err(E2bError::not_found(format!(
            "context '{other}' not found: a sandboxd sandbox has one python interpreter, the context '{DEFAULT_CONTEXT}'"
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
    check_context(body.context_id.as_deref())?;
    if body.env_vars.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err(E2bError::invalid(
            "per-execution env_vars are not applied by sandboxd's interpreter: set os.environ in the code, or pass envs to commands.run",
        ));
    }
    let guard = st.streams.open(&caller, Kind::Request, &st.shutdown)?;
    let _in_use = live.hold();
    let tools = SessionTools::of(live.session(), &st.config);
    let timeout = Duration::from_secs(live.limits.max_timeout_secs.max(1));
    let cancel: CancellationToken = guard.token().child_token();
    let (cell, _notes) = tools
        .python
        .run_cell(&body.code, timeout, &cancel)
        .await
        .map_err(|e| E2bError::from(ApiError::internal(e)))?;
    let count = live
        .session()
        .slots
        .get_or_insert_with(Executions::default)
        .0
        .fetch_add(1, Ordering::Relaxed)
        + 1;
    let mut lines = match cell {
        Cell::Ran(out, timed_out) => output_lines(out, timed_out),
        Cell::Failed(result) => vec![json!({
            "type": "error",
            "name": "InterpreterError",
            "value": result.error.clone().unwrap_or_else(|| result.output.clone()),
            "traceback": result.error.unwrap_or(result.output),
        })],
    };
    lines.push(json!({"type": "number_of_executions", "execution_count": count}));
    let mut text = String::new();
    for l in lines {
        text.push_str(&l.to_string());
        text.push('\n');
    }
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], text).into_response())
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

fn default_context() -> Value {
    json!({"id": DEFAULT_CONTEXT, "language": "python", "cwd": CWD})
}

pub(super) async fn create_context(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
) -> Result<Response, E2bError> {
    super::target(&st, &caller, &headers).await?;
    Err(E2bError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "a sandboxd sandbox has one python interpreter, the context '{DEFAULT_CONTEXT}' (run_code without a context uses it); a second one is not made"
        ),
    ))
}

pub(super) async fn list_contexts(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
) -> Result<Json<Value>, E2bError> {
    super::target(&st, &caller, &headers).await?;
    Ok(Json(json!([default_context()])))
}

pub(super) async fn restart_context(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let (live, _) = super::target(&st, &caller, &headers).await?;
    check_context(Some(&id))?;
    SessionTools::of(live.session(), &st.config)
        .python
        .restart()
        .await
        .map_err(|e| E2bError::from(ApiError::internal(e)))?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn remove_context(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    super::target(&st, &caller, &headers).await?;
    check_context(Some(&id))?;
    Err(E2bError::invalid(format!(
        "the context '{DEFAULT_CONTEXT}' is the sandbox's interpreter and cannot be removed; restart it instead"
    )))
}

#[cfg(test)]
mod tests {
    use super::error_name;

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
}
