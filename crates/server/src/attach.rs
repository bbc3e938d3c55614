//! Sessions reachable from every replica: several `serve` processes on one store and one
//! engine, any of which answers for any session.
//!
//! A session's row is the truth; the manager of each replica holds (attaches) the sessions
//! it serves. A request for a session this replica does not hold attaches it on demand
//! (`live`): the owner is checked against the row first and against the container's labels
//! (or the pool scope, for a claimed warm sandbox) by the manager. Each replica's persistent
//! shells carry its own tag (`shared::shell_tag_of`), and the store records which replicas
//! hold each session (`session_holders`). Whoever attaches a session, or holds one, kills
//! the tags of its holders that are no longer alive before it runs anything there, then
//! forgets them: a command a dead replica left running has lost its timeout and its
//! kill-tree, and nobody else would ever stop it. A live replica's shell is never touched.
//!
//! Liveness is the replica registry's lease (`Store::live_replicas`), with one shortcut: a
//! replica on this host that used this data directory is dead at once when its process is
//! (its file under `replicas/` names its `pid:starttime`); the next start ends its lease
//! (`bury_local_dead`), so a restart after `kill -9` need not wait the lease out.
//!
//! Idle reaping stays the manager's (`Books` is its `SharedSessions`): a session idle here
//! ends only by the store's conditional update (`end_idle_session`), which exactly one
//! replica wins and which fails while another replica's recorded use is recent or a run is
//! in flight. Every replica records its uses in the row, at most once a second per session
//! (`note_use`), and the upkeep records the use of the sessions it holds in use.
//!
//! The sweep (`sweep`, at start and every upkeep) does each job once across replicas: a
//! running session no live replica holds is attached by one replica, chosen by hashing its
//! id over the live replicas (an orphan after a replica died, or after every replica
//! restarted); a row whose container is gone ends, whoever notices (its runs fail, saying
//! why); a row still `creating` whose replica is dead ends; a container no active row names
//! is removed only if the replica that made it is dead (a live replica's containers are its
//! own business: its creates in flight, its warm pool).

use sandboxd_core::config::{AuditConfig, Config};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::AppState;
use crate::backend::{Live, OWNER_PREFIX};
use sandboxd_core::sandbox::ends::EndReason;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::shared::{ReapVerdict, SharedSessions, VanishVerdict, shell_tag_of};
use sandboxd_core::sandbox::shell::SHELL_TAG;
use sandboxd_core::sandbox::{SandboxError, SandboxState, SessionInfo};
use sandboxd_core::store::{SessionKind, SessionRow, SessionState, Store, now_ms};

/// How often one session's use is written to its row at most.
const USE_WRITE_EVERY: Duration = Duration::from_secs(1);

/// The store's books as the manager's `SharedSessions`.
pub struct Books {
    pub store: Arc<dyn Store>,
    /// Where an idle end is recorded (`[audit]`).
    pub audit: AuditConfig,
}

#[async_trait]
impl SharedSessions for Books {
    async fn vet_idle(&self, session: &Session, timeout: Duration) -> ReapVerdict {
        // /mcp sandboxes are their replica's alone (never kept, never attached elsewhere).
        if !session.owner.as_str().starts_with(OWNER_PREFIX) {
            return ReapVerdict::Reap;
        }
        let reason = EndReason::Idle(timeout).to_string();
        let now = now_ms();
        match self.store.end_idle_session(&session.id, &reason, now).await {
            Ok(Some(row_id)) => {
                let row = self.store.session(&row_id).await.ok().flatten();
                let store = self.store.as_ref();
                let who = crate::audit::Who::system();
                crate::audit::record_end(store, &self.audit, &who, &row_id, &reason, row.as_ref())
                    .await;
                return ReapVerdict::Reap;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "the store failed while reaping");
                return ReapVerdict::Unknown;
            }
        }
        let rows = match self.store.active_sessions().await {
            Ok(rows) => rows,
            Err(_) => return ReapVerdict::Unknown,
        };
        let row = rows
            .into_iter()
            .find(|r| r.runtime_id.as_deref() == Some(session.id.as_str()));
        match row {
            // Ended (by another replica, a DELETE, a removed user): its sandbox goes too.
            None => ReapVerdict::Reap,
            Some(row) => {
                let ago = Duration::from_millis(now.saturating_sub(row.last_used_at).max(0) as u64);
                // Not ended although idle by the row: a run is in flight somewhere.
                ReapVerdict::UsedAgo(if ago > timeout { Duration::ZERO } else { ago })
            }
        }
    }

    async fn live_replicas(&self) -> Option<Vec<String>> {
        self.store.live_replicas().await.ok()
    }

    async fn vet_vanished(&self, session: &Session) -> VanishVerdict {
        // /mcp sandboxes are their replica's alone: nobody else hibernates or ends them.
        if !session.owner.as_str().starts_with(OWNER_PREFIX) {
            return VanishVerdict::End;
        }
        let rows = match self.store.active_sessions().await {
            Ok(rows) => rows,
            Err(e) => {
                // Not ended here: its records stay, and the next use of its row (or the
                // sweep) finds the container gone and ends it then.
                tracing::warn!(session = %session.id, error = %e, "the store failed while vetting a vanished sandbox");
                return VanishVerdict::Forget;
            }
        };
        let row = rows
            .iter()
            .find(|r| r.runtime_id.as_deref() == Some(session.id.as_str()));
        match row {
            Some(row) if !row.hibernated() => VanishVerdict::End,
            // Hibernated, or ended (by another replica, a DELETE, a removed user).
            _ => VanishVerdict::Forget,
        }
    }
}

/// The live session a running row names, attaching it on demand if this replica does not
/// hold it yet; None when it cannot be had (its container is gone or could not be
/// attached: the row is then ended, or the sweep ends it).
pub async fn live(st: &AppState, row: &SessionRow) -> Option<Arc<Live>> {
    if let Some(live) = held(st, row).await {
        return Some(live);
    }
    let runtime_id = row.runtime_id.as_deref()?;
    let holders = holders_of(st, &row.id).await.ok()?;
    let live = attach(st, row, runtime_id, &holders).await?;
    note_use(st, &live);
    crate::egress_proxies::follow(st, live.session(), row).await;
    Some(live)
}

/// The live session a running row names if this replica holds it, marked as used.
pub async fn held(st: &AppState, row: &SessionRow) -> Option<Arc<Live>> {
    let live = st.backend.get(row).await?;
    note_use(st, &live);
    // The row was just read: another replica's change of the policy reaches this
    // replica's shell and python here, before the caller's command.
    live.sandbox.set_proxy_env(!row.egress.is_off());
    Some(live)
}

/// Records a use of the session in its row, at most once a second per session, on a task
/// of its own (a request does not wait for it).
fn note_use(st: &AppState, live: &Live) {
    if !st.backend.use_due(&live.runtime_id, USE_WRITE_EVERY) {
        return;
    }
    let (store, id, now) = (st.store.clone(), live.id.clone(), now_ms());
    tokio::spawn(async move {
        if let Err(e) = store.touch_session(&id, now).await {
            tracing::warn!(session = %id, error = %e, "could not record a session's use");
        }
    });
}

/// The replicas the store records as holding session `id`.
async fn holders_of(
    st: &AppState,
    id: &str,
) -> Result<Vec<String>, sandboxd_core::store::StoreError> {
    Ok(st
        .store
        .session_holders()
        .await?
        .into_iter()
        .filter(|(s, _)| s == id)
        .map(|(_, r)| r)
        .collect())
}

/// Which replicas are alive now, by the registry (`bury_local_dead` ended the leases of those
/// known dead on this host); None when the store cannot tell.
pub async fn live_replicas(st: &AppState) -> Option<HashSet<String>> {
    match st.store.live_replicas().await {
        Ok(ids) => Some(ids.into_iter().collect()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell which replicas are alive");
            None
        }
    }
}

/// Attaches the session of `row` here: kills the shells of its dead holders (an older
/// sandboxd's untagged shell if none is recorded), then records this replica as a holder.
/// A kill that cannot be confirmed (or a sandbox found gone) ends the session and removes
/// its container: nothing is left unsupervised. None when it cannot be attached.
async fn attach(
    st: &AppState,
    row: &SessionRow,
    runtime_id: &str,
    holders: &[String],
) -> Option<Arc<Live>> {
    let me = st.replica.id().to_string();
    let live = live_replicas(st).await?;
    let dead: Vec<String> = holders
        .iter()
        .filter(|r| **r != me && !live.contains(*r))
        .cloned()
        .collect();
    let mut tags: Vec<String> = dead.iter().map(|r| shell_tag_of(r)).collect();
    if holders.is_empty() {
        tags.push(SHELL_TAG.to_string());
    }
    match st.backend.attach(row, runtime_id, &tags).await {
        Ok(live) => {
            let recorded = async {
                st.store.add_session_holder(&row.id, &me).await?;
                st.store.remove_session_holders(&row.id, &dead).await
            };
            if let Err(e) = recorded.await {
                tracing::warn!(session = %row.id, error = %e, "could not record a session's holders");
            }
            Some(live)
        }
        // Only a kill that could not be confirmed, or a sandbox found gone, ends the session;
        // a lookup that failed (the engine busy, say) leaves it for the next try.
        Err(e @ (SandboxError::KillUnconfirmed { .. } | SandboxError::SandboxGone { .. })) => {
            let reason = format!("its container could not be re-attached: {e}");
            tracing::info!(session = %row.id, %reason, "ending a stored session");
            end_and_remove(st, row, &reason).await;
            None
        }
        Err(e) => {
            tracing::warn!(session = %row.id, error = %e, "could not attach a session");
            None
        }
    }
}

/// Ends the row (its runs cancelled first) and removes its container.
async fn end_and_remove(st: &AppState, row: &SessionRow, reason: &str) {
    st.runs
        .cancel_session(&row.id, Duration::from_secs(10))
        .await;
    if let Err(e) = crate::audit::end(st, &crate::audit::Who::system(), &row.id, reason).await {
        tracing::warn!(session = %row.id, error = %e, "could not end a session's row");
    }
    if let Err(e) = st
        .backend
        .remove(&row.owner, row.runtime_id.as_deref())
        .await
    {
        tracing::warn!(session = %row.id, error = %e, "could not remove a session's container");
    }
}

/// What one sweep did.
#[derive(Debug, Default)]
pub struct Swept {
    /// Rows whose session this replica attached as orphans.
    pub attached: Vec<String>,
    /// Rows ended, with why.
    pub ended: Vec<(String, String)>,
    /// Containers removed (runtime ids).
    pub removed: Vec<String>,
}

/// Whether this replica is the one of `live` that sweeps the orphan `id`: the same choice
/// on every replica that sees the same live set, so one attaches it, not all.
fn chosen(id: &str, live: &HashSet<String>, me: &str) -> bool {
    use sha2::{Digest, Sha256};
    let mut ids: Vec<&String> = live.iter().collect();
    if !live.contains(me) {
        // This replica's own lease is not live in the store's eyes: it picks nothing.
        return false;
    }
    ids.sort();
    let digest = Sha256::digest(id.as_bytes());
    let n = u64::from_be_bytes(digest[..8].try_into().unwrap_or_default());
    ids.get((n % ids.len() as u64) as usize)
        .is_some_and(|r| r.as_str() == me)
}

/// One pass of the jobs that must happen once across replicas (see the module doc). The
/// rows are read before the engine is listed, so a session that started meanwhile is never
/// taken for one whose container is gone.
pub async fn sweep(st: &AppState, at_start: bool) -> anyhow::Result<Swept> {
    let mut out = Swept::default();
    let me = st.replica.id().to_string();
    let rows = st.store.active_sessions().await?;
    let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (s, r) in st.store.session_holders().await? {
        holders.entry(s).or_default().push(r);
    }
    let Some(live) = live_replicas(st).await else {
        return Ok(out);
    };
    let alone = live.iter().all(|r| *r == me);
    let containers = st.backend.containers().await?;
    let by_runtime: HashMap<&str, &SessionInfo> = containers
        .iter()
        .map(|c| (c.session_id.as_str(), c))
        .collect();
    for row in &rows {
        let hs = holders.get(&row.id).map(Vec::as_slice).unwrap_or_default();
        let live_holder = hs.iter().any(|r| live.contains(r));
        let found = row.runtime_id.as_deref().and_then(|rt| by_runtime.get(rt));
        match (row.kind, row.state) {
            // An /mcp sandbox lives and dies with the replica that made it.
            // Before /mcp rows recorded their replica, a start ended them all; it still does
            // when no other replica is alive.
            (SessionKind::Mcp, _) if !live_holder && (!hs.is_empty() || at_start && alone) => {
                let why = "sandboxd stopped (MCP sandboxes do not outlive the service)";
                end_row(st, row, why, &mut out).await;
            }
            (SessionKind::Mcp, _) => {}
            (_, SessionState::Creating) if !live_holder => {
                let why = "sandboxd stopped while its container was being created";
                end_row(st, row, why, &mut out).await;
            }
            (_, SessionState::Creating) | (_, SessionState::Ended) => {}
            (_, SessionState::Running) if row.hibernated() => {
                if let Some(c) = found {
                    left_by_hibernation(st, row, c, &live, &me, &mut out).await;
                }
            }
            (_, SessionState::Running) => match found {
                None => {
                    // Its runs fail, on every replica, saying why.
                    let why = crate::ends::gone_reason(st, row, "its container is gone");
                    // As when the end is heard (ends.rs): failed once, by the fail request,
                    // waiting only for runs driven here (none at start-up, before the port
                    // is bound); a dead driver's run is failed by whoever takes it over.
                    if crate::ends::end_vanished(st, row, &why).await {
                        out.ended.push((row.id.clone(), why));
                    }
                    if let Some(rt) = &row.runtime_id {
                        st.backend.manager().session_ended(rt).await;
                    }
                }
                Some(c) if c.state != SandboxState::Running => {
                    let why = format!("its container is {}", c.state);
                    end_and_remove(st, row, &why).await;
                    out.ended.push((row.id.clone(), why));
                }
                Some(c) => held_or_orphan(st, row, c, hs, &live, &me, &mut out).await,
            },
        }
    }
    remove_strays(st, &rows, &containers, &live, at_start, &mut out).await;
    Ok(out)
}

/// A running session: if this replica holds it, the shells of its dead holders are killed;
/// if no live replica holds it, the chosen replica attaches it.
async fn held_or_orphan(
    st: &AppState,
    row: &SessionRow,
    c: &SessionInfo,
    holders: &[String],
    live: &HashSet<String>,
    me: &str,
    out: &mut Swept,
) {
    let dead: Vec<String> = holders
        .iter()
        .filter(|r| !live.contains(*r) && r.as_str() != me)
        .cloned()
        .collect();
    if let Some(held) = st.backend.get_quiet(row) {
        // Recorded, so that whoever finds this replica gone kills its shell there.
        if !holders.iter().any(|r| r == me)
            && let Err(e) = st.store.add_session_holder(&row.id, me).await
        {
            tracing::warn!(session = %row.id, error = %e, "could not record a session's holder");
        }
        if !dead.is_empty() {
            let tags: Vec<String> = dead.iter().map(|r| shell_tag_of(r)).collect();
            match st.backend.kill_tags(&held, &tags).await {
                Ok(()) => {
                    if let Err(e) = st.store.remove_session_holders(&row.id, &dead).await {
                        tracing::warn!(session = %row.id, error = %e, "could not forget dead holders");
                    }
                }
                Err(e) => {
                    let why =
                        format!("what a stopped replica left running could not be killed: {e}");
                    end_and_remove(st, row, &why).await;
                    out.ended.push((row.id.clone(), why));
                }
            }
        }
        return;
    }
    if holders.iter().any(|r| live.contains(r)) || !chosen(&row.id, live, me) {
        return;
    }
    if attach(st, row, &c.session_id, holders).await.is_some() {
        out.attached.push(row.id.clone());
    } else {
        out.ended
            .push((row.id.clone(), "could not be attached".into()));
    }
}

/// A container named by a hibernated row: one a hibernation recorded but could not remove
/// (its replica stopped, the engine failed). Removed once its replica is gone, or here when
/// this replica made it and is not resuming the session now.
async fn left_by_hibernation(
    st: &AppState,
    row: &SessionRow,
    c: &SessionInfo,
    live: &HashSet<String>,
    me: &str,
    out: &mut Swept,
) {
    let lock = st.backend.transitions.of(&row.id);
    let Ok(_quiet) = lock.try_lock() else {
        return;
    };
    let gone = match c.replica.as_deref() {
        Some(r) if r == me => true,
        Some(r) => !live.contains(r),
        None => true,
    };
    // Read again under the lock: a resume here may have finished since the sweep's read.
    let still = matches!(st.store.session(&row.id).await, Ok(Some(r)) if r.hibernated());
    if gone && still {
        // Not through the manager's removal: that would end the session's tool records.
        match st.backend.manager().runtime().remove(&c.handle).await {
            Ok(()) => out.removed.push(c.session_id.clone()),
            Err(e) => {
                tracing::warn!(session = %row.id, error = %e, "could not remove a hibernated session's container")
            }
        }
    }
}

/// Cancels the runs still in the session, then ends its row (ends.rs, as for a heard end).
async fn end_row(st: &AppState, row: &SessionRow, why: &str, out: &mut Swept) {
    if crate::ends::end_row(st, row, why).await {
        out.ended.push((row.id.clone(), why.to_string()));
    }
}

/// Removes the containers of this service that no active row names and whose replica is
/// dead (one made before replicas recorded theirs: only at start, as before).
async fn remove_strays(
    st: &AppState,
    rows: &[SessionRow],
    containers: &[SessionInfo],
    live: &HashSet<String>,
    at_start: bool,
    out: &mut Swept,
) {
    let named: HashSet<&str> = rows
        .iter()
        .filter_map(|r| r.runtime_id.as_deref())
        .collect();
    let owners: HashSet<String> = match st.store.owner_ids().await {
        Ok(ids) => ids.into_iter().collect(),
        Err(e) => {
            tracing::warn!(error = %e, "the store failed while looking for stray containers");
            return;
        }
    };
    let scope = st.backend.manager().pool_scope().map(|o| o.to_string());
    for c in containers {
        let api = c
            .owner
            .strip_prefix(OWNER_PREFIX)
            .is_some_and(|o| owners.contains(o));
        let pooled = c.pooled && scope.as_deref() == Some(c.owner.as_str());
        let dead = match &c.replica {
            Some(r) => !live.contains(r),
            None => at_start,
        };
        if (api || pooled) && dead && !named.contains(c.session_id.as_str()) {
            match st.backend.remove_runtime(&c.session_id).await {
                Ok(()) => out.removed.push(c.session_id.clone()),
                Err(e) => {
                    tracing::warn!(session = %c.session_id, error = %e, "could not remove a stray container")
                }
            }
        }
    }
}

/// Makes this process replica `me` of the service: the leases of gone replicas that used
/// this data directory end (`bury_local_dead`), the manager reaps and reconciles on the
/// store's books, and this process's shells carry the replica's tag.
pub async fn join(
    store: &Arc<dyn Store>,
    manager: &Arc<sandboxd_core::sandbox::SessionManager>,
    config: &Config,
    me: &str,
) {
    bury_local_dead(store.as_ref(), &config.data_dir(), me).await;
    let books = Arc::new(Books {
        store: store.clone(),
        audit: config.audit.clone(),
    });
    manager.share(me, books);
    sandboxd_core::sandbox::shell::tag_shells(shell_tag_of(me));
}

/// The file under the data directory that says which process this replica is.
fn replica_file(data_dir: &Path, id: &str) -> PathBuf {
    data_dir.join("replicas").join(id)
}

/// Ends the leases of the replicas that used this data directory on this host and whose
/// process is gone (`kill -9`), so nobody waits them out, then records this replica's own
/// process there. Best effort: without the directory, leases expire as usual.
pub async fn bury_local_dead(store: &dyn Store, data_dir: &Path, me: &str) {
    let dir = data_dir.join("replicas");
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let id = entry.file_name().to_string_lossy().to_string();
            let creator = std::fs::read_to_string(entry.path()).unwrap_or_default();
            if id == me || sandboxd_core::sandbox::host::creator_alive(creator.trim()) {
                continue;
            }
            tracing::info!(replica = %id, "a replica that ran from this data directory is gone; ending its lease");
            match store.replica_leave(&id).await {
                Ok(()) => {
                    let _ = std::fs::remove_file(entry.path());
                }
                Err(e) => {
                    tracing::warn!(replica = %id, error = %e, "could not end a gone replica's lease")
                }
            }
        }
    }
    let mine = replica_file(data_dir, me);
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&mine, sandboxd_core::sandbox::host::creator_label()));
    if let Err(e) = written {
        tracing::warn!(path = %mine.display(), error = %e, "could not record this replica's process");
    }
}

/// Forgets this replica's file (a graceful stop: its lease ended already).
pub fn forget_local(data_dir: &Path, me: &str) {
    let _ = std::fs::remove_file(replica_file(data_dir, me));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_live_replica_is_chosen_for_each_orphan() {
        let live: HashSet<String> = ["r-a", "r-b", "r-c"].map(String::from).into();
        for id in ["ses_1", "ses_2", "ses_3", "ses_4", "ses_5"] {
            let n = live.iter().filter(|me| chosen(id, &live, me)).count();
            assert_eq!(n, 1, "{id}");
        }
        assert!(
            !chosen("ses_1", &live, "r-x"),
            "a replica not live picks nothing"
        );
    }
}
