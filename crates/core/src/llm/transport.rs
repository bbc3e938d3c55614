//! The HTTP layer under async-openai: one attempt per call, no retries, and every failure
//! turned into an `HttpFailure` that keeps what the retry policy needs (status,
//! Retry-After, the server's own message).
//!
//! Why not async-openai's built-in layer: it retries 3 times on its own schedule, hides
//! Retry-After and the status from the caller, and its error parsing only understands
//! OpenAI's `{"error": {...}}` body (vLLM sends `{"object":"error","message":...}`), so
//! a 400 from such a server would lose both its status and its message. Our retry policy
//! lives in `LlmClient::chat`, where it can also emit retry events and honour cancellation.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use async_openai::error::OpenAIError;
use async_openai::middleware::{HttpRequestFactory, ReqwestService};
use serde_json::Value;

type Response = <ReqwestService as tower::Service<HttpRequestFactory>>::Response;

/// Why one HTTP attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpFailure {
    #[error("HTTP {status}: {message}")]
    Status {
        status: u16,
        message: String,
        retry_after: Option<Duration>,
    },
    #[error("{message}")]
    Transport { message: String, connect: bool },
}

#[derive(Clone, Default)]
pub(super) struct Transport {
    inner: ReqwestService,
}

impl tower::Service<HttpRequestFactory> for Transport {
    type Response = Response;
    type Error = OpenAIError;
    type Future = Pin<Box<dyn Future<Output = Result<Response, OpenAIError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: HttpRequestFactory) -> Self::Future {
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let response = match inner.call(request).await {
                Ok(r) => r,
                Err(OpenAIError::Reqwest(e)) => {
                    let message = error_chain(&e);
                    return Err(boxed(HttpFailure::Transport {
                        message,
                        connect: e.is_connect(),
                    }));
                }
                Err(other) => return Err(other),
            };
            let status = response.status();
            if status.is_success() {
                return Ok(response);
            }
            let retry_after = retry_after(
                response
                    .headers()
                    .get("retry-after-ms")
                    .and_then(|v| v.to_str().ok()),
                response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()),
            );
            let body = response
                .bytes()
                .await
                .map(|b| b.to_vec())
                .unwrap_or_default();
            Err(boxed(HttpFailure::Status {
                status: status.as_u16(),
                message: server_message(&body),
                retry_after,
            }))
        })
    }
}

fn boxed(f: HttpFailure) -> OpenAIError {
    OpenAIError::Boxed(Box::new(f))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// OpenAI's `retry-after-ms`, else `Retry-After` as seconds (an HTTP date counts as 1 s).
pub(super) fn retry_after(ms: Option<&str>, secs: Option<&str>) -> Option<Duration> {
    if let Some(ms) = ms
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let secs = secs?.trim();
    match secs.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Some(Duration::from_secs_f64(v)),
        Ok(_) => None,
        Err(_) => Some(Duration::from_secs(1)),
    }
}

/// The server's error message from whatever error body shape it uses, cut to 1000 chars.
pub(super) fn server_message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let from_json = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
        let candidates = [
            v.pointer("/error/message"),
            v.get("message"),
            v.get("error"),
            v.get("detail"),
        ];
        candidates.into_iter().flatten().find_map(|m| match m {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Null => None,
            other if !other.is_object() => Some(other.to_string()),
            _ => None,
        })
    });
    let msg = from_json.unwrap_or_else(|| {
        let t = text.trim();
        if t.is_empty() {
            "(empty body)".to_string()
        } else {
            t.to_string()
        }
    });
    msg.chars().take(1000).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_from_each_server_shape() {
        assert_eq!(
            server_message(br#"{"error":{"message":"bad model","type":"invalid_request_error"}}"#),
            "bad model"
        );
        assert_eq!(server_message(br#"{"object":"error","message":"vllm says no","type":"BadRequestError","code":400}"#), "vllm says no");
        assert_eq!(
            server_message(br#"{"error":"ollama says no"}"#),
            "ollama says no"
        );
        assert_eq!(server_message(b"upstream gone"), "upstream gone");
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(retry_after(None, Some("2")), Some(Duration::from_secs(2)));
        assert_eq!(
            retry_after(Some("1500"), Some("2")),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after(None, Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            Some(Duration::from_secs(1))
        );
        assert_eq!(retry_after(None, None), None);
    }
}
