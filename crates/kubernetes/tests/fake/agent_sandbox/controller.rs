//! The fake's agent-sandbox controller, a client of the fake API as the real one is of a
//! cluster (so its pods pass the same admission and are real containers): each
//! SandboxWarmPool keeps `replicas` warm Sandboxes, each with its pod, from its template;
//! a SandboxClaim is bound to a warm Sandbox whose pod runs (its warm label removed, the
//! claim's uid as a label, owned by the claim; the pod relabelled by a merge patch), or, when
//! the pool has none at all, to a Sandbox cold-created under the claim's name; its status then
//! names the Sandbox and says Ready. Each pod is owned by its Sandbox (an owner reference
//! with the Sandbox's name and uid); Sandboxes whose owner is gone are deleted, and with
//! them the pods they own (what the cluster's garbage collector does). A misbinding can be
//! asked for (`FakeApi::misbind_next`): the next claim is bound to a Sandbox whose
//! pod-name annotation names another pod, as a broken or hostile writer of Sandboxes would.
//! It acts at every write and otherwise every 100 ms (a pod's start is not a write here).

use std::sync::Weak;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::AgentSandbox;

const WARM_LABEL: &str = "agents.x-k8s.io/warm-pool-sandbox";
const CLAIM_UID_LABEL: &str = "agents.x-k8s.io/claim-uid";
const POD_NAME: &str = "agents.x-k8s.io/pod-name";

pub(crate) async fn run(store: Weak<AgentSandbox>, client: kube::Client) {
    let mut n = 0u64;
    loop {
        let Some(s) = store.upgrade() else { return };
        for ns in namespaces(&s) {
            let c = Ctl {
                s: &s,
                ns: &ns,
                pods: Api::namespaced(client.clone(), &ns),
            };
            c.pools(&mut n).await;
            c.claims().await;
            c.orphans().await;
        }
        let wake = s.wake.notified();
        tokio::select! {
            _ = wake => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

fn namespaces(s: &AgentSandbox) -> Vec<String> {
    let objects = s.objects.lock().unwrap_or_else(|e| e.into_inner());
    let ns: std::collections::BTreeSet<String> =
        objects.keys().map(|(_, n, _)| n.clone()).collect();
    ns.into_iter().collect()
}

struct Ctl<'a> {
    s: &'a AgentSandbox,
    ns: &'a str,
    pods: Api<Pod>,
}

fn name_of(o: &Value) -> String {
    o["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// An `ownerReferences` list naming `o` as the controller.
fn owner(kind: &str, o: &Value) -> Value {
    json!([{"apiVersion": o["apiVersion"], "kind": kind, "name": o["metadata"]["name"],
            "uid": o["metadata"]["uid"], "controller": true}])
}

impl Ctl<'_> {
    /// Makes a Sandbox and its pod (owned by it) from a template; false when the pod was
    /// refused (the Sandbox is deleted again).
    async fn make(&self, name: &str, template: &Value, labels: Value, owners: Value) -> bool {
        let pod_template = &template["spec"]["podTemplate"];
        let sandbox = json!({"metadata": {"name": name, "labels": labels,
                                          "annotations": {POD_NAME: name}, "ownerReferences": owners},
                             "spec": {"podTemplate": pod_template}});
        let sandbox = self.s.put("sandboxes", self.ns, sandbox);
        let mut pod_labels = pod_template["metadata"]["labels"].clone();
        if !pod_labels.is_object() {
            pod_labels = json!({});
        }
        for (k, v) in labels.as_object().into_iter().flatten() {
            pod_labels[k] = v.clone();
        }
        let pod: Result<Pod, _> = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": pod_labels,
                         "ownerReferences": owner("Sandbox", &sandbox)},
            "spec": pod_template["spec"],
        }));
        let made = match pod {
            Ok(pod) => self.pods.create(&PostParams::default(), &pod).await,
            Err(e) => {
                eprintln!("[fake agent-sandbox] pod {name} unreadable: {e}");
                self.s.remove("sandboxes", self.ns, name);
                return false;
            }
        };
        if let Err(e) = made {
            eprintln!("[fake agent-sandbox] pod {name} refused: {e}");
            self.s.remove("sandboxes", self.ns, name);
            return false;
        }
        true
    }

    /// Deletes a Sandbox, and its pod if the Sandbox owns it (by uid): the garbage
    /// collector never deletes a pod another object owns.
    async fn delete_sandbox(&self, sandbox: &Value) {
        let name = name_of(sandbox);
        self.s.remove("sandboxes", self.ns, &name);
        let pod = sandbox["metadata"]["annotations"][POD_NAME]
            .as_str()
            .unwrap_or(&name)
            .to_string();
        let Ok(Some(p)) = self.pods.get_opt(&pod).await else {
            return;
        };
        let uid = sandbox["metadata"]["uid"].as_str().unwrap_or_default();
        let owned = p
            .metadata
            .owner_references
            .unwrap_or_default()
            .iter()
            .any(|o| o.kind == "Sandbox" && o.uid == uid);
        if owned {
            let _ = self.pods.delete(&pod, &DeleteParams::default()).await;
        }
    }

    fn warm(&self, pool: &str) -> Vec<Value> {
        let all = self.s.all("sandboxes", self.ns);
        all.into_iter()
            .filter(|s| s["metadata"]["labels"][WARM_LABEL].as_str() == Some(pool))
            .collect()
    }

    /// Each pool keeps `replicas` warm sandboxes.
    async fn pools(&self, n: &mut u64) {
        for pool in self.s.all("sandboxwarmpools", self.ns) {
            let name = name_of(&pool);
            let want = pool["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
            let tname = pool["spec"]["sandboxTemplateRef"]["name"]
                .as_str()
                .unwrap_or_default();
            let Some(template) = self.s.get("sandboxtemplates", self.ns, tname) else {
                continue;
            };
            let warm = self.warm(&name);
            for extra in warm.iter().skip(want) {
                self.delete_sandbox(extra).await;
            }
            for _ in warm.len()..want {
                *n += 1;
                let sandbox = format!("{name}-w{n}");
                let labels = json!({WARM_LABEL: name});
                if !self
                    .make(&sandbox, &template, labels, owner("SandboxWarmPool", &pool))
                    .await
                {
                    break;
                }
            }
        }
    }

    /// Binds every unbound claim (module header).
    async fn claims(&self) {
        for claim in self.s.all("sandboxclaims", self.ns) {
            if claim["status"]["sandbox"]["name"].is_string() {
                continue;
            }
            let name = name_of(&claim);
            let uid = claim["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let pool = claim["spec"]["warmPoolRef"]["name"]
                .as_str()
                .unwrap_or_default();
            let template = self
                .s
                .get("sandboxwarmpools", self.ns, pool)
                .and_then(|p| {
                    p["spec"]["sandboxTemplateRef"]["name"]
                        .as_str()
                        .map(str::to_string)
                })
                .and_then(|t| self.s.get("sandboxtemplates", self.ns, &t));
            let Some(template) = template else {
                self.status(&claim, None, "False", "TemplateNotFound");
                continue;
            };
            let warm = self.warm(pool);
            let misbound = self
                .s
                .misbind
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            let bound = if let Some(other) = misbound {
                self.misbind(&name, &claim, &other)
            } else if warm.is_empty() {
                let labels = json!({CLAIM_UID_LABEL: uid});
                self.make(&name, &template, labels, owner("SandboxClaim", &claim))
                    .await
                    .then(|| name.clone())
            } else {
                self.adopt(&claim, &warm).await
            };
            if let Some(sandbox) = bound {
                self.status(&claim, Some(&sandbox), "True", "DependenciesReady");
            }
        }
    }

    /// A Sandbox of the claim whose pod-name annotation names `pod`, someone else's.
    fn misbind(&self, name: &str, claim: &Value, pod: &str) -> Option<String> {
        let sandbox = json!({"metadata": {"name": name, "annotations": {POD_NAME: pod},
                                          "ownerReferences": owner("SandboxClaim", claim)},
                             "spec": {}});
        self.s.put("sandboxes", self.ns, sandbox);
        Some(name.to_string())
    }

    /// A warm sandbox whose pod runs becomes the claim's; None while none runs yet.
    async fn adopt(&self, claim: &Value, warm: &[Value]) -> Option<String> {
        let uid = claim["metadata"]["uid"].clone();
        for sandbox in warm {
            let name = name_of(sandbox);
            let running = self
                .pods
                .get_opt(&name)
                .await
                .ok()
                .flatten()
                .is_some_and(|p| {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                });
            if !running {
                continue;
            }
            let mut adopted = sandbox.clone();
            adopted["metadata"]["labels"] = json!({CLAIM_UID_LABEL: uid});
            adopted["metadata"]["ownerReferences"] = owner("SandboxClaim", claim);
            self.s.put("sandboxes", self.ns, adopted);
            let patch = json!({"metadata": {"labels": {WARM_LABEL: null, CLAIM_UID_LABEL: uid}}});
            let _ = self
                .pods
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            return Some(name);
        }
        None
    }

    fn status(&self, claim: &Value, sandbox: Option<&str>, ready: &str, reason: &str) {
        let mut c = claim.clone();
        c["status"] = json!({"conditions": [{"type": "Ready", "status": ready, "reason": reason,
                                             "message": "", "lastTransitionTime": "2026-12-01T00:00:00Z"}]});
        if let Some(s) = sandbox {
            c["status"]["sandbox"] = json!({"name": s});
        }
        if c["status"] != claim["status"] {
            self.s.put("sandboxclaims", self.ns, c);
        }
    }

    /// Sandboxes whose owner (a claim or a pool) is gone go, with their pods.
    async fn orphans(&self) {
        for sandbox in self.s.all("sandboxes", self.ns) {
            let o = &sandbox["metadata"]["ownerReferences"][0];
            let plural = match o["kind"].as_str() {
                Some("SandboxClaim") => "sandboxclaims",
                Some("SandboxWarmPool") => "sandboxwarmpools",
                _ => continue,
            };
            let owner = self
                .s
                .get(plural, self.ns, o["name"].as_str().unwrap_or_default());
            if owner.is_none_or(|w| w["metadata"]["uid"] != o["uid"]) {
                self.delete_sandbox(&sandbox).await;
            }
        }
    }
}
