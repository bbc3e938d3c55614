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
//!
//! A follower that comes in while an answer is being written (a reload, a reconnect) gets
//! the text so far as its first delta (`LiveText`), so what it shows is the answer's start,
//! not a tail cut mid-sentence.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Mutex;

use axum::response::sse::Event as SseEvent;
use futures::Stream;
use serde_json::json;
use tokio::sync::broadcast;

use super::routes::revoked_event;
use super::stream::Follower;
use crate::streams::StreamGuard;
use sandboxd_core::agent::TextDelta;
use sandboxd_core::store::StoredEvent;

/// The longest answer so far a late follower is given; past it, it gets the pieces from
/// then on only (the whole text still comes in `assistant_text`).
const SO_FAR_MAX: usize = 256 * 1024;

/// A run's answer pieces for this replica's followers, and the text so far of the answer
/// being written.
pub(crate) struct LiveText {
    tx: broadcast::Sender<TextDelta>,
    so_far: Mutex<SoFar>,
}

/// The pieces since the run's last event, joined.
#[derive(Default)]
struct SoFar {
    text: Option<TextDelta>,
    /// Past `SO_FAR_MAX`: a late follower gets no beginning, only the pieces that come.
    cut: bool,
}

impl LiveText {
    pub(crate) fn new(queue: usize) -> LiveText {
        LiveText {
            tx: broadcast::channel(queue).0,
            so_far: Mutex::new(SoFar::default()),
        }
    }

    /// Hands a piece to the followers and adds it to the text so far. One lock around both,
    /// so a follower that subscribes gets each piece once: in its text so far or queued.
    pub(crate) fn send(&self, delta: TextDelta) {
        let Ok(mut so_far) = self.so_far.lock() else {
            return;
        };
        let len = so_far.text.as_ref().map_or(0, |t| t.text.len()) + delta.text.len();
        if so_far.cut || len > SO_FAR_MAX {
            so_far.text = None;
            so_far.cut = true;
        } else if let Some(t) = so_far.text.as_mut() {
            t.text.push_str(&delta.text);
        } else {
            so_far.text = Some(delta.clone());
        }
        if self.tx.receiver_count() > 0 {
            let _ = self.tx.send(delta);
        }
    }

    /// An event of the engine is being committed: the answer so far is in it, or void (a
    /// retry). Called before the commit, so a follower that has the event never gets the
    /// text again. (The service's own events, a state change, do not end an answer.)
    pub(crate) fn forget_answer(&self) {
        if let Ok(mut so_far) = self.so_far.lock() {
            *so_far = SoFar::default();
        }
    }

    /// The pieces from now on, and the text so far of the answer being written.
    pub(crate) fn subscribe(&self) -> (broadcast::Receiver<TextDelta>, Option<TextDelta>) {
        let so_far = self.so_far.lock().ok();
        let text = so_far.as_ref().and_then(|s| s.text.clone());
        (self.tx.subscribe(), text)
    }
}

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
/// deltas when `deltas` is given (`LiveText::subscribe`: the text so far goes first).
pub(super) fn events(
    follower: Follower,
    after: u64,
    guard: StreamGuard,
    deltas: Option<(broadcast::Receiver<TextDelta>, Option<TextDelta>)>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let (deltas, so_far) = deltas.unzip();
    let state = State {
        follower,
        guard,
        deltas,
        // The answer is not in the store yet (`forget_answer` runs first), so its text
        // goes no earlier than where the follower starts: a service event (a state change)
        // may have come since the answer began.
        held: so_far
            .flatten()
            .map(|mut d| {
                d.after_seq = d.after_seq.max(after);
                d
            })
            .into_iter()
            .collect(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(after_seq: u64, text: &str) -> TextDelta {
        TextDelta {
            run_id: "run-1".into(),
            step: 1,
            after_seq,
            text: text.into(),
        }
    }

    #[test]
    fn a_late_follower_gets_the_text_so_far_then_each_piece_once() {
        let live = LiveText::new(8);
        assert!(live.subscribe().1.is_none(), "no answer yet");
        live.send(piece(3, "Looking "));
        live.send(piece(3, "around "));
        let (mut rx, so_far) = live.subscribe();
        let so_far = so_far.unwrap();
        assert_eq!(
            (so_far.after_seq, so_far.text.as_str()),
            (3, "Looking around ")
        );
        live.send(piece(3, "here."));
        assert_eq!(rx.try_recv().unwrap().text, "here.");
        assert!(rx.try_recv().is_err(), "nothing twice");
        // The step's event: the answer is in the store, a later follower gets no text.
        live.forget_answer();
        assert!(live.subscribe().1.is_none());
        live.send(piece(5, "Next."));
        assert_eq!(live.subscribe().1.unwrap().text, "Next.");
    }

    #[test]
    fn an_answer_past_the_bound_gives_no_beginning() {
        let live = LiveText::new(8);
        live.send(piece(1, &"x".repeat(SO_FAR_MAX)));
        assert_eq!(live.subscribe().1.unwrap().text.len(), SO_FAR_MAX);
        live.send(piece(1, "y"));
        assert!(live.subscribe().1.is_none(), "a cut text is not offered");
        live.send(piece(1, "z"));
        assert!(live.subscribe().1.is_none(), "nor its later pieces alone");
        live.forget_answer();
        live.send(piece(2, "fresh"));
        assert_eq!(live.subscribe().1.unwrap().text, "fresh");
    }
}
