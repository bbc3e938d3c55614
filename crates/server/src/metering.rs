//! Usage metering as serve does it (issue 28, item 2; the store's half is
//! `sandboxd_core::store::metering`): the cgroup of every sandbox this replica holds is
//! sampled every `[sessions] usage_sample_secs`, a session that ends gets a last reading
//! (by the manager just before it removes a sandbox on its own, idle or over the budget, in
//! its end event; by `DELETE`, the upkeep and hibernation before they remove one, so a
//! `DELETE`'s answer already counts it), and the amounts that happen in requests are
//! counted where they happen: bytes through the file and archive routes (files.rs), tokens
//! and tool calls of runs (runs/sink.rs).
//!
//! Metering never fails a request: a store error is logged and the amount is lost (a
//! sample's CPU is not: the next sample adds the difference from the stored reading).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::AppState;
use sandboxd_core::sandbox::ends::Ended;
use sandboxd_core::store::{Counted, Reading, SessionRow, Store, now_ms};

/// Sandboxes sampled at once (each sample is two backend reads and one store write).
const SAMPLES_AT_ONCE: usize = 8;

/// Samples the sandboxes this replica holds every `usage_sample_secs` (none: 0) until
/// shutdown.
pub fn spawn_sampler(st: Arc<AppState>) -> tokio::task::JoinHandle<()> {
    let secs = st.config.sessions.usage_sample_secs;
    tokio::spawn(async move {
        if secs == 0 {
            return;
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(secs)) => {}
                _ = st.shutdown.cancelled() => return,
            }
            sample_held(&st).await;
        }
    })
}

/// One sample of every sandbox this replica holds (API sessions and /mcp sandboxes: the
/// store finds each one's row by its runtime id).
pub async fn sample_held(st: &AppState) {
    let manager = st.backend.manager();
    let live = manager.live().await;
    futures::stream::iter(live)
        .for_each_concurrent(SAMPLES_AT_ONCE, |s| async move {
            let reading = manager.reading_of(&s.handle).await;
            record(st.store.as_ref(), &s.id, reading).await;
        })
        .await;
}

/// Adds a reading of the sandbox whose runtime id is `runtime_id` (nothing if it tells
/// nothing).
pub async fn record(store: &dyn Store, runtime_id: &str, reading: Reading) {
    if reading.is_empty() {
        return;
    }
    if let Err(e) = store.meter_sample(runtime_id, &reading).await {
        tracing::warn!(session = %runtime_id, error = %e, "could not record a usage sample");
    }
}

/// The last reading the manager took of a sandbox it removed.
pub async fn on_end(st: &AppState, ended: &Ended) {
    if let Some(reading) = &ended.reading {
        record(st.store.as_ref(), &ended.id, reading.clone()).await;
    }
}

/// A reading of the session's sandbox now, before its caller removes it (`DELETE`).
pub async fn sample_before_end(st: &AppState, row: &SessionRow) {
    let (Some(runtime_id), Some(handle)) = (&row.runtime_id, &row.container_id) else {
        return;
    };
    if row.hibernated() {
        return;
    }
    let reading = st.backend.manager().reading_of(handle).await;
    record(st.store.as_ref(), runtime_id, reading).await;
}

/// Adds what a request or a run counted to session `session_id`.
pub async fn count(store: &dyn Store, session_id: &str, counted: Counted) {
    if let Err(e) = store.meter_count(session_id, &counted, now_ms()).await {
        tracing::warn!(session = %session_id, error = %e, "could not count usage");
    }
}

/// One tool call in a session outside a run (a run's are counted from its events): the
/// tools route, and /mcp.
pub async fn tool_call(store: &dyn Store, session_id: &str) {
    let counted = Counted {
        tool_calls: 1,
        ..Counted::default()
    };
    count(store, session_id, counted).await;
}

/// Bytes written into a session through the file or archive routes.
pub async fn bytes_in(st: &AppState, session_id: &str, bytes: u64) {
    let counted = Counted {
        bytes_in: bytes,
        ..Counted::default()
    };
    count(st.store.as_ref(), session_id, counted).await;
}

/// Bytes read out of a session through them.
pub async fn bytes_out(st: &AppState, session_id: &str, bytes: u64) {
    let counted = Counted {
        bytes_out: bytes,
        ..Counted::default()
    };
    count(st.store.as_ref(), session_id, counted).await;
}
