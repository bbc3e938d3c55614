//! agent-sandbox mode against the fake API server with agent-sandbox's CRDs and its minimal
//! controller (fake/agent_sandbox/): the runtime conformance suite, unchanged, on claims; a
//! session bound to a warm sandbox of the pool sandboxd wrote; "auto" choosing pods without
//! the CRDs and claims with them, "agent-sandbox" refusing without them; a claim that is never
//! bound timing out and deleted; the SandboxTemplate against its golden file and the
//! hardening checks; the mode's Role in deploy/kubernetes/agent-sandbox/.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::Api;
use sandboxd_core::config::{KubeMode, Limits};
use sandboxd_core::sandbox::runtime::{Runtime, SandboxSpec};
use sandboxd_core::sandbox::{Owner, SandboxError, ShellOptions};
use sandboxd_kubernetes::agent_sandbox::{self, Mode, objects};
use sandboxd_kubernetes::{AgentSandboxRuntime, PodSettings, spec};
use sandboxd_testkit::conformance::{RuntimeCaps, runtime_conformance};
use serde_json::Value;

use crate::conformance::runtime;
use crate::fake::FakeApi;
use crate::golden::assert_hardened;

fn claims(fake: &FakeApi) -> Vec<Value> {
    fake.agent_sandbox_objects("sandboxclaims", "sandboxd")
}

fn session(id: &str, limits: Limits) -> SandboxSpec {
    SandboxSpec {
        session_id: id.into(),
        owner: Owner::new("alice@example.com").ok(),
        pooled: false,
        limits,
        keep: true,
        replica: None,
        image: None,
        restore_bytes: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_conforms_in_agent_sandbox_mode() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    fake.install_agent_sandbox(true)?;
    let rt = AgentSandboxRuntime::new(runtime(&fake).await, Limits::default(), 0);
    runtime_conformance(Arc::new(rt), RuntimeCaps::full()).await?;
    assert!(
        claims(&fake).is_empty(),
        "every claim removed: {:?}",
        claims(&fake)
    );
    Ok(())
}

/// Polls the fake's store until `what` holds (the fake's controller works in the
/// background; this waits for its event, bounded).
async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..600 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_a_claim_bound_to_a_warm_sandbox_and_remove_deletes_it() -> anyhow::Result<()>
{
    let fake = FakeApi::start(false).await?;
    fake.install_agent_sandbox(true)?;
    let limits = Limits::default();
    let rt = AgentSandboxRuntime::new(runtime(&fake).await, limits.clone(), 1);
    rt.write_defaults().await?;
    let warm = |fake: &FakeApi| fake.agent_sandbox_objects("sandboxes", "sandboxd");
    until("a warm sandbox in the pool", || warm(&fake).len() == 1).await;
    let first = warm(&fake)[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();

    let (handle, sb) = rt.create(&session("asb1", limits.clone())).await?;
    assert_eq!(
        handle,
        format!("sandboxd-asb1/{first}"),
        "the warm sandbox's pod"
    );
    let claim = &claims(&fake)[0];
    assert_eq!(claim["spec"]["warmPoolRef"]["name"], objects::DEFAULT_POOL);
    assert_eq!(claim["metadata"]["labels"]["sandboxd/session"], "asb1");
    assert_eq!(
        claim["metadata"]["annotations"]["sandboxd/owner"],
        "alice@example.com"
    );
    let out = sb.shell("echo claimed", ShellOptions::default()).await?;
    assert_eq!(out.stdout_lossy(), "claimed\n");
    let found = rt.find("asb1").await?.expect("found by its claim");
    assert_eq!(found.handle, handle);
    assert!(found.keep && found.owner.is_some(), "{found:?}");
    assert!(
        rt.memory_usage(&handle).await?.is_some(),
        "usage of the bound pod"
    );
    // The pool refills with a new sandbox; the claimed one is the claim's.
    until("the pool refilled", || warm(&fake).len() == 2).await;
    let pods: Api<Pod> = Api::namespaced(fake.client()?, "sandboxd");
    let pod = pods.get(&first).await?;
    let labels = pod.metadata.labels.unwrap_or_default();
    assert!(
        labels.contains_key("agents.x-k8s.io/claim-uid"),
        "{labels:?}"
    );
    assert_eq!(
        labels.get("sandboxd/managed").map(String::as_str),
        Some("true")
    );

    rt.remove(&handle).await?;
    assert!(claims(&fake).is_empty());
    assert!(
        pods.get_opt(&first).await?.is_none(),
        "the claim's pod went with it"
    );
    assert!(rt.find("asb1").await?.is_none());
    assert!(
        rt.list().await?.is_empty(),
        "the warm sandbox is no session"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_picks_pods_without_the_crds_and_claims_with_them() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    let rt = runtime(&fake).await;
    assert_eq!(
        agent_sandbox::resolve(&rt, KubeMode::Auto).await?,
        Mode::Pods
    );
    assert_eq!(
        agent_sandbox::resolve(&rt, KubeMode::Pods).await?,
        Mode::Pods
    );
    let refused = agent_sandbox::resolve(&rt, KubeMode::AgentSandbox).await;
    let Err(e) = refused else {
        panic!("agent-sandbox mode without the CRDs starts: {refused:?}");
    };
    let msg = e.to_string();
    assert!(
        msg.contains("mode = \"agent-sandbox\"")
            && msg.contains("does not serve agent-sandbox's CRDs")
            && msg.contains("SandboxClaim"),
        "{msg}"
    );
    let made =
        agent_sandbox::session_runtime(rt.clone(), KubeMode::Auto, Limits::default(), 0).await?;
    assert!(made.1.is_none(), "auto without the CRDs: pods");

    fake.install_agent_sandbox(true)?;
    assert_eq!(
        agent_sandbox::resolve(&rt, KubeMode::Auto).await?,
        Mode::AgentSandbox
    );
    let (sessions, claims_rt) =
        agent_sandbox::session_runtime(rt, KubeMode::Auto, Limits::default(), 0).await?;
    assert!(claims_rt.is_some(), "auto with the CRDs: claims");
    let (handle, _) = sessions.create(&session("auto1", small())).await?;
    assert_eq!(claims(&fake).len(), 1, "the session is a claim");
    sessions.remove(&handle).await?;
    Ok(())
}

fn small() -> Limits {
    Limits {
        memory_mb: 256,
        ..Limits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_is_never_bound_times_out_and_is_deleted() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    // The CRDs are there, the controller is not: nothing binds a claim.
    fake.install_agent_sandbox(false)?;
    let rt = AgentSandboxRuntime::new(runtime(&fake).await, Limits::default(), 0)
        .with_bind_timeout(Duration::from_secs(1));
    let made = rt.create(&session("never1", small())).await;
    let Err(e) = made else {
        panic!("a claim nobody binds made a session");
    };
    assert!(matches!(e, SandboxError::Timeout { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("SandboxClaim sandboxd-never1")
            && msg.contains("agent-sandbox's controller")
            && msg.contains("no Ready condition yet"),
        "{msg}"
    );
    assert!(
        claims(&fake).is_empty(),
        "no claim left behind: {:?}",
        claims(&fake)
    );
    Ok(())
}

fn settings() -> PodSettings {
    PodSettings {
        image: "registry.example/sandboxd-sandbox:1".into(),
        ..PodSettings::default()
    }
}

/// The template's pod as a Pod, for the hardening checks.
fn template_pod(template: &Value) -> Pod {
    let t = &template["spec"]["podTemplate"];
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "from-template", "labels": t["metadata"]["labels"]},
        "spec": t["spec"],
    }))
    .unwrap()
}

#[test]
fn the_template_is_the_golden_one_and_nothing_weakens_it() {
    let s = settings();
    let limits = Limits::default();
    let pod = objects::pod_spec(&s, &limits, None);
    let t =
        serde_json::to_value(objects::template(objects::DEFAULT_POOL, "sandboxd", &pod)).unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/sandboxtemplate.json");
    let text = serde_json::to_string_pretty(&t).unwrap() + "\n";
    if std::env::var_os("SANDBOXD_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    assert_eq!(
        text,
        std::fs::read_to_string(&path).unwrap_or_default(),
        "SANDBOXD_BLESS=1 to accept"
    );
    // The SAME spec as a session pod's, from the same function.
    let session_pod = spec::pod(&s, &session("0123456789ab", limits.clone()), "c");
    assert_eq!(Some(pod.clone()), session_pod.spec);
    assert_hardened(&template_pod(&t));
    assert_eq!(t["spec"]["networkPolicyManagement"], "Unmanaged");
    assert_eq!(t["spec"]["envVarsInjectionPolicy"], "Disallowed");
    assert_eq!(t["spec"]["volumeClaimTemplatesPolicy"], "Disallowed");
    assert_eq!(t["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    // Whatever a request brings, only numbers reach the template, and a different pod spec
    // gets a template (and a pool with no warm sandboxes) of its own.
    let huge = Limits {
        memory_mb: u64::MAX / 2,
        cpus: 1e12,
        ..Limits::default()
    };
    let hostile = objects::pod_spec(&s, &huge, Some("x\"; hostPath: /"));
    let name = objects::template_name(&hostile, &pod);
    assert!(
        name.starts_with("sandboxd-") && name.len() == 25 && objects::is_name(&name),
        "{name}"
    );
    let t2 = serde_json::to_value(objects::template(&name, "sandboxd", &hostile)).unwrap();
    assert_hardened(&template_pod(&t2));
    let pool = serde_json::to_value(objects::warm_pool(&name, "sandboxd", 0)).unwrap();
    assert_eq!(pool["spec"]["replicas"], 0);
    assert_eq!(pool["spec"]["sandboxTemplateRef"]["name"], name.as_str());
    // A hostile session id never reaches a claim's name or labels raw.
    let c = objects::claim(
        "sandboxd",
        &session("../x,sandboxd/managed=false", limits),
        "c",
        "p",
    );
    let c = serde_json::to_value(c).unwrap();
    assert!(objects::is_name(c["metadata"]["name"].as_str().unwrap()));
    for v in c["metadata"]["labels"].as_object().unwrap().values() {
        assert!(
            sandboxd_kubernetes::meta::is_label_value(v.as_str().unwrap()),
            "{v}"
        );
    }
}

#[test]
fn the_modes_role_manifests_are_the_generated_ones() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/agent-sandbox");
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap()
    };
    let (role_json, binding_json) = (read("role.json"), read("rolebinding.json"));
    let role: Role = serde_json::from_value(role_json.clone()).unwrap();
    let back = serde_json::to_value(&role).unwrap();
    assert_eq!(back, role_json, "the Role round-trips through its type");
    let mut want = serde_json::to_value(objects::role("sandboxd")).unwrap();
    want["apiVersion"] = "rbac.authorization.k8s.io/v1".into();
    want["kind"] = "Role".into();
    assert_eq!(
        role_json, want,
        "the Role grants exactly what the mode uses"
    );
    let rb: RoleBinding = serde_json::from_value(binding_json.clone()).unwrap();
    assert_eq!(serde_json::to_value(&rb).unwrap(), binding_json);
    assert_eq!(rb.role_ref.name, objects::ROLE);
    // The same account as the base binding's, in the sandboxes' namespace.
    let base: RoleBinding =
        serde_json::from_str(&std::fs::read_to_string(dir.join("../12-rolebinding.json")).unwrap())
            .unwrap();
    assert_eq!(rb.subjects, base.subjects);
    assert_eq!(rb.metadata.namespace, base.metadata.namespace);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_the_mode_against_the_cluster_and_the_modes_role() -> anyhow::Result<()> {
    use sandboxd_kubernetes::KubeRuntime;
    use sandboxd_kubernetes::doctor::{self, Level};
    let fake = FakeApi::start(false).await?;
    let mut settings = runtime(&fake).await.settings().clone();
    settings.mode = "agent-sandbox".into();
    // No namespace: no pod is admitted, so the network probe does not run here.
    fake.cluster().set_namespaces(&["elsewhere"]);
    let rt = KubeRuntime::new(fake.client()?, settings);
    let with = |checks: &[doctor::Check], level: Level, text: &str| {
        checks
            .iter()
            .any(|c| c.level == level && c.what.contains(text))
    };
    let checks = doctor::checks(&rt).await;
    assert!(
        with(&checks, Level::Fail, "does not serve agent-sandbox's CRDs"),
        "{checks:#?}"
    );
    fake.install_agent_sandbox(false)?;
    fake.cluster().deny("create", "sandboxclaims");
    let checks = doctor::checks(&rt).await;
    assert!(
        with(&checks, Level::Ok, "sessions are SandboxClaims"),
        "{checks:#?}"
    );
    assert!(
        with(&checks, Level::Fail, "may not create sandboxclaims"),
        "{checks:#?}"
    );
    Ok(())
}
