//! One request to the model while the run's watchers look on: the client's retry notices
//! become `retry` events, and the answer's text, streamed, goes to the sinks as deltas
//! while it is written.
//!
//! Both come from synchronous callbacks inside the LLM client and reach the (async) sinks
//! through queues drained while the request is in flight. Deltas are coalesced: the first
//! piece goes out at once (the time to the first visible token is what a user feels), later
//! ones at most every `COALESCE`, so a fast model makes ~40 deltas a second, not one per
//! token. The text queue holds at most one answer (the client bounds a streamed answer).

use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::sink::Emitter;
use crate::events::EventKind;
use crate::llm::{Completion, LlmClient, LlmError, Message, RetryNotice};

/// The shortest time between two deltas of one run.
pub(super) const COALESCE: Duration = Duration::from_millis(25);

/// Asks the model with `tools`, streaming the answer's text to `emitter` as deltas of `step`.
pub(super) async fn chat(
    llm: &LlmClient,
    messages: &[Message],
    tools: &[Value],
    cancel: &CancellationToken,
    emitter: &mut Emitter<'_>,
    step: usize,
) -> Result<Completion, LlmError> {
    // The client retries a bounded number of times, so a full queue only drops notices.
    let (retry_tx, mut retry_rx) = mpsc::channel::<RetryNotice>(16);
    let on_retry = move |n: RetryNotice| {
        let _ = retry_tx.try_send(n);
    };
    let (text_tx, mut text_rx) = mpsc::unbounded_channel::<String>();
    let on_text = move |t: &str| {
        let _ = text_tx.send(t.to_string());
    };
    let mut pending = String::new();
    let mut last_sent: Option<Instant> = None;
    let result = {
        let chat = llm.chat_streaming(messages, tools, cancel, &on_retry, &on_text);
        tokio::pin!(chat);
        loop {
            let due = last_sent.map_or_else(Instant::now, |t| t + COALESCE);
            tokio::select! {
                r = &mut chat => break r,
                Some(n) = retry_rx.recv() => emitter.emit(retry_event(n)).await,
                Some(t) = text_rx.recv() => {
                    pending.push_str(&t);
                    if last_sent.is_none_or(|at| at.elapsed() >= COALESCE) {
                        emitter.delta(step, std::mem::take(&mut pending)).await;
                        last_sent = Some(Instant::now());
                    }
                }
                _ = tokio::time::sleep_until(due), if !pending.is_empty() => {
                    emitter.delta(step, std::mem::take(&mut pending)).await;
                    last_sent = Some(Instant::now());
                }
            }
        }
    };
    while let Ok(t) = text_rx.try_recv() {
        pending.push_str(&t);
    }
    if !pending.is_empty() {
        emitter.delta(step, pending).await;
    }
    while let Ok(n) = retry_rx.try_recv() {
        emitter.emit(retry_event(n)).await;
    }
    result
}

fn retry_event(n: RetryNotice) -> EventKind {
    EventKind::Retry {
        attempt: n.attempt,
        max_attempts: n.max_attempts,
        delay_ms: n.delay.as_millis() as u64,
        reason: n.reason,
    }
}
