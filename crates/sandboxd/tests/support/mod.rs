//! Shared test plumbing: a SessionManager on the real engine and the real image, and a
//! guard that removes a test's containers even when the test panics.
#![allow(dead_code)]

pub mod cli;

#[allow(unused_imports)]
pub use sandboxd_testkit::{fake_llm, fake_runtime, fake_web};
pub mod rss;
pub mod web_browser;

use std::sync::Arc;

use sandboxd_core::config::{Config, LimitRequest, Limits, SessionsConfig};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::{CreateOptions, Owner, SessionManager};
use sandboxd_docker::image as docker_image;
use sandboxd_docker::{self as docker, DockerRuntime};

/// The image under test: SANDBOXD_DOCKER_IMAGE when set, else the one this recipe builds
/// (built now if missing — CI builds it before the tests).
pub async fn image(engine: &docker::Engine) -> String {
    if let Ok(tag) = std::env::var("SANDBOXD_DOCKER_IMAGE")
        && !tag.is_empty()
    {
        return tag;
    }
    let quiet = |_| {};
    docker_image::ensure_image(engine, &quiet)
        .await
        .expect("the sandbox image is missing and could not be built: run `sandboxd image build`")
}

/// The OCI runtime the tests' sessions run under: SANDBOXD_DOCKER_RUNTIME (the variable of
/// `[docker] runtime`, which the `sandboxd` processes tests start read too), else Docker's
/// default. `SANDBOXD_DOCKER_RUNTIME=runsc cargo test --test runtime_hardening` runs the
/// hardening tests under gVisor.
pub fn oci_runtime() -> Option<String> {
    std::env::var("SANDBOXD_DOCKER_RUNTIME")
        .ok()
        .filter(|r| !r.is_empty())
}

/// Whether the tests' sessions run under gVisor, by the backend's own rule for the name.
pub fn under_gvisor() -> bool {
    oci_runtime().is_some_and(|r| sandboxd_docker::is_gvisor(&r))
}

pub async fn runtime() -> DockerRuntime {
    let engine = docker::connect()
        .await
        .expect("these tests need a running Docker engine (CI starts one)");
    let tag = image(&engine).await;
    DockerRuntime::new(engine, tag, oci_runtime())
}

pub fn test_limits() -> Limits {
    Config::load_with_env(None, &[])
        .expect("default config")
        .limits
}

pub async fn manager_with(limits: Limits, max: usize) -> Arc<SessionManager> {
    SessionManager::new(
        Arc::new(runtime().await),
        limits,
        SessionsConfig {
            max,
            ..SessionsConfig::default()
        },
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    )
}

pub async fn manager() -> Arc<SessionManager> {
    manager_with(test_limits(), 32).await
}

/// The owner of the sessions tests create.
pub fn owner() -> Owner {
    Owner::new("test").expect("a valid owner")
}

/// Removes a session's container on drop, through the docker CLI (Drop cannot await). It
/// holds the backend's handle of the session (`Session::handle`, or what `sessions list
/// --json` shows for a CLI-made one: `cli::cleanup`), never a name derived from the id.
pub struct Cleanup(pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .output();
    }
}

/// A fresh session owned by "test", and the guard that removes it.
pub async fn session(manager: &SessionManager) -> (Arc<Session>, Cleanup) {
    session_with(manager, &LimitRequest::default()).await
}

pub async fn session_with(manager: &SessionManager, req: &LimitRequest) -> (Arc<Session>, Cleanup) {
    let s = manager
        .create(&owner(), req, CreateOptions::default())
        .await
        .expect("create a session");
    let guard = Cleanup(s.handle.clone());
    (s, guard)
}
