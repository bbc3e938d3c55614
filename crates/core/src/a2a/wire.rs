//! The client's side of A2A's JSON-RPC binding, both dialects: v1.0 (`SendMessage`,
//! `ROLE_USER`, `TASK_STATE_*`, `{"task": …}` results, the card's `supportedInterfaces`) and
//! 0.3 (`message/send`, `kind` discriminators, lower-case states, the card's top-level `url`).
//! Everything read here comes from a remote agent and is hostile: unknown shapes are errors
//! that say what was wrong, text is cut to a cap and stripped of control characters.

use serde_json::{Value, json};
use url::Url;

/// Most characters of the agent's text a call returns to the model.
pub const MAX_TEXT: usize = 32 * 1024;
/// Most characters of a card's description used as the tool's description.
pub const MAX_DESCRIPTION: usize = 900;

/// The protocol version spoken with one agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    V1,
    V03,
}

/// What the card says: who the agent is and where its JSON-RPC endpoint is.
#[derive(Debug, Clone)]
pub struct Card {
    pub name: String,
    pub description: String,
    pub endpoint: Url,
    pub dialect: Dialect,
}

/// Reads an agent card fetched from `card_url`: a JSON-RPC interface of v1.0 first, else 0.3.
pub fn parse_card(body: &[u8], card_url: &Url) -> Result<Card, String> {
    let card: Value =
        serde_json::from_slice(body).map_err(|e| format!("the agent card is not JSON: {e}"))?;
    let text = |key: &str| card.get(key).and_then(Value::as_str).unwrap_or("");
    let interfaces = card
        .get("supportedInterfaces")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let jsonrpc = |version: &str| {
        interfaces.iter().find_map(|i| {
            let binding = i.get("protocolBinding").and_then(Value::as_str)?;
            let v = i.get("protocolVersion").and_then(Value::as_str)?;
            (binding.eq_ignore_ascii_case("JSONRPC") && v.starts_with(version))
                .then(|| i.get("url").and_then(Value::as_str))
                .flatten()
        })
    };
    let legacy = (!text("url").is_empty() && ["", "JSONRPC"].contains(&text("preferredTransport")))
        .then(|| text("url"));
    let (raw, dialect) = match (jsonrpc("1."), jsonrpc("0.3"), legacy) {
        (Some(u), _, _) => (u, Dialect::V1),
        (None, Some(u), _) | (None, None, Some(u)) => (u, Dialect::V03),
        (None, None, None) => {
            return Err(
                "the agent card names no JSON-RPC endpoint (sandboxd speaks A2A's JSON-RPC binding, v1.0 or 0.3)".into(),
            );
        }
    };
    let endpoint = card_url
        .join(raw)
        .map_err(|e| format!("the card's endpoint {raw:?} is not a URL: {e}"))?;
    if !matches!(endpoint.scheme(), "http" | "https") {
        return Err(format!("the card's endpoint {endpoint} is not http(s)"));
    }
    Ok(Card {
        name: cut(&clean(text("name")), 100),
        description: cut(&clean(text("description")), MAX_DESCRIPTION),
        endpoint,
        dialect,
    })
}

/// A JSON-RPC request of method `v1`/`v03` (by dialect) with `params`.
fn request(d: Dialect, id: u64, v1: &str, v03: &str, params: Value) -> Value {
    let method = if d == Dialect::V1 { v1 } else { v03 };
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// Sends `text` as the user, in `context` (continuing a conversation) and `task` (answering
/// a task that asked for input); the call returns at once and the task is polled.
pub fn send(d: Dialect, id: u64, text: &str, context: Option<&str>, task: Option<&str>) -> Value {
    let mut message = match d {
        Dialect::V1 => json!({"role": "ROLE_USER", "parts": [{"text": text}]}),
        Dialect::V03 => {
            json!({"kind": "message", "role": "user", "parts": [{"kind": "text", "text": text}]})
        }
    };
    message["messageId"] = json!(uuid::Uuid::new_v4().to_string());
    if let Some(c) = context {
        message["contextId"] = json!(c);
    }
    if let Some(t) = task {
        message["taskId"] = json!(t);
    }
    let configuration = match d {
        Dialect::V1 => json!({"acceptedOutputModes": ["text/plain"], "returnImmediately": true}),
        Dialect::V03 => json!({"acceptedOutputModes": ["text/plain"], "blocking": false}),
    };
    let params = json!({"message": message, "configuration": configuration});
    request(d, id, "SendMessage", "message/send", params)
}

/// Asks for a task as it is now.
pub fn get(d: Dialect, id: u64, task: &str) -> Value {
    request(d, id, "GetTask", "tasks/get", json!({"id": task}))
}

/// Cancels a task (best effort, when the call is given up).
pub fn cancel(d: Dialect, id: u64, task: &str) -> Value {
    request(d, id, "CancelTask", "tasks/cancel", json!({"id": task}))
}

/// A task's state, both dialects' spellings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Working,
    InputRequired,
    AuthRequired,
    Completed,
    Failed,
    Canceled,
    Rejected,
}

impl State {
    fn parse(s: &str) -> Option<State> {
        let s = s.trim_start_matches("TASK_STATE_").to_ascii_lowercase();
        Some(match s.replace('_', "-").as_str() {
            "submitted" | "working" | "unspecified" => State::Working,
            "input-required" => State::InputRequired,
            "auth-required" => State::AuthRequired,
            "completed" => State::Completed,
            "failed" => State::Failed,
            "canceled" | "cancelled" => State::Canceled,
            "rejected" => State::Rejected,
            _ => return None,
        })
    }

    /// Whether polling stops here (the task ended, or waits for us).
    pub fn settled(&self) -> bool {
        *self != State::Working
    }
}

/// What a call brought back: a task, or a direct message (which ends the exchange).
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// None for a direct message.
    pub task: Option<String>,
    pub context: Option<String>,
    pub state: State,
    /// The status message's text (a question when input is required).
    pub status: String,
    /// The artifacts' text parts, and a line per file or data part.
    pub artifacts: String,
}

/// Reads a JSON-RPC response: its result as a `Reply`, its error as an `Err` saying so.
pub fn parse_reply(body: &[u8]) -> Result<Reply, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the agent's answer is not JSON: {e}"))?;
    if let Some(err) = v.get("error") {
        let code = err.get("code").and_then(Value::as_i64).unwrap_or(0);
        let message = err.get("message").and_then(Value::as_str).unwrap_or("");
        return Err(format!(
            "the agent answered error {code}: {}",
            cut(&clean(message), 500)
        ));
    }
    let result = v
        .get("result")
        .ok_or("the agent's answer has neither a result nor an error")?;
    // v1.0 wraps the oneof ({"task": …} / {"message": …}); 0.3 sends it bare with a `kind`.
    let (task, message) = match (result.get("task"), result.get("message")) {
        (Some(t), _) => (Some(t), None),
        (None, Some(m)) => (None, Some(m)),
        _ => match result.get("kind").and_then(Value::as_str) {
            Some("task") => (Some(result), None),
            Some("message") => (None, Some(result)),
            _ if result.get("status").is_some() => (Some(result), None),
            _ => return Err("the agent's result is neither a task nor a message".into()),
        },
    };
    if let Some(m) = message {
        return Ok(Reply {
            task: None,
            context: str_at(m, "contextId"),
            state: State::Completed,
            status: parts_text(m.get("parts")),
            artifacts: String::new(),
        });
    }
    let task = task.ok_or("no task")?;
    let status = task.get("status");
    let raw_state = status
        .and_then(|s| s.get("state"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let state = State::parse(raw_state).ok_or_else(|| {
        format!(
            "the task's state {:?} is not one A2A defines",
            cut(raw_state, 40)
        )
    })?;
    let mut artifacts = String::new();
    for a in task
        .get("artifacts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push_line(&mut artifacts, &parts_text(a.get("parts")));
    }
    Ok(Reply {
        task: str_at(task, "id"),
        context: str_at(task, "contextId"),
        state,
        status: parts_text(
            status
                .and_then(|s| s.get("message"))
                .and_then(|m| m.get("parts")),
        ),
        artifacts: cut(&artifacts, MAX_TEXT),
    })
}

fn str_at(v: &Value, key: &str) -> Option<String> {
    v.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty() && s.len() <= 256)
        .map(clean)
}

/// The text of parts: text as it is, a line for each file or data part.
fn parts_text(parts: Option<&Value>) -> String {
    let mut out = String::new();
    for p in parts.and_then(Value::as_array).into_iter().flatten() {
        let file = p.get("file");
        let line = if let Some(t) = p.get("text").and_then(Value::as_str) {
            clean(t)
        } else if let Some(u) = p.get("url").or_else(|| file.and_then(|f| f.get("uri"))) {
            let name = p
                .get("filename")
                .or_else(|| file.and_then(|f| f.get("name")))
                .and_then(Value::as_str)
                .unwrap_or("a file");
            format!(
                "[file {}: {}]",
                clean(name),
                clean(u.as_str().unwrap_or(""))
            )
        } else if let Some(d) = p.get("data") {
            cut(&clean(&d.to_string()), 4096)
        } else {
            "[a part sandboxd does not show (raw bytes or an unknown kind)]".into()
        };
        push_line(&mut out, &line);
        if out.len() > MAX_TEXT {
            break;
        }
    }
    cut(&out, MAX_TEXT)
}

fn push_line(out: &mut String, line: &str) {
    if line.is_empty() {
        return;
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(line);
}

/// Drops control characters (ANSI escapes included) but newlines and tabs.
fn clean(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control() || *c == '\n' || *c == '\t')
        .collect()
}

/// At most `max` bytes, cut at a character boundary, with a note when cut.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[cut by sandboxd: {} bytes in all]", &s[..end], s.len())
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
