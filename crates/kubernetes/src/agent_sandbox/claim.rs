//! A session's claim: the template and pool its pod spec needs written (templates.rs), the
//! `SandboxClaim` created, and a bounded wait until agent-sandbox's controller has bound it
//! (the claim's status names a Sandbox, the Sandbox its pod, the pod runs, and it is the
//! Sandbox's own pod, labelled by sandboxd's template). A claim that does not bind in time,
//! whose pod is not its Sandbox's, whose pod fails, or whose create is dropped half-way is
//! deleted again (`ClaimGuard`), so a failed create leaves nothing behind.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};

use sandboxd_core::sandbox::SandboxError;
use sandboxd_core::sandbox::runtime::SandboxSpec;

use super::{AgentSandboxRuntime, objects};
use crate::state::start_failure;
use crate::{BACKEND, exec, kube_err};

/// Deletes its claim unless disarmed: on a failed bind (awaited, `delete_now`) and when the
/// create is dropped before it finished (spawned from `Drop`).
struct ClaimGuard {
    api: Api<DynamicObject>,
    name: String,
    armed: bool,
}

impl ClaimGuard {
    async fn delete_now(mut self) {
        self.armed = false;
        delete_claim(&self.api, &self.name).await;
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (api, name) = (self.api.clone(), std::mem::take(&mut self.name));
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { delete_claim(&api, &name).await });
        }
    }
}

async fn delete_claim(api: &Api<DynamicObject>, name: &str) {
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(r)) if r.code == 404 => {}
        Err(e) => {
            tracing::warn!(claim = %name, error = %e, "could not delete a SandboxClaim that did not bind; the reconciler removes it")
        }
    }
}

impl AgentSandboxRuntime {
    /// Creates the session's claim and waits until it is bound to a running pod of its own:
    /// the claim's name, the pod's and its uid. On any failure the claim is deleted again.
    pub(super) async fn claim(
        &self,
        spec: &SandboxSpec,
    ) -> Result<(String, String, Option<String>), SandboxError> {
        let pod = objects::pod_spec(self.inner.settings(), &spec.limits, spec.image.as_deref());
        // Not swept until the claim names it (templates.rs).
        let _claiming = self.claiming(&pod);
        let pool = self.ensure_template(&pod).await?;
        let ns = &self.inner.settings().namespace;
        let claim = objects::claim(ns, spec, &self.inner.creator(), &pool);
        let name = claim.metadata.name.clone().unwrap_or_default();
        let api = self.api("SandboxClaim");
        api.create(&PostParams::default(), &claim)
            .await
            .map_err(|e| kube_err("create the SandboxClaim", &spec.session_id, e))?;
        let guard = ClaimGuard {
            api,
            name: name.clone(),
            armed: true,
        };
        match self.wait_bound(&name, &pod, &pool, &spec.session_id).await {
            Ok(p) => {
                let mut guard = guard;
                guard.armed = false;
                let uid = p.metadata.uid.filter(|u| !u.is_empty());
                Ok((name, p.metadata.name.unwrap_or_default(), uid))
            }
            Err(e) => {
                guard.delete_now().await;
                Err(e)
            }
        }
    }

    /// The pod a claim is bound to, once it runs (module header). A pool that went meanwhile
    /// (another replica swept it before this claim named it) is written again.
    async fn wait_bound(
        &self,
        name: &str,
        spec: &PodSpec,
        pool: &str,
        session: &str,
    ) -> Result<Pod, SandboxError> {
        let op = "bind the SandboxClaim";
        let (claims, sandboxes) = (self.api("SandboxClaim"), self.api("Sandbox"));
        let pods: Api<Pod> = Api::namespaced(
            self.inner.client().clone(),
            &self.inner.settings().namespace,
        );
        let deadline = tokio::time::Instant::now() + self.bind_timeout;
        let mut round = 0u64;
        loop {
            round += 1;
            let Some(claim) = claims
                .get_opt(name)
                .await
                .map_err(|e| kube_err(op, session, e))?
            else {
                return Err(SandboxError::SandboxGone {
                    session: session.into(),
                    message: "its SandboxClaim was deleted while it was being bound".into(),
                });
            };
            if let Some(pod) = self.bound_pod(&claim, &sandboxes, &pods, session).await? {
                return Ok(pod);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(SandboxError::Timeout {
                    what: format!(
                        "the SandboxClaim {name} to be bound to a running pod by agent-sandbox's controller \
                         (is its controller running, and can the pool {pool} start sandboxes? the claim says: {})",
                        objects::ready_condition(&claim)
                    ),
                    after: self.bind_timeout,
                });
            }
            if round.is_multiple_of(10) && objects::bound_sandbox(&claim).is_none() {
                self.rewrite_if_swept(pool, spec).await?;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Writes the template and its pool again if either is gone (a sweep deletes the pool
    /// first, so one cut short leaves the template alone).
    async fn rewrite_if_swept(&self, pool: &str, spec: &PodSpec) -> Result<(), SandboxError> {
        for kind in ["SandboxTemplate", "SandboxWarmPool"] {
            let have = self.api(kind).get_opt(pool).await;
            if have
                .map_err(|e| kube_err(&format!("read the {kind}"), "", e))?
                .is_none()
            {
                tracing::info!(template = %pool, kind, "the claim's template or pool was deleted meanwhile; writing it again");
                // Writes only what is missing or differs (templates.rs `write`).
                return self.write_template(pool, spec).await;
            }
        }
        Ok(())
    }

    /// The claim's pod when it runs; None while not yet; an error when it failed to start,
    /// or when it is not one the claim's Sandbox owns and sandboxd's template made
    /// (`objects::pod_belongs`): a session never runs in a pod it was not given.
    async fn bound_pod(
        &self,
        claim: &DynamicObject,
        sandboxes: &Api<DynamicObject>,
        pods: &Api<Pod>,
        session: &str,
    ) -> Result<Option<Pod>, SandboxError> {
        let op = "bind the SandboxClaim";
        let Some(sandbox) = objects::bound_sandbox(claim) else {
            return Ok(None);
        };
        let Some(sandbox) = sandboxes
            .get_opt(&sandbox)
            .await
            .map_err(|e| kube_err(op, session, e))?
        else {
            return Ok(None);
        };
        let Some(pod) = objects::pod_of(&sandbox) else {
            return Ok(None);
        };
        let Some(p) = pods
            .get_opt(&pod)
            .await
            .map_err(|e| kube_err(op, session, e))?
        else {
            return Ok(None);
        };
        if let Err(why) = objects::pod_belongs(&p, &sandbox) {
            return Err(SandboxError::Backend {
                backend: BACKEND,
                operation: "use the claim's pod".into(),
                message: format!(
                    "the SandboxClaim {} is bound to the pod {pod}, which {why}; the claim is deleted \
                     (is something other than agent-sandbox's controller writing Sandboxes in this namespace?)",
                    claim.metadata.name.as_deref().unwrap_or_default()
                ),
            });
        }
        if exec::running(&p) {
            return Ok(Some(p));
        }
        match start_failure(&p) {
            Some(why) => Err(SandboxError::Backend {
                backend: BACKEND,
                operation: "start the claim's pod".into(),
                message: why,
            }),
            None => Ok(None),
        }
    }
}
