//! Replica liveness through `coordination.k8s.io/v1` Leases. Each process that makes pods
//! holds one Lease in the sandbox namespace, `sandboxd-replica-<12 hex>` (new at every start,
//! so a restarted container never inherits its predecessor's pods), with `holderIdentity`
//! `<host>/<pid>:<start>`, `leaseDurationSeconds` from `[kubernetes] lease_secs` and a
//! `renewTime` a task renews every third of the duration (a failed renewal is logged and
//! retried a second later; a Lease someone deleted is created again). Its pods record the
//! creator `lease:<name>`; shutdown deletes the Lease (best-effort, `release_lease`).
//!
//! Another process's creator is alive iff its Lease exists and `renewTime` plus the duration
//! plus `GRACE` (clock skew between nodes) is after now. A Lease that is missing was deleted
//! at shutdown or never renewed again: it counts as dead once the newest pod recorded with
//! it is older than a lease duration plus the grace (the Lease is written before the first
//! pod, and a live holder re-creates a deleted one within a third of the duration); with no
//! such pod known, alive. An API answer that cannot be read counts as alive: a live
//! replica's pods are never removed on an error. "Now" comes from an injectable clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use sha2::{Digest, Sha256};

use sandboxd_core::sandbox::runtime::meta_key;
use sandboxd_core::sandbox::{SandboxError, host};

use crate::{KubeRuntime, kube_err, meta};

/// What a pod records as its creator: this prefix and the Lease's name.
pub const CREATOR_PREFIX: &str = "lease:";
/// Added to every expiry: the clocks of the nodes replicas run on may differ this much.
pub const GRACE: Duration = Duration::from_secs(5);
/// The label every replica Lease carries (for `kubectl get leases -l sandboxd/lease=true`).
pub const LEASE_LABEL: &str = "sandboxd/lease";
/// How soon a failed renewal is retried (never later than the regular interval).
const RETRY: Duration = Duration::from_secs(1);

/// Where "now" comes from (tests move it).
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(SystemTime::now)
}

/// A fresh Lease name for this process: a DNS label, unique per start.
pub(crate) fn new_name(host: &str) -> String {
    let seed = format!(
        "{host}/{}/{:?}",
        host::creator_label(),
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH)
    );
    let digest = hex::encode(Sha256::digest(seed.as_bytes()));
    format!("sandboxd-replica-{}", &digest[..12])
}

/// Whether `name` can be a Lease's name (a DNS subdomain): what is not is never looked up.
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
}

fn expiry(from: Timestamp, secs: u64) -> Timestamp {
    let d = SignedDuration::from_secs(i64::try_from(secs).unwrap_or(i64::MAX))
        .saturating_add(SignedDuration::try_from(GRACE).unwrap_or(SignedDuration::MAX));
    from.saturating_add(d).unwrap_or(Timestamp::MAX)
}

/// The liveness rule (module header): `lease` as the API answered (None: it does not
/// exist), the newest creation time of a pod recorded with it, `now`, and the duration a
/// Lease without one (or a missing Lease) is taken to have.
pub fn alive(
    lease: Option<&Lease>,
    newest_pod: Option<Timestamp>,
    now: Timestamp,
    default_secs: u64,
) -> bool {
    let Some(lease) = lease else {
        return newest_pod.is_none_or(|t| expiry(t, default_secs) > now);
    };
    let spec = lease.spec.as_ref();
    let secs = spec
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .unwrap_or(default_secs);
    let from = spec
        .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
        .map(|t| t.0)
        .or_else(|| lease.metadata.creation_timestamp.as_ref().map(|t| t.0));
    from.is_none_or(|t| expiry(t, secs) > now)
}

/// What the renewal task needs, detached from the runtime.
#[derive(Clone)]
struct Renewer {
    api: Api<Lease>,
    name: String,
    identity: String,
    secs: u64,
    clock: Clock,
}

impl Renewer {
    fn now(&self) -> MicroTime {
        MicroTime(Timestamp::try_from((self.clock)()).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    fn lease(&self) -> Lease {
        let now = self.now();
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some([(LEASE_LABEL.to_string(), "true".to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(i32::try_from(self.secs).unwrap_or(i32::MAX)),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..LeaseSpec::default()
            }),
        }
    }

    async fn create(&self) -> Result<(), kube::Error> {
        match self.api.create(&PostParams::default(), &self.lease()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(r)) if r.code == 409 => self.renew().await,
            Err(e) => Err(e),
        }
    }

    /// One merge patch of `renewTime` (and what the holder says of itself); a Lease that is
    /// gone is created again.
    async fn renew(&self) -> Result<(), kube::Error> {
        let patch = serde_json::json!({"spec": {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.secs,
            "renewTime": self.now(),
        }});
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(r)) if r.code == 404 => self
                .api
                .create(&PostParams::default(), &self.lease())
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        }
    }

    /// Renews every third of the duration until aborted.
    async fn run(self) {
        let every = Duration::from_millis(self.secs.saturating_mul(1000) / 3);
        let mut wait = every;
        loop {
            tokio::time::sleep(wait).await;
            wait = match self.renew().await {
                Ok(()) => every,
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "could not renew this replica's Lease; retrying");
                    RETRY.min(every)
                }
            };
        }
    }
}

/// The Lease this process holds, once written, and what remembers the pods' creators.
#[derive(Default)]
pub(crate) struct LeaseState {
    held: tokio::sync::OnceCell<()>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
    /// Per creator, the newest creation time of a pod listed with it.
    newest: Mutex<HashMap<String, Timestamp>>,
}

impl KubeRuntime {
    /// The name of the Lease this process holds (or will, at its first pod).
    pub fn lease_name(&self) -> &str {
        &self.lease_name
    }

    /// The creator its pods record.
    pub(crate) fn creator(&self) -> String {
        format!("{CREATOR_PREFIX}{}", self.lease_name)
    }

    /// Decides "now" with `clock` from here on (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    fn renewer(&self) -> Renewer {
        Renewer {
            api: Api::namespaced(self.client.clone(), &self.settings.namespace),
            name: self.lease_name.clone(),
            identity: format!("{}/{}", self.host, host::creator_label()),
            secs: self.settings.lease_secs.max(1),
            clock: self.clock.clone(),
        }
    }

    /// Writes this process's Lease and starts renewing it (once; later calls return at once).
    /// A create calls it before its pod, so no pod names a Lease that was never written.
    pub async fn hold_lease(&self) -> Result<(), SandboxError> {
        self.lease
            .held
            .get_or_try_init(|| async {
                let renewer = self.renewer();
                renewer
                    .create()
                    .await
                    .map_err(|e| kube_err("create this replica's Lease", "", e))?;
                let task = tokio::spawn(renewer.run());
                *self.lease.task.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(task.abort_handle());
                tracing::info!(lease = %self.lease_name, "holding this replica's Lease");
                Ok::<(), SandboxError>(())
            })
            .await
            .map(|_| ())
    }

    /// Stops renewing and deletes the Lease (best-effort: a failure is logged, and the
    /// Lease then runs out by itself). For a graceful stop.
    pub async fn release_lease(&self) {
        let task = self
            .lease
            .task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(task) = task else { return };
        task.abort();
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        match api.delete(&self.lease_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(r)) if r.code == 404 => {}
            Err(e) => {
                tracing::warn!(lease = %self.lease_name, error = %e, "could not delete this replica's Lease; it runs out by itself")
            }
        }
    }

    /// Remembers, per creator, the newest pod listed with it (for a missing Lease).
    pub(crate) fn note_pods(&self, pods: &[Pod]) {
        let key = meta::name(meta_key::CREATOR);
        let mut newest = self.lease.newest.lock().unwrap_or_else(|e| e.into_inner());
        for p in pods {
            let creator = p.metadata.annotations.as_ref().and_then(|a| a.get(&key));
            let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            if let (Some(c), Some(t)) = (creator, created) {
                let e = newest.entry(c.clone()).or_insert(t);
                *e = (*e).max(t);
            }
        }
    }

    /// Whether the process holding the Lease `name` is alive (module header).
    pub(crate) async fn lease_alive(&self, creator: &str, name: &str) -> bool {
        if name == self.lease_name {
            return true;
        }
        let lease = if is_name(name) {
            let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.settings.namespace);
            match api.get_opt(name).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(lease = %name, error = %e, "cannot read a replica's Lease; its pods count as in use");
                    return true;
                }
            }
        } else {
            None
        };
        let newest = self
            .lease
            .newest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(creator)
            .copied();
        let now = Timestamp::try_from((self.clock)()).unwrap_or(Timestamp::MAX);
        alive(lease.as_ref(), newest, now, self.settings.lease_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn lease(renewed: Option<i64>, secs: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                renew_time: renewed.map(|s| MicroTime(at(s))),
                lease_duration_seconds: secs,
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_lease_lives_until_renew_time_plus_duration_plus_grace() {
        let l = lease(Some(0), Some(30));
        assert!(alive(Some(&l), None, at(0), 99));
        assert!(alive(Some(&l), None, at(34), 99));
        assert!(
            !alive(Some(&l), None, at(35), 99),
            "30 s + 5 s of grace is the end"
        );
        assert!(!alive(Some(&l), None, at(3600), 99));
        // Without a duration, the configured one; without any time, alive.
        let d = lease(Some(0), None);
        assert!(alive(Some(&d), None, at(14), 10) && !alive(Some(&d), None, at(15), 10));
        assert!(alive(Some(&lease(None, Some(1))), None, at(1_000_000), 10));
        // A Lease that does not exist: judged by its newest pod's age, alive with none.
        assert!(alive(None, Some(at(0)), at(34), 30));
        assert!(!alive(None, Some(at(0)), at(35), 30));
        assert!(alive(None, None, at(1_000_000), 30));
    }

    #[test]
    fn lease_names_are_dns_labels_and_hostile_ones_are_never_looked_up() {
        let n = new_name("node-1");
        assert!(is_name(&n) && n.len() <= 63, "{n}");
        assert_ne!(n, new_name("node-2"));
        for bad in ["", "../x", "A", "-a", "a-", &"a".repeat(254), "a/b", "a b"] {
            assert!(!is_name(bad), "{bad:?}");
        }
    }
}
