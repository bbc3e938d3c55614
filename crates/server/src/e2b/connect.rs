//! Connect's protocol as envd's clients speak it: HTTP/1.1 POSTs to `/{service}/{method}`,
//! messages in JSON (the SDKs' envd codec is JSON, `client_shared.py`: "matching the JS SDK's
//! `useBinaryFormat: false`"), so the messages are serde types of proto3's JSON mapping
//! (`wire.rs`) and no protobuf code is generated: there is no binary encoding to speak.
//!
//! A unary call's request and answer are one JSON body (`application/json`); an error is a
//! non-200 status with `{"code": "not_found", "message": ...}`. A server stream's request is
//! one envelope and its answer a sequence of envelopes (`application/connect+json`): one
//! flags byte, a 4-byte big-endian length, the JSON; the last has flag 2 and carries `{}` or
//! `{"error": {...}}`.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::E2bError;
use crate::error::ApiError;

/// The largest request envelope taken (the messages envd receives are small).
const MAX_ENVELOPE: usize = 4 << 20;
const END_STREAM: u8 = 2;

/// A Connect error: a code of the protocol's and a message.
#[derive(Debug)]
pub(super) struct ConnectError {
    pub(super) code: &'static str,
    pub(super) message: String,
    /// `Retry-After` in seconds, carried from the E2B/`/v1` error (unary answers only: a
    /// stream's error is in its last envelope, after the headers).
    pub(super) retry_after: Option<u64>,
}

impl ConnectError {
    pub(super) fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub(super) fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_argument", message)
    }

    pub(super) fn not_found(message: impl Into<String>) -> Self {
        Self::new("not_found", message)
    }

    fn status(&self) -> StatusCode {
        match self.code {
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            "permission_denied" => StatusCode::FORBIDDEN,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn json(&self) -> Value {
        serde_json::json!({"code": self.code, "message": self.message})
    }
}

impl From<E2bError> for ConnectError {
    fn from(e: E2bError) -> Self {
        let code = match e.status.as_u16() {
            400 => "invalid_argument",
            401 => "unauthenticated",
            403 => "permission_denied",
            404 => "not_found",
            409 => "failed_precondition",
            413 | 429 => "resource_exhausted",
            501 => "unimplemented",
            502 | 503 => "unavailable",
            504 => "deadline_exceeded",
            _ => "internal",
        };
        let mut out = Self::new(code, e.message);
        out.retry_after = e.retry_after;
        out
    }
}

impl From<ApiError> for ConnectError {
    fn from(e: ApiError) -> Self {
        E2bError::from(e).into()
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), axum::Json(self.json())).into_response();
        super::retry_after(&mut resp, self.retry_after);
        resp
    }
}

/// Whether the call is a server stream (its body is an envelope).
fn is_stream(headers: &HeaderMap) -> bool {
    content_type(headers).starts_with("application/connect+")
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The request message, from a unary JSON body or a stream's one envelope.
pub(super) fn request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<T, ConnectError> {
    let ct = content_type(headers).split(';').next().unwrap_or("").trim();
    let json: &[u8] = match ct {
        "application/json" => body,
        "application/connect+json" => envelope(body)?,
        "" => body,
        other => {
            return Err(ConnectError::new(
                "unimplemented",
                format!(
                    "content type {other:?}: sandboxd's envd speaks Connect with JSON messages (application/json, application/connect+json), as the E2B SDKs send them"
                ),
            ));
        }
    };
    let json = if json.is_empty() {
        b"{}" as &[u8]
    } else {
        json
    };
    serde_json::from_slice(json)
        .map_err(|e| ConnectError::invalid(format!("the request message is not valid: {e}")))
}

fn envelope(body: &[u8]) -> Result<&[u8], ConnectError> {
    let bad = |why: &str| Err(ConnectError::invalid(format!("the request envelope {why}")));
    if body.len() < 5 {
        return bad("is shorter than its 5-byte prefix");
    }
    if body[0] & 1 != 0 {
        return bad("is compressed; send it uncompressed");
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if len > MAX_ENVELOPE || body.len() != 5 + len {
        return bad("has a length that does not match its body");
    }
    Ok(&body[5..])
}

/// A unary answer.
pub(super) fn unary(message: Value) -> Response {
    (StatusCode::OK, axum::Json(message)).into_response()
}

fn frame(flags: u8, message: &Value) -> Bytes {
    let json = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
    let mut out = Vec::with_capacity(5 + json.len());
    out.push(flags);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    Bytes::from(out)
}

/// A server stream's answer: each message as it comes; an error ends the stream with it.
pub(super) fn stream<S>(messages: S) -> Response
where
    S: Stream<Item = Result<Value, ConnectError>> + Send + 'static,
{
    let body = futures::stream::unfold(
        (Box::pin(messages), false),
        |(mut messages, done)| async move {
            if done {
                return None;
            }
            let (piece, done) = match messages.next().await {
                Some(Ok(m)) => (frame(0, &m), false),
                Some(Err(e)) => (
                    frame(END_STREAM, &serde_json::json!({"error": e.json()})),
                    true,
                ),
                None => (frame(END_STREAM, &serde_json::json!({})), true),
            };
            Some((Ok::<Bytes, std::io::Error>(piece), (messages, done)))
        },
    );
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/connect+json")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A call's answer; an error as the call expects it (a unary error, or a stream that ends
/// with it).
pub(super) fn answer(headers: &HeaderMap, answer: Result<Response, ConnectError>) -> Response {
    match answer {
        Ok(r) => r,
        Err(e) if is_stream(headers) => stream_error(e),
        Err(e) => e.into_response(),
    }
}

/// A stream that fails before its first message (the target is gone, the request is bad).
fn stream_error(e: ConnectError) -> Response {
    stream(futures::stream::once(async move { Err(e) }))
}
