//! How a session's conversation is stored: a versioned document of our own,
//! `{"v": 1, "messages": [...]}`, rather than the bare message list the LLM is sent, so
//! the stored form can change without old rows silently reading as something else.
//!
//! Version 1's messages have the serde shape `llm::Message` has today; a change to that
//! shape needs a version 2 and a conversion here (the test pinning a v1 document catches
//! one made by accident). Rows written before the wrapper existed are the bare list:
//! they read as version 0. A row that decodes as neither is an error, never an empty
//! history: continuing it as empty would run the task without what came before.

use serde::Serialize;
use serde_json::Value;

use crate::llm::Message;

/// The version `encode` writes.
pub const CONVERSATION_VERSION: u64 = 1;

/// Why a stored conversation cannot be continued.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    #[error(
        "it is stored in format version {found}, newer than this sandboxd knows ({CONVERSATION_VERSION})"
    )]
    TooNew { found: u64 },
    #[error("it cannot be decoded: {0}")]
    Malformed(String),
}

#[derive(Serialize)]
struct V1<'a> {
    v: u64,
    messages: &'a [Message],
}

/// The stored form of `messages` (what `Store::set_conversation` takes).
pub fn encode(messages: &[Message]) -> Result<String, serde_json::Error> {
    serde_json::to_string(&V1 {
        v: CONVERSATION_VERSION,
        messages,
    })
}

/// The messages of a stored conversation (what `Store::conversation` returns), of any
/// version this sandboxd knows.
pub fn decode(text: &str) -> Result<Vec<Message>, ConversationError> {
    let malformed = |e: serde_json::Error| ConversationError::Malformed(e.to_string());
    let messages = match serde_json::from_str::<Value>(text).map_err(malformed)? {
        // Version 0: the bare list, as rows were written before the format had a version.
        list @ Value::Array(_) => list,
        Value::Object(mut doc) => match doc.get("v").and_then(Value::as_u64) {
            Some(CONVERSATION_VERSION) => doc.remove("messages").ok_or_else(|| {
                ConversationError::Malformed("version 1 without \"messages\"".into())
            })?,
            Some(found) if found > CONVERSATION_VERSION => {
                return Err(ConversationError::TooNew { found });
            }
            _ => {
                return Err(ConversationError::Malformed(
                    "an object without a known \"v\"".into(),
                ));
            }
        },
        _ => {
            return Err(ConversationError::Malformed(
                "neither a list nor a versioned object".into(),
            ));
        }
    };
    serde_json::from_value(messages).map_err(malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{FunctionCall, ToolCall};

    fn messages() -> Vec<Message> {
        vec![
            Message::user("list the files"),
            Message::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: "bash".into(),
                        arguments: "{\"command\":\"ls\"}".into(),
                    },
                }],
            },
            Message::tool("c1", "a.txt"),
        ]
    }

    #[test]
    fn version_1_round_trips() {
        let text = encode(&messages()).unwrap();
        assert!(text.starts_with("{\"v\":1,\"messages\":["), "{text}");
        assert_eq!(decode(&text).unwrap(), messages());
    }

    #[test]
    fn a_version_1_document_keeps_reading() {
        // Pinned: if the message types change shape, stored conversations need a version 2.
        let text = r#"{"v":1,"messages":[{"role":"user","content":"list the files"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{\"command\":\"ls\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"a.txt"}]}"#;
        assert_eq!(decode(text).unwrap(), messages());
    }

    #[test]
    fn a_version_0_row_reads_as_its_messages() {
        let v0 = serde_json::to_string(&messages()).unwrap();
        assert_eq!(decode(&v0).unwrap(), messages());
        assert_eq!(decode("[]").unwrap(), Vec::<Message>::new());
    }

    #[test]
    fn an_undecodable_row_is_an_error_not_an_empty_history() {
        for bad in [
            "",
            "not json",
            "[1]",
            "{}",
            "{\"v\":1}",
            "{\"v\":1,\"messages\":[{\"role\":\"nobody\"}]}",
            "\"text\"",
        ] {
            assert!(
                matches!(decode(bad), Err(ConversationError::Malformed(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            decode("{\"v\":2,\"messages\":[]}"),
            Err(ConversationError::TooNew { found: 2 })
        ));
    }
}
