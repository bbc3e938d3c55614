//! KubeRuntime against the runtime conformance suite, unchanged, through kube's client and
//! the fake API server (fake/), whose pods are Docker containers of the real sandbox image:
//! SANDBOXD_DOCKER_IMAGE when set, else the image this recipe builds (built now if missing).

use std::sync::Arc;

use sandboxd_core::sandbox::Runtime;
use sandboxd_docker::image::ensure_image;
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
