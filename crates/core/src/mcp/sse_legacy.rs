//! The legacy HTTP+SSE client transport of MCP (protocol 2024-11-05), for servers that offer
//! nothing newer (OpenManus's own example `mcp.json` names one).
//!
//! The client opens a GET event stream; the server's first event, `endpoint`, names the URL
//! to POST JSON-RPC messages to, and every answer comes back as a `message` event on the
//! stream. rmcp 3 dropped this transport, and it is small, so it is written here rather than
//! taken from a crate: a reader task parses the stream with hard caps (a line, an event) and
//! hands messages over a bounded channel; `send` is one POST each.
//!
//! The endpoint must have the stream's origin (scheme, host, port): the headers configured
//! for the server (often an `Authorization`) go with every POST, and a server must not be
//! able to send them elsewhere.

use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use rmcp::RoleClient;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Longest line of the event stream, and largest event (its data lines together).
const MAX_LINE: usize = 1 << 20;
const MAX_EVENT: usize = 8 << 20;
/// Messages read ahead of the service: the stream waits when it is full.
const QUEUE: usize = 32;
const ENDPOINT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub(super) enum SseError {
    #[error("{0}")]
    Http(String),
    #[error("the server answered the POST with HTTP {0}")]
    Status(u16),
}

pub(super) struct LegacySse {
    client: reqwest::Client,
    post_url: reqwest::Url,
    rx: mpsc::Receiver<ServerJsonRpcMessage>,
    reader: JoinHandle<()>,
}

impl Drop for LegacySse {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Opens the event stream and waits for the server's `endpoint` event.
pub(super) async fn connect(url: &str, headers: &[(String, String)]) -> Result<LegacySse, String> {
    let sse_url = reqwest::Url::parse(url).map_err(|e| format!("{url:?}: {e}"))?;
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        let name = HeaderName::try_from(k.as_str()).map_err(|e| format!("header {k:?}: {e}"))?;
        let value = HeaderValue::try_from(v.as_str()).map_err(|e| format!("header {k:?}: {e}"))?;
        map.insert(name, value);
    }
    let client = reqwest::Client::builder()
        .default_headers(map)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    let response = client
        .get(sse_url.clone())
        .header(ACCEPT, "text/event-stream")
        .send()
        .await
        .map_err(|e| format!("cannot open the event stream {url}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!(
            "the event stream {url} answered HTTP {}",
            response.status()
        ));
    }
    let (endpoint_tx, endpoint_rx) = tokio::sync::oneshot::channel();
    let (tx, rx) = mpsc::channel(QUEUE);
    let reader = tokio::spawn(read_stream(response, endpoint_tx, tx));
    let endpoint = match tokio::time::timeout(ENDPOINT_TIMEOUT, endpoint_rx).await {
        Ok(Ok(e)) => e,
        Ok(Err(_)) => {
            return Err(format!(
                "the event stream {url} ended before its endpoint event"
            ));
        }
        Err(_) => return Err(format!("{url} sent no endpoint event within 30 s")),
    };
    let post_url = sse_url
        .join(endpoint.trim())
        .map_err(|e| format!("the endpoint event {endpoint:?} is not a URL: {e}"))?;
    if post_url.origin() != sse_url.origin() {
        reader.abort();
        return Err(format!(
            "the server asked for messages at {post_url}, outside the origin of {url}; refused"
        ));
    }
    Ok(LegacySse {
        client,
        post_url,
        rx,
        reader,
    })
}

/// Reads events until the stream ends or the service goes away: the first `endpoint` to
/// `endpoint`, every `message` (or untyped event) to `messages`.
async fn read_stream(
    mut response: reqwest::Response,
    endpoint: tokio::sync::oneshot::Sender<String>,
    messages: mpsc::Sender<ServerJsonRpcMessage>,
) {
    let mut endpoint = Some(endpoint);
    let mut parser = EventParser::default();
    while let Ok(Some(chunk)) = response.chunk().await {
        let Ok(events) = parser.feed(&chunk) else {
            tracing::warn!("an MCP event stream sent an over-long line or event; closed");
            return;
        };
        for (kind, data) in events {
            match kind.as_str() {
                "endpoint" => {
                    if let Some(tx) = endpoint.take() {
                        let _ = tx.send(data);
                    }
                }
                "message" | "" => match serde_json::from_str::<ServerJsonRpcMessage>(&data) {
                    Ok(m) => {
                        if messages.send(m).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "an MCP SSE message is not JSON-RPC"),
                },
                _ => {}
            }
        }
    }
}

/// The text/event-stream format, bounded: `feed` returns the events a chunk completes.
#[derive(Default)]
struct EventParser {
    line: Vec<u8>,
    kind: String,
    data: String,
}

impl EventParser {
    fn feed(&mut self, chunk: &[u8]) -> Result<Vec<(String, String)>, ()> {
        let mut out = Vec::new();
        for &b in chunk {
            if b != b'\n' {
                if self.line.len() >= MAX_LINE {
                    return Err(());
                }
                self.line.push(b);
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let line = String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(&line));
            if line.is_empty() {
                if !self.data.is_empty() || !self.kind.is_empty() {
                    out.push((
                        std::mem::take(&mut self.kind),
                        std::mem::take(&mut self.data),
                    ));
                }
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.kind = value.to_string(),
                "data" => {
                    if self.data.len() + value.len() + 1 > MAX_EVENT {
                        return Err(());
                    }
                    if !self.data.is_empty() {
                        self.data.push('\n');
                    }
                    self.data.push_str(value);
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

impl Transport<RoleClient> for LegacySse {
    type Error = SseError;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), SseError>> + Send + 'static {
        let request = self
            .client
            .post(self.post_url.clone())
            .header(CONTENT_TYPE, "application/json")
            .json(&item);
        async move {
            let response = request
                .send()
                .await
                .map_err(|e| SseError::Http(e.to_string()))?;
            if response.status().is_success() {
                Ok(())
            } else {
                Err(SseError::Status(response.status().as_u16()))
            }
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ServerJsonRpcMessage>> + Send {
        self.rx.recv()
    }

    async fn close(&mut self) -> Result<(), SseError> {
        self.reader.abort();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_split_across_chunks() {
        let mut p = EventParser::default();
        assert!(
            p.feed(b"event: endpoint\r\ndata: /messages/?session_id=1")
                .unwrap()
                .is_empty()
        );
        let e = p
            .feed(b"\r\n\r\n: comment\n\ndata: {\"a\":\ndata: 1}\n\n")
            .unwrap();
        assert_eq!(
            e,
            vec![
                (
                    "endpoint".to_string(),
                    "/messages/?session_id=1".to_string()
                ),
                (String::new(), "{\"a\":\n1}".to_string()),
            ]
        );
    }

    #[test]
    fn over_long_lines_and_events_are_refused() {
        let mut p = EventParser::default();
        assert!(p.feed(&vec![b'x'; MAX_LINE + 1]).is_err());
        let mut p = EventParser::default();
        let line = format!("data: {}\n", "y".repeat(MAX_LINE - 10));
        let mut refused = false;
        for _ in 0..(MAX_EVENT / MAX_LINE + 2) {
            if p.feed(line.as_bytes()).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused, "an event is capped in total, not only per line");
    }
}
