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
    let oci_runtime = std::env::var("SANDBOXD_DOCKER_RUNTIME")
        .ok()
        .filter(|r| !r.is_empty());
    runtime_under(oci_runtime).await
}

/// The runtime on the real engine and image, under an OCI runtime (None: the engine's default).
pub async fn runtime_under(oci_runtime: Option<String>) -> DockerRuntime {
    let engine = sandboxd_docker::connect()
        .await
        .expect("this test needs a running Docker engine (CI starts one)");
    let image = match std::env::var("SANDBOXD_DOCKER_IMAGE") {
        Ok(tag) if !tag.is_empty() => tag,
        _ => ensure_image(&engine, &|_| {})
            .await
            .expect("the sandbox image is missing and could not be built"),
    };
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

/// `docker kill` outside sandboxd: the engine's `die`, inspected, is a stop with its code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_killed_outside_sandboxd_is_reported_with_its_exit_code() -> anyhow::Result<()>
{
    use sandboxd_core::sandbox::runtime::SandboxSpec;
    use sandboxd_core::sandbox::vanished::VanishKind;
    let rt: Arc<dyn Runtime> = Arc::new(runtime().await);
    let mut reports = rt.vanished();
    let spec = SandboxSpec {
        session_id: format!("dockerkill{}", std::process::id()),
        owner: Some(sandboxd_core::sandbox::Owner::new("conformance")?),
        pooled: false,
        limits: sandboxd_core::config::Limits::default(),
        keep: false,
        replica: None,
        image: None,
        restore_bytes: None,
    };
    let (handle, _) = rt.create(&spec).await?;
    let out = tokio::process::Command::new("docker")
        .args(["kill", &handle])
        .output()
        .await?;
    let first = async {
        loop {
            match reports.recv().await {
                Ok(r) if r.handle == handle => return Ok(r),
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => return Err(e),
            }
        }
    };
    let report = tokio::time::timeout(std::time::Duration::from_secs(60), first).await;
    rt.remove(&handle).await?;
    anyhow::ensure!(out.status.success(), "docker kill: {out:?}");
    let report = report??;
    assert_eq!(report.session_id, spec.session_id);
    assert_eq!(report.kind, VanishKind::Exited { code: 137 });
    Ok(())
}
