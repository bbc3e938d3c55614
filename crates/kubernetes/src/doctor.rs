//! `sandboxd doctor` for the Kubernetes backend: what a cluster must have before a session
//! can start, each check phrased for the admin with what to do when it fails. Nothing is
//! left behind: the namespace and admission are checked with a dry-run create of the probe
//! pod (the API server runs its admission, Pod Security included, and stores nothing), the
//! Role with one SelfSubjectAccessReview per verb it grants (any account may ask about
//! itself), and the network with the probe (probe.rs), which does create and remove a pod.
//! `[kubernetes] mode` is checked against discovery, and in agent-sandbox mode that mode's
//! Role too.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

use k8s_openapi::api::rbac::v1::Role;

use crate::agent_sandbox::{self, Mode, objects};
use crate::probe::{self, Verdict};
use crate::{KubeRuntime, spec};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    Info,
    Warn,
    Fail,
}

/// One line of doctor's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub level: Level,
    pub what: String,
    /// What to do (empty unless it warns or fails).
    pub fix: String,
}

fn check(level: Level, what: impl Into<String>, fix: &str) -> Check {
    Check {
        level,
        what: what.into(),
        fix: fix.to_string(),
    }
}

const APPLY: &str = "kubectl apply -f deploy/kubernetes/ (README, \"On Kubernetes\")";

/// Every check, in order; the network probe runs only when a pod can be created at all.
pub async fn checks(rt: &KubeRuntime) -> Vec<Check> {
    let mut out = Vec::new();
    match rt.client().apiserver_version().await {
        Ok(v) => out.push(check(
            Level::Ok,
            format!("Kubernetes API server reachable: {}", v.git_version),
            "",
        )),
        Err(e) => {
            out.push(check(
                Level::Fail,
                format!("Kubernetes API server: {e}"),
                "point KUBECONFIG at the cluster (or run in it with its service account)",
            ));
            return out;
        }
    }
    let admitted = admission(rt, &mut out).await;
    let mut roles = vec![spec::role(&rt.settings().namespace)];
    let (mode_check, claims) = mode(rt).await;
    out.push(mode_check);
    if claims {
        roles.push(objects::role(&rt.settings().namespace));
    }
    out.extend(rbac(rt, &roles).await);
    out.extend(image(rt));
    let s = rt.settings();
    out.push(check(
        Level::Info,
        format!(
            "pods: namespace {}, runtime class {}, /workspace and /tmp {}; no pids limit in a pod spec: the kubelet's podPidsLimit (a node setting) is the only one, so [limits] pids is not enforced per session on this backend",
            s.namespace,
            if s.runtime_class.is_empty() { "the cluster's default" } else { s.runtime_class.as_str() },
            if s.memory_backed { "in memory" } else { "on the node's disk" },
        ),
        "",
    ));
    if admitted {
        out.push(network(rt).await);
    }
    out
}

/// A dry-run create of the probe pod: the namespace exists, RBAC lets us create pods and
/// admission (Pod Security "restricted" included) takes our hardened spec. Whether it did.
async fn admission(rt: &KubeRuntime, out: &mut Vec<Check>) -> bool {
    let ns = &rt.settings().namespace;
    let pod = spec::pod(rt.settings(), &probe::probe_spec(), "doctor");
    let pods: Api<Pod> = Api::namespaced(rt.client().clone(), ns);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let (level, what, fix) = match pods.create(&dry, &pod).await {
        Ok(_) => (
            Level::Ok,
            format!("namespace {ns}: a session pod is admitted (dry run)"),
            "",
        ),
        Err(kube::Error::Api(r)) if r.code == 404 => (
            Level::Fail,
            format!("namespace {ns} does not exist ({})", r.message),
            APPLY,
        ),
        Err(kube::Error::Api(r)) if r.code == 403 && r.message.contains("PodSecurity") => (
            Level::Fail,
            format!("namespace {ns} refuses the session pod: {}", r.message),
            "label the namespace pod-security.kubernetes.io/enforce=restricted (not stricter custom policies that forbid what the pod needs)",
        ),
        Err(kube::Error::Api(r)) if r.code == 403 => (
            Level::Fail,
            format!("may not create pods in {ns}: {}", r.message),
            APPLY,
        ),
        Err(e) => (
            Level::Fail,
            format!("a dry-run create of a session pod in {ns} failed: {e}"),
            "",
        ),
    };
    out.push(check(level, what, fix));
    level == Level::Ok
}

/// `[kubernetes] mode` against the cluster (agent_sandbox.rs: `resolve`), and whether
/// sessions are claims here (then the mode's Role is checked too).
async fn mode(rt: &KubeRuntime) -> (Check, bool) {
    let configured = rt.settings().kube_mode();
    match agent_sandbox::resolve(rt, configured).await {
        Ok(Mode::Pods) => (
            check(
                Level::Info,
                format!(
                    "mode {:?}: sessions are pods sandboxd makes itself",
                    rt.settings().mode
                ),
                "",
            ),
            false,
        ),
        Ok(Mode::AgentSandbox) => (
            check(
                Level::Ok,
                format!(
                    "mode {:?}: the cluster serves agent-sandbox's CRDs; sessions are SandboxClaims against the SandboxWarmPool {}",
                    rt.settings().mode,
                    objects::DEFAULT_POOL
                ),
                "",
            ),
            true,
        ),
        Err(e) => (
            check(
                Level::Fail,
                e.to_string(),
                "install kubernetes-sigs/agent-sandbox, or set [kubernetes] mode = \"pods\"",
            ),
            true,
        ),
    }
}

/// One SelfSubjectAccessReview per verb of the Roles sandboxd needs (spec::role, and in
/// agent-sandbox mode that mode's).
async fn rbac(rt: &KubeRuntime, roles: &[Role]) -> Vec<Check> {
    let ns = &rt.settings().namespace;
    let api: Api<SelfSubjectAccessReview> = Api::all(rt.client().clone());
    let mut denied = Vec::new();
    let rules = roles
        .iter()
        .flat_map(|r| r.rules.clone().unwrap_or_default());
    for rule in rules {
        let group = rule
            .api_groups
            .as_ref()
            .and_then(|g| g.first())
            .cloned()
            .unwrap_or_default();
        for resource in rule.resources.unwrap_or_default() {
            let (res, sub) = match resource.split_once('/') {
                Some((r, s)) => (r.to_string(), Some(s.to_string())),
                None => (resource.clone(), None),
            };
            for verb in &rule.verbs {
                let review = SelfSubjectAccessReview {
                    spec: SelfSubjectAccessReviewSpec {
                        resource_attributes: Some(ResourceAttributes {
                            namespace: Some(ns.clone()),
                            group: Some(group.clone()),
                            resource: Some(res.clone()),
                            subresource: sub.clone(),
                            verb: Some(verb.clone()),
                            ..ResourceAttributes::default()
                        }),
                        ..SelfSubjectAccessReviewSpec::default()
                    },
                    ..SelfSubjectAccessReview::default()
                };
                let allowed = match api.create(&PostParams::default(), &review).await {
                    Ok(r) => r.status.is_some_and(|s| s.allowed),
                    Err(e) => {
                        return vec![check(
                            Level::Warn,
                            format!("cannot ask the API server what this account may do: {e}"),
                            "check the Role by hand against deploy/kubernetes/11-role.json",
                        )];
                    }
                };
                if !allowed {
                    denied.push(format!("{verb} {resource}"));
                }
            }
        }
    }
    if denied.is_empty() {
        vec![check(
            Level::Ok,
            format!("RBAC: every verb sandboxd needs in {ns} is allowed"),
            "",
        )]
    } else {
        vec![check(
            Level::Fail,
            format!("RBAC: this account may not {} in {ns}", denied.join(", ")),
            APPLY,
        )]
    }
}

/// The image reference and its pull policy: a moving tag the nodes keep is stale sessions.
fn image(rt: &KubeRuntime) -> Vec<Check> {
    let s = rt.settings();
    let what = format!("sandbox image {} (pull policy {})", s.image, s.pull_policy);
    let last = s.image.rsplit('/').next().unwrap_or_default();
    let pinned = s.image.contains("@sha256:");
    let tagged = last.contains(':') && !last.ends_with(":latest");
    if s.image.trim().is_empty() {
        return vec![check(
            Level::Fail,
            "no sandbox image ([kubernetes] image)",
            "push the image to the cluster's registry and set [kubernetes] image",
        )];
    }
    vec![match s.pull_policy.as_str() {
        "Never" => check(
            Level::Warn,
            format!("{what}: every node must already have it"),
            "load the image on every node, or use IfNotPresent with a registry",
        ),
        "IfNotPresent" if !pinned && !tagged => check(
            Level::Warn,
            format!("{what}: a node keeps the first image it pulled under a moving tag"),
            "use a digest (@sha256:…) or a versioned tag, or pull_policy = \"Always\"",
        ),
        _ => check(Level::Ok, what, ""),
    }]
}

/// The network probe, run now.
async fn network(rt: &KubeRuntime) -> Check {
    match rt.probe_network().await {
        Ok(Verdict::Isolated(blocked)) => check(
            Level::Ok,
            format!(
                "network: sandbox pods reach nothing (probe: {})",
                blocked.join(", ")
            ),
            "",
        ),
        Ok(Verdict::Leaks(leaks)) => check(
            Level::Fail,
            probe::not_enforced(&leaks).to_string(),
            "install or enable a network plugin that enforces NetworkPolicy (Calico, Cilium, …)",
        ),
        Err(e) => check(
            Level::Fail,
            format!("network: the probe could not tell: {e}"),
            "see why the probe pod did not run (kubectl -n <namespace> get events)",
        ),
    }
}
