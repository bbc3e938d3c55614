//! One request to the model while the run's watchers look on: the client's retry notices
//! become `retry` events, and the answer's text, streamed, goes to the sinks as deltas
//! while it is written.
//!
//! Both come from synchronous callbacks inside the LLM client and reach the (async) sinks
//! through one queue, in order, drained while the request is in flight. Deltas are
//! coalesced: the first piece goes out at once (the time to the first visible token is what
//! a user feels), later ones at most every `COALESCE`, so a fast model makes ~40 deltas a
//! second, not one per token. The queue holds at most one answer (the client bounds a
//! streamed answer) and a bounded number of retries.

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

/// What the client's callbacks hand over, in the order they happened: a retry's notice
/// comes after the pieces of the attempt it ends and before those of the next one, so the
/// failed attempt's text is never placed after its `retry` event (a watcher drops the text
/// it shows at a retry: the answer starts again).
enum Heard {
    Text(String),
    Retry(RetryNotice),
}

/// Asks the model with `tools`, streaming the answer's text to `emitter` as deltas of `step`.
pub(super) async fn chat(
    llm: &LlmClient,
    messages: &[Message],
    tools: &[Value],
    cancel: &CancellationToken,
    emitter: &mut Emitter<'_>,
    step: usize,
) -> Result<Completion, LlmError> {
    // One queue for both: the client retries a bounded number of times and bounds a
    // streamed answer, so it stays small.
    let (tx, mut rx) = mpsc::unbounded_channel::<Heard>();
    let retry_tx = tx.clone();
    let on_retry = move |n: RetryNotice| {
        let _ = retry_tx.send(Heard::Retry(n));
    };
    let on_text = move |t: &str| {
        let _ = tx.send(Heard::Text(t.to_string()));
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
                Some(heard) = rx.recv() => match heard {
                    Heard::Text(t) => {
                        pending.push_str(&t);
                        if last_sent.is_none_or(|at| at.elapsed() >= COALESCE) {
                            emitter.delta(step, std::mem::take(&mut pending)).await;
                            last_sent = Some(Instant::now());
                        }
                    }
                    Heard::Retry(n) => retry(n, &mut pending, emitter, step).await,
                },
                _ = tokio::time::sleep_until(due), if !pending.is_empty() => {
                    emitter.delta(step, std::mem::take(&mut pending)).await;
                    last_sent = Some(Instant::now());
                }
            }
        }
    };
    while let Ok(heard) = rx.try_recv() {
        match heard {
            Heard::Text(t) => pending.push_str(&t),
            Heard::Retry(n) => retry(n, &mut pending, emitter, step).await,
        }
    }
    if !pending.is_empty() {
        emitter.delta(step, pending).await;
    }
    result
}

/// A retry: the ended attempt's pieces not sent yet go first, then its event.
async fn retry(n: RetryNotice, pending: &mut String, emitter: &mut Emitter<'_>, step: usize) {
    if !pending.is_empty() {
        emitter.delta(step, std::mem::take(pending)).await;
    }
    emitter.emit(retry_event(n)).await;
}

fn retry_event(n: RetryNotice) -> EventKind {
    EventKind::Retry {
        attempt: n.attempt,
        max_attempts: n.max_attempts,
        delay_ms: n.delay.as_millis() as u64,
        reason: n.reason,
    }
}
