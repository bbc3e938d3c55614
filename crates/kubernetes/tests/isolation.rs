//! "No network", verified: the probe pod against the fake API server whose network plugin
//! enforces NetworkPolicy (its pods run with `--network none`) and against one that does
//! not (a Docker bridge), probing the same target — a listener on the host that counts
//! what reaches it — so the two branches differ only in the cluster. Where the policy is
//! not enforced no session starts and every refusal says why; doctor's cluster checks
//! name a missing namespace and each verb the account lacks.

use sandboxd_core::sandbox::ShellOptions;
use sandboxd_core::sandbox::runtime::Runtime;
use sandboxd_kubernetes::doctor::{self, Level};
use sandboxd_kubernetes::probe::Verdict;
use sandboxd_kubernetes::{KubeRuntime, PodSettings};

use crate::conformance::image;
use crate::fake::FakeApi;
use crate::fake::cluster::Outside;
use crate::protocol::spec;

/// A runtime on `fake` whose probe tries only `outside` (and so finishes at once).
async fn runtime(fake: &FakeApi, outside: &Outside) -> KubeRuntime {
    let settings = PodSettings {
        image: image().await,
        egress_probe: vec![outside.target.clone()],
        ..PodSettings::default()
    };
    KubeRuntime::new(fake.client().unwrap(), settings)
}

fn fails(checks: &[doctor::Check]) -> Vec<String> {
    checks
        .iter()
        .filter(|c| c.level == Level::Fail)
        .map(|c| c.what.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_the_plugin_enforces_the_policy_the_probe_passes_and_sessions_start()
-> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    let outside = Outside::start().await?;
    let rt = runtime(&fake, &outside).await;
    match rt.probe_network().await? {
        Verdict::Isolated(blocked) => {
            assert_eq!(blocked.len(), 1, "{blocked:?}");
            assert!(blocked[0].starts_with(&outside.target), "{blocked:?}");
        }
        leaks => panic!("a pod with no network reached something: {leaks:?}"),
    }
    assert_eq!(outside.accepted(), 0);
    let (handle, sb) = rt.create(&spec("on")).await?;
    let out = sb.shell("echo up", ShellOptions::default()).await?;
    assert_eq!(out.stdout_lossy(), "up\n");
    let ready = rt.readiness().await;
    assert!(
        ready
            .iter()
            .any(|(name, r)| *name == "network isolation" && r.is_ok()),
        "{ready:?}"
    );
    rt.remove(&handle).await?;
    let checks = doctor::checks(&rt).await;
    assert_eq!(fails(&checks), Vec::<String>::new(), "{checks:#?}");
    assert!(
        checks
            .iter()
            .any(|c| c.level == Level::Ok
                && c.what.starts_with("network: sandbox pods reach nothing")),
        "{checks:#?}"
    );
    assert!(
        checks.iter().any(|c| c.what.contains("podPidsLimit")),
        "doctor says where the pids limit is (not) enforced: {checks:#?}"
    );
    // The probes left no pod behind.
    assert!(rt.list().await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_the_plugin_does_not_enforce_it_no_session_starts_and_the_error_says_why()
-> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    fake.set_enforcing(false);
    let outside = Outside::start().await?;
    let rt = runtime(&fake, &outside).await;
    match rt.probe_network().await? {
        Verdict::Leaks(leaks) => {
            assert_eq!(leaks, [format!("{} connected", outside.target)])
        }
        blocked => panic!("a bridged pod reached nothing (is docker0 firewalled?): {blocked:?}"),
    }
    assert!(outside.accepted() >= 1, "the leak is a real connection");
    let e = rt.create(&spec("off")).await.err().expect("refused");
    let message = e.to_string();
    assert!(
        message.contains("does not enforce NetworkPolicy") && message.contains(&outside.target),
        "{message}"
    );
    // The verdict holds: the next create is refused without another probe pod.
    let before = outside.accepted();
    let again = rt.create(&spec("again")).await.err().expect("refused");
    assert!(again.to_string().contains("does not enforce NetworkPolicy"));
    assert_eq!(outside.accepted(), before);
    let ready = rt.readiness().await;
    let (_, isolation) = ready
        .iter()
        .find(|(name, _)| *name == "network isolation")
        .expect("readiness checks isolation");
    assert!(
        isolation
            .as_ref()
            .is_err_and(|e| e.contains("does not enforce NetworkPolicy")),
        "{ready:?}"
    );
    let checks = doctor::checks(&rt).await;
    let failed = fails(&checks);
    assert!(
        failed.len() == 1 && failed[0].contains("does not enforce NetworkPolicy"),
        "{checks:#?}"
    );
    assert!(
        rt.list().await?.is_empty(),
        "no session pod, no probe pod left"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_a_missing_namespace_and_each_verb_the_account_lacks() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    let outside = Outside::start().await?;
    let mut settings = runtime(&fake, &outside).await.settings().clone();
    settings.image = "registry.example/sandboxd-sandbox:latest".into();
    let rt = KubeRuntime::new(fake.client()?, settings);
    fake.cluster().set_namespaces(&["elsewhere"]);
    fake.cluster().deny("create", "pods/exec");
    fake.cluster().deny("delete", "pods");
    let checks = doctor::checks(&rt).await;
    let failed = fails(&checks);
    assert!(
        failed
            .iter()
            .any(|f| f.contains("namespace sandboxd does not exist")),
        "{checks:#?}"
    );
    assert!(
        failed
            .iter()
            .any(|f| f.contains("may not delete pods, create pods/exec")),
        "{checks:#?}"
    );
    // A moving tag the nodes keep is a warning; the network is not probed where no pod
    // can be made.
    assert!(
        checks
            .iter()
            .any(|c| c.level == Level::Warn && c.what.contains("moving tag")),
        "{checks:#?}"
    );
    assert!(!checks.iter().any(|c| c.what.starts_with("network")));
    assert_eq!(outside.accepted(), 0);
    Ok(())
}
