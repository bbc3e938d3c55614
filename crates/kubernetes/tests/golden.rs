//! The pod, NetworkPolicy and Role sandboxd asks for, compared with golden JSON files under
//! tests/golden/ (SANDBOXD_BLESS=1 rewrites them after a deliberate change), and what no
//! input can weaken: every hardening field present whatever the settings and the request,
//! hostile metadata turned into valid labels and names, no host path, no token.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::Role;
use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::Owner;
use sandboxd_core::sandbox::runtime::SandboxSpec;
use sandboxd_kubernetes::meta::is_label_value;
use sandboxd_kubernetes::spec::{self, PodSettings};
use serde_json::Value;

fn golden(name: &str, actual: &Value) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    let text = serde_json::to_string_pretty(actual).unwrap() + "\n";
    if std::env::var_os("SANDBOXD_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        text, want,
        "{name} differs from its golden file (SANDBOXD_BLESS=1 to accept)"
    );
}

fn settings() -> PodSettings {
    PodSettings {
        image: "registry.example/sandboxd-sandbox:1".into(),
        ..PodSettings::default()
    }
}

fn session(id: &str, owner: &str) -> SandboxSpec {
    SandboxSpec {
        session_id: id.into(),
        owner: Owner::new(owner).ok(),
        pooled: false,
        limits: Limits::default(),
        keep: false,
        replica: None,
        image: None,
        restore_bytes: None,
    }
}

#[test]
fn the_objects_are_the_golden_ones() {
    let pod = spec::pod(
        &settings(),
        &session("0123456789ab", "serve:42"),
        "host/12:34",
    );
    golden("pod.json", &serde_json::to_value(&pod).unwrap());
    golden(
        "networkpolicy.json",
        &serde_json::to_value(spec::network_policy("sandboxd")).unwrap(),
    );
    golden(
        "role.json",
        &serde_json::to_value(spec::role("sandboxd")).unwrap(),
    );
    // What was written parses back as the Kubernetes types, unchanged.
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/pod.json"),
    )
    .unwrap();
    assert_eq!(serde_json::from_str::<Pod>(&text).unwrap(), pod);
    let np = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/networkpolicy.json"),
    )
    .unwrap();
    let np: NetworkPolicy = serde_json::from_str(&np).unwrap();
    let np_spec = np.spec.unwrap();
    assert_eq!(np_spec.policy_types.unwrap(), ["Ingress", "Egress"]);
    assert!(
        np_spec.ingress.is_none() && np_spec.egress.is_none(),
        "no rule: nothing allowed"
    );
    let role: Role = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/role.json"),
        )
        .unwrap(),
    )
    .unwrap();
    for rule in role.rules.unwrap() {
        for verb in &rule.verbs {
            assert!(
                [
                    "create", "get", "list", "watch", "patch", "delete", "update"
                ]
                .contains(&verb.as_str()),
                "{verb}"
            );
        }
        assert!(
            !rule
                .resources
                .unwrap()
                .iter()
                .any(|r| r == "*" || r == "secrets")
        );
    }
}

/// Every hardening field, checked field by field (not only through the golden file).
pub(crate) fn assert_hardened(pod: &Pod) {
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.enable_service_links, Some(false));
    assert_eq!(
        (spec.host_network, spec.host_pid, spec.host_ipc),
        (Some(false), Some(false), Some(false))
    );
    assert!(
        spec.volumes.iter().flatten().all(|v| v.host_path.is_none()
            && v.empty_dir.as_ref().is_some_and(|d| d.size_limit.is_some()))
    );
    let psc = spec.security_context.as_ref().unwrap();
    assert_eq!(
        (psc.run_as_non_root, psc.run_as_user, psc.run_as_group),
        (Some(true), Some(1000), Some(1000))
    );
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    assert_eq!(spec.containers.len(), 1);
    let c = &spec.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    assert!(sc.capabilities.as_ref().unwrap().add.is_none());
    let r = c.resources.as_ref().unwrap();
    assert_eq!(r.limits, r.requests, "limits = requests");
    let mounts: Vec<&str> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(mounts, ["/workspace", "/tmp"]);
    for v in pod.metadata.labels.as_ref().unwrap().values() {
        assert!(is_label_value(v), "label value {v:?}");
    }
    let name = pod.metadata.name.as_deref().unwrap();
    assert!(
        name.len() <= 63
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
        "{name}"
    );
}

#[test]
fn nothing_weakens_the_hardening() {
    let hostile = [
        ("../../../../var/run/docker.sock", "x/../../etc"),
        ("ID,sandboxd/managed=false", "serve:1"),
        (&"a".repeat(500) as &str, "user@example.com"),
        ("", ""),
        ("hostPath:/", "-"),
    ];
    let mut s = settings();
    s.runtime_class = "gvisor".into();
    s.memory_backed = false;
    s.pull_policy = "Sometimes; rm -rf /".into();
    for (id, owner) in hostile {
        let mut spec = session(id, owner);
        // The manager hands the builder limits within the ceilings; whatever it is handed,
        // only numbers of them reach the pod, never a field.
        spec.limits = Limits {
            memory_mb: u64::MAX / 2,
            cpus: 1e12,
            ..Limits::default()
        };
        spec.keep = true;
        let pod = spec::pod(&s, &spec, "c");
        assert_hardened(&pod);
        let c = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(
            pod.spec.as_ref().unwrap().runtime_class_name.as_deref(),
            Some("gvisor")
        );
        let text = serde_json::to_string(&pod).unwrap();
        assert!(!text.contains("hostPath\":"), "{text}");
    }
    assert_hardened(&spec::pod(
        &settings(),
        &session("0123456789ab", "serve:42"),
        "c",
    ));
}
