//! The warm pool of the SessionManager: sandboxes of the configured limits profile made and
//! started ahead of time, with no owner, no env and no secrets, their shell and file helper
//! already up, so that a session is a claim of milliseconds instead of a cold create.
//!
//! The pool speaks only the `Runtime` seam. Its rules:
//! - A claim takes a warm sandbox out of the pool and binds it to one session and owner in
//!   this process's records (a sandbox's `SandboxMeta` is written once, at creation). Limits
//!   below the profile's are applied through `Runtime::update_limits`; a backend that
//!   declines, a failed update, a profile mismatch (tmpfs sizes and ulimits are fixed at
//!   creation), a kept session (unless the pool is scoped) or an empty pool all mean a cold
//!   create, never an error. A backend that can mark the sandbox as claimed does so
//!   (`Runtime::mark_claimed`, one call); a failed mark is a cold create too.
//! - A scoped pool (`with_scoped_pool`, for `serve`) labels its sandboxes with the scope as
//!   owner and as kept: the caller records each claim, and at its next start re-adopts the
//!   claimed ones (`adopt`) and removes the rest of its scope.
//! - A sandbox is never given back: when its session ends it is destroyed, like any other.
//! - Refills run after every claim and on a timer; the pool never exceeds its size, and
//!   warm plus live sandboxes never exceed the global session cap. Sandboxes older than
//!   `max_age_secs`, made from an older image, or gone from the backend are replaced.
//! - With `[sessions] memory_budget_mb`, fills stop where the budget ends (budget.rs).
//! - Each fill is its own task holding only the runtime and the table, so a refill loop
//!   that is aborted cannot leave a sandbox nobody knows; a fill that ends after the pool
//!   closed removes what it made. A process that dies leaves pooled sandboxes whose creator
//!   is dead, which the reconciler removes.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::manager::{Session, SessionManager, Table, lock, plausible_id};
use super::runtime::{Runtime, SandboxSpec, SandboxState};
use super::{Owner, Sandbox, SandboxError};
use crate::config::Limits;

/// A warm sandbox waiting in the pool.
pub(super) struct Warm {
    /// The session id it was labelled with; the claiming session takes it.
    pub session_id: String,
    pub handle: String,
    pub sandbox: Arc<dyn Sandbox>,
    made: Instant,
    /// `Runtime::image_revision` when it was made.
    revision: Option<String>,
}

/// Whether a session with `wanted` limits can run in a sandbox made with `profile`: what is
/// fixed at creation (tmpfs sizes, ulimits) must be equal; memory, CPU and processes may be
/// lowered at claim time.
pub(super) fn fits_profile(wanted: &Limits, profile: &Limits) -> bool {
    wanted.workspace_mb == profile.workspace_mb
        && wanted.tmp_mb == profile.tmp_mb
        && wanted.nofile == profile.nofile
        && wanted.fsize_mb == profile.fsize_mb
}

fn lowers_resources(wanted: &Limits, profile: &Limits) -> bool {
    wanted.memory_mb < profile.memory_mb || wanted.cpus < profile.cpus || wanted.pids < profile.pids
}

/// Removes a sandbox taken out of the pool unless it was handed to a session, however the
/// claim ends (even cancelled half-way).
struct Discard {
    runtime: Arc<dyn Runtime>,
    handle: Option<String>,
}

impl Drop for Discard {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            discard(self.runtime.clone(), handle);
        }
    }
}

/// Removes a sandbox in the background (a claim or a drop must not wait for it).
fn discard(runtime: Arc<dyn Runtime>, handle: String) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            if let Err(e) = runtime.remove(&handle).await {
                tracing::warn!(handle, error = %e, "could not remove a warm sandbox");
            }
        });
    }
}

/// Counts a fill under way until it ends, however it ends.
struct Filling(Arc<std::sync::Mutex<Table>>);

impl Drop for Filling {
    fn drop(&mut self) {
        let mut t = lock(&self.0);
        t.filling = t.filling.saturating_sub(1);
    }
}

/// What one refill did (for logs and tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RefillReport {
    /// Warm sandboxes removed for age, an older image or being gone.
    pub retired: usize,
    /// Warm sandboxes made and added.
    pub added: usize,
    /// Fills that failed (logged; retried at the next refill).
    pub failed: usize,
}

impl SessionManager {
    /// A warm sandbox for a session with `limits`, already lowered to them, or None (then the
    /// caller creates one cold). Wakes the refill task when it takes one.
    pub(super) async fn claim(&self, owner: &Owner, limits: &Limits, keep: bool) -> Option<Warm> {
        // A kept session must outlive this process: only a scoped pool's sandboxes can,
        // since its caller records the claim and re-adopts it (an unscoped one is an orphan
        // once its creator is gone).
        let keep_ok = !keep || self.pool_scope.is_some();
        if !keep_ok || self.pool_config.size == 0 || !fits_profile(limits, &self.limits) {
            return None;
        }
        let warm = lock(&self.table).pool.pop_front()?;
        self.refill.notify_one();
        let mut guard = Discard {
            runtime: self.runtime.clone(),
            handle: Some(warm.handle.clone()),
        };
        if lowers_resources(limits, &self.limits) {
            match self.runtime.update_limits(&warm.handle, limits).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::debug!(
                        "the backend cannot lower a warm sandbox's limits; creating one"
                    );
                    return None;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not lower a warm sandbox's limits; creating one");
                    return None;
                }
            }
        }
        if let Err(e) = self.runtime.mark_claimed(&warm.handle, owner).await {
            tracing::warn!(error = %e, "could not mark a warm sandbox as claimed; creating one");
            return None;
        }
        guard.handle = None;
        Some(warm)
    }

    /// Takes warm sandboxes out (and removes them) while warm plus live sandboxes exceed the
    /// global cap: a cold create must not push the host over it.
    pub(super) fn make_room(&self) {
        let max = self.config.max;
        let evicted: Vec<Warm> = {
            let mut t = lock(&self.table);
            let mut out = Vec::new();
            while t.containers() > max {
                match t.pool.pop_front() {
                    Some(w) => out.push(w),
                    None => break,
                }
            }
            out
        };
        for w in evicted {
            discard(self.runtime.clone(), w.handle);
        }
        if !self.pool_closed() {
            self.refill.notify_one();
        }
    }

    fn pool_closed(&self) -> bool {
        lock(&self.table).pool_closed
    }

    /// The owner label of this manager's warm sandboxes, if its pool is scoped.
    pub fn pool_scope(&self) -> Option<&Owner> {
        self.pool_scope.as_ref()
    }

    /// Takes back a sandbox of this manager's pool scope that an earlier process claimed
    /// for `owner`, on the word of the caller's own records (the sandbox's metadata, written
    /// before the claim, cannot say who claimed it): `limits` are what those records say the
    /// session got, with what the host enforces per call capped by today's ceilings. Without
    /// a scope, or for anything but a pooled sandbox of the scope, the session is "not found".
    pub async fn adopt(
        &self,
        owner: &Owner,
        id: &str,
        limits: &Limits,
    ) -> Result<Arc<Session>, SandboxError> {
        let Some(scope) = self.pool_scope.clone() else {
            return Err(SandboxError::SessionNotFound { id: id.into() });
        };
        self.adopt_pooled(owner, id, limits, Some(&scope)).await
    }

    /// Takes a sandbox that another process's warm pool made and that process claimed for
    /// `owner` (its label names that pool's scope, not the owner), on the word of the caller's
    /// own records, as `adopt` does for this manager's scope: serve's replicas each have a
    /// pool of their own, and a session made on one is used through the others (an MCP
    /// session moving between replicas). Anything but a pooled sandbox is "not found".
    pub async fn adopt_claimed(
        &self,
        owner: &Owner,
        id: &str,
        limits: &Limits,
    ) -> Result<Arc<Session>, SandboxError> {
        self.adopt_pooled(owner, id, limits, None).await
    }

    /// `adopt` and `adopt_claimed`: a pooled sandbox (of `scope`, when given) bound to
    /// `owner` with `limits`; one this manager holds already is returned if it is `owner`'s.
    async fn adopt_pooled(
        &self,
        owner: &Owner,
        id: &str,
        limits: &Limits,
        scope: Option<&Owner>,
    ) -> Result<Arc<Session>, SandboxError> {
        let not_found = || SandboxError::SessionNotFound { id: id.into() };
        if !plausible_id(id) {
            return Err(not_found());
        }
        if let Some(s) = lock(&self.table).sessions.get(id) {
            return if &s.owner == owner {
                Ok(s.clone())
            } else {
                Err(not_found())
            };
        }
        let mut found = self
            .runtime
            .find(id)
            .await?
            .filter(|f| f.pooled && scope.is_none_or(|sc| f.owner.as_ref() == Some(sc)))
            .ok_or_else(not_found)?;
        found.limits = Some(limits.clone());
        self.attach_found(owner, found).await
    }

    /// Warm sandboxes ready now.
    pub fn pool_ready(&self) -> usize {
        lock(&self.table).pool.len()
    }

    /// The session ids the warm sandboxes carry (what `sessions list` shows as "(pool)").
    pub fn pool_sessions(&self) -> Vec<String> {
        lock(&self.table)
            .pool
            .iter()
            .map(|w| w.session_id.clone())
            .collect()
    }

    /// Retires stale warm sandboxes and makes new ones up to the pool size and the cap.
    pub async fn refill_pool(&self) -> RefillReport {
        let mut report = RefillReport::default();
        let config = self.pool_config.clone();
        if config.size == 0 || self.pool_closed() {
            return report;
        }
        let revision = match self.runtime.image_revision().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell which image new sandboxes use; the pool waits");
                return report;
            }
        };
        // One listing tells which warm sandboxes still run (one removed from outside is not
        // handed to a session).
        let running: Option<HashSet<String>> = self.runtime.list().await.ok().map(|all| {
            all.into_iter()
                .filter(|f| f.state == SandboxState::Running)
                .map(|f| f.handle)
                .collect()
        });
        let max_age = Duration::from_secs(config.max_age_secs);
        let stale: Vec<Warm> = {
            let mut t = lock(&self.table);
            let (fresh, stale): (VecDeque<Warm>, VecDeque<Warm>) =
                std::mem::take(&mut t.pool).into_iter().partition(|w| {
                    w.made.elapsed() < max_age
                        && (revision.is_none() || w.revision == revision)
                        && running.as_ref().is_none_or(|r| r.contains(&w.handle))
                });
            t.pool = fresh;
            stale.into()
        };
        report.retired = stale.len();
        futures::future::join_all(stale.iter().map(|w| self.runtime.remove(&w.handle))).await;

        // Measured before the lock: with a memory budget, fill only what fits in it.
        let budget_room = self.budget_room().await;
        let want = {
            let mut t = lock(&self.table);
            if t.pool_closed {
                return report;
            }
            let room = self.config.max.saturating_sub(t.containers());
            let want = config
                .size
                .saturating_sub(t.pool.len() + t.filling)
                .min(room)
                .min(budget_room);
            t.filling += want;
            want
        };
        let fills: Vec<_> = (0..want)
            .map(|_| {
                let filling = Filling(self.table.clone());
                let runtime = self.runtime.clone();
                let table = self.table.clone();
                let spec = SandboxSpec {
                    session_id: super::manager::new_session_id(),
                    owner: self.pool_scope.clone(),
                    limits: self.limits.clone(),
                    keep: self.pool_scope.is_some(),
                    pooled: true,
                    replica: self.replica().map(str::to_string),
                    image: None,
                    restore_bytes: None,
                };
                let revision = revision.clone();
                self.fills.spawn(async move {
                    let _filling = filling;
                    fill_one(runtime, table, spec, revision).await
                })
            })
            .collect();
        for f in fills {
            match f.await {
                Ok(Ok(())) => report.added += 1,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "could not make a warm sandbox");
                    report.failed += 1;
                }
                Err(_) => report.failed += 1,
            }
        }
        report
    }

    /// Closes the pool: no more fills, and every warm sandbox (also those being made) is
    /// removed before this returns.
    pub async fn close_pool(&self) {
        let warm: Vec<Warm> = {
            let mut t = lock(&self.table);
            t.pool_closed = true;
            t.pool.drain(..).collect()
        };
        futures::future::join_all(warm.iter().map(|w| self.runtime.remove(&w.handle))).await;
        self.fills.close();
        self.fills.wait().await;
    }

    /// The refill task: refills now, then after every claim and every
    /// `[pool] refill_interval_secs`, until the manager is dropped. None when the pool is off.
    pub fn spawn_pool(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        if self.pool_config.size == 0 {
            return None;
        }
        let weak = Arc::downgrade(self);
        let wake = self.refill.clone();
        let every = Duration::from_secs(self.pool_config.refill_interval_secs.max(1));
        let settle = Duration::from_millis(self.pool_config.refill_delay_ms);
        Some(tokio::spawn(async move {
            loop {
                {
                    let Some(manager) = weak.upgrade() else {
                        return;
                    };
                    if manager.pool_closed() {
                        return;
                    }
                    let report = manager.refill_pool().await;
                    if report != RefillReport::default() {
                        tracing::debug!(?report, "warm pool refilled");
                    }
                }
                tokio::select! {
                    _ = wake.notified() => {
                        // A claim woke the refill: its session's first command goes first,
                        // before a new container's create, start and warm-up take the cores.
                        if !settle.is_zero() {
                            tokio::time::sleep(settle).await;
                        }
                    }
                    _ = tokio::time::sleep(every) => {}
                }
            }
        }))
    }
}

/// Makes one warm sandbox and adds it to the pool (or removes it if the pool closed).
async fn fill_one(
    runtime: Arc<dyn Runtime>,
    table: Arc<std::sync::Mutex<Table>>,
    spec: SandboxSpec,
    revision: Option<String>,
) -> Result<(), SandboxError> {
    let (handle, sandbox) = runtime.create(&spec).await?;
    if let Err(e) = sandbox.warm_up().await {
        let _ = runtime.remove(&handle).await;
        return Err(e);
    }
    let warm = Warm {
        session_id: spec.session_id,
        handle,
        sandbox,
        made: Instant::now(),
        revision,
    };
    let closed = {
        let mut t = lock(&table);
        if !t.pool_closed {
            t.pool.push_back(warm);
            return Ok(());
        }
        warm
    };
    runtime.remove(&closed.handle).await
}
