//! The SSE body of GET /v1/runs/{id}/events: the run's stored events (the follower, any
//! replica), and, while the run is driven by this replica, the answer's text as it is
//! written (`event: delta`, no `id`).
//!
//! Deltas are live only: they are never stored and carry no id, so `Last-Event-ID` stays
//! the last stored event's seq and a follower that resumes gets the step's whole
//! `assistant_text`, never the pieces again. A delta that comes after its step's answer
//! was sent (the follower caught up meanwhile) is dropped; a follower that falls behind the
//! delta queue misses pieces, not events. A follower on another replica gets no deltas,
//! only the events (docs/events.md).

use std::convert::Infallible;

use axum::response::sse::Event as SseEvent;
use futures::Stream;
use serde_json::json;
use tokio::sync::broadcast;

use super::routes::revoked_event;
use super::stream::Follower;
use crate::streams::StreamGuard;
use sandboxd_core::agent::TextDelta;
use sandboxd_core::store::StoredEvent;

struct State {
    follower: Follower,
    guard: StreamGuard,
    deltas: Option<broadcast::Receiver<TextDelta>>,
    /// The newest step whose answer (its `token_usage`, which comes first) was sent.
    answered: usize,
}

enum Next {
    Stored(StoredEvent),
    Delta(TextDelta),
    /// The delta queue lagged or closed: nothing to send for it.
    Skip,
    End,
}

/// The stream of SSE events for `follower`, with the run's deltas when `deltas` is given.
pub(super) fn events(
    follower: Follower,
    guard: StreamGuard,
    deltas: Option<broadcast::Receiver<TextDelta>>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let state = State {
        follower,
        guard,
        deltas,
        answered: 0,
    };
    futures::stream::unfold(Some(state), |state| async move {
        let mut st = state?;
        loop {
            let next = if st.guard.token().is_cancelled() {
                Next::End
            } else {
                next(&mut st).await
            };
            match next {
                Next::Stored(e) if !st.guard.token().is_cancelled() => {
                    if e.kind == "token_usage" {
                        st.answered = step_of(&e.payload).max(st.answered);
                    }
                    let ev = SseEvent::default()
                        .id(e.seq.to_string())
                        .event(e.kind)
                        .data(e.payload);
                    return Some((Ok(ev), Some(st)));
                }
                Next::Delta(d) if d.step > st.answered => {
                    let data = json!({"step": d.step, "after_seq": d.after_seq, "text": d.text});
                    let ev = SseEvent::default().event("delta").data(data.to_string());
                    return Some((Ok(ev), Some(st)));
                }
                // Stale: its step's answer is out already.
                Next::Delta(_) | Next::Skip => continue,
                // Revoked: one last event says why (no id: it is not one of the run's
                // events), then the stream ends. A shutdown or the run's end just ends it.
                Next::Stored(_) | Next::End => {
                    let why = st.guard.revoked()?;
                    return Some((Ok(revoked_event(why)), None));
                }
            }
        }
    })
}

/// The next stored event or delta, whichever comes first.
async fn next(st: &mut State) -> Next {
    let Some(deltas) = st.deltas.as_mut() else {
        return st.follower.next().await.map_or(Next::End, Next::Stored);
    };
    tokio::select! {
        // Stored events first: they are the record, and a delta after its answer is stale.
        biased;
        e = st.follower.next() => e.map_or(Next::End, Next::Stored),
        d = deltas.recv() => match d {
            Ok(d) => Next::Delta(d),
            Err(broadcast::error::RecvError::Lagged(_)) => Next::Skip,
            Err(broadcast::error::RecvError::Closed) => {
                st.deltas = None;
                Next::Skip
            }
        },
    }
}

fn step_of(payload: &str) -> usize {
    serde_json::from_str::<serde_json::Value>(payload)
        .ok()
        .and_then(|v| v.get("step")?.as_u64())
        .unwrap_or(0) as usize
}
