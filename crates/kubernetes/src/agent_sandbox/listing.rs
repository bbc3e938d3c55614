//! The sessions of agent-sandbox mode as the seam lists them: each claim labelled as
//! sandboxd's (its labels and annotations are sandboxd's metadata, read as hostile by
//! `meta::decode`), with its state from the pod it is bound to; and remove, which deletes the
//! claim and waits until the claim and its pod are gone (agent-sandbox's owner references
//! take the Sandbox and the pod with it), and then deletes a template no claim uses any more.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};

use sandboxd_core::sandbox::runtime::{FoundSandbox, meta_key};
use sandboxd_core::sandbox::{SandboxError, SandboxState};

use super::templates::pool_of;
use super::vanish::own_uid;
use super::{AgentSandboxRuntime, objects, split};
use crate::state::state_of;
use crate::{kube_err, meta};

/// How long remove waits for a deleted claim and its pod to be gone from the API.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(60);

/// One claim as the seam sees it; `sandbox` and `pod` are what it is bound to, if anything.
/// A pod that is not its Sandbox's own (`objects::pod_belongs`) is never the session's: the
/// claim is then Stopped, with no pod in its handle, so nothing attaches to that pod.
fn describe(
    claim: &DynamicObject,
    sandbox: Option<&DynamicObject>,
    pod: Option<&Pod>,
) -> FoundSandbox {
    let empty = BTreeMap::new();
    let m = meta::decode(
        claim.metadata.labels.as_ref().unwrap_or(&empty),
        claim.metadata.annotations.as_ref().unwrap_or(&empty),
    );
    let foreign = match (sandbox, pod) {
        (Some(s), Some(p)) => objects::pod_belongs(p, s).is_err(),
        _ => false,
    };
    let pod_name = match sandbox.and_then(objects::pod_of) {
        Some(p) if !foreign => p,
        _ => String::new(),
    };
    let state = if claim.metadata.deletion_timestamp.is_some() {
        SandboxState::Removing
    } else if foreign {
        SandboxState::Stopped
    } else if let Some(p) = pod {
        state_of(p)
    } else if objects::bound_sandbox(claim).is_none() || sandbox.is_some() {
        // Not bound yet, or bound and its controller is making the pod.
        SandboxState::Starting
    } else {
        // Bound to a Sandbox that is gone: it will not run again.
        SandboxState::Stopped
    };
    let name = claim.metadata.name.clone().unwrap_or_default();
    FoundSandbox::new(format!("{name}/{pod_name}"), state, m)
}

impl AgentSandboxRuntime {
    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(
            self.inner.client().clone(),
            &self.inner.settings().namespace,
        )
    }

    /// The claims of every session (or of one), each with what it is bound to: a listing
    /// reads the Sandboxes and sandboxd's pods once each, a find only its claim's.
    pub(super) async fn list_claims(
        &self,
        session: Option<&str>,
    ) -> Result<Vec<FoundSandbox>, SandboxError> {
        let op = "list the SandboxClaims";
        let lp = ListParams::default().labels(&meta::selector(session));
        let claims = self
            .api("SandboxClaim")
            .list(&lp)
            .await
            .map_err(|e| kube_err(op, "", e))?
            .items;
        // The replica liveness rule judges a missing Lease by its newest sandbox: here the
        // claims carry the creator, so they are what it is told about.
        let as_pods: Vec<Pod> = claims
            .iter()
            .map(|c| Pod {
                metadata: c.metadata.clone(),
                ..Pod::default()
            })
            .collect();
        self.inner.note_pods(&as_pods);
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let (sandboxes, pods) = match session {
            None => self.everything().await?,
            Some(_) => self.bound_to(&claims).await?,
        };
        Ok(claims
            .iter()
            .map(|c| {
                let sandbox = objects::bound_sandbox(c).and_then(|s| sandboxes.get(&s));
                let pod = sandbox.and_then(objects::pod_of).and_then(|p| pods.get(&p));
                describe(c, sandbox, pod)
            })
            .collect())
    }

    /// Every Sandbox of the namespace and every pod sandboxd's template labelled, by name.
    async fn everything(
        &self,
    ) -> Result<(BTreeMap<String, DynamicObject>, BTreeMap<String, Pod>), SandboxError> {
        let op = "list the Sandboxes and their pods";
        let sandboxes = self
            .api("Sandbox")
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_err(op, "", e))?;
        let lp = ListParams::default().labels(&format!("{}=true", meta::name(meta_key::MANAGED)));
        let pods = self
            .pods_api()
            .list(&lp)
            .await
            .map_err(|e| kube_err(op, "", e))?;
        let by_name = |n: &Option<String>| n.clone().unwrap_or_default();
        Ok((
            sandboxes
                .items
                .into_iter()
                .map(|s| (by_name(&s.metadata.name), s))
                .collect(),
            pods.items
                .into_iter()
                .map(|p| (by_name(&p.metadata.name), p))
                .collect(),
        ))
    }

    /// The Sandboxes and pods of these claims only, read one by one.
    async fn bound_to(
        &self,
        claims: &[DynamicObject],
    ) -> Result<(BTreeMap<String, DynamicObject>, BTreeMap<String, Pod>), SandboxError> {
        let op = "read a claim's Sandbox and pod";
        let (mut sandboxes, mut pods) = (BTreeMap::new(), BTreeMap::new());
        for name in claims.iter().filter_map(objects::bound_sandbox) {
            let got = self.api("Sandbox").get_opt(&name).await;
            let Some(sandbox) = got.map_err(|e| kube_err(op, "", e))? else {
                continue;
            };
            if let Some(pod) = objects::pod_of(&sandbox) {
                let got = self.pods_api().get_opt(&pod).await;
                if let Some(p) = got.map_err(|e| kube_err(op, "", e))? {
                    pods.insert(pod, p);
                }
            }
            sandboxes.insert(name, sandbox);
        }
        Ok((sandboxes, pods))
    }

    /// The pod a handle names, checked as a create checks it: the claim is bound to a
    /// Sandbox that names this pod, and the pod is that Sandbox's own (`objects::pod_belongs`).
    /// Its uid, for the vanish watch; an error saying what is wrong otherwise.
    pub(super) async fn checked_pod(
        &self,
        handle: &str,
        session: &str,
    ) -> Result<Option<String>, SandboxError> {
        let op = "attach to the SandboxClaim's pod";
        let (claim, pod) = split(handle);
        let gone = |why: String| SandboxError::SandboxGone {
            session: session.into(),
            message: why,
        };
        let got = self.api("SandboxClaim").get_opt(claim).await;
        let c = got.map_err(|e| kube_err(op, session, e))?;
        let Some(sandbox) = c.as_ref().and_then(objects::bound_sandbox) else {
            return Err(gone(format!(
                "its SandboxClaim {claim} is gone or not bound"
            )));
        };
        let got = self.api("Sandbox").get_opt(&sandbox).await;
        let Some(s) = got.map_err(|e| kube_err(op, session, e))? else {
            return Err(gone(format!("its Sandbox {sandbox} is gone")));
        };
        let got = self.pods_api().get_opt(pod).await;
        let p = got.map_err(|e| kube_err(op, session, e))?;
        let Some(p) = p.filter(|_| objects::pod_of(&s).as_deref() == Some(pod)) else {
            return Err(gone(format!(
                "its Sandbox {sandbox} no longer has the pod {pod}"
            )));
        };
        if let Err(why) = objects::pod_belongs(&p, &s) {
            return Err(SandboxError::Backend {
                backend: crate::BACKEND,
                operation: op.into(),
                message: format!(
                    "the SandboxClaim {claim} names the pod {pod}, which {why}; the session is not \
                     attached to it (is something other than agent-sandbox's controller writing \
                     Sandboxes in this namespace?): remove the session"
                ),
            });
        }
        Ok(p.metadata.uid.filter(|u| !u.is_empty()))
    }

    /// Deletes the claim of a handle and waits until it and its pod are gone, so a find
    /// right after finds nothing; a claim already gone is not an error. The pod's end is this
    /// runtime's, never reported (vanish.rs); a template only this claim used is deleted
    /// after it (templates.rs).
    pub(super) async fn remove_claim(&self, handle: &str) -> Result<(), SandboxError> {
        let op = "remove the SandboxClaim";
        let (claim, pod) = split(handle);
        if !objects::is_name(claim) {
            return Ok(());
        }
        let binding = self.bound.remove(pod);
        let uid = binding.as_ref().and_then(|b| b.uid.as_deref()).map(own_uid);
        self.watch.own.mark(handle);
        if let Some(u) = &uid {
            self.watch.own.mark(u);
        }
        let claims = self.api("SandboxClaim");
        let pool = match claims.delete(claim, &DeleteParams::background()).await {
            Ok(deleted) => deleted.left().as_ref().and_then(pool_of),
            Err(kube::Error::Api(r)) if r.code == 404 => return Ok(()),
            Err(e) => {
                // Not removed: its end, later, is news.
                self.watch.own.unmark(handle);
                if let Some(u) = &uid {
                    self.watch.own.unmark(u);
                }
                if let Some(b) = binding {
                    self.bound.insert(pod, b);
                }
                return Err(kube_err(op, handle, e));
            }
        };
        self.wait_removed(claim, pod, handle).await?;
        if pool.is_some_and(|p| p != objects::DEFAULT_POOL)
            && let Err(e) = self.sweep().await
        {
            tracing::warn!(error = %e, "could not delete the SandboxTemplates no claim uses; the next removal or new template tries again");
        }
        Ok(())
    }

    /// Waits until the claim and its pod are gone from the API.
    async fn wait_removed(&self, claim: &str, pod: &str, handle: &str) -> Result<(), SandboxError> {
        let op = "remove the SandboxClaim";
        let claims = self.api("SandboxClaim");
        let pods = self.pods_api();
        let deadline = tokio::time::Instant::now() + REMOVE_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            let claim_gone = claims
                .get_opt(claim)
                .await
                .map_err(|e| kube_err(op, handle, e))?
                .is_none();
            let pod_gone = !objects::is_name(pod)
                || pods
                    .get_opt(pod)
                    .await
                    .map_err(|e| kube_err(op, handle, e))?
                    .is_none();
            if claim_gone && pod_gone {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(SandboxError::Timeout {
            what: format!("the SandboxClaim {claim} and its pod to be deleted"),
            after: REMOVE_TIMEOUT,
        })
    }
}
