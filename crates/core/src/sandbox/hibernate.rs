//! Hibernation, the manager's half: which sessions are due (`hibernate_idle`, run by the one
//! reaper), and the table operations a `Hibernator` needs to save a session's /workspace
//! and remove its sandbox without ending the session (its tool records stay), and to make
//! its sandbox again under the same id and limits (`recreate`).
//!
//! What a snapshot is, where it lives and what records the session's state is the caller's
//! (serve: server/src/hibernate.rs, over its store). Only sessions made to outlive their
//! process (`keep`) are ever offered: a session that dies with its process has nothing to
//! come back to. A session is offered once it has been unused for `[sessions]
//! hibernate_after_secs` and while it is not past its own idle timeout (then the reaper ends
//! it instead); a session held in use is never idle, so never offered.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::manager::{Session, SessionManager, lock};
use super::runtime::SandboxSpec;
use super::{Owner, SandboxError};
use crate::config::Limits;

/// Saves an idle session and removes its sandbox (set once per manager, `set_hibernator`).
#[async_trait]
pub trait Hibernator: Send + Sync {
    /// Hibernates `session`, if it still may be; whether it did. It must leave the session
    /// either live as it was or hibernated whole (a complete snapshot recorded, then the
    /// sandbox removed through `SessionManager::take_idle` and `remove_kept`).
    async fn hibernate(&self, session: Arc<Session>) -> bool;
}

/// The sessions being hibernated now, so the reaper offers each one once at a time; and
/// when each one that stayed live (a workspace that cannot be saved, a use meanwhile) was
/// last used when it was offered, so it is not offered again until it is used and idle again.
#[derive(Default)]
pub(super) struct Hibernating(std::sync::Mutex<Offers>);

#[derive(Default)]
struct Offers {
    now: HashSet<String>,
    declined: HashMap<String, Instant>,
}

impl Hibernating {
    fn offers(&self) -> std::sync::MutexGuard<'_, Offers> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `id`, last used at `used`, is to be offered now (and marks it offered).
    fn start(&self, id: &str, used: Instant) -> bool {
        let mut o = self.offers();
        let declined = o.declined.get(id).is_some_and(|at| {
            at.max(&used).duration_since(*at.min(&used)) < Duration::from_secs(1)
        });
        !declined && o.now.insert(id.to_string())
    }

    fn done(&self, id: &str, used: Instant, hibernated: bool) {
        let mut o = self.offers();
        o.now.remove(id);
        if hibernated {
            o.declined.remove(id);
        } else {
            o.declined.insert(id.to_string(), used);
        }
    }

    /// Forgets what it declined of sessions no longer in `live`.
    fn keep_only(&self, live: &HashSet<&String>) {
        self.offers().declined.retain(|id, _| live.contains(id));
    }
}

impl SessionManager {
    /// Sets what hibernates idle sessions. Set once; a second call is ignored.
    pub fn set_hibernator(&self, hibernator: Arc<dyn Hibernator>) {
        if self.hibernator.set(hibernator).is_err() {
            tracing::warn!("the session manager's hibernator was set twice; the first one stays");
        }
    }

    /// Whether idle sessions hibernate here (a hibernator is set and `hibernate_after_secs`
    /// is not 0).
    pub fn hibernates(&self) -> bool {
        self.hibernator.get().is_some() && self.config.hibernate_after_secs > 0
    }

    /// The kept sessions unused for longer than `[sessions] hibernate_after_secs` and not
    /// past their own idle timeout, each handed to the hibernator on a task of its own (a
    /// large /workspace takes a while to save; the reaper does not wait). Returns the ids
    /// handed over now; one still being hibernated is not handed over again.
    pub fn hibernate_idle(self: &Arc<Self>) -> Vec<String> {
        let Some(hibernator) = self.hibernator.get().cloned() else {
            return Vec::new();
        };
        if self.config.hibernate_after_secs == 0 {
            return Vec::new();
        }
        let after = Duration::from_secs(self.config.hibernate_after_secs);
        let configured = Duration::from_secs(self.config.idle_timeout_secs);
        let due: Vec<Arc<Session>> = {
            let t = lock(&self.table);
            self.hibernating
                .keep_only(&t.sessions.keys().collect::<HashSet<_>>());
            t.sessions
                .values()
                .filter(|s| {
                    let timeout = s.idle_timeout().unwrap_or(configured);
                    let idle = s.idle_for();
                    s.keep && after < timeout && idle > after && idle <= timeout
                })
                .cloned()
                .collect()
        };
        let mut started = Vec::new();
        for s in due {
            let now = Instant::now();
            let used = now.checked_sub(s.idle_for()).unwrap_or(now);
            if !self.hibernating.start(&s.id, used) {
                continue;
            }
            started.push(s.id.clone());
            let (manager, hibernator) = (self.clone(), hibernator.clone());
            tokio::spawn(async move {
                let id = s.id.clone();
                let done = hibernator.hibernate(s).await;
                if done {
                    tracing::info!(session = %id, "hibernated an idle session");
                }
                manager.hibernating.done(&id, used, done);
            });
        }
        started
    }

    /// Takes `session` out of the table if it is still the one there and unused for at
    /// least `unused_for` (never while held): from then on no lookup here finds it. Its
    /// sandbox and records stay; `put_back` undoes it, `remove_kept` removes the sandbox.
    pub fn take_idle(&self, session: &Arc<Session>, unused_for: Duration) -> bool {
        let mut t = lock(&self.table);
        let same = t
            .sessions
            .get(&session.id)
            .is_some_and(|c| Arc::ptr_eq(c, session));
        if same && session.idle_for() >= unused_for {
            t.sessions.remove(&session.id);
            true
        } else {
            false
        }
    }

    /// Puts a session `take_idle` took back in the table (unless another took its place).
    pub fn put_back(&self, session: Arc<Session>) {
        lock(&self.table)
            .sessions
            .entry(session.id.clone())
            .or_insert(session);
    }

    /// Removes the sandbox of a session taken out of the table, without ending the session:
    /// no end event, no end hook, its tool records stay (a hibernated session's).
    pub async fn remove_kept(&self, session: &Session) -> Result<(), SandboxError> {
        self.runtime.remove(&session.handle).await
    }

    /// Forgets the session `id` of `owner` this process holds without touching its sandbox
    /// or its records: another replica hibernated it, so what this one held is gone.
    pub fn forget_held(&self, owner: &Owner, id: &str) {
        let mut t = lock(&self.table);
        if t.sessions.get(id).is_some_and(|s| &s.owner == owner) {
            t.sessions.remove(id);
        }
    }

    /// Makes a hibernated session's sandbox again: the same session id (so its tool records
    /// and what the service recorded still name it), `limits` as recorded (within today's
    /// ceilings), from `image` (a template's; None: the default), kept, counted in the caps
    /// like a create. The sandbox that was hibernated (`hibernated`: its handle), if it was
    /// left (a hibernation that stopped after its record), is removed first; any other
    /// sandbox with that id is another process's resume of the same session, left alone
    /// (`Busy`: the caller retries and finds it running). `restore_bytes`: the size of the
    /// archive the resume restores (`SandboxSpec::restore_bytes`).
    pub async fn recreate(
        &self,
        owner: &Owner,
        id: &str,
        limits: &Limits,
        image: Option<String>,
        hibernated: Option<&str>,
        restore_bytes: Option<u64>,
    ) -> Result<Arc<Session>, SandboxError> {
        if let Some(s) = self.held(owner, id) {
            return Ok(s);
        }
        let reservation = self.reserve(owner)?;
        if let Some(left) = self.runtime.find(id).await? {
            if hibernated != Some(left.handle.as_str()) {
                return Err(SandboxError::Busy(format!(
                    "session {id} is being resumed by another process"
                )));
            }
            self.runtime.remove(&left.handle).await?;
        }
        // What the host enforces per call, within today's ceilings (as for a re-attach).
        let mut within = limits.clone();
        within.max_timeout_secs = within.max_timeout_secs.min(self.limits.max_timeout_secs);
        within.output_cap_kb = within.output_cap_kb.min(self.limits.output_cap_kb);
        within.max_file_mb = within.max_file_mb.min(self.limits.max_file_mb);
        let spec = SandboxSpec {
            session_id: id.to_string(),
            owner: Some(owner.clone()),
            limits: within,
            keep: true,
            pooled: false,
            replica: self.replica().map(str::to_string),
            image,
            restore_bytes,
        };
        let (handle, sandbox) = self.runtime.create(&spec).await?;
        let session = Session::new(
            spec.session_id.clone(),
            owner.clone(),
            sandbox,
            spec.limits,
            true,
            handle,
            self.records().clone(),
        );
        let mut t = lock(&self.table);
        let session = t.sessions.entry(spec.session_id).or_insert(session).clone();
        drop(t);
        drop(reservation);
        Ok(session)
    }
}

/// What a resumed session's next run tells first (a `notice` event): kept in the session's
/// slots by the resume, taken once by `agent::session_run`.
#[derive(Default)]
pub struct ResumeNotice(std::sync::Mutex<Option<String>>);

impl ResumeNotice {
    pub fn set(&self, notice: String) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(notice);
    }

    pub fn take(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}
