//! The runtime seam: what the SessionManager needs from a sandbox backend, in neutral words.
//!
//! A backend (Docker today, Kubernetes pods later, a fake in tests) creates sandboxes from a
//! `SandboxSpec`, lists the ones it manages as `FoundSandbox` values, removes them, and says
//! whether the process that created one is still alive. Everything a session must remember
//! across processes (its id, owner, keep flag, creator and the limits it was created with)
//! is recorded on the sandbox itself as a `SandboxMeta`, because a kept session is found
//! again by a later process that knows nothing else about it. Each backend encodes it its
//! own way (Docker: container labels); `SandboxMeta::selectable` and `annotations` say which
//! entries fit where a backend selects on them. Nothing here is Docker's.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;

use super::{Owner, Sandbox, SandboxError};
use crate::config::Limits;

/// The names of `SandboxMeta`'s entries, short and neutral: a backend adds its own prefix
/// or namespace (Docker: `sandboxd.`, so `sandboxd.session`).
pub mod meta_key {
    /// "true" on every sandbox sandboxd manages: what a listing selects on.
    pub const MANAGED: &str = "managed";
    pub const SESSION: &str = "session";
    pub const OWNER: &str = "owner";
    pub const KEEP: &str = "keep";
    pub const CREATOR: &str = "creator";
    pub const LIMITS: &str = "limits";
    pub const POOL: &str = "pool";
    pub const REPLICA: &str = "replica";
}

/// What a sandbox records about its session, in the seam's words. The seam guarantees it is
/// written once, when the sandbox is created, and read back unchanged by every later
/// listing; it has no call to change it (Docker cannot; a backend that could must not be
/// relied on), so anything decided later (a warm sandbox's claim) lives in the records of
/// the process that decided it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxMeta {
    pub session_id: String,
    /// None for a warm-pool sandbox made before anyone owned it, or when what was read is
    /// not a valid owner (only the admin sees such a sandbox).
    pub owner: Option<Owner>,
    /// Kept sessions outlive the process that made them.
    pub keep: bool,
    /// Made ahead of time for the warm pool: it has no owner, or the pool's scope (see
    /// `SessionManager::with_scoped_pool`). Once a session claims it, the binding lives only
    /// in the records of the claiming process: an unscoped one is never re-attached by
    /// another process and dies with its creator; a scoped one is kept, and the scope's
    /// next process re-adopts it from its own records or removes it.
    pub pooled: bool,
    /// Who created it, as the backend records it (see `Runtime::creator_alive`).
    pub creator: Option<String>,
    /// The limits it was created with: memory, CPU and processes are set on the sandbox at
    /// creation, so a re-attached session must know them. None for a sandbox made before
    /// they were recorded.
    pub limits: Option<Limits>,
    /// The replica (one `serve` of several on a shared store) that made it, if any: an
    /// unclaimed warm sandbox is its replica's until that replica's lease ends, whatever
    /// host the replica runs on (a creator is a process of one host only).
    pub replica: Option<String>,
}

impl SandboxMeta {
    /// The entries a backend may put where it selects sandboxes (a Kubernetes label, a
    /// Docker label filter): `managed=true` and the session id. Every value is a valid
    /// Kubernetes label value (at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at
    /// both ends): a session id is ours, 12 hex digits.
    pub fn selectable(&self) -> Vec<(&'static str, String)> {
        vec![
            (meta_key::MANAGED, "true".to_string()),
            (meta_key::SESSION, self.session_id.clone()),
        ]
    }

    /// Every other entry, as free-form text a backend stores beside the selectable ones (a
    /// Kubernetes annotation): an owner has up to 128 characters and may hold `:` or `@`,
    /// the limits are JSON. An absent owner, and `pool` when not pooled, are left out.
    pub fn annotations(&self) -> Vec<(&'static str, String)> {
        let mut entries = vec![(meta_key::KEEP, self.keep.to_string())];
        if let Some(creator) = &self.creator {
            entries.push((meta_key::CREATOR, creator.clone()));
        }
        if let Some(limits) = &self.limits {
            entries.push((
                meta_key::LIMITS,
                serde_json::to_string(limits).unwrap_or_default(),
            ));
        }
        if let Some(owner) = &self.owner {
            entries.push((meta_key::OWNER, owner.to_string()));
        }
        if self.pooled {
            entries.push((meta_key::POOL, "true".to_string()));
        }
        if let Some(replica) = &self.replica {
            entries.push((meta_key::REPLICA, replica.clone()));
        }
        entries
    }

    /// Reads back what `selectable` and `annotations` wrote; `get` looks an entry up by its
    /// key. Anyone with access to the backend can write there, so what is not ours reads as
    /// absent: a session id that is not ours (hex) is dropped rather than printed or matched,
    /// an invalid owner is none, limits that do not parse are none.
    pub fn read<'a>(get: impl Fn(&str) -> Option<&'a str>) -> SandboxMeta {
        SandboxMeta {
            session_id: get(meta_key::SESSION)
                .filter(|id| id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric()))
                .unwrap_or_default()
                .to_string(),
            owner: get(meta_key::OWNER).and_then(|o| Owner::new(o).ok()),
            keep: get(meta_key::KEEP) == Some("true"),
            pooled: get(meta_key::POOL) == Some("true"),
            creator: get(meta_key::CREATOR).map(str::to_string),
            limits: get(meta_key::LIMITS).and_then(|v| serde_json::from_str(v).ok()),
            // Compared with the store's replica ids only, never shown raw: a bounded token.
            replica: get(meta_key::REPLICA)
                .filter(|r| {
                    r.len() <= 64
                        && r.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                })
                .map(str::to_string),
        }
    }
}

/// What a new session's sandbox is made from.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub session_id: String,
    /// None for a warm-pool sandbox, made before anyone owns it; or the pool's scope.
    pub owner: Option<Owner>,
    /// Made for the warm pool (see `SandboxMeta::pooled`).
    pub pooled: bool,
    /// Already lowered by the request and within the admin's ceilings.
    pub limits: Limits,
    /// Kept sessions outlive the process that made them (`--keep`).
    pub keep: bool,
    /// The replica making it (see `SandboxMeta::replica`).
    pub replica: Option<String>,
    /// The image to make it from, a template's (`templates::Templates`); None: the
    /// runtime's own image.
    pub image: Option<String>,
    /// A resume's: the size of the archive of /workspace that follows. A backend that can
    /// have the sandbox's main process take it on its stdin as it starts does (Docker:
    /// `ExecBackend::take_main_stdin`), so the transfer runs while the shell is started
    /// (shell_restore.rs); another ignores it, and the shell takes the archive on its own
    /// stdin. None for every other sandbox.
    pub restore_bytes: Option<u64>,
}

impl SandboxSpec {
    /// What every backend records on the sandbox; `creator` comes from the backend (see
    /// `Runtime::creator_alive`).
    pub fn meta(&self, creator: &str) -> SandboxMeta {
        SandboxMeta {
            session_id: self.session_id.clone(),
            owner: self.owner.clone(),
            keep: self.keep,
            pooled: self.pooled,
            creator: Some(creator.to_string()),
            limits: Some(self.limits.clone()),
            replica: self.replica.clone(),
        }
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

/// A sandbox's CPU time and memory now, as far as its backend tells (None: cannot tell).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Microseconds of CPU its processes used since it was made.
    pub cpu_usec: Option<u64>,
    /// Bytes of memory in use now (processes and tmpfs files, without reclaimable cache).
    pub memory_bytes: Option<u64>,
}

/// A managed sandbox as a listing found it.
#[derive(Debug, Clone)]
pub struct FoundSandbox {
    /// The backend's own name for it (a container id, a pod name): what `remove` takes.
    pub handle: String,
    pub session_id: String,
    /// None when none was recorded or it is not a valid owner: only the admin sees it.
    pub owner: Option<Owner>,
    pub state: SandboxState,
    pub keep: bool,
    /// Made for the warm pool (claimed or not, it records no owner, or the pool's scope).
    pub pooled: bool,
    /// The creator the backend recorded, checked with `Runtime::creator_alive`.
    pub creator: Option<String>,
    /// The limits it was created with; None for a sandbox made before they were recorded.
    pub limits: Option<Limits>,
    /// The replica that made it, if it recorded one (see `SandboxMeta::replica`).
    pub replica: Option<String>,
}

impl FoundSandbox {
    /// A sandbox a listing found, with what it recorded (see `SandboxMeta::read`).
    pub fn new(handle: String, state: SandboxState, meta: SandboxMeta) -> FoundSandbox {
        let SandboxMeta {
            session_id,
            owner,
            keep,
            pooled,
            creator,
            limits,
            replica,
        } = meta;
        FoundSandbox {
            handle,
            session_id,
            owner,
            state,
            keep,
            pooled,
            creator,
            limits,
            replica,
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

    /// Marks a warm sandbox as claimed by a session of `owner`, where the backend can say
    /// so in one call (Kubernetes: one patch of the pod's labels and annotations), so that
    /// what the backend shows (kubectl) tells free warm sandboxes from taken ones. Nothing
    /// reads it back as the binding: that stays in the claiming process's records (see
    /// `SandboxMeta`). An error makes the pool discard the sandbox and create one cold.
    /// Default: nothing to mark (Docker cannot change a container's labels).
    async fn mark_claimed(&self, _handle: &str, _owner: &Owner) -> Result<(), SandboxError> {
        Ok(())
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

    /// Microseconds of CPU the sandbox's processes have used since it was made (its cgroup's
    /// `cpu.stat` `usage_usec`), if the backend can tell: usage metering samples it.
    async fn cpu_usage_usec(&self, _handle: &str) -> Result<Option<u64>, SandboxError> {
        Ok(None)
    }

    /// `cpu_usage_usec` and `memory_usage` together, as a usage reading needs them (every
    /// end, hibernation and sample takes one). The default asks for each; a backend that
    /// learns both from one call (Docker's stats, one exec into a pod) answers at once.
    async fn usage(&self, handle: &str) -> Result<Usage, SandboxError> {
        let (cpu, memory) = tokio::join!(self.cpu_usage_usec(handle), self.memory_usage(handle));
        Ok(Usage {
            cpu_usec: cpu?,
            memory_bytes: memory?,
        })
    }

    /// The sandboxes that end outside sandboxd's hands from now on (deleted, evicted,
    /// OOM-killed, exited), each reported once and never one this runtime removed itself
    /// (vanished.rs); every call is a new follower. Default: a backend that cannot tell,
    /// whose receiver is closed at once (it never reports).
    fn vanished(&self) -> tokio::sync::broadcast::Receiver<super::vanished::Vanished> {
        super::vanished::never()
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            session_id: "0123456789ab".into(),
            owner: Some(Owner::new("serve:42").unwrap()),
            pooled: true,
            limits: Limits::default(),
            keep: true,
            replica: None,
            image: None,
            restore_bytes: None,
        }
    }

    /// What Kubernetes accepts as a label value.
    fn label_value_ok(v: &str) -> bool {
        let b = v.as_bytes();
        v.len() <= 63
            && (b.is_empty()
                || (b[0].is_ascii_alphanumeric()
                    && b[b.len() - 1].is_ascii_alphanumeric()
                    && b.iter()
                        .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))))
    }

    #[test]
    fn selectable_values_are_label_values_and_the_rest_reads_back() {
        let meta = spec().meta("1234:5678");
        let selectable = meta.selectable();
        for (k, v) in &selectable {
            assert!(label_value_ok(v), "{k}={v}");
        }
        // The owner and the limits are not label values: they must be annotations.
        let annotations = meta.annotations();
        assert!(annotations.iter().any(|(k, _)| *k == meta_key::OWNER));
        assert!(annotations.iter().any(|(k, _)| *k == meta_key::LIMITS));
        let all: HashMap<&str, String> = selectable.into_iter().chain(annotations).collect();
        assert_eq!(SandboxMeta::read(|k| all.get(k).map(String::as_str)), meta);
    }

    #[test]
    fn what_is_not_ours_reads_as_absent() {
        let all = HashMap::from([
            (meta_key::SESSION, "../etc"),
            (meta_key::OWNER, "bad owner"),
            (meta_key::LIMITS, "{not json"),
            (meta_key::KEEP, "yes"),
        ]);
        let meta = SandboxMeta::read(|k| all.get(k).copied());
        assert_eq!(meta, SandboxMeta::default());
    }
}
