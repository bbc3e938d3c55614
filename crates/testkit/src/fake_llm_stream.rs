//! The fake LLM's streamed answers: what it sends for a request with `stream: true`, as
//! OpenAI does (server-sent events of `chat.completion.chunk`s, text and tool-call
//! arguments in fragments, the usage in a last chunk, then `data: [DONE]`).
//!
//! Every scripted `Reply::Assistant` is streamed in fragments when the request asks for a
//! stream (so every agent test runs the real assembly); `Reply::Streamed` scripts the
//! pieces themselves, with gates between them so a test can hold the answer half-written
//! for exactly as long as it looks at what arrived so far.

use std::collections::VecDeque;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use crate::fake_llm::Gate;

/// One piece of a streamed answer.
#[derive(Debug, Clone)]
pub enum Piece {
    /// A fragment of the answer's text.
    Text(String),
    /// A fragment of tool call `index`: the first one names it, later ones carry only
    /// more of its arguments.
    Call {
        index: usize,
        name: Option<String>,
        arguments: String,
    },
    /// Nothing more is sent until the gate is opened.
    Wait(Gate),
    /// The connection breaks here (the body ends in an error, as when a proxy drops it):
    /// the client sees a broken stream and retries (the next scripted reply answers).
    Break,
}

impl Piece {
    pub fn text(t: &str) -> Piece {
        Piece::Text(t.to_string())
    }

    /// The first fragment of call `index`, with its name.
    pub fn call(index: usize, name: &str, arguments: &str) -> Piece {
        Piece::Call {
            index,
            name: Some(name.to_string()),
            arguments: arguments.to_string(),
        }
    }

    /// More of call `index`'s arguments.
    pub fn args(index: usize, arguments: &str) -> Piece {
        Piece::Call {
            index,
            name: None,
            arguments: arguments.to_string(),
        }
    }
}

/// `content` and `calls` cut into fragments: the text in three, each call's arguments in two.
pub fn fragments(content: Option<&str>, calls: &[(String, String)]) -> Vec<Piece> {
    let mut pieces = Vec::new();
    if let Some(text) = content {
        let chars: Vec<char> = text.chars().collect();
        let step = chars.len().div_ceil(3).max(1);
        for part in chars.chunks(step) {
            pieces.push(Piece::Text(part.iter().collect()));
        }
    }
    for (index, (name, args)) in calls.iter().enumerate() {
        let cut = args
            .char_indices()
            .map(|(i, _)| i)
            .nth(args.chars().count() / 2)
            .unwrap_or(args.len());
        pieces.push(Piece::call(index, name, &args[..cut]));
        pieces.push(Piece::args(index, &args[cut..]));
    }
    pieces
}

/// The SSE answer of request `n` whose prompt had `prompt_chars` characters.
pub fn response(pieces: Vec<Piece>, n: u64, prompt_chars: u64) -> Response {
    let has_calls = pieces.iter().any(|p| matches!(p, Piece::Call { .. }));
    let finish = if has_calls { "tool_calls" } else { "stop" };
    let chunk = move |delta: Value, finish: Option<&str>| {
        json!({"id": format!("chatcmpl-fake-{n}"), "object": "chat.completion.chunk", "created": 1_700_000_000u64,
            "model": "fake-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    // Ok: a chunk to send; Err(Some): a gate to wait for; Err(None): the break.
    let mut frames: VecDeque<Result<Value, Option<Gate>>> = VecDeque::new();
    frames.push_back(Ok(chunk(json!({"role": "assistant", "content": ""}), None)));
    for piece in pieces {
        frames.push_back(match piece {
            Piece::Text(t) => Ok(chunk(json!({"content": t}), None)),
            Piece::Call {
                index,
                name,
                arguments,
            } => {
                let mut call = json!({"index": index, "function": {"arguments": arguments}});
                if let Some(name) = name {
                    call["id"] = json!(format!("call_{n}_{index}"));
                    call["type"] = json!("function");
                    call["function"]["name"] = json!(name);
                }
                Ok(chunk(json!({"tool_calls": [call]}), None))
            }
            Piece::Wait(gate) => Err(Some(gate)),
            Piece::Break => Err(None),
        });
    }
    frames.push_back(Ok(chunk(json!({}), Some(finish))));
    // ~4 characters per token, like the plain answers.
    frames.push_back(Ok(json!({"id": format!("chatcmpl-fake-{n}"), "object": "chat.completion.chunk",
        "choices": [], "usage": {"prompt_tokens": prompt_chars / 4, "completion_tokens": 10, "total_tokens": prompt_chars / 4 + 10}})));
    let stream = futures::stream::unfold((frames, false), |(mut frames, done)| async move {
        loop {
            match frames.pop_front() {
                Some(Ok(v)) => {
                    let bytes = Bytes::from(format!("data: {v}\n\n"));
                    return Some((Ok::<_, std::io::Error>(bytes), (frames, done)));
                }
                Some(Err(Some(gate))) => gate.wait().await,
                Some(Err(None)) => {
                    let broke = std::io::Error::other("the fake model's stream breaks here");
                    return Some((Err(broke), (VecDeque::new(), true)));
                }
                None if !done => {
                    return Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), (frames, true)));
                }
                None => return None,
            }
        }
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(stream),
    )
        .into_response()
}
