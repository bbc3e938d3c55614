//! The Kubernetes backend: one hardened pod per session in a configured namespace
//! (spec.rs), reached only through the pod's exec subresource over a WebSocket (exec.rs,
//! channel.rs), with sandboxd's `SandboxMeta` as labels and annotations (meta.rs), behind
//! the same `Runtime` seam as Docker. This crate is the only one that imports kube and
//! k8s-openapi. The deny-all NetworkPolicy is created before the first pod and checked by
//! the readiness probe; whether the cluster's network plugin enforces it is not proven here
//! (see README, "On Kubernetes": what was and was not tested).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, Config};
use tokio::sync::OnceCell;

use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::runtime::{FoundSandbox, Runtime, SandboxSpec};
use sandboxd_core::sandbox::{Sandbox, SandboxError, SandboxState, host};

mod channel;
mod exec;
pub mod meta;
pub mod spec;

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
    /// This host's name: creators are recorded as `<host>/<pid>:<start>`.
    host: String,
    policy: Arc<OnceCell<()>>,
}

/// The client for the cluster `KUBECONFIG` names (or `~/.kube/config`), else the in-cluster
/// service account.
pub async fn connect() -> Result<Client, SandboxError> {
    install_tls_provider();
    let config = Config::infer()
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    Client::try_from(config).map_err(|e| unavailable(e.to_string()))
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
            host,
            policy: Arc::new(OnceCell::new()),
        }
    }

    pub fn settings(&self) -> &PodSettings {
        &self.settings
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    fn creator(&self) -> String {
        format!("{}/{}", self.host, host::creator_label())
    }

    /// Creates the deny-all NetworkPolicy unless it exists (once per process).
    async fn ensure_policy(&self) -> Result<(), SandboxError> {
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

    fn sandbox(&self, pod: String, session_id: &str, limits: &Limits) -> KubeSandbox {
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

/// Why a starting pod will not run, when it says so (the image cannot be pulled, the pod
/// failed, its container ended).
fn start_failure(pod: &Pod) -> Option<String> {
    if exec::stopped(pod) {
        return Some(exec::stop_reason(pod).unwrap_or_else(|| "the pod stopped".into()));
    }
    let waiting = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| c.state.as_ref()?.waiting.clone())?;
    let reason = waiting.reason.unwrap_or_default();
    let fatal = [
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    ];
    fatal.contains(&reason.as_str()).then(|| {
        let message: String = waiting
            .message
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_control())
            .take(300)
            .collect();
        format!("{reason}: {message} (is the sandbox image pushed to the cluster's registry? [kubernetes] image)")
    })
}

/// A pod's state in the seam's words.
fn state_of(pod: &Pod) -> SandboxState {
    if pod.metadata.deletion_timestamp.is_some() {
        return SandboxState::Removing;
    }
    if exec::stopped(pod) {
        return SandboxState::Stopped;
    }
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Running") => SandboxState::Running,
        _ => SandboxState::Starting,
    }
}

#[async_trait]
impl Runtime for KubeRuntime {
    async fn create(&self, spec: &SandboxSpec) -> Result<(String, Arc<dyn Sandbox>), SandboxError> {
        self.ensure_policy().await?;
        let pod = spec::pod(&self.settings, spec, &self.creator());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let op = "create the session pod";
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| kube_err(op, &spec.session_id, e))?;
        if let Err(e) = self.wait_running(&name, &spec.session_id).await {
            let _ = self.remove(&name).await;
            return Err(e);
        }
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

    async fn list(&self) -> Result<Vec<FoundSandbox>, SandboxError> {
        self.list_selected(None).await
    }

    async fn find(&self, session_id: &str) -> Result<Option<FoundSandbox>, SandboxError> {
        let found = self.list_selected(Some(session_id)).await?;
        Ok(found.into_iter().find(|f| f.session_id == session_id))
    }

    /// Deletes the pod at once (no grace: nothing in it is worth a clean shutdown) and
    /// waits until the API no longer has it, so a find right after finds nothing.
    async fn remove(&self, handle: &str) -> Result<(), SandboxError> {
        let op = "remove the session pod";
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        match self.pods().delete(handle, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(r)) if r.code == 404 => return Ok(()),
            Err(e) => return Err(kube_err(op, handle, e)),
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

    /// The API server answers in the namespace, and the deny-all NetworkPolicy is there
    /// (created if missing). That the network plugin enforces it is not checked yet.
    async fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        let cluster = self
            .pods()
            .list(&ListParams::default().limit(1))
            .await
            .map(|_| ())
            .map_err(|e| kube_err("list pods", "", e).to_string());
        let policy = self.ensure_policy().await.map_err(|e| e.to_string());
        vec![("cluster", cluster), ("network policy", policy)]
    }

    /// A creator is `<host>/<pid>:<start>`: a process of this host is checked; another
    /// host's is taken as alive, so no replica ever removes another's pods (a replica's
    /// Lease, which would let a dead one's pods go, is not implemented yet).
    async fn creator_alive(&self, creator: &str) -> bool {
        match creator.split_once('/') {
            Some((h, label)) if h == self.host => host::creator_alive(label),
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_of_pods() {
        let pod = |status: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": status}))
                .unwrap()
        };
        assert_eq!(
            state_of(&pod(serde_json::json!({"phase": "Pending"}))),
            SandboxState::Starting
        );
        assert_eq!(
            state_of(&pod(serde_json::json!({"phase": "Running"}))),
            SandboxState::Running
        );
        assert_eq!(
            state_of(&pod(serde_json::json!({"phase": "Failed"}))),
            SandboxState::Stopped
        );
        let pulling = pod(
            serde_json::json!({"phase": "Pending", "containerStatuses": [{
            "name": "sandbox", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}]}),
        );
        assert!(
            start_failure(&pulling)
                .unwrap()
                .contains("ImagePullBackOff")
        );
    }
}
