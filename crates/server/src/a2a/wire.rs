//! A2A's wire shapes, built from runs: a run is a task, its session the context, its answer
//! and the files in /workspace its artifacts. Two dialects: v1.0 (the proto's JSON mapping:
//! `TASK_STATE_*`, `ROLE_*`, bare parts, `StreamResponse` wrappers) and 0.3 (`kind`
//! discriminators, lower-case states, `final` on status updates), which is what a request
//! without an `A2A-Version` header speaks (spec §3.6).

use serde_json::{Value, json};

use crate::runs::rfc3339;
use sandboxd_core::store::{RunRow, RunState};

/// The protocol version a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    V1,
    V03,
}

impl Dialect {
    /// From the `A2A-Version` header (or query parameter): empty or absent is 0.3.
    pub fn parse(v: Option<&str>) -> Option<Dialect> {
        match v.map(str::trim).unwrap_or("") {
            "" => Some(Dialect::V03),
            v if v == "1" || v == "1.0" || v.starts_with("1.0.") => Some(Dialect::V1),
            v if v == "0.3" || v.starts_with("0.3.") => Some(Dialect::V03),
            _ => None,
        }
    }
}

/// A file in /workspace offered as an artifact part.
#[derive(Debug, Clone)]
pub struct WorkspaceFile {
    pub name: String,
    pub url: String,
}

/// The task state a run's state is.
pub fn state(d: Dialect, s: RunState) -> &'static str {
    use RunState::*;
    match (d, s) {
        (Dialect::V1, Queued) => "TASK_STATE_SUBMITTED",
        (Dialect::V1, Running) => "TASK_STATE_WORKING",
        (Dialect::V1, WaitingForHuman) => "TASK_STATE_INPUT_REQUIRED",
        (Dialect::V1, Succeeded) => "TASK_STATE_COMPLETED",
        (Dialect::V1, Failed | Interrupted) => "TASK_STATE_FAILED",
        (Dialect::V1, Cancelled) => "TASK_STATE_CANCELED",
        (Dialect::V03, Queued) => "submitted",
        (Dialect::V03, Running) => "working",
        (Dialect::V03, WaitingForHuman) => "input-required",
        (Dialect::V03, Succeeded) => "completed",
        (Dialect::V03, Failed | Interrupted) => "failed",
        (Dialect::V03, Cancelled) => "canceled",
    }
}

/// A task state (either dialect's spelling) as a run state, for ListTasks' filter.
pub fn parse_state(s: &str) -> Option<RunState> {
    let s = s.trim_start_matches("TASK_STATE_").to_ascii_lowercase();
    Some(match s.as_str() {
        "submitted" => RunState::Queued,
        "working" => RunState::Running,
        "input_required" | "input-required" => RunState::WaitingForHuman,
        "completed" => RunState::Succeeded,
        "failed" => RunState::Failed,
        "canceled" => RunState::Cancelled,
        _ => return None,
    })
}

pub fn text_part(d: Dialect, text: &str) -> Value {
    match d {
        Dialect::V1 => json!({"text": text}),
        Dialect::V03 => json!({"kind": "text", "text": text}),
    }
}

fn file_part(d: Dialect, f: &WorkspaceFile) -> Value {
    match d {
        Dialect::V1 => json!({"url": f.url, "filename": f.name,
            "mediaType": "application/octet-stream"}),
        Dialect::V03 => json!({"kind": "file",
            "file": {"uri": f.url, "name": f.name, "mimeType": "application/octet-stream"}}),
    }
}

/// An agent message of the task; `id` is stable per event so a client can tell repeats.
pub fn agent_message(d: Dialect, row: &RunRow, id: &str, text: &str) -> Value {
    let mut m = json!({
        "messageId": id,
        "contextId": row.session_id,
        "taskId": row.id,
        "parts": [text_part(d, text)],
    });
    match d {
        Dialect::V1 => m["role"] = json!("ROLE_AGENT"),
        Dialect::V03 => {
            m["role"] = json!("agent");
            m["kind"] = json!("message");
        }
    }
    m
}

/// The task's status now: a pending question is its message, as is why a run failed.
pub fn status(d: Dialect, row: &RunRow, at_ms: i64) -> Value {
    let mut s = json!({"state": state(d, row.state), "timestamp": rfc3339(at_ms)});
    let text = match (&row.question, row.state) {
        (Some(q), RunState::WaitingForHuman) => Some(q.text.clone()),
        (_, RunState::Failed | RunState::Interrupted) => row.outcome.as_ref().map(|o| {
            o.get("message")
                .and_then(Value::as_str)
                .map(String::from)
                .unwrap_or_else(|| o.to_string())
        }),
        _ => None,
    };
    if let Some(text) = text {
        let id = format!("{}-status-{}", row.id, row.last_seq);
        s["message"] = agent_message(d, row, &id, &text);
    }
    s
}

/// The run's deliverables: the answer as a text part, the files in /workspace as file parts.
pub fn artifacts(d: Dialect, row: &RunRow, files: &[WorkspaceFile]) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(answer) = row.answer.as_deref().filter(|a| !a.is_empty()) {
        out.push(
            json!({"artifactId": format!("{}-answer", row.id), "name": "answer",
            "parts": [text_part(d, answer)]}),
        );
    }
    if !files.is_empty() {
        let parts: Vec<Value> = files.iter().map(|f| file_part(d, f)).collect();
        out.push(
            json!({"artifactId": format!("{}-files", row.id), "name": "workspace",
            "description": "The files in /workspace when the run ended (GET them with your key)",
            "parts": parts}),
        );
    }
    out
}

/// The task as GetTask answers it; `files` only matter once the run ended.
pub fn task(d: Dialect, row: &RunRow, files: &[WorkspaceFile]) -> Value {
    let at = row.ended_at.or(row.started_at).unwrap_or(row.created_at);
    let mut t = json!({
        "id": row.id,
        "contextId": row.session_id,
        "status": status(d, row, at),
        "artifacts": artifacts(d, row, files),
        // The log position the snapshot reflects: a subscriber's updates follow it.
        "metadata": {"sandboxd": {"lastSeq": row.last_seq, "mode": row.mode}},
    });
    if d == Dialect::V03 {
        t["kind"] = json!("task");
    }
    t
}

/// A task as one item of a stream (or SendMessage's result).
pub fn task_result(d: Dialect, task: Value) -> Value {
    match d {
        Dialect::V1 => json!({"task": task}),
        Dialect::V03 => task,
    }
}

/// A status update of the stream; `seq` is the run event it came from.
pub fn status_update(d: Dialect, row: &RunRow, status: Value, seq: u64, last: bool) -> Value {
    let mut u = json!({
        "taskId": row.id,
        "contextId": row.session_id,
        "status": status,
        "metadata": {"sandboxd": {"seq": seq}},
    });
    match d {
        Dialect::V1 => json!({"statusUpdate": u}),
        Dialect::V03 => {
            u["kind"] = json!("status-update");
            u["final"] = json!(last);
            u
        }
    }
}

/// An artifact, whole, as one update of the stream.
pub fn artifact_update(d: Dialect, row: &RunRow, artifact: Value) -> Value {
    let mut u = json!({
        "taskId": row.id,
        "contextId": row.session_id,
        "artifact": artifact,
        "append": false,
        "lastChunk": true,
    });
    match d {
        Dialect::V1 => json!({"artifactUpdate": u}),
        Dialect::V03 => {
            u["kind"] = json!("artifact-update");
            u
        }
    }
}
