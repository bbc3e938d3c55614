//! SessionManager: the live sessions of this process, their limits, the idle reaper and the
//! startup reconciler that removes containers nobody owns any more.
//!
//! Sessions outlive a CLI process only when asked to (`--keep`); every container records
//! which host process created it (pid and start time), so the reconciler can tell an
//! orphan of a crashed process from a session another live sandboxd still uses.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::Mutex;

use super::docker::{DockerRuntime, ManagedContainer, SessionSpec};
use super::{Sandbox, SandboxError};
use crate::config::{LimitRequest, Limits, SessionsConfig};

/// The backend boundary for session lifecycles; DockerRuntime is the one implementation.
#[async_trait]
pub trait Runtime: Send + Sync {
    async fn create(&self, spec: &SessionSpec) -> Result<Arc<dyn Sandbox>, SandboxError>;
    /// Wraps the existing container of a kept session, as `list_managed` found it.
    async fn attach(
        &self,
        found: &ManagedContainer,
        limits: &Limits,
    ) -> Result<Arc<dyn Sandbox>, SandboxError>;
    async fn list_managed(&self) -> Result<Vec<ManagedContainer>, SandboxError>;
    async fn remove(&self, container_id: &str) -> Result<(), SandboxError>;
}

#[async_trait]
impl Runtime for DockerRuntime {
    async fn create(&self, spec: &SessionSpec) -> Result<Arc<dyn Sandbox>, SandboxError> {
        Ok(DockerRuntime::create(self, spec).await?)
    }

    async fn attach(
        &self,
        found: &ManagedContainer,
        limits: &Limits,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        Ok(DockerRuntime::attach(self, found, limits)?)
    }

    async fn list_managed(&self) -> Result<Vec<ManagedContainer>, SandboxError> {
        DockerRuntime::list_managed(self).await
    }

    async fn remove(&self, container_id: &str) -> Result<(), SandboxError> {
        self.remove_container(container_id).await
    }
}

pub struct Session {
    pub id: String,
    pub owner: String,
    pub sandbox: Arc<dyn Sandbox>,
    pub limits: Limits,
    last_used: std::sync::Mutex<Instant>,
}

impl Session {
    pub fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
    }

    pub fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }
}

/// What `sessions list` shows.
#[derive(Debug, Clone, Serialize)]
pub struct SessionInfo {
    pub session_id: String,
    pub owner: String,
    pub container_id: String,
    pub state: String,
    pub kept: bool,
    pub created_by_pid: Option<u32>,
}

pub struct SessionManager {
    runtime: Arc<dyn Runtime>,
    limits: Limits,
    config: SessionsConfig,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Sessions whose containers are being created: they count against the max already.
    starting: AtomicUsize,
}

impl SessionManager {
    pub fn new(runtime: Arc<dyn Runtime>, limits: Limits, config: SessionsConfig) -> Arc<Self> {
        Arc::new(Self {
            runtime,
            limits,
            config,
            sessions: Mutex::new(HashMap::new()),
            starting: AtomicUsize::new(0),
        })
    }

    /// Creates a session container for `owner`. The request can only lower the limits.
    pub async fn create(
        &self,
        owner: &str,
        request: &LimitRequest,
        keep: bool,
    ) -> Result<Arc<Session>, SandboxError> {
        let limits = self
            .limits
            .lowered(request)
            .map_err(|e| SandboxError::InvalidRequest(e.to_string()))?;
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let spec = SessionSpec {
            session_id: id.clone(),
            owner: owner.to_string(),
            limits: limits.clone(),
            keep,
        };
        {
            // Count and reserve under one lock so concurrent creates cannot overshoot the max.
            let sessions = self.sessions.lock().await;
            let live = sessions.len() + self.starting.load(Ordering::SeqCst);
            if live >= self.config.max {
                return Err(SandboxError::TooManySessions {
                    limit: self.config.max,
                });
            }
            self.starting.fetch_add(1, Ordering::SeqCst);
        }
        let created = self.runtime.create(&spec).await;
        let mut sessions = self.sessions.lock().await;
        self.starting.fetch_sub(1, Ordering::SeqCst);
        let session = Arc::new(Session {
            id: id.clone(),
            owner: owner.to_string(),
            sandbox: created?,
            limits,
            last_used: std::sync::Mutex::new(Instant::now()),
        });
        sessions.insert(id, session.clone());
        Ok(session)
    }

    /// A live session of this process, or a kept one found by its label.
    pub async fn get(&self, id: &str) -> Result<Arc<Session>, SandboxError> {
        if let Some(s) = self.sessions.lock().await.get(id) {
            s.touch();
            return Ok(s.clone());
        }
        let found = self
            .runtime
            .list_managed()
            .await?
            .into_iter()
            .find(|c| c.session_id == id)
            .ok_or_else(|| SandboxError::SessionNotFound { id: id.into() })?;
        let sandbox = self.runtime.attach(&found, &self.limits).await?;
        let session = Arc::new(Session {
            id: id.into(),
            owner: found.owner,
            sandbox,
            limits: self.limits.clone(),
            last_used: std::sync::Mutex::new(Instant::now()),
        });
        self.sessions
            .lock()
            .await
            .insert(id.into(), session.clone());
        Ok(session)
    }

    /// Removes a session and its container; removing a missing one is not an error.
    pub async fn remove(&self, id: &str) -> Result<(), SandboxError> {
        self.sessions.lock().await.remove(id);
        self.remove_container_of(id).await
    }

    async fn remove_container_of(&self, id: &str) -> Result<(), SandboxError> {
        for c in self.runtime.list_managed().await? {
            if c.session_id == id {
                self.runtime.remove(&c.container_id).await?;
            }
        }
        Ok(())
    }

    /// Removes every session this process holds (on shutdown).
    pub async fn remove_all(&self) {
        let ids: Vec<String> = self.sessions.lock().await.keys().cloned().collect();
        for id in ids {
            if let Err(e) = self.remove(&id).await {
                tracing::warn!(session = %id, error = %e, "could not remove session");
            }
        }
    }

    /// Sessions held by this process.
    pub async fn live(&self) -> Vec<Arc<Session>> {
        self.sessions.lock().await.values().cloned().collect()
    }

    /// Every managed container on the engine, with who created it.
    pub async fn list(&self) -> Result<Vec<SessionInfo>, SandboxError> {
        Ok(self
            .runtime
            .list_managed()
            .await?
            .into_iter()
            .map(|c| SessionInfo {
                session_id: c.session_id,
                owner: c.owner,
                container_id: c.container_id,
                state: c.state,
                kept: c.keep,
                created_by_pid: c.creator.map(|(pid, _)| pid),
            })
            .collect())
    }

    /// Removes sessions of this process idle for longer than the configured timeout.
    pub async fn reap_idle(&self) -> Vec<String> {
        let limit = Duration::from_secs(self.config.idle_timeout_secs);
        let idle: Vec<String> = self
            .sessions
            .lock()
            .await
            .values()
            .filter(|s| s.idle_for() > limit)
            .map(|s| s.id.clone())
            .collect();
        for id in &idle {
            tracing::info!(session = %id, "removing idle session");
            if let Err(e) = self.remove(id).await {
                tracing::warn!(session = %id, error = %e, "could not remove idle session");
            }
        }
        idle
    }

    /// Runs the idle reaper every `reap_interval_secs` until the manager is dropped.
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
            }
        })
    }

    /// Removes managed containers no live process owns: their creator is gone and they
    /// were not kept on purpose, or they stopped running. Touches nothing unlabelled.
    pub async fn reconcile(&self) -> Result<Vec<String>, SandboxError> {
        let mine: Vec<String> = self.sessions.lock().await.keys().cloned().collect();
        let mut removed = Vec::new();
        for c in self.runtime.list_managed().await? {
            if mine.contains(&c.session_id) {
                continue;
            }
            let creator_alive = c
                .creator
                .is_some_and(|(pid, start)| process_alive(pid, start));
            // A stopped container is garbage; a live creator may still be starting one
            // ("created"), so only a dead creator makes a not-yet-running container an orphan.
            let stopped = matches!(c.state.as_str(), "exited" | "dead");
            if !stopped && (creator_alive || (c.keep && c.state == "running")) {
                continue;
            }
            self.runtime.remove(&c.container_id).await?;
            removed.push(c.session_id);
        }
        Ok(removed)
    }
}

/// This process's identity for the `sandboxd.creator` label: pid and kernel start time.
pub fn creator_label() -> String {
    let pid = std::process::id();
    format!("{pid}:{}", process_start_time(pid).unwrap_or(0))
}

pub fn parse_creator(label: &str) -> Option<(u32, u64)> {
    let (pid, start) = label.split_once(':')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime) counted after the ")" that closes the command name.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split_whitespace().nth(19)?.parse().ok()
}

fn process_alive(pid: u32, start: u64) -> bool {
    process_start_time(pid).is_some_and(|s| s == start)
}
