//! The templates (and their pools) sessions are claimed from: the default one, `sandboxd`
//! (the `[limits]` ceilings and the configured image, warm with `[pool] size`), written once
//! per process; and one `sandboxd-<digest>` for each other set of limits or image a session
//! asks for, with no warm sandboxes.
//!
//! Those others are made by requests, so they are bounded: at most `max_templates` (default
//! `MAX_TEMPLATES`) in the namespace. Before a new one is written the ones no claim names are
//! deleted (`sweep`), and when the cap is still reached the create is refused with what to
//! do; the sweep also runs after a claim of such a template is removed, so a template lives
//! as long as a claim uses it. A template a create of this process is about to claim from is
//! never swept (`Claiming`); one another replica is about to claim from may be, and that
//! create writes it again while it waits for its bind (claim.rs: the template and the pool,
//! whichever is gone). Within a process the check of the cap and the write of a new template
//! are one step (`cap`, an async lock), and a template it admitted but that is not listed yet
//! counts too, so parallel creates of one replica never pass the cap; replicas each check it
//! on their own, so several replicas writing at once may pass it by one each.
//!
//! An existing object is left as it is only if its spec is ours (`spec_matches`: a template's
//! exactly), anything else is overwritten.

use std::collections::BTreeSet;

use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::Value;

use sandboxd_core::sandbox::SandboxError;

use super::{AgentSandboxRuntime, objects};
use crate::kube_err;

/// The label sandboxd's templates and pools carry (objects.rs).
const OURS: &str = "app.kubernetes.io/managed-by=sandboxd";

/// Whether `have`, a spec the API server holds, is the spec `want` sandboxd writes.
///
/// A template's spec is compared exactly, its pod template first: it is what every session
/// pod runs as, and anything more there or beside it (a sidecar, a host path, volume claim
/// templates, a NetworkPolicy) is someone else's and is overwritten. An API server defaults
/// a custom resource only from its CRD schema's `default`s, and the ones agent-sandbox's
/// v1beta1 template declares (`envVarsInjectionPolicy`, `networkPolicyManagement`) are
/// fields sandboxd sets itself, so nothing is expected to differ by defaulting; were a later
/// CRD to default another field, the cost is one update per write, never a weaker pod. A
/// pool (`extras_allowed`) carries no pod: the fields sandboxd sets are compared exactly,
/// and one it does not set is no difference (its schema's defaults, the cluster's).
fn spec_matches(have: &Value, want: &Value, extras_allowed: bool) -> bool {
    let (Value::Object(h), Value::Object(w)) = (have, want) else {
        return have == want;
    };
    if h.get("podTemplate") != w.get("podTemplate") {
        return false;
    }
    let extra = h.keys().any(|k| !w.contains_key(k));
    w.iter().all(|(k, v)| h.get(k) == Some(v)) && (extras_allowed || !extra)
}

/// Takes a template out of the sweep while a create of this process is about to claim
/// from it; dropped when the claim exists (or the create failed).
pub(super) struct Claiming {
    rt: AgentSandboxRuntime,
    name: String,
}

impl Drop for Claiming {
    fn drop(&mut self) {
        let mut c = self.rt.claiming.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = c.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                c.remove(&self.name);
                // Its claim exists now (or the create failed): the claim's count is the list's.
                self.rt.lock_admitted().remove(&self.name);
            }
        }
    }
}

fn name_of(o: &DynamicObject) -> String {
    o.metadata.name.clone().unwrap_or_default()
}

/// The pool a claim names.
pub(super) fn pool_of(claim: &DynamicObject) -> Option<String> {
    claim.data["spec"]["warmPoolRef"]["name"]
        .as_str()
        .map(str::to_string)
}

impl AgentSandboxRuntime {
    /// Creates `obj`, or updates it where its spec differs from ours (`spec_matches`).
    async fn write(&self, kind: &str, obj: DynamicObject) -> Result<(), SandboxError> {
        let op = format!("write the {kind}");
        let api = self.api(kind);
        let name = name_of(&obj);
        match api.get_opt(&name).await.map_err(|e| kube_err(&op, "", e))? {
            None => match api.create(&PostParams::default(), &obj).await {
                Ok(_) => Ok(()),
                // Another replica wrote it this moment, from the same settings.
                Err(kube::Error::Api(r)) if r.code == 409 => Ok(()),
                Err(e) => Err(kube_err(&op, "", e)),
            },
            Some(have)
                if spec_matches(
                    &have.data["spec"],
                    &obj.data["spec"],
                    kind != "SandboxTemplate",
                ) =>
            {
                Ok(())
            }
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

    /// Marks the template of `pod` as about to be claimed from (until the guard drops).
    pub(super) fn claiming(&self, pod: &k8s_openapi::api::core::v1::PodSpec) -> Claiming {
        let name = objects::template_name(pod, &self.default_pod());
        let mut c = self.claiming.lock().unwrap_or_else(|e| e.into_inner());
        *c.entry(name.clone()).or_default() += 1;
        Claiming {
            rt: self.clone(),
            name,
        }
    }

    /// The template and pool for a pod spec, written: the default one once per process; one
    /// of its own (no warm sandboxes) each time, after the check of the cap when it is new.
    pub(super) async fn ensure_template(
        &self,
        pod: &k8s_openapi::api::core::v1::PodSpec,
    ) -> Result<String, SandboxError> {
        self.inner.ensure_policy().await?;
        let name = objects::template_name(pod, &self.default_pod());
        let default = name == objects::DEFAULT_POOL;
        if default && self.lock_written().contains(&name) {
            return Ok(name);
        }
        if default {
            self.write_template(&name, pod).await?;
            self.lock_written().insert(name.clone());
            return Ok(name);
        }
        // The check and the write are one step: a parallel create waits, then counts this one.
        let _cap = self.cap.lock().await;
        let exists = self
            .api("SandboxTemplate")
            .get_opt(&name)
            .await
            .map_err(|e| kube_err("read the SandboxTemplate", "", e))?
            .is_some();
        if !exists {
            if self.sweep().await? >= self.max_templates {
                return Err(self.too_many_templates());
            }
            self.lock_admitted().insert(name.clone());
        }
        self.write_template(&name, pod).await?;
        Ok(name)
    }

    /// Writes the template `name` and its pool (create or update).
    pub(super) async fn write_template(
        &self,
        name: &str,
        pod: &k8s_openapi::api::core::v1::PodSpec,
    ) -> Result<(), SandboxError> {
        let ns = &self.inner.settings().namespace;
        let replicas = if name == objects::DEFAULT_POOL {
            self.pool_size
        } else {
            0
        };
        self.write("SandboxTemplate", objects::template(name, ns, pod))
            .await?;
        self.write("SandboxWarmPool", objects::warm_pool(name, ns, replicas))
            .await
    }

    fn lock_written(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Templates this process admitted under the cap whose claim does not exist yet.
    fn lock_admitted(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.admitted.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn too_many_templates(&self) -> SandboxError {
        SandboxError::Conflict(format!(
            "the cluster already holds {} SandboxTemplates sandboxd made for sessions whose limits or \
             image differ from the warm pool's, each in use by a session, and that is the most it \
             keeps: create the session with the default limits and image (it is then claimed from \
             the warm pool), or end a session that asked for other limits, then retry",
            self.max_templates
        ))
    }

    /// Deletes sandboxd's templates other than the default one (and their pools) that no
    /// claim of the namespace names and no create of this process is about to claim from;
    /// the number of such templates left, with those this process admitted that the list
    /// does not show yet.
    pub(super) async fn sweep(&self) -> Result<usize, SandboxError> {
        let op = "delete the SandboxTemplates no claim uses";
        let templates = self
            .api("SandboxTemplate")
            .list(&ListParams::default().labels(OURS))
            .await
            .map_err(|e| kube_err(op, "", e))?;
        // Listed after the templates: a claim made meanwhile is seen.
        let claims = self
            .api("SandboxClaim")
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_err(op, "", e))?;
        let used: BTreeSet<String> = claims.items.iter().filter_map(pool_of).collect();
        let busy: BTreeSet<String> = {
            let c = self.claiming.lock().unwrap_or_else(|e| e.into_inner());
            c.keys().cloned().collect()
        };
        let listed: BTreeSet<String> = templates.items.iter().map(name_of).collect();
        let mut left = self
            .lock_admitted()
            .iter()
            .filter(|n| !listed.contains(*n))
            .count();
        for name in listed {
            let extra = name.starts_with(&format!("{}-", objects::DEFAULT_POOL));
            if !extra {
                continue;
            }
            if used.contains(&name) || busy.contains(&name) {
                left += 1;
                continue;
            }
            for kind in ["SandboxWarmPool", "SandboxTemplate"] {
                match self.api(kind).delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(r)) if r.code == 404 => {}
                    Err(e) => return Err(kube_err(op, "", e)),
                }
            }
            tracing::info!(template = %name, "deleted a SandboxTemplate and its pool no claim uses");
        }
        Ok(left)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::spec_matches;

    #[test]
    fn a_template_matches_only_when_it_is_ours_exactly() {
        let pod = json!({"metadata": {"labels": {"sandboxd/managed": "true"}},
                         "spec": {"containers": [{"name": "sandbox", "image": "i"}]}});
        let want = json!({"podTemplate": pod, "networkPolicyManagement": "Unmanaged"});
        assert!(spec_matches(&want, &want, false));
        // Anything more in the pod template is someone else's.
        let mut sidecar = want.clone();
        sidecar["podTemplate"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "x", "image": "evil"}));
        assert!(!spec_matches(&sidecar, &want, false));
        let mut host = want.clone();
        host["podTemplate"]["spec"]["hostNetwork"] = json!(true);
        assert!(!spec_matches(&host, &want, false));
        let mut label = want.clone();
        label["podTemplate"]["metadata"]["labels"]["other"] = json!("x");
        assert!(!spec_matches(&label, &want, false));
        // So is a field beside it, and a field sandboxd sets, changed or missing.
        let mut beside = want.clone();
        beside["volumeClaimTemplates"] = json!([{"metadata": {"name": "v"}}]);
        assert!(!spec_matches(&beside, &want, false));
        let managed = json!({"podTemplate": pod, "networkPolicyManagement": "Managed"});
        assert!(!spec_matches(&managed, &want, false));
        assert!(!spec_matches(&json!({"podTemplate": pod}), &want, false));
    }

    #[test]
    fn a_pool_matches_on_the_fields_sandboxd_sets() {
        let pool = json!({"replicas": 2, "sandboxTemplateRef": {"name": "sandboxd"}});
        // What the schema or the cluster adds beside them is no difference.
        let have = json!({"replicas": 2, "sandboxTemplateRef": {"name": "sandboxd"},
                          "updateStrategy": {"type": "OnReplenish"}});
        assert!(spec_matches(&have, &pool, true));
        assert!(!spec_matches(
            &json!({"replicas": 3, "sandboxTemplateRef": {"name": "sandboxd"}}),
            &pool,
            true
        ));
        assert!(!spec_matches(&json!({"replicas": 2}), &pool, true));
    }
}
