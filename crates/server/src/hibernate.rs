//! Hibernation of API sessions (issue 28, item 5): a session idle past `[sessions]
//! hibernate_after_secs` has its /workspace saved to a snapshot file under the data
//! directory (`snapshots/`), its row marked hibernated, and its container removed; its next
//! use, on any replica, resumes it (resume.rs). Its tool records (the editor's undo history,
//! the plans) are rows of the store keyed by the session's runtime id, which the resumed
//! sandbox keeps, so they survive as they survive a restart; the browser's record names a
//! Chromium that is gone, so it is dropped.
//!
//! The order makes a crash harmless: the snapshot is written whole (temp file, fsync,
//! rename, fsync of the directory: core/src/sandbox/snapshot.rs) before the row changes, and
//! the container is removed only after the row changed. A crash before the row changes leaves
//! the live session and at most a temporary file (swept); a crash after leaves a complete
//! snapshot the row names, and a container the sweep removes once its replica is gone.
//!
//! A session used after the save began stays live (its snapshot is deleted): locally, the
//! manager takes it out of its table only if unused since then (`take_idle`) and under the
//! session's transition lock, which every lookup that does not find it held takes too
//! (`Transitions`); across replicas, the store's conditional update refuses a row whose
//! recorded use is later, or that has a run in flight.
//!
//! A hibernated session still counts in its owner's session quota and the global cap (it is
//! the user's, resumable at any moment; its resume never fails for a quota), holds no
//! container, and ends at its own idle timeout like any other (`upkeep`), its snapshot
//! and records deleted with it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::AppState;
use crate::backend::OWNER_PREFIX;
use sandboxd_core::sandbox::hibernate::Hibernator;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::snapshot;
use sandboxd_core::store::{SessionKind, SessionRow, SessionState, now_ms};

/// The browser tool's record kind: its DevTools endpoint dies with the container.
const BROWSER_RECORD: &str = "browser";
/// How old a snapshot file no session names (or a temporary) must be before it is deleted.
const STALE_AFTER: Duration = Duration::from_secs(600);

/// Where snapshots live: `<data dir>/snapshots` (replicas on several hosts must share it).
pub fn snapshot_dir(st: &AppState) -> PathBuf {
    st.config.snapshot_dir()
}

/// The longest a save or a restore may take (a large workspace on a slow disk).
pub fn transfer_timeout(st: &AppState) -> Duration {
    Duration::from_secs(st.config.limits.max_timeout_secs.max(600))
}

/// The bytes a session's /workspace may hold.
pub fn workspace_bytes(row: &SessionRow) -> u64 {
    row.limits.workspace_mb.saturating_mul(1 << 20)
}

/// One lock per session for the moments its sandbox changes (hibernate, resume, attach on
/// demand); lookups that find the session held do not take it.
#[derive(Default)]
pub struct Transitions(std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Transitions {
    /// The lock of session `id` (its API id).
    pub fn of(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > 1024 {
            map.retain(|_, l| Arc::strong_count(l) > 1);
        }
        map.entry(id.to_string()).or_default().clone()
    }
}

/// serve's `Hibernator` (the manager holds it; it holds the state weakly: no cycle).
pub struct ServeHibernator(pub Weak<AppState>);

#[async_trait]
impl Hibernator for ServeHibernator {
    async fn hibernate(&self, session: Arc<Session>) -> bool {
        let Some(st) = self.0.upgrade() else {
            return false;
        };
        let Some(user) = session.owner.as_str().strip_prefix(OWNER_PREFIX) else {
            return false;
        };
        let row = match st.store.active_sessions().await {
            Ok(rows) => rows
                .into_iter()
                .find(|r| r.owner == user && r.runtime_id.as_deref() == Some(session.id.as_str())),
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "the store failed before hibernating");
                return false;
            }
        };
        let Some(row) = row else { return false };
        match hibernate(&st, &row, session).await {
            Ok(done) => done,
            Err(why) => {
                tracing::warn!(session = %row.id, reason = %why, "the session stays live: it could not be hibernated");
                false
            }
        }
    }
}

/// Hibernates the session of `row` whose manager session is `session` (see the module
/// doc): Ok(true) once hibernated; Ok(false) when it was used meanwhile or changed
/// elsewhere (it stays live); Err with why it cannot be (it stays live).
pub async fn hibernate(
    st: &AppState,
    row: &SessionRow,
    session: Arc<Session>,
) -> Result<bool, String> {
    if row.kind != SessionKind::Api || row.state != SessionState::Running || row.hibernated() {
        return Ok(false);
    }
    let (started, started_ms) = (Instant::now(), now_ms());
    let dir = snapshot_dir(st);
    let short = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let name = format!("{}.{short}.tar", row.id);
    let manager = st.backend.manager();
    // Its last usage reading before its sandbox goes (a resumed one counts from zero), taken
    // beside the save: the session is idle, so the reading is the same before or after it,
    // the save's own `tar` is sandboxd's work and not the user's, and a reading can be slow:
    // where Docker's cgroup files are not on this host it is the engine's one-shot stats,
    // which wait up to a second for its collector's next tick (docker/src/cgroup.rs).
    let (saved, reading) = tokio::join!(
        snapshot::save(
            session.sandbox.as_ref(),
            &dir,
            &name,
            workspace_bytes(row),
            transfer_timeout(st),
        ),
        manager.reading_of(&session.handle),
    );
    let bytes = saved.map_err(|e| e.to_string())?;
    let saved_ms = started.elapsed().as_millis() as u64;
    let lock = st.backend.transitions.of(&row.id);
    let _switching = lock.lock().await;
    if !manager.take_idle(&session, started.elapsed()) {
        snapshot::delete(&dir, &name);
        return Ok(false);
    }
    match st.store.hibernate_session(&row.id, &name, started_ms).await {
        Ok(true) => {}
        other => {
            manager.put_back(session);
            snapshot::delete(&dir, &name);
            return other.map_err(|e| e.to_string());
        }
    }
    // Committed: the snapshot is the session now. What named the old container goes.
    manager.records().clear(&session.id, BROWSER_RECORD).await;
    if let Ok(holders) = st.store.session_holders().await {
        let of: Vec<String> = holders
            .into_iter()
            .filter(|(s, _)| *s == row.id)
            .map(|(_, r)| r)
            .collect();
        let _ = st.store.remove_session_holders(&row.id, &of).await;
    }
    crate::metering::record(st.store.as_ref(), &session.id, reading).await;
    let removed_at = started.elapsed().as_millis() as u64;
    if let Err(e) = manager.remove_kept(&session).await {
        tracing::warn!(session = %row.id, error = %e, "could not remove a hibernated session's container; the sweep will");
    }
    let ms = started.elapsed().as_millis() as u64;
    tracing::info!(session = %row.id, bytes, ms, saved_ms, removal_ms = ms - removed_at, "hibernated");
    Ok(true)
}

/// What ends with a hibernated session: its snapshot and its tool records (its sandbox,
/// which would have taken them, is gone already).
pub async fn forget(st: &AppState, row: &SessionRow) {
    if let Some(name) = &row.snapshot {
        snapshot::delete(&snapshot_dir(st), name);
    }
    if let Some(rt) = &row.runtime_id {
        st.backend.manager().forget_records(rt).await;
    }
}

/// The periodic part (reconcile.rs): hibernated sessions past their idle timeout end (their
/// snapshots and records deleted); what this replica holds of a session another replica
/// hibernated is forgotten; snapshot files no session names any more are deleted once
/// stale (a save that stopped, a session ended by a user's removal).
pub async fn upkeep(st: &AppState) {
    let reason = "idle while hibernated (its idle timeout passed)";
    match st.store.end_idle_hibernated(reason, now_ms()).await {
        Ok(ended) => {
            for (id, name) in ended {
                tracing::info!(session = %id, "a hibernated session idled out");
                snapshot::delete(&snapshot_dir(st), &name);
                let row = st.store.session(&id).await.ok().flatten();
                let (store, who) = (st.store.as_ref(), crate::audit::Who::system());
                crate::audit::record_end(store, &st.config.audit, &who, &id, reason, row.as_ref())
                    .await;
                if let Some(rt) = row.as_ref().and_then(|r| r.runtime_id.as_ref()) {
                    st.backend.manager().forget_records(rt).await;
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not end idle hibernated sessions"),
    }
    let Ok(rows) = st.store.active_sessions().await else {
        return;
    };
    for row in rows.iter().filter(|r| r.hibernated()) {
        forget_stale(st, row).await;
    }
    let named: HashSet<&str> = rows.iter().filter_map(|r| r.snapshot.as_deref()).collect();
    let dir = snapshot_dir(st);
    for file in snapshot::stale_files(&dir, STALE_AFTER) {
        if !named.contains(file.as_str()) {
            tracing::info!(file = %file, "deleting a snapshot file no session names");
            snapshot::delete_file(&dir, &file);
        }
    }
}

/// Forgets what this replica holds of the session of `row`, hibernated by another replica
/// (its container is gone): checked again under the session's lock, so a resume here that
/// finished meanwhile is kept.
async fn forget_stale(st: &AppState, row: &SessionRow) {
    let (Some(rt), Ok(owner)) = (
        &row.runtime_id,
        crate::backend::Backend::owner_of(&row.owner),
    ) else {
        return;
    };
    let manager = st.backend.manager();
    if manager.held(&owner, rt).is_none() {
        return;
    }
    let lock = st.backend.transitions.of(&row.id);
    let _switching = lock.lock().await;
    if let Ok(Some(now)) = st.store.session(&row.id).await
        && now.hibernated()
    {
        manager.forget_held(&owner, rt);
    }
}
