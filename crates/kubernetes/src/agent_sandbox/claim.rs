//! A session's claim: the template and pool its pod spec needs written (create or update,
//! once per process), the `SandboxClaim` created, and a bounded wait until agent-sandbox's
//! controller has bound it (the claim's status names a Sandbox, the Sandbox its pod, the pod
//! runs). A claim that does not bind in time, whose pod fails, or whose create is dropped
//! half-way is deleted again (`ClaimGuard`), so a failed create leaves nothing behind.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::Value;

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

/// Whether every field `want` sets has that value in `have` (what the API server added,
/// defaults and status, is not a difference).
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| contains(hv, v))),
        _ => have == want,
    }
}

impl AgentSandboxRuntime {
    /// Creates `obj`, or updates it where its spec differs from ours.
    async fn write(&self, kind: &str, obj: DynamicObject) -> Result<(), SandboxError> {
        let op = format!("write the {kind}");
        let api = self.api(kind);
        let name = obj.metadata.name.clone().unwrap_or_default();
        match api.get_opt(&name).await.map_err(|e| kube_err(&op, "", e))? {
            None => match api.create(&PostParams::default(), &obj).await {
                Ok(_) => Ok(()),
                // Another replica wrote it this moment, from the same settings.
                Err(kube::Error::Api(r)) if r.code == 409 => Ok(()),
                Err(e) => Err(kube_err(&op, "", e)),
            },
            Some(have) if contains(&have.data["spec"], &obj.data["spec"]) => Ok(()),
            Some(have) => {
                let mut next = obj;
                next.metadata.resource_version = have.metadata.resource_version;
                api.replace(&name, &PostParams::default(), &next)
                    .await
                    .map(|_| ())
                    .map_err(|e| kube_err(&op, "", e))
            }
        }
    }

    /// The template and pool for a pod spec, written once per process: the default one
    /// (`sandboxd`, warm with `[pool] size`), or one of its own with no warm sandboxes.
    pub(super) async fn ensure_template(
        &self,
        pod: &k8s_openapi::api::core::v1::PodSpec,
    ) -> Result<String, SandboxError> {
        self.inner.ensure_policy().await?;
        let name = objects::template_name(pod, &self.default_pod());
        let done = |w: &std::collections::BTreeSet<String>| w.contains(&name);
        if done(&self.written.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(name);
        }
        let ns = &self.inner.settings().namespace;
        let replicas = if name == objects::DEFAULT_POOL {
            self.pool_size
        } else {
            0
        };
        self.write("SandboxTemplate", objects::template(&name, ns, pod))
            .await?;
        self.write("SandboxWarmPool", objects::warm_pool(&name, ns, replicas))
            .await?;
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.clone());
        Ok(name)
    }

    /// Creates the session's claim and waits until it is bound to a running pod: the claim's
    /// name and the pod's. On any failure the claim is deleted again.
    pub(super) async fn claim(&self, spec: &SandboxSpec) -> Result<(String, String), SandboxError> {
        let pod = objects::pod_spec(self.inner.settings(), &spec.limits, spec.image.as_deref());
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
        match self.wait_bound(&name, &pool, &spec.session_id).await {
            Ok(pod) => {
                let mut guard = guard;
                guard.armed = false;
                Ok((name, pod))
            }
            Err(e) => {
                guard.delete_now().await;
                Err(e)
            }
        }
    }

    /// The pod a claim is bound to, once it runs (module header).
    async fn wait_bound(
        &self,
        name: &str,
        pool: &str,
        session: &str,
    ) -> Result<String, SandboxError> {
        let op = "bind the SandboxClaim";
        let (claims, sandboxes) = (self.api("SandboxClaim"), self.api("Sandbox"));
        let pods: Api<Pod> = Api::namespaced(
            self.inner.client().clone(),
            &self.inner.settings().namespace,
        );
        let deadline = tokio::time::Instant::now() + self.bind_timeout;
        loop {
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
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The claim's pod when it runs; None while not yet; an error when it failed to start.
    async fn bound_pod(
        &self,
        claim: &DynamicObject,
        sandboxes: &Api<DynamicObject>,
        pods: &Api<Pod>,
        session: &str,
    ) -> Result<Option<String>, SandboxError> {
        let op = "bind the SandboxClaim";
        let Some(sandbox) = objects::bound_sandbox(claim) else {
            return Ok(None);
        };
        let sandbox = sandboxes
            .get_opt(&sandbox)
            .await
            .map_err(|e| kube_err(op, session, e))?;
        let Some(pod) = sandbox.as_ref().and_then(objects::pod_of) else {
            return Ok(None);
        };
        match pods
            .get_opt(&pod)
            .await
            .map_err(|e| kube_err(op, session, e))?
        {
            Some(p) if exec::running(&p) => Ok(Some(pod)),
            Some(p) => match start_failure(&p) {
                Some(why) => Err(SandboxError::Backend {
                    backend: BACKEND,
                    operation: "start the claim's pod".into(),
                    message: why,
                }),
                None => Ok(None),
            },
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::contains;

    #[test]
    fn what_the_server_added_is_no_difference() {
        let want = json!({"replicas": 2, "sandboxTemplateRef": {"name": "sandboxd"}});
        let have = json!({"replicas": 2, "sandboxTemplateRef": {"name": "sandboxd"},
                          "updateStrategy": {"type": "OnReplenish"}});
        assert!(contains(&have, &want));
        assert!(!contains(
            &json!({"replicas": 3, "sandboxTemplateRef": {"name": "sandboxd"}}),
            &want
        ));
        assert!(!contains(&json!({"replicas": 2}), &want));
    }
}
