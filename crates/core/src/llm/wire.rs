//! The chat-completions wire format: the messages we send (also what a transcript stores)
//! and deliberately lenient response types.
//!
//! The response side accepts what "OpenAI-compatible" servers really send: a missing
//! `created` or `id`, an unknown `finish_reason` ("eos", "error"), tool calls without
//! `type` or `id` (older Ollama), arguments as a JSON object instead of a string, `null`
//! where a field is expected, and extra fields (vLLM's `reasoning_content`, `stop_reason`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One chat message, serialized exactly as OpenAI expects it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: UserContent,
    },
    Assistant {
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        tool_call_id: String,
        content: String,
    },
}

impl Message {
    pub fn system(text: impl Into<String>) -> Self {
        Message::System {
            content: text.into(),
        }
    }

    pub fn user(text: impl Into<String>) -> Self {
        Message::User {
            content: UserContent::Text(text.into()),
        }
    }

    pub fn tool(call_id: impl Into<String>, text: impl Into<String>) -> Self {
        Message::Tool {
            tool_call_id: call_id.into(),
            content: text.into(),
        }
    }

    pub fn has_image(&self) -> bool {
        matches!(self, Message::User { content: UserContent::Parts(parts) } if parts.iter().any(|p| matches!(p, ContentPart::ImageUrl { .. })))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum UserContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageUrl {
    pub url: String,
}

impl ContentPart {
    /// A base64 PNG or JPEG as a data URL part; the media type is sniffed from the bytes.
    pub fn image_base64(b64: &str) -> Self {
        let mime = if b64.starts_with("/9j/") {
            "image/jpeg"
        } else {
            "image/png"
        };
        ContentPart::ImageUrl {
            image_url: ImageUrl {
                url: format!("data:{mime};base64,{b64}"),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// The raw JSON text the model produced (possibly malformed: the registry checks it).
    pub arguments: String,
}

/// The request body of POST /chat/completions.
#[derive(Debug, Serialize)]
pub struct ChatRequest<'a> {
    pub model: &'a str,
    pub messages: &'a [Message],
    #[serde(skip_serializing_if = "<[Value]>::is_empty")]
    pub tools: &'a [Value],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    pub stream: bool,
    /// `{"include_usage": true}` when streaming: the usage comes in a last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<Value>,
}

/// Token counts of one response (`usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Usage {
    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
    }
}

/// What the model answered, normalized.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    pub usage: Usage,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawResponse {
    #[serde(default)]
    choices: Option<Vec<RawChoice>>,
    #[serde(default)]
    usage: Option<RawUsage>,
}

#[derive(Debug, Deserialize)]
struct RawChoice {
    #[serde(default)]
    message: Option<RawMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawMessage {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<RawToolCall>>,
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawToolCall {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<RawFunction>,
}

#[derive(Debug, Deserialize)]
struct RawFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct RawUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

impl RawResponse {
    /// The first choice, normalized; None when the server sent no choice at all.
    pub(crate) fn into_completion(self) -> Option<Completion> {
        let usage = self
            .usage
            .map(|u| Usage {
                prompt_tokens: u.prompt_tokens.unwrap_or(0),
                completion_tokens: u.completion_tokens.unwrap_or(0),
            })
            .unwrap_or_default();
        let choice = self.choices?.into_iter().next()?;
        let message = choice.message?;
        let mut content = message
            .content
            .and_then(content_text)
            .filter(|c| !c.trim().is_empty());
        if content.is_none() {
            content = message.refusal.filter(|r| !r.trim().is_empty());
        }
        let tool_calls = message
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let f = c.function?;
                let arguments = match f.arguments {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s,
                    Some(other) => other.to_string(),
                };
                Some(ToolCall {
                    // A missing id would make the tool message unpairable; invent a unique one.
                    id: c
                        .id
                        .filter(|id| !id.is_empty())
                        .unwrap_or_else(|| format!("call_{}_{i}", short_id())),
                    kind: function_type(),
                    function: FunctionCall {
                        name: f.name.unwrap_or_default(),
                        arguments,
                    },
                })
            })
            .collect();
        Some(Completion {
            content,
            tool_calls,
            finish_reason: choice.finish_reason,
            usage,
        })
    }
}

/// Text of a `content` that is a string or an array of text parts.
fn content_text(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s),
        Value::Array(parts) => {
            let text: Vec<String> = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str).map(String::from))
                .collect();
            (!text.is_empty()).then(|| text.join(""))
        }
        _ => None,
    }
}

fn short_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Completion {
        serde_json::from_value::<RawResponse>(v)
            .unwrap()
            .into_completion()
            .unwrap()
    }

    #[test]
    fn vllm_response_with_extra_fields() {
        // As sent by vLLM 0.6+ with --enable-auto-tool-choice (hermes parser).
        let c = parse(json!({
            "id": "chatcmpl-9f1c", "object": "chat.completion", "created": 1732000000, "model": "Qwen/Qwen2.5-7B-Instruct",
            "choices": [{"index": 0, "message": {"role": "assistant", "reasoning_content": null, "content": null,
                "tool_calls": [{"id": "chatcmpl-tool-3a1b", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
                "logprobs": null, "finish_reason": "tool_calls", "stop_reason": null}],
            "usage": {"prompt_tokens": 310, "total_tokens": 335, "completion_tokens": 25, "prompt_tokens_details": null},
            "prompt_logprobs": null
        }));
        assert_eq!(c.tool_calls[0].id, "chatcmpl-tool-3a1b");
        assert_eq!(c.tool_calls[0].function.arguments, "{\"command\": \"ls\"}");
        assert_eq!(
            c.usage,
            Usage {
                prompt_tokens: 310,
                completion_tokens: 25
            }
        );
    }

    #[test]
    fn ollama_style_and_broken_servers() {
        // Older Ollama: finish_reason "stop" with tool calls, no type; some servers: no created,
        // arguments as an object, an unknown finish_reason.
        let c = parse(json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "llama3.1", "system_fingerprint": "fp_ollama",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "",
                "tool_calls": [{"function": {"name": "bash", "arguments": {"command": "pwd"}}}]}, "finish_reason": "eos"}]
        }));
        assert_eq!(c.content, None);
        assert_eq!(c.tool_calls[0].function.name, "bash");
        assert_eq!(c.tool_calls[0].function.arguments, r#"{"command":"pwd"}"#);
        assert!(c.tool_calls[0].id.starts_with("call_"));
        assert_eq!(c.finish_reason.as_deref(), Some("eos"));
        assert_eq!(c.usage, Usage::default());
    }

    #[test]
    fn messages_serialize_as_openai_expects() {
        let m = Message::Assistant {
            content: None,
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                kind: "function".into(),
                function: FunctionCall {
                    name: "bash".into(),
                    arguments: "{}".into(),
                },
            }],
        };
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]})
        );
        assert_eq!(
            serde_json::to_value(Message::tool("c1", "ok")).unwrap(),
            json!({"role": "tool", "tool_call_id": "c1", "content": "ok"})
        );
        assert_eq!(
            serde_json::to_value(Message::user("hi")).unwrap(),
            json!({"role": "user", "content": "hi"})
        );
    }
}
