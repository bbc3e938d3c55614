//! SessionManager: the live sessions of this process, their owners and limits, the session
//! caps (global and per owner), the one idle reaper and the reconciler that removes
//! sandboxes nobody owns any more. It speaks only the `Runtime` seam, never a backend.
//!
//! Sessions come from the warm pool (pool.rs) when one fits, else from a cold create; either
//! way the session is in this table and its sandbox is destroyed when it ends.
//!
//! Sessions outlive a process only when asked to (`--keep`); every sandbox records its
//! owner, its limits and which process created it, so a later process can re-attach a kept
//! session as it was made, and the reconciler can tell an orphan of a crashed process from
//! a session another live sandboxd still uses.
//!
//! Every path that destroys a session's sandbox (remove, the reaper, the memory budget,
//! the reconciler) goes through `destroy`, which then tells the end hook and the end events
//! why (ends.rs), so what the layers above keep for a session (a kept session's tool
//! records, serve's session rows) ends with it.
//!
//! It is the one registry of sessions and its reaper the one that ends idle ones, in every
//! process: each session idles out after its own timeout (`Session::set_idle_timeout`; the
//! configured one unless set), which is how serve's API sessions with their per-session
//! timeouts are reaped here too.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::ends::{EndReason, Ended, RecentEnds};
use super::pool::Warm;
use super::records::SessionRecords;
use super::runtime::{Runtime, SandboxSpec, SandboxState};
use super::templates::Templates;
use super::{Owner, Sandbox, SandboxError, Viewer};
use crate::config::{LimitRequest, Limits, PoolConfig, SessionsConfig};
use crate::store::Reading;

pub struct Session {
    pub id: String,
    pub owner: Owner,
    pub sandbox: Arc<dyn Sandbox>,
    /// What the sandbox was created with (for a re-attached session: what it recorded).
    pub limits: Limits,
    /// Meant to outlive this process; `remove_all` leaves it alone.
    pub keep: bool,
    /// The backend's name for the sandbox (for Docker, the container id), what
    /// `Runtime::remove` takes and what the service records: nothing above the backend
    /// derives a backend's names itself.
    pub handle: String,
    /// What the tools and the agent keep for the session's lifetime (see slots.rs).
    pub slots: super::slots::SessionSlots,
    /// Where a kept session's tools save what a later process needs (the manager's).
    pub records: Arc<dyn SessionRecords>,
    /// When it was last used and whether it is in use now (see in_use.rs).
    pub(super) clock: super::in_use::UseClock,
    /// Its own idle timeout in milliseconds; 0: the manager's configured one.
    idle_timeout_ms: AtomicU64,
}

impl Session {
    pub(super) fn new(
        id: String,
        owner: Owner,
        sandbox: Arc<dyn Sandbox>,
        limits: Limits,
        keep: bool,
        handle: String,
        records: Arc<dyn SessionRecords>,
    ) -> Arc<Session> {
        Arc::new(Session {
            id,
            owner,
            sandbox,
            limits,
            keep,
            handle,
            slots: Default::default(),
            records,
            clock: super::in_use::UseClock::new(),
            idle_timeout_ms: AtomicU64::new(0),
        })
    }

    /// Gives the session its own idle timeout (at least a millisecond): the reaper ends it
    /// once it is unused for longer. What decides it lives with the caller (serve: the
    /// session's row), which sets it again on a session it re-attaches.
    pub fn set_idle_timeout(&self, timeout: Duration) {
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.idle_timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// Its own idle timeout, if one was set; else the manager's configured one applies.
    pub fn idle_timeout(&self) -> Option<Duration> {
        match self.idle_timeout_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Marks a moment of use.
    pub fn touch(&self) {
        self.clock.touch();
    }

    /// Holds the session in use while the guard lives (a run, a tool call): it is not idle
    /// meanwhile, and its idle time starts when the last holder lets go.
    pub fn hold(&self) -> super::in_use::InUse<&Session> {
        super::in_use::InUse::new(self)
    }

    /// How long it has been unused: zero while held. Every idle check reads this.
    pub fn idle_for(&self) -> Duration {
        self.clock.idle_for()
    }

    /// Dates its last use `ago` back: what an earlier process recorded, for a re-attached
    /// session whose idle time must go on from there.
    pub fn used_ago(&self, ago: Duration) {
        self.clock.used_ago(ago);
    }
}

/// How to create a session, beside its owner and limits.
#[derive(Debug, Clone, Copy, Default)]
pub struct CreateOptions {
    /// Outlive this process (`--keep`): a later process re-attaches it by id.
    pub keep: bool,
}

/// What `sessions list` shows.
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    pub session_id: String,
    /// Empty when the sandbox carries no valid owner.
    pub owner: String,
    /// The backend's name for the sandbox (a container id).
    pub handle: String,
    pub state: SandboxState,
    pub kept: bool,
    /// The creator the backend recorded (for Docker, `pid:starttime` on this host).
    pub creator: Option<String>,
    /// Made for a warm pool: unclaimed, or claimed by a session of its creator.
    pub pooled: bool,
    /// The replica that made it, if it recorded one.
    pub replica: Option<String>,
}

/// The sessions of this process and the creations under way, under one lock so that
/// concurrent creates cannot overshoot a cap. Never held across an await.
#[derive(Default)]
pub(super) struct Table {
    pub(super) sessions: HashMap<String, Arc<Session>>,
    /// Creations under way per owner: they count against the caps already.
    starting: HashMap<Owner, usize>,
    /// Warm sandboxes ready to be claimed, oldest first.
    pub(super) pool: VecDeque<Warm>,
    /// Warm sandboxes being made now.
    pub(super) filling: usize,
    /// Set by `close_pool`: no more fills, and a fill that ends afterwards removes its sandbox.
    pub(super) pool_closed: bool,
}

impl Table {
    /// Every sandbox this process holds or is making: sessions, warm ones, both under way.
    pub(super) fn containers(&self) -> usize {
        self.count(None) + self.pool.len() + self.filling
    }

    fn count(&self, owner: Option<&Owner>) -> usize {
        match owner {
            None => self.sessions.len() + self.starting.values().sum::<usize>(),
            Some(o) => {
                self.sessions.values().filter(|s| &s.owner == o).count()
                    + self.starting.get(o).copied().unwrap_or(0)
            }
        }
    }
}

/// Ended-session ids a slow subscriber may fall behind by before it is told it lagged.
const ENDS_BUFFERED: usize = 1024;

/// Told the id of each session whose sandbox is gone (see `SessionManager::on_session_end`).
/// It may block (it deletes files): the manager runs it on the blocking pool.
pub type EndHook = Arc<dyn Fn(&str) + Send + Sync>;

pub struct SessionManager {
    pub(super) runtime: Arc<dyn Runtime>,
    /// The admin's ceilings, and the limits profile warm sandboxes are made with.
    pub(super) limits: Limits,
    pub(super) config: SessionsConfig,
    pub(super) pool_config: PoolConfig,
    /// The owner label warm sandboxes carry, if the pool is scoped (`with_scoped_pool`).
    pub(super) pool_scope: Option<Owner>,
    pub(super) table: Arc<std::sync::Mutex<Table>>,
    /// Wakes the pool's refill task (after a claim).
    pub(super) refill: Arc<tokio::sync::Notify>,
    /// The pool's fill tasks, so closing the pool can wait for them.
    pub(super) fills: tokio_util::task::TaskTracker,
    /// Kept sessions' tool records: given to each session's tools, emptied when it ends.
    records: Arc<dyn SessionRecords>,
    /// What to tell when a session ends; set once by the process that makes the manager.
    on_end: std::sync::OnceLock<EndHook>,
    /// Ended sessions and why, for whoever keeps its own books on them (`serve`'s rows);
    /// a subscriber that lags must look again itself.
    ends: tokio::sync::broadcast::Sender<Ended>,
    /// The last ends announced (and vanished sandboxes taken out of the table), for `end_of`.
    pub(super) recent_ends: RecentEnds,
    /// The replica this manager's process is, recorded on every sandbox it makes (`share`).
    replica: std::sync::OnceLock<String>,
    /// The books shared with other replicas, consulted before reaping and reconciling.
    pub(super) shared: std::sync::OnceLock<Arc<dyn super::shared::SharedSessions>>,
    /// The templates sessions may name (`set_templates`); none but the default until set.
    templates: std::sync::OnceLock<Templates>,
    /// What hibernates idle sessions, if this process does (hibernate.rs).
    pub(super) hibernator: std::sync::OnceLock<Arc<dyn super::hibernate::Hibernator>>,
    /// The sessions being hibernated now.
    pub(super) hibernating: super::hibernate::Hibernating,
}

/// Releases a creation's place in the caps however the creation ends (even cancelled).
pub(super) struct Reservation {
    table: Arc<std::sync::Mutex<Table>>,
    owner: Owner,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut t = lock(&self.table);
        if let Some(n) = t.starting.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                t.starting.remove(&self.owner);
            }
        }
    }
}

pub(super) fn lock(table: &std::sync::Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
    // A panic while holding the lock cannot leave the table half-written (every update is
    // one map operation), so a poisoned lock is still good.
    table.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fresh session id: 12 hex digits.
pub(super) fn new_session_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}

/// Session ids are ours (hex); anything else cannot name a session and is not looked up.
pub(super) fn plausible_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

impl SessionManager {
    /// The runtime this manager's sandboxes come from (readiness probes ask it).
    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.runtime
    }

    /// Where kept sessions' tool records live (see records.rs).
    pub fn records(&self) -> &Arc<dyn SessionRecords> {
        &self.records
    }

    /// A manager without a warm pool.
    pub fn new(
        runtime: Arc<dyn Runtime>,
        limits: Limits,
        config: SessionsConfig,
        records: Arc<dyn SessionRecords>,
    ) -> Arc<Self> {
        let off = PoolConfig {
            size: 0,
            ..PoolConfig::default()
        };
        Self::with_pool(runtime, limits, config, off, records)
    }

    /// A manager whose creates claim from a warm pool of `pool.size` sandboxes of the
    /// `limits` profile; the pool fills once `spawn_pool` runs (long-lived processes only).
    pub fn with_pool(
        runtime: Arc<dyn Runtime>,
        limits: Limits,
        config: SessionsConfig,
        pool: PoolConfig,
        records: Arc<dyn SessionRecords>,
    ) -> Arc<Self> {
        Self::make(runtime, limits, config, pool, None, records)
    }

    /// A manager whose warm sandboxes carry `scope` as their owner label and are kept, for
    /// a caller that records every claim itself and outlives restarts (`serve`: its store).
    /// Such a pool also serves kept sessions. At its next start the caller re-adopts the
    /// claimed sandboxes its records name (`adopt`) and removes the rest of the scope: an
    /// unscoped pool's claims die with their process, which kept sessions must not.
    pub fn with_scoped_pool(
        runtime: Arc<dyn Runtime>,
        limits: Limits,
        config: SessionsConfig,
        pool: PoolConfig,
        scope: Owner,
        records: Arc<dyn SessionRecords>,
    ) -> Arc<Self> {
        Self::make(runtime, limits, config, pool, Some(scope), records)
    }

    fn make(
        runtime: Arc<dyn Runtime>,
        limits: Limits,
        config: SessionsConfig,
        pool: PoolConfig,
        pool_scope: Option<Owner>,
        records: Arc<dyn SessionRecords>,
    ) -> Arc<Self> {
        Arc::new(Self {
            runtime,
            limits,
            config,
            pool_config: pool,
            pool_scope,
            table: Arc::default(),
            refill: Arc::default(),
            fills: tokio_util::task::TaskTracker::new(),
            records,
            on_end: std::sync::OnceLock::new(),
            ends: tokio::sync::broadcast::channel(ENDS_BUFFERED).0,
            recent_ends: RecentEnds::default(),
            replica: std::sync::OnceLock::new(),
            shared: std::sync::OnceLock::new(),
            templates: std::sync::OnceLock::new(),
            hibernator: std::sync::OnceLock::new(),
            hibernating: Default::default(),
        })
    }

    /// Sets the templates sessions may name (see templates.rs). Set once, before sessions
    /// are made; a second call is ignored.
    pub fn set_templates(&self, templates: Templates) {
        if self.templates.set(templates).is_err() {
            tracing::warn!("the session manager's templates were set twice; the first stay");
        }
    }

    /// The templates sessions may name: `resolve` a name before `create_from`.
    pub fn templates(&self) -> Templates {
        self.templates.get().cloned().unwrap_or_default()
    }

    /// Makes this manager one replica of several sharing sessions: every sandbox it makes
    /// from now on records `replica`, its reaper ends a session only as `books` agree, and
    /// its reconciler leaves live replicas' sandboxes alone (see shared.rs). Set once,
    /// before the reaper and the pool start; a second call is ignored.
    pub fn share(&self, replica: &str, books: Arc<dyn super::shared::SharedSessions>) {
        if self.replica.set(replica.to_string()).is_err() || self.shared.set(books).is_err() {
            tracing::warn!("the session manager was made a replica twice; the first one stays");
        }
    }

    /// The replica this manager is, if it shares sessions (`share`).
    pub fn replica(&self) -> Option<&str> {
        self.replica.get().map(String::as_str)
    }

    /// The sessions that end from now on, with why: every one this manager destroys (its
    /// sandbox removed: closed, reaped, over the memory budget, reconciled) and every one
    /// `session_ended` reports.
    pub fn subscribe_ends(&self) -> tokio::sync::broadcast::Receiver<Ended> {
        self.ends.subscribe()
    }

    /// Why session `id` ended, if this manager announced its end lately (`RecentEnds`).
    pub fn end_of(&self, id: &str) -> Option<EndReason> {
        self.recent_ends.of(id)
    }

    /// Sets the hook told the id of every session this manager destroys (its sandbox
    /// removed) and of every one `session_ended` reports. Set once; a second call is ignored.
    pub fn on_session_end(&self, hook: EndHook) {
        if self.on_end.set(hook).is_err() {
            tracing::warn!("the session manager's end hook was set twice; the first one stays");
        }
    }

    /// Tells the end hook that `session_id` ended without this manager removing its sandbox
    /// (a caller found the sandbox already gone), after its tool records are forgotten. The
    /// hook may do file work, so it runs on the blocking pool; this waits for both, so what
    /// they delete is gone when this returns (a one-shot command may exit right after, and
    /// the pool drops tasks not yet started).
    pub async fn session_ended(&self, session_id: &str) {
        self.announce_end(session_id, EndReason::Gone, None).await;
    }

    /// Tells the end events and the end hook that `session_id` ended, and why.
    pub(super) async fn announce_end(
        &self,
        session_id: &str,
        reason: EndReason,
        reading: Option<Reading>,
    ) {
        self.recent_ends.note(session_id, &reason);
        // No subscriber is not an error.
        let _ = self.ends.send(Ended {
            id: session_id.to_string(),
            reason,
            reading,
        });
        self.forget_records(session_id).await;
        let Some(hook) = self.on_end.get().cloned() else {
            return;
        };
        let id = session_id.to_string();
        if let Err(e) = tokio::task::spawn_blocking(move || hook(&id)).await {
            tracing::warn!(session = %session_id, error = %e, "the session end hook failed");
        }
    }

    /// Deletes every tool record of `session_id`; returns the kinds deleted, sorted. The one
    /// way records of one session go: a session's end, and `sessions rm` of a session whose
    /// sandbox was already gone (trusted callers only: no owner is checked here).
    pub async fn forget_records(&self, session_id: &str) -> Vec<String> {
        let kinds = self.records.forget(session_id).await;
        if !kinds.is_empty() {
            tracing::debug!(session = %session_id, ?kinds, "the session's tool records are gone");
        }
        kinds
    }

    /// Removes a session's sandbox, then tells the end hook: the one way a session's
    /// sandbox is destroyed. A failed removal leaves the session (and what is kept for it).
    pub(super) async fn destroy(
        &self,
        session_id: &str,
        handle: &str,
        reason: EndReason,
    ) -> Result<(), SandboxError> {
        // The last reading for usage metering, of the sandboxes the manager itself decided
        // to remove (idle, over the budget, orphaned); a caller that asked for a removal
        // takes its own before (serve's DELETE does, so its answer already counts it). A
        // vanished sandbox has nothing left to read (asking a dead pod waits for a timeout).
        let reading = if matches!(reason, EndReason::Removed | EndReason::Vanished(_)) {
            None
        } else {
            Some(self.reading_of(handle).await).filter(|r| !r.is_empty())
        };
        self.runtime.remove(handle).await?;
        self.announce_end(session_id, reason, reading).await;
        Ok(())
    }

    /// The sandbox's CPU time and memory now, as far as the backend tells (an error is
    /// "cannot tell": metering must never stop a removal or a sample of the others).
    pub async fn reading_of(&self, handle: &str) -> Reading {
        let usage = self.runtime.usage(handle).await.unwrap_or_default();
        Reading {
            container: handle.to_string(),
            at: crate::store::now_ms(),
            cpu_usec: usage.cpu_usec,
            memory_bytes: usage.memory_bytes,
        }
    }

    /// Creates a session for `owner`. The request can only lower the limits; the global
    /// and the per-owner caps count sessions being created too.
    pub async fn create(
        &self,
        owner: &Owner,
        request: &LimitRequest,
        options: CreateOptions,
    ) -> Result<Arc<Session>, SandboxError> {
        self.create_from(owner, request, options, None).await
    }

    /// `create`, from the image of a template (`Templates::resolve`; None: the default
    /// image). The warm pool holds only the default image's sandboxes, so another
    /// template's session is always made cold.
    pub async fn create_from(
        &self,
        owner: &Owner,
        request: &LimitRequest,
        options: CreateOptions,
        image: Option<String>,
    ) -> Result<Arc<Session>, SandboxError> {
        let limits = self
            .limits
            .lowered(request)
            .map_err(|e| SandboxError::InvalidRequest(e.to_string()))?;
        let reservation = self.reserve(owner)?;
        let started = std::time::Instant::now();
        let warm = match image {
            None => self.claim(owner, &limits, options.keep).await,
            Some(_) => None,
        };
        if let Some(warm) = warm {
            let session = Session::new(
                warm.session_id.clone(),
                owner.clone(),
                warm.sandbox,
                limits,
                options.keep,
                warm.handle,
                self.records.clone(),
            );
            lock(&self.table)
                .sessions
                .insert(warm.session_id, session.clone());
            drop(reservation);
            crate::metrics::session_created(crate::metrics::Claim::Warm, started);
            return Ok(session);
        }
        self.make_room();
        let spec = SandboxSpec {
            session_id: new_session_id(),
            owner: Some(owner.clone()),
            limits,
            keep: options.keep,
            pooled: false,
            replica: self.replica().map(str::to_string),
            image,
            restore_bytes: None,
        };
        // The creation runs as its own task, so a caller that gives up (a client that
        // disconnects, a cancelled future) cannot leave a sandbox nobody knows about: the
        // task removes what it made when nobody is waiting for it any more.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let runtime = self.runtime.clone();
        let task_spec = spec.clone();
        tokio::spawn(async move {
            let created = runtime.create(&task_spec).await;
            if let Err(Ok((handle, _))) = tx.send(created)
                && let Err(e) = runtime.remove(&handle).await
            {
                tracing::warn!(session = %task_spec.session_id, error = %e, "could not remove the sandbox of an abandoned create");
            }
        });
        let (handle, sandbox) = rx.await.map_err(|_| SandboxError::Protocol {
            helper: "the session manager".into(),
            message: "the sandbox creation task ended without an answer".into(),
        })??;
        let session = Session::new(
            spec.session_id.clone(),
            owner.clone(),
            sandbox,
            spec.limits,
            spec.keep,
            handle,
            self.records.clone(),
        );
        lock(&self.table)
            .sessions
            .insert(spec.session_id, session.clone());
        drop(reservation);
        crate::metrics::session_created(crate::metrics::Claim::Cold, started);
        Ok(session)
    }

    pub(super) fn reserve(&self, owner: &Owner) -> Result<Reservation, SandboxError> {
        let mut t = lock(&self.table);
        if t.count(None) >= self.config.max {
            return Err(SandboxError::TooManySessions {
                limit: self.config.max,
            });
        }
        let per_owner = self.config.max_per_owner.min(self.config.max);
        if t.count(Some(owner)) >= per_owner {
            return Err(SandboxError::TooManySessionsForOwner {
                owner: owner.to_string(),
                limit: per_owner,
            });
        }
        *t.starting.entry(owner.clone()).or_default() += 1;
        Ok(Reservation {
            table: self.table.clone(),
            owner: owner.clone(),
        })
    }

    /// A session of `owner`: a live one of this process, or a kept one found by its label
    /// and re-attached with the limits it was created with. Another owner's session is
    /// "not found", exactly like a missing one.
    pub async fn get(&self, owner: &Owner, id: &str) -> Result<Arc<Session>, SandboxError> {
        let not_found = || SandboxError::SessionNotFound { id: id.into() };
        if !plausible_id(id) {
            return Err(not_found());
        }
        if let Some(s) = lock(&self.table).sessions.get(id) {
            if &s.owner != owner {
                return Err(not_found());
            }
            s.touch();
            return Ok(s.clone());
        }
        let found = self
            .runtime
            .find(id)
            .await?
            .filter(|f| Viewer::Owner(owner.clone()).sees(f.owner.as_ref()))
            .ok_or_else(not_found)?;
        if found.limits.is_none() {
            tracing::warn!(session = %id, "the session recorded no limits (made by an older sandboxd); using the configured ones");
        }
        self.attach_found(owner, found).await
    }

    /// Attaches a sandbox found on the backend as a session of `owner`, with its recorded
    /// limits within today's ceilings, and puts it in the table.
    pub(super) async fn attach_found(
        &self,
        owner: &Owner,
        found: super::runtime::FoundSandbox,
    ) -> Result<Arc<Session>, SandboxError> {
        let limits = found.limits_within(&self.limits);
        let sandbox = self.runtime.attach(&found, &limits).await?;
        let id = found.session_id.clone();
        let session = Session::new(
            id.clone(),
            owner.clone(),
            sandbox,
            limits,
            found.keep,
            found.handle,
            self.records.clone(),
        );
        // Two lookups may race to attach; the first one in the table wins.
        let mut t = lock(&self.table);
        Ok(t.sessions.entry(id).or_insert(session).clone())
    }

    /// The session of `owner` this process holds now, if any: unlike `get`, never one
    /// re-attached from the backend, and not marked as used.
    pub fn held(&self, owner: &Owner, id: &str) -> Option<Arc<Session>> {
        lock(&self.table)
            .sessions
            .get(id)
            .filter(|s| &s.owner == owner)
            .cloned()
    }

    /// Removes a session of `owner` and its sandbox; another owner's is "not found".
    pub async fn remove(&self, owner: &Owner, id: &str) -> Result<(), SandboxError> {
        let viewer = Viewer::Owner(owner.clone());
        self.remove_as(&viewer, id, EndReason::Removed).await
    }

    /// Removes any session (the admin: `sessions rm`). `SessionNotFound` here means that no
    /// sandbox on the backend has that id at all (no warm one, none in the table, none
    /// labelled with it), which is what lets `sessions rm` drop a vanished session's records.
    pub async fn admin_remove(&self, id: &str) -> Result<(), SandboxError> {
        self.remove_as(&Viewer::Admin, id, EndReason::Removed).await
    }

    /// When no sandbox is found, nothing else is touched: not the end hook, not a file. A
    /// vanished sandbox's owner label is gone with it, so an owner's "not found" cannot tell
    /// its own session from another owner's, and must not act on either (or a caller could
    /// end another's records by naming the id, and a 404 would differ by whether the id
    /// exists). Records left that way are dropped only by trusted callers: `sessions rm`
    /// (the local admin) and the sweep of orphans (`forget_orphan_records`).
    pub(super) async fn remove_as(
        &self,
        viewer: &Viewer,
        id: &str,
        reason: EndReason,
    ) -> Result<(), SandboxError> {
        let not_found = || SandboxError::SessionNotFound { id: id.into() };
        if !plausible_id(id) {
            return Err(not_found());
        }
        // The admin may remove a warm sandbox by its id; to anyone else it is no session.
        let warm = {
            let mut t = lock(&self.table);
            match t.pool.iter().position(|w| w.session_id == id) {
                Some(i) if viewer.sees(None) => t.pool.remove(i),
                _ => None,
            }
        };
        if let Some(warm) = warm {
            return self.runtime.remove(&warm.handle).await;
        }
        let held = {
            let mut t = lock(&self.table);
            match t.sessions.get(id) {
                Some(s) if viewer.sees(Some(&s.owner)) => t.sessions.remove(id),
                Some(_) => return Err(not_found()),
                None => None,
            }
        };
        let handle = match held {
            Some(s) => s.handle.clone(),
            None => {
                self.runtime
                    .find(id)
                    .await?
                    .filter(|f| viewer.sees(f.owner.as_ref()))
                    .ok_or_else(not_found)?
                    .handle
            }
        };
        self.destroy(id, &handle, reason).await
    }

    /// Removes every session this process holds, except kept ones, and closes the warm
    /// pool, removing its sandboxes (on shutdown).
    pub async fn remove_all(&self) {
        self.close_pool().await;
        let all: Vec<Arc<Session>> = lock(&self.table)
            .sessions
            .values()
            .filter(|s| !s.keep)
            .cloned()
            .collect();
        for s in all {
            if let Err(e) = self.remove(&s.owner, &s.id).await {
                tracing::warn!(session = %s.id, error = %e, "could not remove session");
            }
        }
    }

    /// The memory the session's sandbox uses now, if the backend can tell.
    pub async fn memory_of(&self, session: &Session) -> Result<Option<u64>, SandboxError> {
        self.runtime.memory_usage(&session.handle).await
    }

    /// Sessions held by this process.
    /// How many sessions this process holds and is making, and its warm pool (for the
    /// metrics: cheap, no await).
    pub fn census(&self) -> crate::metrics::Census {
        let t = lock(&self.table);
        crate::metrics::Census {
            live: t.sessions.len(),
            starting: t.starting.values().sum(),
            warm: t.pool.len(),
            filling: t.filling,
        }
    }

    pub async fn live(&self) -> Vec<Arc<Session>> {
        lock(&self.table).sessions.values().cloned().collect()
    }

    /// The sandboxes on the backend `viewer` may see (the admin: all managed ones).
    pub async fn list(&self, viewer: &Viewer) -> Result<Vec<SessionInfo>, SandboxError> {
        Ok(self
            .runtime
            .list()
            .await?
            .into_iter()
            .filter(|f| viewer.sees(f.owner.as_ref()))
            .map(|f| SessionInfo {
                session_id: f.session_id,
                owner: f.owner.map(|o| o.to_string()).unwrap_or_default(),
                handle: f.handle,
                state: f.state,
                kept: f.keep,
                creator: f.creator,
                pooled: f.pooled,
                replica: f.replica,
            })
            .collect())
    }

    /// Removes the sessions of this process unused for longer than their own idle timeout
    /// (the configured one unless set), and tells why. A session held in use is never idle.
    /// With shared books (`share`) each is first vetted there: one used by another replica
    /// meanwhile stays, its idle time dated from that use. A session is taken out of the
    /// table only if it is still the one found idle, and (unless the books ended it) still
    /// idle, so a session used meanwhile is not taken.
    pub async fn reap_idle(&self) -> Vec<String> {
        let configured = Duration::from_secs(self.config.idle_timeout_secs);
        let over: Vec<(Arc<Session>, Duration)> = lock(&self.table)
            .sessions
            .values()
            .map(|s| (s.clone(), s.idle_timeout().unwrap_or(configured)))
            .filter(|(s, timeout)| s.idle_for() > *timeout)
            .collect();
        let mut reaped = Vec::new();
        for (s, timeout) in over {
            let vetted = match self.shared.get() {
                None => false,
                Some(books) => match books.vet_idle(&s, timeout).await {
                    super::shared::ReapVerdict::Reap => true,
                    super::shared::ReapVerdict::UsedAgo(ago) => {
                        s.used_ago(ago.min(s.idle_for()));
                        continue;
                    }
                    super::shared::ReapVerdict::Unknown => continue,
                },
            };
            let taken = {
                let mut t = lock(&self.table);
                let same = t.sessions.get(&s.id).is_some_and(|c| Arc::ptr_eq(c, &s));
                if same && (vetted || s.idle_for() > timeout) {
                    t.sessions.remove(&s.id)
                } else {
                    None
                }
            };
            if taken.is_none() {
                continue;
            }
            tracing::info!(session = %s.id, "removing idle session");
            match self
                .destroy(&s.id, &s.handle, EndReason::Idle(timeout))
                .await
            {
                Ok(()) => reaped.push(s.id.clone()),
                Err(e) => {
                    tracing::warn!(session = %s.id, error = %e, "could not remove idle session")
                }
            }
        }
        reaped
    }

    /// The one reaper: runs `reap_idle`, `hibernate_idle` (hibernate.rs) and
    /// `enforce_memory_budget` every `reap_interval_secs` until the manager is dropped.
    pub fn spawn_reaper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let every = Duration::from_secs(self.config.reap_interval_secs.max(1));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(manager) = weak.upgrade() else {
                    return;
                };
                manager.reap_idle().await;
                manager.hibernate_idle();
                manager.enforce_memory_budget().await;
            }
        })
    }

    /// Removes managed sandboxes no live process owns: their creator is gone and they were
    /// not kept on purpose, or they stopped. Touches nothing unlabelled. One listing.
    ///
    /// A sandbox that recorded a replica with a live lease (one of several sharing sessions,
    /// see `share`) is in use even if its creator looks gone: a creator is a process of one
    /// host, and replicas may run on several. A lease can only spare a sandbox, never condemn
    /// it: a replica this store does not know may be another service's, so without a live
    /// lease the creator decides, as before. While the live replicas cannot be told, such a
    /// sandbox is left alone.
    pub async fn reconcile(&self) -> Result<Vec<String>, SandboxError> {
        let mut removed = Vec::new();
        let mut live: Option<Option<Vec<String>>> = None;
        for f in self.runtime.list().await? {
            {
                let t = lock(&self.table);
                if t.sessions.contains_key(&f.session_id)
                    || t.pool.iter().any(|w| w.handle == f.handle)
                {
                    continue;
                }
            }
            let replica_alive = match (f.replica.as_deref(), self.shared.get()) {
                (Some(replica), Some(books)) => {
                    if live.is_none() {
                        live = Some(books.live_replicas().await);
                    }
                    match live.as_ref().and_then(Option::as_ref) {
                        Some(ids) => ids.iter().any(|id| id == replica),
                        None => true,
                    }
                }
                _ => false,
            };
            let creator_alive = replica_alive
                || match f.creator.as_deref() {
                    Some(c) => self.runtime.creator_alive(c).await,
                    None => false,
                };
            // A stopped sandbox is garbage; a live creator may still be starting one, so
            // only a dead creator makes a not-yet-running sandbox an orphan.
            let stopped = f.state == SandboxState::Stopped;
            let kept_running = f.keep && f.state == SandboxState::Running;
            if !stopped && (creator_alive || kept_running) {
                continue;
            }
            self.destroy(&f.session_id, &f.handle, EndReason::Orphan)
                .await?;
            removed.push(f.session_id);
        }
        Ok(removed)
    }

    /// Deletes the tool records of every session that has no sandbox on the backend (its
    /// sandbox was removed outside sandboxd), and returns those sessions' ids, sorted.
    ///
    /// Only for callers trusted with the whole records home (`sessions gc`, a command's
    /// start-up reconcile, `serve`'s start): nothing a client names reaches it, so no owner
    /// is checked; the test is the backend's own listing, whoever the session belonged to.
    /// The records are listed before the sandboxes, so a session created meanwhile cannot
    /// lose its records: a record is written only while its sandbox exists. A failed listing
    /// deletes nothing.
    pub async fn forget_orphan_records(&self) -> Result<Vec<String>, SandboxError> {
        self.forget_orphans_in(self.records.as_ref()).await
    }

    /// `forget_orphan_records` in another records home (serve's start sweeps the data
    /// directory's record files, which its own records no longer are).
    pub async fn forget_orphans_in(
        &self,
        records: &dyn SessionRecords,
    ) -> Result<Vec<String>, SandboxError> {
        self.forget_orphans_sparing(records, &Default::default())
            .await
    }

    /// `forget_orphans_in`, sparing the sessions `spare` names: hibernated ones, whose
    /// sandbox is gone on purpose and whose records their resume needs (serve's start).
    pub async fn forget_orphans_sparing(
        &self,
        records: &dyn SessionRecords,
        spare: &std::collections::BTreeSet<String>,
    ) -> Result<Vec<String>, SandboxError> {
        let mut recorded = records.sessions().await;
        recorded.retain(|id| !spare.contains(id));
        if recorded.is_empty() {
            return Ok(Vec::new());
        }
        let mut alive: std::collections::BTreeSet<String> = self
            .list(&Viewer::Admin)
            .await?
            .into_iter()
            .map(|s| s.session_id)
            .collect();
        alive.extend(self.live().await.into_iter().map(|s| s.id.clone()));
        let orphans: Vec<String> = recorded.difference(&alive).cloned().collect();
        for id in &orphans {
            let kinds = records.forget(id).await;
            tracing::info!(session = %id, ?kinds, "removed the tool records of a session whose sandbox is gone");
        }
        Ok(orphans)
    }
}
