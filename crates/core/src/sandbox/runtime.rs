//! The runtime seam: what the SessionManager needs from a sandbox backend, in neutral words.
//!
//! A backend (Docker today, Kubernetes pods later, a fake in tests) creates sandboxes from a
//! `SandboxSpec`, lists the ones it manages as `FoundSandbox` values, removes them, and says
//! whether the process that created one is still alive. Everything a session must remember
//! across processes (its id, owner, keep flag, creator and the limits it was created with)
//! is recorded on the sandbox itself as the labels below, because a kept session is found
//! again by a later process that knows nothing else about it. Nothing here is Docker's.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

use super::{Owner, Sandbox, SandboxError};
use crate::config::Limits;

pub const LABEL_MANAGED: &str = "sandboxd.managed";
pub const LABEL_SESSION: &str = "sandboxd.session";
pub const LABEL_OWNER: &str = "sandboxd.owner";
pub const LABEL_KEEP: &str = "sandboxd.keep";
pub const LABEL_CREATOR: &str = "sandboxd.creator";
/// The limits the session was created with, as JSON: a container's memory, CPU and
/// process limits cannot change after creation, so a re-attached session must know them.
pub const LABEL_LIMITS: &str = "sandboxd.limits";
/// A sandbox made ahead of time for the warm pool: it has no owner label, or the pool's
/// scope (see `SessionManager::with_scoped_pool`). Once a session claims it, the binding
/// lives only in the records of the claiming process (labels cannot change): an unscoped
/// one is never re-attached by another process and dies with its creator; a scoped one is
/// kept, and the scope's next process re-adopts it from its own records or removes it.
pub const LABEL_POOL: &str = "sandboxd.pool";

/// What a new session's sandbox is made from.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub session_id: String,
    /// None for a warm-pool sandbox, made before anyone owns it; or the pool's scope.
    pub owner: Option<Owner>,
    /// Made for the warm pool (labelled `sandboxd.pool`).
    pub pooled: bool,
    /// Already lowered by the request and within the admin's ceilings.
    pub limits: Limits,
    /// Kept sessions outlive the process that made them (`--keep`).
    pub keep: bool,
}

impl SandboxSpec {
    /// The labels every backend records on the sandbox; `creator` comes from the backend's
    /// host (see `Runtime::creator_alive`).
    pub fn labels(&self, creator: &str) -> HashMap<String, String> {
        let mut labels = HashMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_SESSION.to_string(), self.session_id.clone()),
            (LABEL_KEEP.to_string(), self.keep.to_string()),
            (LABEL_CREATOR.to_string(), creator.to_string()),
            (
                LABEL_LIMITS.to_string(),
                serde_json::to_string(&self.limits).unwrap_or_default(),
            ),
        ]);
        if let Some(owner) = &self.owner {
            labels.insert(LABEL_OWNER.to_string(), owner.to_string());
        }
        if self.pooled {
            labels.insert(LABEL_POOL.to_string(), "true".to_string());
        }
        labels
    }
}

/// Where a sandbox is in its life, whatever the backend calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// Created but not running yet (its creator may be starting it right now).
    Starting,
    Running,
    /// Frozen from outside; it may be resumed.
    Paused,
    /// On its way out.
    Removing,
    /// Exited or dead: it will never run again.
    Stopped,
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SandboxState::Starting => "starting",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Removing => "removing",
            SandboxState::Stopped => "stopped",
        })
    }
}

/// A managed sandbox as a listing found it.
#[derive(Debug, Clone)]
pub struct FoundSandbox {
    /// The backend's own name for it (a container id, a pod name): what `remove` takes.
    pub handle: String,
    pub session_id: String,
    /// None when the label is missing or not a valid owner: only the admin sees it.
    pub owner: Option<Owner>,
    pub state: SandboxState,
    pub keep: bool,
    /// Made for the warm pool (claimed or not, it has no owner label).
    pub pooled: bool,
    /// The creator recorded by the backend's host, checked with `Runtime::creator_alive`.
    pub creator: Option<String>,
    /// The limits it was created with; None for a sandbox made before they were recorded.
    pub limits: Option<Limits>,
}

impl FoundSandbox {
    /// Reads what `SandboxSpec::labels` recorded.
    pub fn from_labels(
        handle: String,
        state: SandboxState,
        labels: &HashMap<String, String>,
    ) -> FoundSandbox {
        FoundSandbox {
            handle,
            // Labels can be written by anyone with access to the backend: an id that is
            // not ours (hex) is dropped rather than printed or matched.
            session_id: labels
                .get(LABEL_SESSION)
                .filter(|id| id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric()))
                .cloned()
                .unwrap_or_default(),
            owner: labels.get(LABEL_OWNER).and_then(|o| Owner::new(o).ok()),
            state,
            keep: labels.get(LABEL_KEEP).is_some_and(|v| v == "true"),
            pooled: labels.get(LABEL_POOL).is_some_and(|v| v == "true"),
            creator: labels.get(LABEL_CREATOR).cloned(),
            limits: labels
                .get(LABEL_LIMITS)
                .and_then(|v| serde_json::from_str(v).ok()),
        }
    }

    /// The limits a re-attached session runs under: the recorded ones (the sandbox was
    /// built with them), with the limits the host enforces per call capped by today's
    /// ceilings, since an admin may have lowered those since. Without a record, the ceilings.
    pub fn limits_within(&self, ceilings: &Limits) -> Limits {
        let Some(recorded) = &self.limits else {
            return ceilings.clone();
        };
        let mut l = recorded.clone();
        l.max_timeout_secs = l.max_timeout_secs.min(ceilings.max_timeout_secs);
        l.output_cap_kb = l.output_cap_kb.min(ceilings.output_cap_kb);
        l.max_file_mb = l.max_file_mb.min(ceilings.max_file_mb);
        l
    }
}

/// The backend boundary for session lifecycles.
#[async_trait]
pub trait Runtime: Send + Sync {
    /// Creates and starts a hardened sandbox; on failure nothing is left behind. Returns
    /// the backend's handle for it (what `remove` takes) and the sandbox.
    async fn create(&self, spec: &SandboxSpec) -> Result<(String, Arc<dyn Sandbox>), SandboxError>;

    /// Wraps the existing sandbox of a kept session, as a listing found it.
    async fn attach(
        &self,
        found: &FoundSandbox,
        limits: &Limits,
    ) -> Result<Arc<dyn Sandbox>, SandboxError>;

    /// Every sandbox this backend manages, in any state.
    async fn list(&self) -> Result<Vec<FoundSandbox>, SandboxError>;

    /// The sandbox of one session, if any. Backends that can filter by label override this.
    async fn find(&self, session_id: &str) -> Result<Option<FoundSandbox>, SandboxError> {
        Ok(self
            .list()
            .await?
            .into_iter()
            .find(|f| f.session_id == session_id))
    }

    /// Removes a sandbox by its handle; a missing one is not an error.
    async fn remove(&self, handle: &str) -> Result<(), SandboxError>;

    /// Lowers the memory, CPU and process limits of a running sandbox to `limits` (a warm
    /// sandbox claimed by a session that asked for less). `Ok(false)`: this backend cannot,
    /// and the caller creates a fresh sandbox instead. Never raises a limit.
    async fn update_limits(&self, _handle: &str, _limits: &Limits) -> Result<bool, SandboxError> {
        Ok(false)
    }

    /// An identity of what new sandboxes are made from now (for Docker, the image id behind
    /// the tag), so the pool can replace warm sandboxes made from an older one. None: the
    /// backend does not tell.
    async fn image_revision(&self) -> Result<Option<String>, SandboxError> {
        Ok(None)
    }

    /// Bytes of memory the sandbox uses now (processes and its tmpfs files), if the backend
    /// can tell: the idle-density measurement and the memory budget read it.
    async fn memory_usage(&self, _handle: &str) -> Result<Option<u64>, SandboxError> {
        Ok(None)
    }

    /// What a readiness probe asks of the backend before it may create sandboxes: each check
    /// by name (Docker: "engine" and "image") with what is wrong, phrased for an operator,
    /// when it fails. No checks: always ready.
    async fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        Vec::new()
    }

    /// Whether the creator recorded on a sandbox is still alive, so its sandboxes are in
    /// use, not orphans. A creator is whatever the backend records: a `pid:starttime` on
    /// this host, a lease or replica id in a cluster. Only the backend knows where its
    /// creators live, and answering may take a round trip (a lease lookup), hence async.
    /// False makes a sandbox that is not kept and running an orphan the reconciler removes.
    async fn creator_alive(&self, creator: &str) -> bool;
}
