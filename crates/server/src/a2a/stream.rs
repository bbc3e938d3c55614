//! A run's event log as A2A updates: the follower of /v1/runs/{id}/events (runs/stream.rs)
//! read from a seq, each event translated: `running` is a working status, the model's text a
//! working status with its message, a question the input-required status (the stream's
//! last: the next message answers it), and the run's end its artifacts then the final
//! status. Every update carries its event's seq (SSE `id`, `metadata.sandboxd.seq`), and a
//! subscriber starts after the snapshot's `lastSeq`, so no update comes twice and none is
//! skipped. SendMessage waits with the same follower (`settle`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::send::{Ctx, owned, task_of};
use super::wire::{self, Dialect};
use super::{RpcError, code};
use crate::AppState;
use crate::auth::Caller;
use crate::runs::stream::Follower;
use crate::streams::{Kind, StreamGuard};
use sandboxd_core::store::{RunRow, RunState, StoredEvent};

/// The run state a `run_state` event names.
fn run_state(e: &StoredEvent) -> Option<RunState> {
    if e.kind != "run_state" {
        return None;
    }
    let v: Value = serde_json::from_str(&e.payload).ok()?;
    RunState::parse(v.get("state")?.as_str()?)
}

/// Whether a task in this state has nothing more to say until someone acts.
fn settled(s: RunState) -> bool {
    s.is_terminal() || s == RunState::WaitingForHuman
}

/// Waits until the run ends or asks for input; its row then.
pub(super) async fn settle(ctx: &Ctx<'_>, row: &RunRow) -> Result<RunRow, RpcError> {
    // Just answered, a run is still `waiting_for_human` (its question gone) until it goes on.
    let asks = row.state == RunState::WaitingForHuman && row.question.is_some();
    if row.state.is_terminal() || asks {
        return Ok(row.clone());
    }
    // A long request, as a run's events with follow=false: revoked with the key, not counted.
    let guard = ctx
        .st
        .streams
        .open(ctx.caller, Kind::Request, &ctx.st.shutdown)?;
    let mut f = Follower::new(
        ctx.st.store.clone(),
        row.id.clone(),
        row.last_seq,
        true,
        guard.token().clone(),
    );
    while let Some(e) = f.next().await {
        if run_state(&e).is_some_and(settled) {
            break;
        }
    }
    if guard.token().is_cancelled() && guard.revoked().is_some() {
        return Err(RpcError::new(
            code::SERVER,
            "the key this request was made with was revoked",
        ));
    }
    owned(ctx, &row.id).await
}

/// What a stream holds between its items.
struct Streaming {
    st: Arc<AppState>,
    caller: Caller,
    base: String,
    dialect: Dialect,
    rpc_id: Value,
    row: RunRow,
    follower: Follower,
    guard: StreamGuard,
    pending: VecDeque<SseEvent>,
    done: bool,
}

impl Streaming {
    fn item(&self, result: Value) -> SseEvent {
        let body = json!({"jsonrpc": "2.0", "id": self.rpc_id, "result": result});
        SseEvent::default().data(body.to_string())
    }

    fn status(&self, seq: u64, at: i64, message: Option<Value>, last: bool) -> SseEvent {
        let mut status = wire::status(self.dialect, &self.row, at);
        if let Some(m) = message {
            status["message"] = m;
        }
        let u = wire::status_update(self.dialect, &self.row, status, seq, last);
        self.item(u).id(seq.to_string())
    }

    /// The updates one event makes (none for most: tools, tokens and notices are /v1's).
    async fn translate(&mut self, e: StoredEvent) {
        self.row.last_seq = e.seq;
        if e.kind == "assistant_text" {
            let v: Value = serde_json::from_str(&e.payload).unwrap_or_default();
            if let Some(text) = v.get("text").and_then(Value::as_str) {
                let id = format!("{}-{}", self.row.id, e.seq);
                let m = wire::agent_message(self.dialect, &self.row, &id, text);
                self.row.state = RunState::Running;
                let ev = self.status(e.seq, e.time, Some(m), false);
                self.pending.push_back(ev);
            }
            return;
        }
        match run_state(&e) {
            Some(RunState::Queued) | None => {}
            Some(RunState::Running) => {
                self.row.state = RunState::Running;
                let ev = self.status(e.seq, e.time, None, false);
                self.pending.push_back(ev);
            }
            Some(_) => {
                // Asks or ended: the row has the question, or the answer and outcome.
                let ctx = Ctx {
                    st: &self.st,
                    caller: &self.caller,
                    base: &self.base,
                    dialect: self.dialect,
                };
                if let Ok(row) = owned(&ctx, &self.row.id).await {
                    self.row = row;
                }
                self.row.last_seq = e.seq;
                if self.row.state.is_terminal() {
                    let files = super::send::files(&ctx, &self.row).await;
                    for a in wire::artifacts(self.dialect, &self.row, &files) {
                        let u = wire::artifact_update(self.dialect, &self.row, a);
                        let ev = self.item(u);
                        self.pending.push_back(ev);
                    }
                }
                let ev = self.status(e.seq, e.time, None, true);
                self.pending.push_back(ev);
                self.done = true;
            }
        }
    }

    /// The stream's next item, or None when it is over.
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Some(ev);
            }
            if self.done {
                return None;
            }
            let next = if self.guard.token().is_cancelled() {
                None
            } else {
                self.follower.next().await
            };
            match next {
                Some(e) if !self.guard.token().is_cancelled() => self.translate(e).await,
                _ => {
                    // Revoked: a last JSON-RPC error says why; a shutdown just ends it.
                    self.done = true;
                    let why = self.guard.revoked()?;
                    let e = RpcError::new(code::SERVER, why.error().detail.message);
                    let body = e.body(&self.rpc_id);
                    return Some(SseEvent::default().event("error").data(body.to_string()));
                }
            }
        }
    }
}

/// The SSE response: the task first (with `snapshot`), then its updates after seq `after`.
pub(super) fn sse(
    ctx: &Ctx<'_>,
    rpc_id: Value,
    row: RunRow,
    snapshot: bool,
    after: u64,
) -> Result<Response, RpcError> {
    let guard = ctx
        .st
        .streams
        .open(ctx.caller, Kind::Stream, &ctx.st.shutdown)?;
    let follower = Follower::new(
        ctx.st.store.clone(),
        row.id.clone(),
        after,
        true,
        guard.token().clone(),
    );
    let s = Streaming {
        st: ctx.st.clone(),
        caller: ctx.caller.clone(),
        base: ctx.base.to_string(),
        dialect: ctx.dialect,
        rpc_id,
        row,
        follower,
        guard,
        pending: VecDeque::new(),
        done: false,
    };
    let stream = futures::stream::unfold((s, snapshot), |(mut s, first)| async move {
        if first {
            let ctx = Ctx {
                st: &s.st,
                caller: &s.caller,
                base: &s.base,
                dialect: s.dialect,
            };
            let task = task_of(&ctx, &s.row).await;
            let ev = s.item(wire::task_result(s.dialect, task));
            return Some((Ok::<_, Infallible>(ev), (s, false)));
        }
        let ev = s.next().await?;
        Some((Ok(ev), (s, false)))
    });
    Ok(Sse::new(stream)
        .keep_alive(
            KeepAlive::new()
                .interval(Duration::from_secs(15))
                .text("keep-alive"),
        )
        .into_response())
}
