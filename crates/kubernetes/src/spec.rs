//! What sandboxd asks of the cluster, as pure functions from settings and a `SandboxSpec`
//! to `k8s_openapi` objects: the session pod with every hardening field the Docker backend
//! has (in pod terms), the deny-all NetworkPolicy that selects every sandbox pod, and the
//! Role `serve` needs in the sandbox namespace. Nothing in a request reaches a hardening
//! field: the limits are already within the admin's ceilings (the manager lowers, never
//! raises), and only numbers of them are used; metadata goes through `meta`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::runtime::{SandboxSpec, meta_key};
use sandboxd_core::sandbox::{HELPERS_DIR, WORKSPACE};

use crate::meta;

/// The sandbox user and group, as in the image and the Docker backend.
pub const SANDBOX_UID: i64 = 1000;
/// The container's name in every sandbox pod (what exec names).
pub const CONTAINER: &str = "sandbox";
/// The NetworkPolicy sandboxd keeps in the namespace.
pub const NETWORK_POLICY: &str = "sandboxd-deny-all";

/// How pods are made: the `[kubernetes]` section itself (config/sandboxd.example.toml says
/// what each field means), so the backend and the config never disagree on a field.
pub type PodSettings = sandboxd_core::config::KubernetesConfig;

fn pull_policy(p: &str) -> String {
    match p {
        "Always" | "Never" => p.to_string(),
        _ => "IfNotPresent".to_string(),
    }
}

/// The resources of a session pod: limits equal requests (Guaranteed QoS, no overcommit
/// that could take memory from another session). Kubernetes has no pids limit in a pod
/// spec: that is the kubelet's `podPidsLimit`, a node setting (README, "On Kubernetes").
fn resources(l: &Limits, memory_backed: bool) -> ResourceRequirements {
    // A memory-backed emptyDir's pages count against the container's memory limit, as
    // tmpfs does under Docker; the disk-backed case counts as ephemeral storage instead.
    let mut r = BTreeMap::from([
        ("memory".to_string(), Quantity(format!("{}Mi", l.memory_mb))),
        (
            "cpu".to_string(),
            Quantity(format!("{}m", ((l.cpus * 1000.0).round() as u64).max(1))),
        ),
    ]);
    if !memory_backed {
        let disk = l.workspace_mb.saturating_add(l.tmp_mb).saturating_add(64);
        r.insert(
            "ephemeral-storage".to_string(),
            Quantity(format!("{disk}Mi")),
        );
    }
    ResourceRequirements {
        limits: Some(r.clone()),
        requests: Some(r),
        ..Default::default()
    }
}

fn scratch(name: &str, size_mb: u64, memory_backed: bool) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: memory_backed.then(|| "Memory".to_string()),
            size_limit: Some(Quantity(format!("{size_mb}Mi"))),
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        ..Default::default()
    }
}

fn container_security() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(SANDBOX_UID),
        run_as_group: Some(SANDBOX_UID),
        read_only_root_filesystem: Some(true),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            add: None,
        }),
        seccomp_profile: Some(runtime_default()),
        ..Default::default()
    }
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_string(),
        localhost_profile: None,
    }
}

/// The pod of one session. `creator` is what the backend records as its creator.
pub fn pod(settings: &PodSettings, spec: &SandboxSpec, creator: &str) -> Pod {
    let l = &spec.limits;
    let m = spec.meta(creator);
    let env = [
        ("HOME", WORKSPACE),
        ("LANG", "C.UTF-8"),
        ("PYTHONUNBUFFERED", "1"),
        ("MPLBACKEND", "Agg"),
    ]
    .into_iter()
    .map(|(name, value)| EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        value_from: None,
    })
    .collect();
    let container = Container {
        name: CONTAINER.to_string(),
        image: Some(spec.image.clone().unwrap_or_else(|| settings.image.clone())),
        image_pull_policy: Some(pull_policy(&settings.pull_policy)),
        command: Some(vec![format!("{HELPERS_DIR}/init.sh")]),
        working_dir: Some(WORKSPACE.to_string()),
        env: Some(env),
        resources: Some(resources(l, settings.memory_backed)),
        security_context: Some(container_security()),
        volume_mounts: Some(vec![mount("workspace", WORKSPACE), mount("tmp", "/tmp")]),
        stdin: Some(false),
        tty: Some(false),
        ..Default::default()
    };
    let spec_ = PodSpec {
        containers: vec![container],
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SANDBOX_UID),
            run_as_group: Some(SANDBOX_UID),
            fs_group: Some(SANDBOX_UID),
            seccomp_profile: Some(runtime_default()),
            ..Default::default()
        }),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        // The pause container is PID 1 and reaps orphans, as tini does under Docker.
        share_process_namespace: Some(true),
        restart_policy: Some("Never".to_string()),
        termination_grace_period_seconds: Some(2),
        runtime_class_name: Some(settings.runtime_class.clone()).filter(|r| !r.is_empty()),
        volumes: Some(vec![
            scratch("workspace", l.workspace_mb, settings.memory_backed),
            scratch("tmp", l.tmp_mb, settings.memory_backed),
        ]),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(meta::pod_name(&spec.session_id)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(meta::labels(&m)),
            annotations: Some(meta::annotations(&m)),
            ..Default::default()
        },
        spec: Some(spec_),
        status: None,
    }
}

/// The NetworkPolicy that selects every sandbox pod and allows nothing either way.
/// It has an effect only where the cluster's network plugin enforces NetworkPolicy.
pub fn network_policy(namespace: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(NETWORK_POLICY.to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    meta::name(meta_key::MANAGED),
                    "true".to_string(),
                )])),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".to_string(), "Egress".to_string()]),
            ingress: None,
            egress: None,
        }),
    }
}

/// The Role `serve` is bound to in the sandbox namespace: exactly the verbs the backend
/// uses, nothing cluster-wide.
pub fn role(namespace: &str) -> Role {
    let rule = |groups: &[&str], resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    Role {
        metadata: ObjectMeta {
            name: Some("sandboxd".to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        rules: Some(vec![
            // patch: a warm pod is marked claimed (`Runtime::mark_claimed`).
            rule(
                &[""],
                &["pods"],
                &["create", "get", "list", "watch", "patch", "delete"],
            ),
            // The exec subresource is opened with a GET upgraded to a WebSocket.
            rule(&[""], &["pods/exec"], &["create", "get"]),
            rule(
                &["networking.k8s.io"],
                &["networkpolicies"],
                &["create", "get", "update"],
            ),
            // Each process's Lease (lease.rs): written, renewed by a merge patch, read for
            // another replica's liveness, deleted at shutdown.
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["create", "get", "patch", "delete"],
            ),
        ]),
    }
}
