//! KubeRuntime against the runtime conformance suite, unchanged, through kube's client and
//! the fake API server (fake/), whose pods are Docker containers of the real sandbox image:
//! SANDBOXD_DOCKER_IMAGE when set, else the image this recipe builds (built now if missing).
//! The same suite against a real cluster is an opt-in lane, ignored (and shown so) unless
//! asked for: see `the_kubernetes_runtime_conforms_on_a_real_cluster`.

use std::sync::Arc;

use sandboxd_core::sandbox::Runtime;
use sandboxd_docker::image::ensure_image;
use sandboxd_kubernetes::probe::Verdict;
use sandboxd_kubernetes::{KubeRuntime, PodSettings};
use sandboxd_testkit::conformance::{RuntimeCaps, runtime_conformance};

use crate::fake::FakeApi;

/// The sandbox image's tag, built if missing.
pub(crate) async fn image() -> String {
    match std::env::var("SANDBOXD_DOCKER_IMAGE") {
        Ok(tag) if !tag.is_empty() => tag,
        _ => {
            let engine = sandboxd_docker::connect()
                .await
                .expect("this test needs a running Docker engine (the fake's pods are containers)");
            ensure_image(&engine, &|_| {})
                .await
                .expect("the sandbox image is missing and could not be built")
        }
    }
}

pub(crate) async fn runtime(fake: &FakeApi) -> KubeRuntime {
    let settings = PodSettings {
        image: image().await,
        ..PodSettings::default()
    };
    KubeRuntime::new(fake.client().unwrap(), settings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_runtime_conforms_against_the_fake_api_server() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    let rt: Arc<dyn Runtime> = Arc::new(runtime(&fake).await);
    runtime_conformance(rt, RuntimeCaps::full()).await
}

/// The real-cluster lane: the network probe (a leak fails the lane, it is never skipped),
/// then the conformance suite, in `SANDBOXD_TEST_K8S_NAMESPACE` (default `sandboxd`, with
/// deploy/kubernetes applied) of the cluster `SANDBOXD_TEST_KUBECONFIG` names, from the
/// image `SANDBOXD_TEST_K8S_IMAGE` (pushed where the nodes pull). Ignored by default, so a
/// run without a cluster reports it "ignored" with this reason, never as passed; asked for
/// with `--ignored` and no kubeconfig set, it fails and says what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SANDBOXD_TEST_KUBECONFIG=path SANDBOXD_TEST_K8S_IMAGE=ref cargo test -p sandboxd-kubernetes --test all -- --ignored real_cluster"]
async fn the_kubernetes_runtime_conforms_on_a_real_cluster() -> anyhow::Result<()> {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "the real-cluster lane needs {name} set (README, \"On Kubernetes\")"
                )
            })
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(var("SANDBOXD_TEST_KUBECONFIG")?)?;
    sandboxd_kubernetes::install_tls_provider();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let settings = PodSettings {
        image: var("SANDBOXD_TEST_K8S_IMAGE")?,
        namespace: var("SANDBOXD_TEST_K8S_NAMESPACE").unwrap_or_else(|_| "sandboxd".into()),
        ..PodSettings::default()
    };
    let rt = KubeRuntime::new(kube::Client::try_from(config)?, settings);
    match rt.probe_network().await? {
        Verdict::Isolated(blocked) => eprintln!("network probe: every target blocked: {blocked:?}"),
        Verdict::Leaks(leaks) => anyhow::bail!(
            "this cluster's network plugin does not enforce NetworkPolicy: the probe reached {leaks:?}"
        ),
    }
    runtime_conformance(Arc::new(rt), RuntimeCaps::full()).await
}
