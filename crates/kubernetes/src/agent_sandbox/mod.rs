//! agent-sandbox mode (`[kubernetes] mode = "agent-sandbox"`, or `"auto"` where discovery
//! shows the CRDs): a session is a `SandboxClaim` of kubernetes-sigs/agent-sandbox against a
//! `SandboxWarmPool` built from a `SandboxTemplate` that sandboxd writes from its own pod spec
//! (objects.rs). Its controller keeps the pool warm and binds each claim to a Sandbox and its
//! pod (claim.rs waits for that, bounded, and deletes a claim that did not bind); from then on
//! the session is that pod, reached exactly as in pods mode (exec, files, usage, liveness
//! through `KubeRuntime`). The claims carry sandboxd's metadata, so list, find and the
//! reconciler look at claims (listing.rs); remove deletes the claim, and what it owns (its
//! Sandbox, then the pod) goes with it. sandboxd still does itself: the deny-all
//! NetworkPolicy and the probe that proves it enforced, the limits (in the template), exec,
//! Leases. The core's warm pool is off in this mode (the binary gives the manager size 0):
//! `[pool] size` is the SandboxWarmPool's replicas instead. A session with other limits or
//! another image gets a template of its own, bounded in number and deleted once no claim
//! uses it (templates.rs); a claim's pod that ends behind sandboxd's back is reported by the
//! watch (vanish.rs).

mod claim;
mod listing;
pub mod objects;
mod templates;
mod vanish;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PodSpec;
use kube::api::{Api, DynamicObject};

use sandboxd_core::config::{KubeMode, Limits};
use sandboxd_core::sandbox::runtime::{FoundSandbox, Runtime, SandboxSpec};
use sandboxd_core::sandbox::{Sandbox, SandboxError, SandboxState, Usage};

use crate::{BACKEND, KubeRuntime, kube_err, watch};
use vanish::{Binding, Bound};

/// How long a claim may take to be bound to a running pod (a cold start pulls and schedules).
const BIND_TIMEOUT: Duration = Duration::from_secs(180);
/// How many templates (each with its pool) sandboxd keeps beside the default one: one per
/// distinct set of limits and image in use (templates.rs).
pub const MAX_TEMPLATES: usize = 32;

/// What a process runs sessions as, once `[kubernetes] mode` met the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pods,
    AgentSandbox,
}

/// Whether the cluster serves all four kinds (discovery of both groups at `v1beta1`).
pub async fn crds_present(rt: &KubeRuntime) -> Result<bool, SandboxError> {
    for group in [objects::EXTENSIONS_GROUP, objects::CORE_GROUP] {
        let gv = format!("{group}/{}", objects::VERSION);
        let list = match rt.client().list_api_group_resources(&gv).await {
            Ok(l) => l,
            Err(kube::Error::Api(r)) if r.code == 404 => return Ok(false),
            Err(e) => return Err(kube_err("discover agent-sandbox's CRDs", "", e)),
        };
        let served = |plural: &str| list.resources.iter().any(|r| r.name == plural);
        let wanted = objects::KINDS.iter().filter(|(_, _, g)| *g == group);
        if !wanted.clone().all(|(_, plural, _)| served(plural)) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The mode a process runs in: `auto` asks discovery (and says what it chose, once);
/// `agent-sandbox` without the CRDs is an error that says so.
pub async fn resolve(rt: &KubeRuntime, configured: KubeMode) -> Result<Mode, SandboxError> {
    match configured {
        KubeMode::Pods => Ok(Mode::Pods),
        KubeMode::Auto => {
            let present = crds_present(rt).await?;
            if present {
                tracing::info!(
                    "[kubernetes] mode = \"auto\": agent-sandbox's CRDs are served; sessions are SandboxClaims"
                );
                Ok(Mode::AgentSandbox)
            } else {
                tracing::info!(
                    "[kubernetes] mode = \"auto\": no agent-sandbox CRDs on this cluster; sessions are plain pods"
                );
                Ok(Mode::Pods)
            }
        }
        KubeMode::AgentSandbox => {
            if crds_present(rt).await? {
                Ok(Mode::AgentSandbox)
            } else {
                Err(missing_crds())
            }
        }
    }
}

/// The runtime sessions are made on for `[kubernetes] mode` (`resolve`): `rt` itself in pods
/// mode; in agent-sandbox mode the claims' runtime over it, also returned as itself (the
/// binary writes its template at start). `limits` are the `[limits]` ceilings, `pool_size`
/// `[pool] size`.
pub async fn session_runtime(
    rt: KubeRuntime,
    configured: KubeMode,
    limits: Limits,
    pool_size: usize,
) -> Result<(Arc<dyn Runtime>, Option<AgentSandboxRuntime>), SandboxError> {
    match resolve(&rt, configured).await? {
        Mode::Pods => Ok((Arc::new(rt), None)),
        Mode::AgentSandbox => {
            let claims = AgentSandboxRuntime::new(rt, limits, pool_size);
            Ok((Arc::new(claims.clone()), Some(claims)))
        }
    }
}

/// The refusal of `mode = "agent-sandbox"` on a cluster without the CRDs.
pub fn missing_crds() -> SandboxError {
    SandboxError::Backend {
        backend: BACKEND,
        operation: "start in agent-sandbox mode".into(),
        message: format!(
            "[kubernetes] mode = \"agent-sandbox\" but the cluster does not serve agent-sandbox's CRDs \
             (SandboxTemplate, SandboxWarmPool, SandboxClaim in {}/{v}, Sandbox in {}/{v}): install \
             kubernetes-sigs/agent-sandbox (its CRDs and controller), or set mode = \"pods\" or \"auto\"",
            objects::EXTENSIONS_GROUP,
            objects::CORE_GROUP,
            v = objects::VERSION
        ),
    }
}

/// Sessions as SandboxClaims; everything about the bound pod is `KubeRuntime`'s.
#[derive(Clone)]
pub struct AgentSandboxRuntime {
    inner: KubeRuntime,
    /// The `[limits]` ceilings: the default template's (what the warm pool holds).
    limits: Limits,
    /// `[pool] size`: the default SandboxWarmPool's replicas.
    pool_size: usize,
    bind_timeout: Duration,
    /// The default template (and its pool) once this process has written it.
    written: Arc<Mutex<BTreeSet<String>>>,
    /// The most templates beside the default one (`MAX_TEMPLATES`).
    max_templates: usize,
    /// Templates a create of this process is about to claim from, with how many creates:
    /// not deleted meanwhile although no claim names them yet.
    claiming: Arc<Mutex<BTreeMap<String, usize>>>,
    /// Held across the check of the cap and the write of a new template (templates.rs).
    cap: Arc<tokio::sync::Mutex<()>>,
    /// Templates admitted under the cap whose claim does not exist yet (templates.rs).
    admitted: Arc<Mutex<BTreeSet<String>>>,
    /// The pods of this process's claims, for the vanish watch (vanish.rs).
    bound: Bound,
    /// The watch of the claims' pods; its own removals.
    watch: Arc<watch::Watch>,
}

impl AgentSandboxRuntime {
    pub fn new(inner: KubeRuntime, limits: Limits, pool_size: usize) -> Self {
        Self {
            inner,
            limits,
            pool_size,
            bind_timeout: BIND_TIMEOUT,
            written: Arc::default(),
            max_templates: MAX_TEMPLATES,
            claiming: Arc::default(),
            cap: Arc::default(),
            admitted: Arc::default(),
            bound: Bound::default(),
            watch: Arc::default(),
        }
    }

    /// The most templates beside the default one (default `MAX_TEMPLATES`).
    pub fn with_max_templates(mut self, most: usize) -> Self {
        self.max_templates = most;
        self
    }

    /// How long a claim may take to bind (default 180 s).
    pub fn with_bind_timeout(mut self, after: Duration) -> Self {
        self.bind_timeout = after;
        self
    }

    /// The pods-mode runtime underneath (Leases, the probe).
    pub fn pods(&self) -> &KubeRuntime {
        &self.inner
    }

    fn api(&self, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.inner.client().clone(),
            &self.inner.settings().namespace,
            &objects::resource(kind),
        )
    }

    /// The default template's pod spec: the ceilings and the configured image.
    fn default_pod(&self) -> PodSpec {
        objects::pod_spec(self.inner.settings(), &self.limits, None)
    }

    /// Writes the default SandboxTemplate and its SandboxWarmPool of `[pool] size` (create or
    /// update): what a start does, before any session. The deny-all NetworkPolicy first: the
    /// pool's pods start at once, and none may run unselected.
    pub async fn write_defaults(&self) -> Result<(), SandboxError> {
        self.inner.ensure_policy().await?;
        self.ensure_template(&self.default_pod()).await.map(|_| ())
    }
}

/// A handle is `<claim>/<pod>` (the pod empty while unbound): remove needs the claim, exec
/// and usage the pod, and neither name can hold a `/`.
pub(crate) fn split(handle: &str) -> (&str, &str) {
    handle.split_once('/').unwrap_or((handle, ""))
}

#[async_trait]
impl Runtime for AgentSandboxRuntime {
    async fn create(&self, spec: &SandboxSpec) -> Result<(String, Arc<dyn Sandbox>), SandboxError> {
        self.inner.ensure_policy().await?;
        self.inner.ensure_isolated().await?;
        self.inner.hold_lease().await?;
        let (claim, pod, uid) = self.claim(spec).await?;
        let handle = format!("{claim}/{pod}");
        // A new pod under a handle this runtime removed before (a resumed session's cold
        // pod is named after its claim): its end is news again.
        self.watch.own.unmark(&handle);
        self.bound.insert(
            &pod,
            Binding {
                handle: handle.clone(),
                session: spec.session_id.clone(),
                uid,
            },
        );
        let sandbox = self
            .inner
            .sandbox(pod.clone(), &spec.session_id, &spec.limits);
        Ok((handle, Arc::new(sandbox)))
    }

    async fn attach(
        &self,
        found: &FoundSandbox,
        limits: &Limits,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        let (_, pod) = split(&found.handle);
        if found.state != SandboxState::Running || pod.is_empty() {
            return Err(SandboxError::SandboxGone {
                session: found.session_id.clone(),
                message: format!("its claim's pod is {}", found.state),
            });
        }
        // The pod is checked as a create checks it: never a pod that is not its Sandbox's.
        let uid = self.checked_pod(&found.handle, &found.session_id).await?;
        self.bound.insert(
            pod,
            Binding {
                handle: found.handle.clone(),
                session: found.session_id.clone(),
                uid,
            },
        );
        Ok(Arc::new(self.inner.sandbox(
            pod.to_string(),
            &found.session_id,
            limits,
        )))
    }

    async fn list(&self) -> Result<Vec<FoundSandbox>, SandboxError> {
        self.list_claims(None).await
    }

    async fn find(&self, session_id: &str) -> Result<Option<FoundSandbox>, SandboxError> {
        let found = self.list_claims(Some(session_id)).await?;
        Ok(found.into_iter().find(|f| f.session_id == session_id))
    }

    async fn remove(&self, handle: &str) -> Result<(), SandboxError> {
        self.remove_claim(handle).await
    }

    fn vanished(
        &self,
    ) -> tokio::sync::broadcast::Receiver<sandboxd_core::sandbox::vanished::Vanished> {
        self.watch
            .subscribe(self.inner.pods(), self.bound.resolver())
    }

    async fn memory_usage(&self, handle: &str) -> Result<Option<u64>, SandboxError> {
        self.inner.read_memory(split(handle).1).await
    }

    async fn cpu_usage_usec(&self, handle: &str) -> Result<Option<u64>, SandboxError> {
        self.inner.read_cpu(split(handle).1).await
    }

    async fn usage(&self, handle: &str) -> Result<Usage, SandboxError> {
        self.inner.read_usage(split(handle).1).await
    }

    /// Pods mode's checks, and the default template and warm pool written.
    async fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        let mut checks = self.inner.readiness().await;
        let written = self.write_defaults().await.map_err(|e| e.to_string());
        checks.push(("agent-sandbox template and warm pool", written));
        checks
    }

    async fn creator_alive(&self, creator: &str) -> bool {
        self.inner.creator_alive(creator).await
    }
}
