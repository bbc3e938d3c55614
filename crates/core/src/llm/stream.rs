//! Streamed chat completions: `stream: true`, the answer read as server-sent events and
//! assembled into the same `Completion` the plain request gives, with each piece of text
//! handed to a callback as it arrives (the CLI and the web UI show it live).
//!
//! Tool calls come in fragments keyed by their `index`: the first fragment of a call has
//! its id and name, later ones append to its arguments. Everything from the server is
//! hostile: a line, an event and the whole answer are bounded, a chunk that is not JSON
//! or an `{"error": …}` event ends the attempt with the server's message. A server that
//! ignores `stream` and answers plain JSON is read as a plain answer.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::transport::{HttpFailure, retry_after, server_message};
use super::wire::{Completion, FunctionCall, RawResponse, ToolCall, Usage};

/// Longest SSE line, and the most a whole streamed answer may hold.
const MAX_LINE: usize = 4 << 20;
const MAX_ANSWER: usize = 16 << 20;

/// Why a streamed attempt failed: the HTTP layer's failure, or an answer sandboxd cannot read.
pub(super) enum StreamFailure {
    Http(HttpFailure),
    Bad(String),
}

/// One streamed attempt: POST `body` to `url` with `headers`, hand text pieces to `on_text`.
pub(super) async fn attempt(
    http: &reqwest::Client,
    url: &str,
    headers: reqwest::header::HeaderMap,
    query: &[(&str, &str)],
    body: &Value,
    on_text: &(dyn Fn(&str) + Send + Sync),
) -> Result<Completion, StreamFailure> {
    let response = http
        .post(url)
        .headers(headers)
        .query(query)
        .json(body)
        .send()
        .await
        .map_err(|e| {
            StreamFailure::Http(HttpFailure::Transport {
                message: e.to_string(),
                connect: e.is_connect(),
            })
        })?;
    if !response.status().is_success() {
        return Err(StreamFailure::Http(refused(response).await));
    }
    let is_sse = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_sse {
        // The server did not stream: a plain answer.
        let bytes = response
            .bytes()
            .await
            .map_err(|e| StreamFailure::Bad(e.to_string()))?;
        let raw: RawResponse =
            serde_json::from_slice(&bytes).map_err(|e| StreamFailure::Bad(e.to_string()))?;
        return raw
            .into_completion()
            .ok_or_else(|| StreamFailure::Bad("the response has no choices[0].message".into()));
    }
    let mut assembly = Assembly::default();
    let mut lines = Lines::default();
    let mut response = response;
    loop {
        let piece = response.chunk().await.map_err(|e| {
            StreamFailure::Http(HttpFailure::Transport {
                message: format!("the stream broke: {e}"),
                connect: false,
            })
        })?;
        let Some(piece) = piece else { break };
        for data in lines.feed(&piece).map_err(StreamFailure::Bad)? {
            if data == "[DONE]" {
                return Ok(assembly.finish());
            }
            assembly.chunk(&data, on_text)?;
        }
    }
    // Some servers end the stream without [DONE]; what arrived is the answer.
    Ok(assembly.finish())
}

/// A non-2xx answer: its status, Retry-After and the server's own message.
async fn refused(response: reqwest::Response) -> HttpFailure {
    let header = |n: &str| {
        response
            .headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let wait = retry_after(
        header("retry-after-ms").as_deref(),
        header("retry-after").as_deref(),
    );
    let status = response.status().as_u16();
    let body = response
        .bytes()
        .await
        .map(|b| b.to_vec())
        .unwrap_or_default();
    HttpFailure::Status {
        status,
        message: server_message(&body),
        retry_after: wait,
    }
}

/// Splits the byte stream into SSE events and returns the `data` of each complete one.
#[derive(Default)]
struct Lines {
    buf: Vec<u8>,
    data: String,
    total: usize,
}

impl Lines {
    fn feed(&mut self, piece: &[u8]) -> Result<Vec<String>, String> {
        self.total += piece.len();
        if self.total > MAX_ANSWER {
            return Err(format!("the streamed answer is over {MAX_ANSWER} bytes"));
        }
        self.buf.extend_from_slice(piece);
        let mut events = Vec::new();
        while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    events.push(std::mem::take(&mut self.data));
                }
            } else if let Some(d) = line.strip_prefix("data:") {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(d.strip_prefix(' ').unwrap_or(d));
            }
            // `event:`, `id:`, `retry:` and `:` comments carry nothing we use.
        }
        if self.buf.len() > MAX_LINE || self.data.len() > MAX_LINE {
            return Err(format!("a streamed line is over {MAX_LINE} bytes"));
        }
        // A server that sends one `data:` line per chunk and no blank line between them.
        if self.buf.is_empty() && self.data.ends_with('}') && self.data.starts_with('{') {
            if serde_json::from_str::<Value>(&self.data).is_ok() {
                events.push(std::mem::take(&mut self.data));
            }
        } else if self.data == "[DONE]" {
            events.push(std::mem::take(&mut self.data));
        }
        Ok(events)
    }
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<ChunkChoice>>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<CallDelta>>,
}

#[derive(Deserialize)]
struct CallDelta {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

/// The answer so far.
#[derive(Default)]
struct Assembly {
    content: String,
    calls: BTreeMap<usize, ToolCall>,
    finish_reason: Option<String>,
    usage: Usage,
}

impl Assembly {
    fn chunk(
        &mut self,
        data: &str,
        on_text: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<(), StreamFailure> {
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
            let snippet: String = data.chars().take(200).collect();
            StreamFailure::Bad(format!("a streamed chunk is not JSON ({e}): {snippet}"))
        })?;
        if let Some(error) = chunk.error {
            // An error in the middle of the stream: its message, retried like a 5xx.
            let body = serde_json::json!({ "error": error }).to_string();
            return Err(StreamFailure::Http(HttpFailure::Status {
                status: 500,
                message: server_message(body.as_bytes()),
                retry_after: None,
            }));
        }
        if let Some(u) = chunk.usage.filter(|u| !u.is_null()) {
            let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
            self.usage = Usage {
                prompt_tokens: n("prompt_tokens"),
                completion_tokens: n("completion_tokens"),
            };
        }
        let Some(choice) = chunk.choices.and_then(|c| c.into_iter().next()) else {
            return Ok(());
        };
        if let Some(f) = choice.finish_reason {
            self.finish_reason = Some(f);
        }
        let Some(delta) = choice.delta else {
            return Ok(());
        };
        if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
            on_text(&text);
            self.content.push_str(&text);
        }
        for (position, call) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
            let index = call.index.unwrap_or(position);
            let entry = self.calls.entry(index).or_insert_with(|| ToolCall {
                id: String::new(),
                kind: "function".into(),
                function: FunctionCall {
                    name: String::new(),
                    arguments: String::new(),
                },
            });
            if let Some(id) = call.id.filter(|id| !id.is_empty()) {
                entry.id = id;
            }
            if let Some(f) = call.function {
                if let Some(name) = f.name {
                    entry.function.name.push_str(&name);
                }
                match f.arguments {
                    Some(Value::String(s)) => entry.function.arguments.push_str(&s),
                    Some(Value::Null) | None => {}
                    Some(other) => entry.function.arguments.push_str(&other.to_string()),
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Completion {
        let content = Some(self.content).filter(|c| !c.trim().is_empty());
        let tool_calls = self
            .calls
            .into_values()
            .enumerate()
            .map(|(i, mut c)| {
                // A call without an id could not be paired with its tool message.
                if c.id.is_empty() {
                    c.id = format!(
                        "call_{}_{i}",
                        &uuid::Uuid::new_v4().simple().to_string()[..8]
                    );
                }
                c
            })
            .collect();
        Completion {
            content,
            tool_calls,
            finish_reason: self.finish_reason,
            usage: self.usage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Fragments as OpenAI sends them: text in pieces, then a tool call whose arguments
    /// arrive split, a second call interleaved, the usage in a last chunk without choices;
    /// the SSE lines themselves cut at arbitrary byte positions.
    #[test]
    fn fragments_assemble_into_one_completion() {
        let chunks = [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Let me "}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"look."}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"bash","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"comm"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","function":{"name":"python_execute","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"and\": \"ls\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":30,"total_tokens":150}}"#,
        ];
        let mut wire = String::new();
        for c in chunks {
            wire.push_str(&format!("data: {c}\r\n\r\n"));
        }
        wire.push_str(": keep-alive\n\ndata: [DONE]\n\n");
        let texts = Mutex::new(Vec::new());
        let on_text = |t: &str| texts.lock().unwrap().push(t.to_string());
        let mut lines = Lines::default();
        let mut assembly = Assembly::default();
        let mut done = false;
        for piece in wire.as_bytes().chunks(7) {
            for data in lines.feed(piece).unwrap() {
                if data == "[DONE]" {
                    done = true;
                } else {
                    assert!(assembly.chunk(&data, &on_text).is_ok());
                }
            }
        }
        assert!(done);
        let c = assembly.finish();
        assert_eq!(*texts.lock().unwrap(), ["Let me ", "look."]);
        assert_eq!(c.content.as_deref(), Some("Let me look."));
        assert_eq!(c.tool_calls.len(), 2);
        assert_eq!(c.tool_calls[0].id, "call_a");
        assert_eq!(c.tool_calls[0].function.arguments, r#"{"command": "ls"}"#);
        assert_eq!(c.tool_calls[1].function.name, "python_execute");
        assert_eq!(c.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(c.usage.prompt_tokens, 120);
    }

    #[test]
    fn hostile_streams_are_refused_with_a_reason() {
        let mut lines = Lines::default();
        let huge = vec![b'x'; MAX_LINE + 10];
        assert!(lines.feed(&huge).is_err());
        let mut assembly = Assembly::default();
        assert!(matches!(
            assembly.chunk("not json", &|_| {}),
            Err(StreamFailure::Bad(_))
        ));
        assert!(matches!(
            assembly.chunk(r#"{"error":{"message":"overloaded"}}"#, &|_| {}),
            Err(StreamFailure::Http(HttpFailure::Status { .. }))
        ));
    }
}
