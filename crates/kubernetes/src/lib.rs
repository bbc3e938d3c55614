//! The Kubernetes backend: one hardened pod per session in a configured namespace
//! (spec.rs), reached only through the pod's exec subresource over a WebSocket (exec.rs,
//! channel.rs), with sandboxd's `SandboxMeta` as labels and annotations (meta.rs), behind
//! the same `Runtime` seam as Docker. This crate is the only one that imports kube and
//! k8s-openapi. The deny-all NetworkPolicy is created before the first pod, and a probe pod
//! proves the network plugin enforces it before the first session starts (probe.rs);
//! `doctor` checks the rest of what a cluster must have (doctor.rs). Each process holds a
//! Lease that its pods name as their creator, so any replica's reconciler removes the pods
//! of a replica that is gone and never a live one's (lease.rs). In agent-sandbox mode a
//! session is a SandboxClaim whose bound pod is then used as here (agent_sandbox/).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tokio::sync::{Mutex, OnceCell};

use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::runtime::{FoundSandbox, Runtime, SandboxSpec};
use sandboxd_core::sandbox::{Owner, Sandbox, SandboxError, SandboxState, Usage, host};

use state::{start_failure, state_of};

pub mod agent_sandbox;
mod calls;
mod channel;
pub mod doctor;
mod exec;
pub mod lease;
pub mod meta;
pub mod probe;
pub mod spec;
mod state;
mod usage;
mod watch;

pub use agent_sandbox::AgentSandboxRuntime;
pub use calls::{ApiCalls, connect_to};
pub use exec::{KubeExec, KubeSandbox};
pub use spec::PodSettings;

/// How the backend names itself in errors.
pub(crate) const BACKEND: &str = "Kubernetes";
const CLUSTER: &str = "the Kubernetes API server";
const CLUSTER_FIX: &str =
    "point KUBECONFIG at the cluster (or run serve in it with its service account), then retry";
/// How long a new pod may take to run (image pull, scheduling) before create gives up.
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// How long remove waits for a deleted pod to be gone from the API.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(60);

/// Sessions as pods of one namespace.
#[derive(Clone)]
pub struct KubeRuntime {
    client: Client,
    settings: PodSettings,
    /// This host's name: a Lease's holder is `<host>/<pid>:<start>` (and creators were,
    /// before Leases).
    host: String,
    /// The Lease this process holds; its pods' creator is `lease:<name>` (lease.rs).
    lease_name: String,
    lease: Arc<lease::LeaseState>,
    clock: lease::Clock,
    policy: Arc<OnceCell<()>>,
    /// The network probe's verdict once it had one: the leaks it found, if any (probe.rs).
    isolation: Arc<Mutex<Option<probe::Isolation>>>,
    /// Pods that end outside sandboxd, from a watch (watch.rs).
    watch: Arc<watch::Watch>,
}

/// The client for the cluster `KUBECONFIG` names (or `~/.kube/config`), else the in-cluster
/// service account.
pub async fn connect() -> Result<Client, SandboxError> {
    connect_to(None, None).await
}

/// kube's rustls wants a process-wide provider and the workspace links two (ring and
/// aws-lc-rs), so none is chosen by itself: call this before making a `kube::Client`.
/// Installing one that is already installed is refused, and harmless.
pub fn install_tls_provider() {
    let _ =
        rustls::crypto::CryptoProvider::install_default(rustls::crypto::ring::default_provider());
}

fn unavailable(message: String) -> SandboxError {
    SandboxError::BackendUnavailable {
        backend: CLUSTER,
        message,
        fix: CLUSTER_FIX,
    }
}

/// Sorts a kube error into gone-pod, unreachable-cluster or a plain refusal.
pub(crate) fn kube_err(operation: &str, session: &str, e: kube::Error) -> SandboxError {
    match e {
        kube::Error::Api(r) if r.code == 404 => SandboxError::SandboxGone {
            session: session.into(),
            message: r.message,
        },
        kube::Error::Api(r) => SandboxError::Backend {
            backend: BACKEND,
            operation: operation.into(),
            message: format!("{} ({})", r.message, r.code),
        },
        e @ (kube::Error::HyperError(_) | kube::Error::Service(_)) => unavailable(e.to_string()),
        other => SandboxError::Backend {
            backend: BACKEND,
            operation: operation.into(),
            message: other.to_string(),
        },
    }
}

impl KubeRuntime {
    pub fn new(client: Client, settings: PodSettings) -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        Self {
            client,
            settings,
            lease_name: lease::new_name(&host),
            lease: Arc::default(),
            clock: lease::system_clock(),
            host,
            policy: Arc::new(OnceCell::new()),
            isolation: Arc::default(),
            watch: Arc::default(),
        }
    }

    pub fn settings(&self) -> &PodSettings {
        &self.settings
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Creates the deny-all NetworkPolicy unless it exists (once per process).
    pub(crate) async fn ensure_policy(&self) -> Result<(), SandboxError> {
        self.policy
            .get_or_try_init(|| async {
                let api: Api<NetworkPolicy> =
                    Api::namespaced(self.client.clone(), &self.settings.namespace);
                let want = spec::network_policy(&self.settings.namespace);
                let op = "create the deny-all NetworkPolicy";
                match api.get_opt(spec::NETWORK_POLICY).await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => match api.create(&PostParams::default(), &want).await {
                        Ok(_) => Ok(()),
                        Err(kube::Error::Api(r)) if r.code == 409 => Ok(()),
                        Err(e) => Err(kube_err(op, "", e)),
                    },
                    Err(e) => Err(kube_err(op, "", e)),
                }
            })
            .await
            .map(|_| ())
    }

    pub(crate) fn sandbox(&self, pod: String, session_id: &str, limits: &Limits) -> KubeSandbox {
        let exec = KubeExec {
            client: self.client.clone(),
            namespace: self.settings.namespace.clone(),
            pod,
            session_id: session_id.to_string(),
        };
        KubeSandbox::new(exec, session_id.to_string(), limits.clone())
    }

    /// Polls the pod until it runs; a pod that fails, or cannot pull its image, is an error.
    async fn wait_running(&self, name: &str, session: &str) -> Result<(), SandboxError> {
        let op = "start the session pod";
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            let pod = self
                .pods()
                .get_opt(name)
                .await
                .map_err(|e| kube_err(op, session, e))?;
            let Some(pod) = pod else {
                return Err(SandboxError::SandboxGone {
                    session: session.into(),
                    message: "its pod was deleted while it started".into(),
                });
            };
            if exec::running(&pod) {
                return Ok(());
            }
            if let Some(why) = start_failure(&pod) {
                return Err(SandboxError::Backend {
                    backend: BACKEND,
                    operation: op.into(),
                    message: why,
                });
            }
            if tokio::time::Instant::now() > deadline {
                return Err(SandboxError::Timeout {
                    what: format!("the pod {name} to run"),
                    after: START_TIMEOUT,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates a pod and waits until it runs; a pod that does not run is removed again.
    /// Its name.
    pub(crate) async fn create_pod(
        &self,
        pod: &Pod,
        session: &str,
    ) -> Result<String, SandboxError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.pods()
            .create(&PostParams::default(), pod)
            .await
            .map_err(|e| kube_err("create the session pod", session, e))?;
        // A new pod under a name this runtime deleted before (a resumed session's): its end
        // is news again.
        self.watch.own.unmark(&name);
        if let Err(e) = self.wait_running(&name, session).await {
            let _ = self.remove_pod(&name).await;
            return Err(e);
        }
        Ok(name)
    }

    /// Deletes the pod at once (no grace: nothing in it is worth a clean shutdown) and
    /// waits until the API no longer has it, so a find right after finds nothing.
    pub(crate) async fn remove_pod(&self, handle: &str) -> Result<(), SandboxError> {
        // Its end is ours, not news (watch.rs); unless the deletion is refused: then it is.
        self.watch.own.mark(handle);
        let op = "remove the session pod";
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        match self.pods().delete(handle, &dp).await {
            // Its uid too: a late event of this pod is still ours once a new pod has the name.
            Ok(deleted) => {
                if let Some(uid) = deleted.left().and_then(|pod| pod.metadata.uid) {
                    self.watch.own.mark(&watch::uid_key(&uid));
                }
            }
            Err(kube::Error::Api(r)) if r.code == 404 => return Ok(()),
            Err(e) => {
                self.watch.own.unmark(handle);
                return Err(kube_err(op, handle, e));
            }
        }
        let deadline = tokio::time::Instant::now() + REMOVE_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            match self.pods().get_opt(handle).await {
                Ok(None) => return Ok(()),
                Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => return Err(kube_err(op, handle, e)),
            }
        }
        Err(SandboxError::Timeout {
            what: format!("the pod {handle} to be deleted"),
            after: REMOVE_TIMEOUT,
        })
    }

    async fn list_selected(
        &self,
        session: Option<&str>,
    ) -> Result<Vec<FoundSandbox>, SandboxError> {
        let lp = ListParams::default().labels(&meta::selector(session));
        let pods = self
            .pods()
            .list(&lp)
            .await
            .map_err(|e| kube_err("list the session pods", "", e))?;
        self.note_pods(&pods.items);
        Ok(pods
            .items
            .into_iter()
            .map(|p| {
                let m = meta::decode(
                    p.metadata.labels.as_ref().unwrap_or(&Default::default()),
                    p.metadata
                        .annotations
                        .as_ref()
                        .unwrap_or(&Default::default()),
                );
                let name = p.metadata.name.clone().unwrap_or_default();
                FoundSandbox::new(name, state_of(&p), m)
            })
            .collect())
    }
}

#[async_trait]
impl Runtime for KubeRuntime {
    async fn create(&self, spec: &SandboxSpec) -> Result<(String, Arc<dyn Sandbox>), SandboxError> {
        self.ensure_policy().await?;
        self.ensure_isolated().await?;
        self.hold_lease().await?;
        let pod = spec::pod(&self.settings, spec, &self.creator());
        let name = self.create_pod(&pod, &spec.session_id).await?;
        let sandbox = self.sandbox(name.clone(), &spec.session_id, &spec.limits);
        Ok((name, Arc::new(sandbox)))
    }

    async fn attach(
        &self,
        found: &FoundSandbox,
        limits: &Limits,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        if found.state != SandboxState::Running {
            return Err(SandboxError::SandboxGone {
                session: found.session_id.clone(),
                message: format!("its pod is {}", found.state),
            });
        }
        Ok(Arc::new(self.sandbox(
            found.handle.clone(),
            &found.session_id,
            limits,
        )))
    }

    /// One merge patch: the label `sandboxd/claimed=true` (what a selector for free warm
    /// pods excludes) and the annotation `sandboxd/claimed-by` with the owner.
    async fn mark_claimed(&self, handle: &str, owner: &Owner) -> Result<(), SandboxError> {
        let patch = serde_json::json!({"metadata": {
            "labels": {meta::CLAIMED: "true"},
            "annotations": {meta::CLAIMED_BY: owner.to_string()},
        }});
        self.pods()
            .patch(handle, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| kube_err("mark a warm pod claimed", handle, e))
    }

    /// Read in the pod through exec (usage.rs): no metrics API needed.
    async fn memory_usage(&self, handle: &str) -> Result<Option<u64>, SandboxError> {
        self.read_memory(handle).await
    }

    /// Read in the pod through exec too (usage.rs).
    async fn cpu_usage_usec(&self, handle: &str) -> Result<Option<u64>, SandboxError> {
        self.read_cpu(handle).await
    }

    /// Both in one exec (usage.rs).
    async fn usage(&self, handle: &str) -> Result<Usage, SandboxError> {
        self.read_usage(handle).await
    }

    async fn list(&self) -> Result<Vec<FoundSandbox>, SandboxError> {
        self.list_selected(None).await
    }

    async fn find(&self, session_id: &str) -> Result<Option<FoundSandbox>, SandboxError> {
        let found = self.list_selected(Some(session_id)).await?;
        Ok(found.into_iter().find(|f| f.session_id == session_id))
    }

    async fn remove(&self, handle: &str) -> Result<(), SandboxError> {
        self.remove_pod(handle).await
    }

    fn vanished(
        &self,
    ) -> tokio::sync::broadcast::Receiver<sandboxd_core::sandbox::vanished::Vanished> {
        self.watch.subscribe(self.pods(), watch::by_labels())
    }

    /// The API server answers in the namespace, the deny-all NetworkPolicy is there
    /// (created if missing), and the network probe found it enforced (probe.rs).
    async fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        let cluster = self
            .pods()
            .list(&ListParams::default().limit(1))
            .await
            .map(|_| ())
            .map_err(|e| kube_err("list pods", "", e).to_string());
        let policy = self.ensure_policy().await.map_err(|e| e.to_string());
        let isolation = self.isolation_ready().await;
        vec![
            ("cluster", cluster),
            ("network policy", policy),
            ("network isolation", isolation),
        ]
    }

    /// A creator `lease:<name>` is alive while its Lease is (lease.rs). One of before
    /// Leases, `<host>/<pid>:<start>`: a process of this host is checked; another host's is
    /// taken as alive.
    async fn creator_alive(&self, creator: &str) -> bool {
        if let Some(name) = creator.strip_prefix(lease::CREATOR_PREFIX) {
            return self.lease_alive(creator, name).await;
        }
        match creator.split_once('/') {
            Some((h, label)) if h == self.host => host::creator_alive(label),
            _ => true,
        }
    }
}
