//! The SSE body of GET /v1/runs/{id}/events: the run's stored events (the follower, any
//! replica), and, while the run is driven by this replica, the answer's text as it is
//! written (`event: delta`, no `id`).
//!
//! Deltas are live only: they are never stored and carry no id, so `Last-Event-ID` stays
//! the last stored event's seq and a follower that resumes gets the step's whole
//! `assistant_text`, never the pieces again. Each delta names the stored event it follows
//! (`after_seq`) and is sent right after that event, never before it and never after a
//! later one: a step's pieces all precede its `token_usage` and `assistant_text`. The
//! engine hands a piece over before it commits the next event, so when the follower reads
//! that event the piece is already queued (`drain`). A follower that falls behind the
//! queue misses pieces, not events. A follower on another replica gets no deltas, only the
//! events (docs/events.md).

use std::collections::VecDeque;
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

/// Pieces held for a follower still reading older events; past it the newest are dropped
/// (the text still comes whole in its `assistant_text`).
const HELD: usize = 1024;

struct State {
    follower: Follower,
    guard: StreamGuard,
    deltas: Option<broadcast::Receiver<TextDelta>>,
    /// Pieces received whose event has not been sent yet, in order.
    held: VecDeque<TextDelta>,
    /// What goes out next, in order.
    ready: VecDeque<SseEvent>,
    /// The seq of the last stored event sent.
    sent: u64,
}

enum Next {
    Stored(StoredEvent),
    /// A piece was queued (or the delta queue lagged or closed).
    Held,
    End,
}

/// The stream of SSE events for `follower`, which starts after seq `after`, with the run's
/// deltas when `deltas` is given.
pub(super) fn events(
    follower: Follower,
    after: u64,
    guard: StreamGuard,
    deltas: Option<broadcast::Receiver<TextDelta>>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let state = State {
        follower,
        guard,
        deltas,
        held: VecDeque::new(),
        ready: VecDeque::new(),
        sent: after,
    };
    futures::stream::unfold(Some(state), |state| async move {
        let mut st = state?;
        loop {
            if let Some(ev) = st.ready.pop_front() {
                return Some((Ok(ev), Some(st)));
            }
            st.release(st.sent);
            if !st.ready.is_empty() {
                continue;
            }
            let next = if st.guard.token().is_cancelled() {
                Next::End
            } else {
                next(&mut st).await
            };
            match next {
                Next::Stored(e) if !st.guard.token().is_cancelled() => {
                    // The pieces written before this event go first.
                    st.drain();
                    st.release(e.seq.saturating_sub(1));
                    st.sent = e.seq;
                    let ev = SseEvent::default()
                        .id(e.seq.to_string())
                        .event(e.kind)
                        .data(e.payload);
                    st.ready.push_back(ev);
                }
                Next::Held => {}
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

impl State {
    /// Holds a piece (dropped past `HELD`).
    fn hold(&mut self, d: TextDelta) {
        if self.held.len() < HELD {
            self.held.push_back(d);
        }
    }

    /// Every piece already queued, held.
    fn drain(&mut self) {
        let Some(rx) = self.deltas.as_mut() else {
            return;
        };
        let mut got = Vec::new();
        loop {
            match rx.try_recv() {
                Ok(d) => got.push(d),
                Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
        for d in got {
            self.hold(d);
        }
    }

    /// The held pieces that follow an event up to seq `upto`, made ready in order.
    fn release(&mut self, upto: u64) {
        while self.held.front().is_some_and(|d| d.after_seq <= upto) {
            let Some(d) = self.held.pop_front() else {
                break;
            };
            let data = json!({"step": d.step, "after_seq": d.after_seq, "text": d.text});
            self.ready
                .push_back(SseEvent::default().event("delta").data(data.to_string()));
        }
    }
}

/// The next stored event, or a piece held, whichever comes first.
async fn next(st: &mut State) -> Next {
    let Some(deltas) = st.deltas.as_mut() else {
        return st.follower.next().await.map_or(Next::End, Next::Stored);
    };
    let got = tokio::select! {
        // Stored events first: they are the record.
        biased;
        e = st.follower.next() => return e.map_or(Next::End, Next::Stored),
        d = deltas.recv() => d,
    };
    match got {
        Ok(d) => st.hold(d),
        Err(broadcast::error::RecvError::Lagged(_)) => {}
        Err(broadcast::error::RecvError::Closed) => st.deltas = None,
    }
    Next::Held
}
