//! One run event (the JSON of docs/events.md, as the page received it over SSE) to an HTML
//! fragment of the timeline. The page posts batches of events to `POST /ui/render` and
//! inserts what comes back; it never builds markup from event strings itself. Every string
//! here is hostile: text is escaped, the model's Markdown goes through `markdown`, tool
//! output through `ansi`, and image URLs are built only from a checked run id and a
//! `sha256:<hex>` image id.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::html::{esc, url_part};
use super::{ansi, markdown};

/// The most events one render request may carry.
pub const MAX_EVENTS: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenderRequest {
    pub events: Vec<Value>,
}

/// Where a fragment goes: appended to the timeline, or into the card of a tool call.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Fragment {
    pub seq: u64,
    /// The event's type.
    pub kind: String,
    pub html: String,
    /// For a tool_call, its card's call; for a tool_result, the call whose card it fills.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// For a tool_result: "ok" or "error".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct RenderResponse {
    pub fragments: Vec<Fragment>,
}

fn s<'a>(ev: &'a Value, k: &str) -> &'a str {
    ev.get(k).and_then(Value::as_str).unwrap_or("")
}

fn n(ev: &Value, k: &str) -> u64 {
    ev.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn safe_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

fn image_id(ev: &Value) -> Option<&str> {
    let id = ev.get("image")?.get("id")?.as_str()?;
    let hex = id.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// The arguments of a call as the card shows them: bash's command and python's code as
/// themselves, anything else as pretty JSON.
fn arguments(name: &str, raw: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(raw).ok();
    if let Some(v) = &parsed {
        for key in ["command", "code"] {
            if let Some(text) = v.get(key).and_then(Value::as_str)
                && (name == "bash" || name == "python")
            {
                return text.to_string();
            }
        }
        if let Ok(pretty) = serde_json::to_string_pretty(v) {
            return pretty;
        }
    }
    raw.to_string()
}

fn note(class: &str, text: &str) -> String {
    format!("<div class=\"ev {class}\">{}</div>", esc(text))
}

fn reason_text(reason: &Value) -> String {
    match reason {
        Value::String(s) => s.replace('_', " "),
        Value::Object(o) => {
            let kind = o.get("kind").and_then(Value::as_str).unwrap_or("finished");
            match kind {
                "error" => format!(
                    "error: {}",
                    o.get("message").and_then(Value::as_str).unwrap_or("")
                ),
                "max_steps" => format!("stopped at max_steps ({})", n(reason, "max_steps")),
                "token_budget" => format!(
                    "token budget spent ({} of {})",
                    n(reason, "spent"),
                    n(reason, "budget")
                ),
                "terminated" => format!(
                    "terminated ({})",
                    o.get("status").and_then(Value::as_str).unwrap_or("")
                ),
                k => k.replace('_', " "),
            }
        }
        _ => "finished".into(),
    }
}

fn plan_list(plan: &Value) -> String {
    let mut out = format!(
        "<div class=\"ev ev-plan\"><strong>Plan: {}</strong><ol>",
        esc(s(plan, "title"))
    );
    for step in plan
        .get("steps")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let _ = write!(
            out,
            "<li><span class=\"pill\">{}</span> {}</li>",
            esc(&s(step, "status").replace('_', " ")),
            esc(s(step, "text"))
        );
    }
    out.push_str("</ol></div>");
    out
}

/// One event as a fragment; None for events the timeline does not show (token counts and
/// state changes update the header instead).
pub fn fragment(ev: &Value) -> Option<Fragment> {
    let seq = n(ev, "seq");
    let kind = s(ev, "type");
    match kind {
        "token_usage" | "run_state" | "thinking" => None,
        "tool_result" => Some(tool_result(ev, seq)),
        "tool_image" => Some(Fragment {
            seq,
            kind: kind.to_string(),
            html: figure(ev).unwrap_or_default(),
            call_id: Some(s(ev, "call_id").to_string()),
            status: None,
            duration_ms: None,
        }),
        _ => Some(Fragment {
            seq,
            kind: kind.to_string(),
            html: event_html(kind, ev),
            call_id: (kind == "tool_call").then(|| s(ev, "call_id").to_string()),
            status: None,
            duration_ms: None,
        }),
    }
}

/// The markup of a timeline event of type `kind` (any but the tool results and the events
/// the timeline does not show).
fn event_html(kind: &str, ev: &Value) -> String {
    match kind {
        "run_started" => run_started(ev),
        "notice" => note("ev-note", s(ev, "message")),
        "context_trimmed" => note(
            "ev-note",
            &format!(
                "older turns left out to fit the context ({} messages)",
                n(ev, "dropped_messages")
            ),
        ),
        "context_condensed" => note(
            "ev-note",
            &format!(
                "context condensed to fit the model: {} → {} tokens ({} old outputs masked, {} messages summarized)",
                n(ev, "before_tokens"),
                n(ev, "after_tokens"),
                n(ev, "masked_outputs"),
                n(ev, "summarized_messages")
            ),
        ),
        "retry" => note(
            "ev-note",
            &format!(
                "the model's endpoint failed ({}); attempt {} of {} in {} ms",
                s(ev, "reason"),
                n(ev, "attempt"),
                n(ev, "max_attempts"),
                n(ev, "delay_ms")
            ),
        ),
        "nudge" => note(
            "ev-note",
            "the same step came twice; the model was told to change strategy",
        ),
        "assistant_text" => format!(
            "<div class=\"ev ev-text\"><div class=\"label\">Step {}</div><div class=\"md\">{}</div></div>",
            n(ev, "step"),
            markdown::to_html(s(ev, "text"))
        ),
        "tool_call" => tool_call(ev),
        "egress" => egress(ev.get("record").unwrap_or(&Value::Null)),
        "error" => note("ev-error", s(ev, "message")),
        "question_asked" => format!(
            "<div class=\"ev ev-question\"><div class=\"label\">The agent asks</div><div>{}</div></div>",
            esc(s(ev, "question"))
        ),
        "question_answered" => note("ev-note", &format!("question answered by {}", s(ev, "by"))),
        "run_finished" => run_finished(ev),
        "plan_created" | "replanned" => plan_list(ev.get("plan").unwrap_or(&Value::Null)),
        "step_started" => note(
            "ev-note",
            &format!(
                "plan step {}: {} ({})",
                n(ev, "index") + 1,
                s(ev, "text"),
                s(ev, "executor")
            ),
        ),
        "step_finished" => note(
            "ev-note",
            &format!(
                "plan step {} {}",
                n(ev, "index") + 1,
                s(ev, "status").replace('_', " ")
            ),
        ),
        "flow_finished" => format!(
            "<div class=\"ev ev-final\"><div class=\"label\">Summary</div><div class=\"md\">{}</div></div>",
            markdown::to_html(s(ev, "summary"))
        ),
        other => note("ev-note", other),
    }
}

/// One connection through the session's egress proxy: where, which rule, bytes.
pub(super) fn egress(r: &Value) -> String {
    let allowed = r.get("allowed").and_then(Value::as_bool) == Some(true);
    let (class, verdict) = if allowed {
        ("ev-note", "allowed")
    } else {
        ("ev-error", "refused")
    };
    let reason = match r.get("reason").and_then(Value::as_str) {
        Some(why) => format!(": {why}"),
        None => String::new(),
    };
    note(
        class,
        &format!(
            "egress {} {}:{} {verdict} by {}{reason} ({} B up, {} B down)",
            s(r, "method"),
            s(r, "host"),
            n(r, "port"),
            s(r, "rule"),
            n(r, "bytes_up"),
            n(r, "bytes_down")
        ),
    )
}

fn run_started(ev: &Value) -> String {
    format!(
        "<div class=\"ev ev-start\"><div class=\"label\">Task</div><div class=\"task\">{}</div><div class=\"meta\">model {} · up to {} steps{}</div></div>",
        esc(s(ev, "task")),
        esc(s(ev, "model")),
        n(ev, "max_steps"),
        match n(ev, "continued_messages") {
            0 => String::new(),
            m => format!(" · continues {m} earlier messages"),
        }
    )
}

/// A tool call's card, open and running; its result fills the card later.
fn tool_call(ev: &Value) -> String {
    let name = s(ev, "name");
    format!(
        "<details class=\"card\" open><summary><span class=\"tool\">{}</span> <span class=\"status running\">running</span> <span class=\"dur\"></span> <span class=\"label\">step {}</span></summary><pre class=\"args\">{}</pre><div class=\"result\"></div></details>",
        esc(name),
        n(ev, "step"),
        esc(&arguments(name, s(ev, "arguments")))
    )
}

/// The event's image as a figure, when its run id and image id check.
fn figure(ev: &Value) -> Option<String> {
    let run_id = s(ev, "run_id");
    let img = image_id(ev).filter(|_| safe_id(run_id))?;
    let what = if s(ev, "name").starts_with("browser") {
        "screenshot"
    } else {
        "image"
    };
    Some(format!(
        "<figure class=\"shot\"><img src=\"/v1/runs/{}/images/{}\" alt=\"{} from {}\"></figure>",
        url_part(run_id),
        url_part(img),
        what,
        esc(s(ev, "name"))
    ))
}

/// A tool result, for the card of its call: the output, and its image when the ids check.
fn tool_result(ev: &Value, seq: u64) -> Fragment {
    let is_error = ev.get("is_error").and_then(Value::as_bool).unwrap_or(false);
    let mut html = format!(
        "<details class=\"out{}\" open><summary>output</summary><pre class=\"term\">{}</pre></details>",
        if is_error { " error" } else { "" },
        ansi::to_html(s(ev, "output"))
    );
    if let Some(fig) = figure(ev) {
        html.push_str(&fig);
    }
    Fragment {
        seq,
        kind: "tool_result".to_string(),
        html,
        call_id: Some(s(ev, "call_id").to_string()),
        status: Some(if is_error { "error" } else { "ok" }),
        duration_ms: Some(n(ev, "duration_ms")),
    }
}

fn run_finished(ev: &Value) -> String {
    let reason = ev.get("reason").cloned().unwrap_or(Value::Null);
    let failed = matches!(&reason, Value::Object(o) if o.get("kind").and_then(Value::as_str) == Some("error"));
    format!(
        "<div class=\"ev ev-final{}\"><div class=\"label\">Final answer{}</div><div class=\"md\">{}</div><div class=\"meta\">{} steps · {} + {} tokens · {:.1} s</div></div>",
        if failed { " error" } else { "" },
        match reason_text(&reason).as_str() {
            "final answer" => String::new(),
            r => format!(" · {}", esc(r)),
        },
        markdown::to_html(s(ev, "answer")),
        n(ev, "steps"),
        n(ev, "prompt_tokens"),
        n(ev, "completion_tokens"),
        n(ev, "duration_ms") as f64 / 1000.0
    )
}

/// A batch of events as fragments, in the order given.
pub fn render(req: &RenderRequest) -> RenderResponse {
    RenderResponse {
        fragments: req.events.iter().filter_map(fragment).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_results_carry_their_call_colours_and_image() {
        let hex = "a".repeat(64);
        let f = fragment(&json!({"type": "tool_result", "seq": 7, "run_id": "run-1-ab", "call_id": "c<1>",
            "name": "python", "output": "\u{1b}[32mok\u{1b}[0m", "is_error": false, "duration_ms": 12,
            "image": {"id": format!("sha256:{hex}"), "media_type": "image/png", "bytes": 3}})).unwrap();
        assert_eq!(f.call_id.as_deref(), Some("c<1>"));
        assert!(
            f.html.contains("<span class=\"a-f2\">ok</span>"),
            "{}",
            f.html
        );
        assert!(
            f.html
                .contains(&format!("src=\"/v1/runs/run-1-ab/images/sha256:{hex}\"")),
            "{}",
            f.html
        );
        // A forged image id or run id gives no image.
        let f = fragment(
            &json!({"type": "tool_result", "seq": 8, "run_id": "run\"x", "call_id": "c",
            "image": {"id": format!("sha256:{hex}")}}),
        )
        .unwrap();
        assert!(!f.html.contains("<img"));
        let f = fragment(
            &json!({"type": "tool_result", "seq": 8, "run_id": "r", "call_id": "c",
            "image": {"id": "sha256:../../x\" onerror=\"y"}}),
        )
        .unwrap();
        assert!(!f.html.contains("<img"));
    }

    #[test]
    fn egress_events_say_where_and_why_escaped() {
        let ev = serde_json::json!({"seq": 4, "type": "egress", "record": {
            "method": "CONNECT", "host": "<script>x</script>.test", "port": 443, "allowed": false,
            "rule": "not in the allowlist", "reason": "<b>no</b>", "bytes_up": 0, "bytes_down": 0}});
        let f = fragment(&ev).unwrap();
        assert_eq!(f.kind, "egress");
        assert!(f.html.contains("ev-error"), "{}", f.html);
        assert!(f.html.contains("&lt;script&gt;x&lt;/script&gt;.test:443 refused by not in the allowlist: &lt;b&gt;no&lt;/b&gt;"), "{}", f.html);
        assert!(
            !f.html.contains("<script>") && !f.html.contains("<b>"),
            "{}",
            f.html
        );
    }

    #[test]
    fn hostile_strings_are_escaped_everywhere() {
        let x = "<img src=x onerror=alert(1)><script>alert(2)</script>";
        for ev in [
            json!({"type": "run_started", "task": x, "model": x}),
            json!({"type": "tool_call", "name": x, "arguments": x}),
            json!({"type": "tool_call", "name": "bash", "arguments": json!({"command": x}).to_string()}),
            json!({"type": "error", "message": x}),
            json!({"type": "question_asked", "question": x}),
            json!({"type": "run_finished", "answer": x, "reason": {"kind": "error", "message": x}}),
            json!({"type": x}),
            json!({"type": "assistant_text", "text": x}),
        ] {
            let h = fragment(&ev).unwrap().html;
            assert!(!h.contains("<img") && !h.contains("<script"), "{ev} -> {h}");
        }
        assert!(fragment(&json!({"type": "token_usage"})).is_none());
    }
}
