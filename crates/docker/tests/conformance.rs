//! DockerRuntime against the runtime conformance suite, on the real engine and the real
//! image: SANDBOXD_DOCKER_IMAGE when set, else the image this recipe builds (built now if
//! missing), under SANDBOXD_DOCKER_RUNTIME's OCI runtime when set (runsc: gVisor).
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

use std::sync::Arc;

use sandboxd_core::sandbox::Runtime;
use sandboxd_docker::DockerRuntime;
use sandboxd_docker::image::ensure_image;
use sandboxd_testkit::conformance::{
    OutOfBand, RuntimeCaps, runtime_conformance, vanish_conformance,
};

async fn runtime() -> DockerRuntime {
    let engine = sandboxd_docker::connect()
        .await
        .expect("this test needs a running Docker engine (CI starts one)");
    let image = match std::env::var("SANDBOXD_DOCKER_IMAGE") {
        Ok(tag) if !tag.is_empty() => tag,
        _ => ensure_image(&engine, &|_| {})
            .await
            .expect("the sandbox image is missing and could not be built"),
    };
    let oci_runtime = std::env::var("SANDBOXD_DOCKER_RUNTIME")
        .ok()
        .filter(|r| !r.is_empty());
    DockerRuntime::new(engine, image, oci_runtime)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_runtime_conforms() -> anyhow::Result<()> {
    let rt: Arc<dyn Runtime> = Arc::new(runtime().await);
    runtime_conformance(rt, RuntimeCaps::full()).await
}

/// `docker rm -f`, as an operator would, behind the runtime's back.
struct DockerRmF;

#[async_trait::async_trait]
impl OutOfBand for DockerRmF {
    async fn delete(&self, handle: &str) -> anyhow::Result<()> {
        let out = tokio::process::Command::new("docker")
            .args(["rm", "-f", handle])
            .output()
            .await?;
        anyhow::ensure!(
            out.status.success(),
            "docker rm -f {handle}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docker_runtime_reports_containers_removed_out_of_band() -> anyhow::Result<()> {
    let rt: Arc<dyn Runtime> = Arc::new(runtime().await);
    vanish_conformance(rt, Arc::new(DockerRmF)).await
}
