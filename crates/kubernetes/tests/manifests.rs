//! The manifests of deploy/kubernetes/ against the types they claim and against this crate.
//! No cluster runs here, so this is the whole validation: every file deserializes into the
//! k8s-openapi type its `kind` names and serializes back to the same JSON (k8s-openapi has no
//! deny-unknown-fields, so the round trip is what catches a misspelt or misplaced field: it
//! would be dropped on the way in and missing on the way out); the serve pod is hardened;
//! the Role and the sandboxes' NetworkPolicy are exactly what the backend generates; the
//! names that tie the objects together agree; the ConfigMap's sandboxd.toml loads with the
//! real config loader (an unknown key is an error there).

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use sandboxd_core::config::Config;
use sandboxd_kubernetes::spec;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// Every manifest file, by name, as JSON.
fn files() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir()).unwrap() {
        let path = entry.unwrap().path();
        // agent-sandbox/: the optional Role of that mode (agent_sandbox.rs checks it).
        if path.is_dir() {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.ends_with(".json"),
            "{name}: only JSON manifests live here (no YAML parser in the workspace)"
        );
        let text = std::fs::read_to_string(&path).unwrap();
        out.insert(name, serde_json::from_str(&text).unwrap());
    }
    out
}

/// Deserialize as `T`, serialize again and demand the same JSON: nothing dropped or renamed.
fn round_trip<T: DeserializeOwned + Serialize>(name: &str, value: &Value) -> T {
    let typed: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{name} does not parse as its kind: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        &back, value,
        "{name} changes in a round trip through its type: a field is misspelt, misplaced or of the wrong type"
    );
    typed
}

/// The one object of `kind` among the files (each kind appears in exactly one file, except
/// Namespace).
fn one<T: DeserializeOwned + Serialize>(files: &BTreeMap<String, Value>, kind: &str) -> T {
    let mut found: Vec<_> = files.iter().filter(|(_, v)| v["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "exactly one {kind}");
    let (name, value) = found.remove(0);
    round_trip(name, value)
}

#[test]
fn every_manifest_round_trips_through_the_type_its_kind_names() {
    let files = files();
    assert!(files.len() >= 9, "{:?}", files.keys());
    for (name, value) in &files {
        match value["kind"].as_str().unwrap_or_default() {
            "Namespace" => drop(round_trip::<Namespace>(name, value)),
            "ServiceAccount" => drop(round_trip::<ServiceAccount>(name, value)),
            "Role" => drop(round_trip::<Role>(name, value)),
            "RoleBinding" => drop(round_trip::<RoleBinding>(name, value)),
            "NetworkPolicy" => drop(round_trip::<NetworkPolicy>(name, value)),
            "ConfigMap" => drop(round_trip::<ConfigMap>(name, value)),
            "Deployment" => drop(round_trip::<Deployment>(name, value)),
            "Service" => drop(round_trip::<Service>(name, value)),
            other => panic!("{name}: kind {other:?} is not one this test knows"),
        }
    }
    // kubectl applies a directory in file-name order: the namespaces must come first.
    let first_two: Vec<&Value> = files.values().take(2).collect();
    assert!(first_two.iter().all(|v| v["kind"] == "Namespace"));
}

#[test]
fn rbac_and_network_policy_are_the_generated_ones() {
    let files = files();
    let role: Role = one(&files, "Role");
    let ns = role.metadata.namespace.clone().unwrap();
    assert_eq!(
        role,
        spec::role(&ns),
        "the Role must grant exactly what the backend's does"
    );
    let np: NetworkPolicy = one(&files, "NetworkPolicy");
    assert_eq!(np, spec::network_policy(&ns));

    // The binding ties that Role, in the sandboxes' namespace, to serve's account.
    let sa: ServiceAccount = one(&files, "ServiceAccount");
    let rb: RoleBinding = one(&files, "RoleBinding");
    assert_eq!(rb.metadata.namespace.as_deref(), Some(ns.as_str()));
    assert_eq!(
        (rb.role_ref.kind.as_str(), &rb.role_ref.name),
        ("Role", role.metadata.name.as_ref().unwrap())
    );
    let subjects = rb.subjects.unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(&subjects[0].name), sa.metadata.name.as_ref());
    assert_eq!(subjects[0].namespace, sa.metadata.namespace);

    // Both namespaces exist in the files and enforce the restricted Pod Security profile.
    let namespaces: Vec<Namespace> = files
        .values()
        .filter(|v| v["kind"] == "Namespace")
        .map(|v| serde_json::from_value(v.clone()).unwrap())
        .collect();
    for want in [&ns, sa.metadata.namespace.as_ref().unwrap()] {
        let n = namespaces
            .iter()
            .find(|n| n.metadata.name.as_ref() == Some(want))
            .unwrap_or_else(|| panic!("no Namespace {want}"));
        let labels = n.metadata.labels.as_ref().unwrap();
        assert_eq!(
            labels
                .get("pod-security.kubernetes.io/enforce")
                .map(String::as_str),
            Some("restricted")
        );
    }
}

#[test]
fn the_serve_deployment_is_hardened_and_wired() {
    let files = files();
    let d: Deployment = one(&files, "Deployment");
    let sa: ServiceAccount = one(&files, "ServiceAccount");
    let svc: Service = one(&files, "Service");
    let cm: ConfigMap = one(&files, "ConfigMap");
    let spec_ = d.spec.as_ref().unwrap();
    assert_eq!(spec_.replicas, Some(2));
    let template = &spec_.template;
    let pod = template.spec.as_ref().unwrap();
    assert_eq!(pod.service_account_name, sa.metadata.name);
    assert_eq!(
        (pod.host_network, pod.host_pid, pod.host_ipc),
        (Some(false), Some(false), Some(false))
    );
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
    for v in pod.volumes.iter().flatten() {
        assert!(v.host_path.is_none(), "no host path");
        if let Some(e) = &v.empty_dir {
            assert!(e.size_limit.is_some(), "bounded emptyDir {}", v.name);
        }
    }
    assert_eq!(pod.containers.len(), 1);
    let c = &pod.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert!(caps.add.is_none());
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert!(limits.contains_key("cpu") && limits.contains_key("memory"));

    // The store URL comes from a Secret, never from the ConfigMap.
    let env = c.env.as_ref().unwrap();
    let store = env.iter().find(|e| e.name == "SANDBOXD_STORE_URL").unwrap();
    assert!(store.value.is_none());
    assert!(store.value_from.as_ref().unwrap().secret_key_ref.is_some());
    for e in env {
        assert!(
            e.value.as_deref().is_none_or(|v| !v.contains("://")),
            "{}: a URL in plain env",
            e.name
        );
    }

    // Probes on the health routes with a loopback Host (serve's Host check allows loopback).
    for (probe, path) in [
        (&c.readiness_probe, "/readyz"),
        (&c.liveness_probe, "/healthz"),
    ] {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        let host = get
            .http_headers
            .iter()
            .flatten()
            .find(|h| h.name == "Host")
            .unwrap();
        assert_eq!(host.value, "localhost");
    }

    // The Service selects the pods, and the config mount is this ConfigMap.
    let labels = template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
    let selector = svc.spec.as_ref().unwrap().selector.as_ref().unwrap();
    assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)) && !selector.is_empty());
    assert!(pod.volumes.iter().flatten().any(|v| {
        v.config_map
            .as_ref()
            .is_some_and(|m| Some(&m.name) == cm.metadata.name.as_ref())
    }));
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/etc/sandboxd")
        .unwrap();
    assert_eq!(mount.read_only, Some(true));
}

#[test]
fn the_config_map_loads_with_the_real_loader() {
    let files = files();
    let cm: ConfigMap = one(&files, "ConfigMap");
    let role: Role = one(&files, "Role");
    let toml = cm.data.as_ref().unwrap().get("sandboxd.toml").unwrap();
    let file = tempfile_in_target(toml);
    let env = [(
        "SANDBOXD_STORE_URL".to_string(),
        "postgres://sandboxd:pw@db:5432/sandboxd".to_string(),
    )];
    let config = Config::load_with_env(Some(&file), &env).unwrap();
    std::fs::remove_file(&file).unwrap();
    assert_eq!(config.runtime.backend, "kubernetes");
    assert_eq!(
        Some(&config.kubernetes.namespace),
        role.metadata.namespace.as_ref()
    );
    assert!(!config.kubernetes.image.is_empty());
    assert!(
        config.store.url.starts_with("postgres://"),
        "from the Secret's env"
    );
    assert!(
        !toml.contains("postgres://"),
        "no store URL in the ConfigMap"
    );
}

/// The TOML written where the loader can read it (a name unique to this process).
fn tempfile_in_target(text: &str) -> PathBuf {
    let path =
        std::env::temp_dir().join(format!("sandboxd-k8s-manifest-{}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}
