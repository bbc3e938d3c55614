//! The OCI runtime tier on the real engine: a runtime that is not registered with Docker
//! (as `runsc` is not until gVisor is installed and listed in daemon.json) fails the create
//! with an error that names the setting and the fix, and leaves no container behind.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

mod support;

use std::sync::Arc;

use sandboxd::config::{LimitRequest, SessionsConfig};
use sandboxd::sandbox::docker::DockerRuntime;
use sandboxd::sandbox::{CreateOptions, SessionManager};

#[tokio::test]
async fn an_unregistered_oci_runtime_is_a_clear_error_and_leaves_nothing() {
    let base = support::runtime().await;
    let engine = sandboxd::sandbox::docker::connect().await.unwrap();
    let name = "sandboxd-test-no-such-runtime";
    let registered = base.registered_runtimes().await.unwrap();
    assert!(registered.iter().any(|r| r == "runc"), "{registered:?}");
    assert!(!registered.iter().any(|r| r == name));
    let rt = DockerRuntime::new(engine, base.image().to_string(), Some(name.into()));
    let m = SessionManager::new(
        Arc::new(rt),
        support::test_limits(),
        SessionsConfig::default(),
    );
    let err = m
        .create(
            &support::owner(),
            &LimitRequest::default(),
            CreateOptions::default(),
        )
        .await
        .err()
        .expect("an unregistered runtime cannot create");
    let text = err.to_string();
    assert!(
        text.contains("[docker] runtime") && text.contains("sandboxd doctor"),
        "{text}"
    );
    assert!(m.live().await.is_empty());
    // Other tests' sessions of owner "test" may run now; none may be in the created state.
    let created = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            "status=created",
            "--filter",
            &format!("label=sandboxd.owner={}", support::owner()),
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&created.stdout).trim().is_empty());
}
