//! kubernetes-sigs/agent-sandbox's objects as sandboxd writes them, pure functions from the
//! settings and a `SandboxSpec` to JSON of the real kinds (read from the project's
//! api/v1beta1/sandbox_types.go and extensions/api/v1beta1/*.go, snapshot v0.5.6):
//! `SandboxTemplate`, `SandboxWarmPool`, `SandboxClaim` in `extensions.agents.x-k8s.io/v1beta1`
//! and `Sandbox` in `agents.x-k8s.io/v1beta1`. The template's pod spec IS `spec::pod`'s (the
//! same function, not a copy), so every hardening field of a session pod is in it; the pod
//! carries only `sandboxd/managed=true` (what the deny-all NetworkPolicy selects), sandboxd's
//! metadata is on the claim. Nothing of a request reaches the template but the limits (already
//! within the admin's ceilings) and the image the manager chose.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::runtime::{SandboxSpec, meta_key};

use crate::{PodSettings, meta, spec};

/// The group of SandboxTemplate, SandboxWarmPool and SandboxClaim.
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
/// The group of Sandbox.
pub const CORE_GROUP: &str = "agents.x-k8s.io";
/// The version sandboxd speaks (both groups; v1alpha1 is converted by the project's webhook).
pub const VERSION: &str = "v1beta1";
/// The name of the template and warm pool made from the `[limits]` ceilings and the
/// configured image: the one `[pool] size` keeps warm.
pub const DEFAULT_POOL: &str = "sandboxd";
/// The Role of this mode (`role`).
pub const ROLE: &str = "sandboxd-agent-sandbox";
/// Where a Sandbox records its pod's name when it differs from its own (adopted warm pods).
pub const POD_NAME_ANNOTATION: &str = "agents.x-k8s.io/pod-name";

/// `(kind, plural, group)` of the four kinds, in discovery's words.
pub const KINDS: [(&str, &str, &str); 4] = [
    ("SandboxTemplate", "sandboxtemplates", EXTENSIONS_GROUP),
    ("SandboxWarmPool", "sandboxwarmpools", EXTENSIONS_GROUP),
    ("SandboxClaim", "sandboxclaims", EXTENSIONS_GROUP),
    ("Sandbox", "sandboxes", CORE_GROUP),
];

/// The `ApiResource` of one of `KINDS` by its kind.
pub fn resource(kind: &str) -> ApiResource {
    let (kind, plural, group) = KINDS
        .iter()
        .copied()
        .find(|(k, _, _)| *k == kind)
        .unwrap_or(KINDS[2]);
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, VERSION, kind), plural)
}

/// The pod spec of a session with these limits and this image: `spec::pod`'s own.
pub fn pod_spec(settings: &PodSettings, limits: &Limits, image: Option<&str>) -> PodSpec {
    let template = SandboxSpec {
        session_id: String::new(),
        owner: None,
        pooled: true,
        limits: limits.clone(),
        keep: false,
        replica: None,
        image: image.map(str::to_string),
        restore_bytes: None,
    };
    spec::pod(settings, &template, "").spec.unwrap_or_default()
}

/// The name of the template (and its pool) for a pod spec: `sandboxd` for the default one,
/// else `sandboxd-` and 16 hex digits of the spec's digest (a session whose limits or image
/// differ from the pool's gets a template of its own, with no warm sandboxes: a cold start).
pub fn template_name(pod: &PodSpec, default: &PodSpec) -> String {
    if pod == default {
        return DEFAULT_POOL.to_string();
    }
    let text = serde_json::to_vec(pod).unwrap_or_default();
    let digest = hex::encode(Sha256::digest(&text));
    format!("{DEFAULT_POOL}-{}", &digest[..16])
}

fn object(kind: &str, name: &str, namespace: &str, spec: Value) -> DynamicObject {
    let mut o = DynamicObject::new(name, &resource(kind)).within(namespace);
    o.metadata.labels = Some(BTreeMap::from([(
        "app.kubernetes.io/managed-by".to_string(),
        "sandboxd".to_string(),
    )]));
    o.data = json!({ "spec": spec });
    o
}

/// The SandboxTemplate: the session pod's spec, labelled so the deny-all NetworkPolicy
/// selects every pod made from it; agent-sandbox's own NetworkPolicy is off (`Unmanaged`:
/// its "Managed" default allows public egress, and policies add up), no Service, and a claim
/// may inject neither environment variables nor volumes.
pub fn template(name: &str, namespace: &str, pod: &PodSpec) -> DynamicObject {
    let labels = BTreeMap::from([(meta::name(meta_key::MANAGED), "true".to_string())]);
    object(
        "SandboxTemplate",
        name,
        namespace,
        json!({
            "podTemplate": {"metadata": {"labels": labels}, "spec": pod},
            "service": false,
            "networkPolicyManagement": "Unmanaged",
            "envVarsInjectionPolicy": "Disallowed",
            "volumeClaimTemplatesPolicy": "Disallowed",
        }),
    )
}

/// The SandboxWarmPool of a template: `replicas` sandboxes kept ready by agent-sandbox's
/// controller; stale ones (an older template) replaced at once.
pub fn warm_pool(name: &str, namespace: &str, replicas: usize) -> DynamicObject {
    object(
        "SandboxWarmPool",
        name,
        namespace,
        json!({
            "replicas": i32::try_from(replicas).unwrap_or(i32::MAX),
            "sandboxTemplateRef": {"name": name},
            "updateStrategy": {"type": "Recreate"},
        }),
    )
}

/// The SandboxClaim of one session: named as its pod would be in pods mode, carrying
/// sandboxd's metadata as labels and annotations exactly as a pod does there, against the
/// pool `pool`. No `env`, no volumes (either would bypass the warm pool), no lifecycle (the
/// claim lives until sandboxd deletes it).
pub fn claim(namespace: &str, spec: &SandboxSpec, creator: &str, pool: &str) -> DynamicObject {
    let m = spec.meta(creator);
    let mut o = DynamicObject::new(&meta::pod_name(&spec.session_id), &resource("SandboxClaim"))
        .within(namespace);
    o.metadata.labels = Some(meta::labels(&m));
    o.metadata.annotations = Some(meta::annotations(&m));
    o.data = json!({"spec": {"warmPoolRef": {"name": pool}}});
    o
}

/// What a claim's status names: its Sandbox, once bound.
pub fn bound_sandbox(claim: &DynamicObject) -> Option<String> {
    claim.data["status"]["sandbox"]["name"]
        .as_str()
        .filter(|n| is_name(n))
        .map(str::to_string)
}

/// The pod of a Sandbox: the name it records, else its own (a cold one's pod is named so).
pub fn pod_of(sandbox: &DynamicObject) -> Option<String> {
    let recorded = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_NAME_ANNOTATION))
        .filter(|n| is_name(n))
        .cloned();
    recorded.or_else(|| sandbox.metadata.name.clone().filter(|n| is_name(n)))
}

/// Whether `pod` is one a session may use as the pod of `sandbox`: labelled
/// `sandboxd/managed=true` (made from sandboxd's template, so the deny-all NetworkPolicy
/// selects it) and owned by that Sandbox (an owner reference of kind Sandbox with its name,
/// and its uid where the Sandbox has one). Else what is wrong, in words.
pub fn pod_belongs(pod: &Pod, sandbox: &DynamicObject) -> Result<(), String> {
    let labels = pod.metadata.labels.as_ref();
    let managed = meta::name(meta_key::MANAGED);
    if labels.and_then(|l| l.get(&managed)).map(String::as_str) != Some("true") {
        return Err(format!(
            "does not carry the label {managed}=true of sandboxd's template (the deny-all NetworkPolicy would not select it)"
        ));
    }
    let name = sandbox.metadata.name.as_deref().unwrap_or_default();
    let uid = sandbox.metadata.uid.as_deref().filter(|u| !u.is_empty());
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    let owned = owners
        .iter()
        .any(|o| o.kind == "Sandbox" && o.name == name && uid.is_none_or(|u| o.uid == u));
    if owned {
        Ok(())
    } else {
        Err(format!("is not owned by its Sandbox {name}"))
    }
}

/// The claim's Ready condition, as words for an error (cut, no control characters).
pub fn ready_condition(claim: &DynamicObject) -> String {
    let conditions = claim.data["status"]["conditions"].as_array();
    let ready = conditions.and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    let Some(c) = ready else {
        return "no Ready condition yet".to_string();
    };
    let text = format!(
        "Ready={} {}: {}",
        c["status"].as_str().unwrap_or("?"),
        c["reason"].as_str().unwrap_or(""),
        c["message"].as_str().unwrap_or("")
    );
    text.chars().filter(|c| !c.is_control()).take(300).collect()
}

/// Whether a name from the API server is one Kubernetes could have given an object (a DNS
/// subdomain), so nothing else reaches a URL path.
pub fn is_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && n.as_bytes()[0].is_ascii_alphanumeric()
        && n.as_bytes()[n.len() - 1].is_ascii_alphanumeric()
}

/// The Role this mode needs beside pods mode's (`spec::role`), in the sandbox namespace:
/// the templates and pools written (create or update) and those no claim uses deleted
/// (listed first), claims made, read, listed and deleted, Sandboxes read to find a claim's
/// pod. Nothing cluster-wide: discovery is open to every authenticated account
/// (`system:discovery`).
pub fn role(namespace: &str) -> Role {
    let rule = |group: &str, resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    Role {
        metadata: ObjectMeta {
            name: Some(ROLE.to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        rules: Some(vec![
            rule(
                EXTENSIONS_GROUP,
                &["sandboxtemplates", "sandboxwarmpools"],
                &["create", "get", "list", "update", "delete"],
            ),
            rule(
                EXTENSIONS_GROUP,
                &["sandboxclaims"],
                &["create", "get", "list", "delete"],
            ),
            rule(CORE_GROUP, &["sandboxes"], &["get", "list"]),
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dynamic(v: Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn what_the_cluster_says_is_read_as_hostile() {
        for bad in [
            "",
            "../etc",
            "a/b",
            "A",
            "-a",
            "a-",
            "x y",
            &"a".repeat(254),
        ] {
            assert!(!is_name(bad), "{bad:?}");
        }
        assert!(is_name("sandboxd-w1") && is_name("a.b-c"));
        let claim = |name: &str| {
            dynamic(
                json!({"metadata": {"name": "c"}, "status": {"sandbox": {"name": name},
                "conditions": [{"type": "Ready", "status": "False", "reason": "X",
                                "message": format!("{}\u{1b}[31m", "m".repeat(1000))}]}}),
            )
        };
        assert_eq!(bound_sandbox(&claim("../x")), None);
        assert_eq!(bound_sandbox(&claim("sb-1")).as_deref(), Some("sb-1"));
        let words = ready_condition(&claim("sb-1"));
        assert!(words.starts_with("Ready=False X: m") && words.chars().count() <= 300);
        assert!(!words.contains('\u{1b}'));
        // A Sandbox's pod: the recorded name when it is one, else its own name.
        let sandbox = |ann: &str| {
            dynamic(
                json!({"metadata": {"name": "sb-1", "annotations": {POD_NAME_ANNOTATION: ann}}}),
            )
        };
        assert_eq!(pod_of(&sandbox("pod-2")).as_deref(), Some("pod-2"));
        assert_eq!(pod_of(&sandbox("../../x")).as_deref(), Some("sb-1"));
    }

    #[test]
    fn a_pod_belongs_to_its_sandbox_only_when_labelled_and_owned() {
        let sandbox = dynamic(json!({"metadata": {"name": "sb-1", "uid": "u-1"}}));
        let pod = |labels: Value, owners: Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p", "labels": labels,
                                                       "ownerReferences": owners}}))
            .unwrap()
        };
        let managed = json!({"sandboxd/managed": "true"});
        let owner = |name: &str, uid: &str| {
            json!([{"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                    "name": name, "uid": uid, "controller": true}])
        };
        assert_eq!(
            pod_belongs(&pod(managed.clone(), owner("sb-1", "u-1")), &sandbox),
            Ok(())
        );
        let unlabelled = pod_belongs(&pod(json!({}), owner("sb-1", "u-1")), &sandbox);
        assert!(unlabelled.unwrap_err().contains("sandboxd/managed=true"));
        let falsely = json!({"sandboxd/managed": "false"});
        assert!(pod_belongs(&pod(falsely, owner("sb-1", "u-1")), &sandbox).is_err());
        for owners in [json!([]), owner("sb-2", "u-1"), owner("sb-1", "u-0")] {
            let e = pod_belongs(&pod(managed.clone(), owners.clone()), &sandbox);
            assert!(
                e.unwrap_err().contains("not owned by its Sandbox sb-1"),
                "{owners}"
            );
        }
        let mut kind = owner("sb-1", "u-1");
        kind[0]["kind"] = json!("SandboxWarmPool");
        assert!(pod_belongs(&pod(managed.clone(), kind), &sandbox).is_err());
        // A Sandbox whose uid is not known: its name decides.
        let no_uid = dynamic(json!({"metadata": {"name": "sb-1"}}));
        assert_eq!(
            pod_belongs(&pod(managed, owner("sb-1", "u-7")), &no_uid),
            Ok(())
        );
    }

    #[test]
    fn a_pod_spec_names_its_template() {
        let s = PodSettings::default();
        let default = pod_spec(&s, &Limits::default(), None);
        assert_eq!(template_name(&default, &default), DEFAULT_POOL);
        let small = Limits {
            memory_mb: 256,
            ..Limits::default()
        };
        let other = pod_spec(&s, &small, None);
        let name = template_name(&other, &default);
        assert_eq!(
            name,
            template_name(&other, &default),
            "the same spec, the same name"
        );
        assert_ne!(
            name,
            template_name(&pod_spec(&s, &small, Some("img:2")), &default)
        );
        assert!(is_name(&name) && name.len() <= 63, "{name}");
    }
}
