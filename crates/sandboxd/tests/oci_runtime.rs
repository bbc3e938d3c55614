//! The OCI runtime tier on the real engine: a runtime that is not registered with Docker
//! (as `runsc` is not until gVisor is installed and listed in daemon.json) fails the create
//! with an error that names the setting and the fix, and leaves no container behind; and
//! sessions under gVisor (`runsc`) for real: the kernel is gVisor's, and the shell, `ls`, the
//! file helper with files of megabytes, the python tool and Chromium work.
//!
//! The gVisor test runs where Docker has `runsc` registered. Where it is not, it fails if CI
//! promised it (`SANDBOXD_TEST_RUNSC=1`, set by .ci/run after scripts/gvisor.sh) and says
//! that it did not run otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;

use sandboxd_core::config::{Config, LimitRequest, SessionsConfig};
use sandboxd_core::sandbox::{CreateOptions, Owner, SessionManager, ShellOptions};
use sandboxd_core::tools::browser::BrowserUse;
use sandboxd_core::tools::{Tool, ToolContext};
use sandboxd_docker::DockerRuntime;

#[tokio::test]
async fn an_unregistered_oci_runtime_is_a_clear_error_and_leaves_nothing() {
    let base = support::runtime().await;
    let engine = sandboxd_docker::connect().await.unwrap();
    let name = "sandboxd-test-no-such-runtime";
    let registered = base.registered_runtimes().await.unwrap();
    assert!(registered.iter().any(|r| r == "runc"), "{registered:?}");
    assert!(!registered.iter().any(|r| r == name));
    let rt = DockerRuntime::new(engine, base.image().to_string(), Some(name.into()));
    let m = SessionManager::new(
        Arc::new(rt),
        support::test_limits(),
        SessionsConfig::default(),
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    // An owner of this test alone: other tests' sessions pass through the created state while
    // they start (for longer under load), so only this owner's containers are looked for.
    let owner = Owner::new("oci-unregistered").unwrap();
    let err = m
        .create(&owner, &LimitRequest::default(), CreateOptions::default())
        .await
        .err()
        .expect("an unregistered runtime cannot create");
    let text = err.to_string();
    assert!(
        text.contains("[docker] runtime")
            && text.contains("not registered with Docker; install it")
            && text.contains("or set [docker] runtime = \"\""),
        "{text}"
    );
    assert!(m.live().await.is_empty());
    // No container of this owner is left, in any state.
    let created = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=sandboxd.owner={owner}"),
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&created.stdout).trim().is_empty());
}

#[tokio::test]
async fn sessions_run_under_gvisor_when_runsc_is_registered() {
    let base = support::runtime().await;
    let registered = base.registered_runtimes().await.unwrap();
    if !registered.iter().any(|r| r == "runsc") {
        let promised = std::env::var("SANDBOXD_TEST_RUNSC").is_ok_and(|v| v == "1");
        assert!(
            !promised,
            "SANDBOXD_TEST_RUNSC=1 promises gVisor, but Docker has no runtime named runsc \
             (registered: {registered:?}); run scripts/gvisor.sh"
        );
        eprintln!("NOT RUN: Docker has no runsc runtime (registered: {registered:?})");
        return;
    }
    let engine = sandboxd_docker::connect().await.unwrap();
    let rt = DockerRuntime::new(engine, base.image().to_string(), Some("runsc".into()));
    let m = SessionManager::new(
        Arc::new(rt),
        support::test_limits(),
        SessionsConfig::default(),
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    // Its own owner: the other test here looks for "test" sessions in the created state,
    // which a runsc create passes through for about a second.
    let s = m
        .create(
            &Owner::new("test-gvisor").unwrap(),
            &LimitRequest::default(),
            CreateOptions::default(),
        )
        .await
        .unwrap();
    let _guard = support::Cleanup(s.handle.clone());
    let sh = |c: &'static str| {
        let sb = s.sandbox.clone();
        async move { sb.shell(c, ShellOptions::default()).await.unwrap() }
    };
    let dmesg = sh("dmesg | head -1").await.stdout_lossy();
    assert!(dmesg.contains("gVisor"), "not under gVisor: {dmesg}");
    assert_eq!(sh("id -u").await.stdout_lossy().trim(), "1000");
    let ifaces = sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        .await
        .stdout_lossy();
    assert_eq!(ifaces.trim(), "lo", "no network but loopback");

    // The file helper and the python driver, through the tools as the model calls them.
    s.sandbox
        .write_file("/workspace/in.txt", b"under gvisor")
        .await
        .unwrap();
    assert_eq!(
        s.sandbox.read_file("/workspace/in.txt").await.unwrap(),
        b"under gvisor"
    );
    let config = Config::load_with_env(None, &[]).unwrap();
    let tools = sandboxd_core::tools::session::server_tools(s.sandbox.clone(), &s.limits, &config);
    let r = tools
        .execute(
            "python",
            r#"{"code":"open('/workspace/in.txt').read().upper()"}"#,
            &ToolContext::default(),
        )
        .await
        .unwrap();
    assert!(!r.is_error(), "{}", r.render());
    assert!(r.render().contains("UNDER GVISOR"), "{}", r.render());

    // Frames of 1 MiB and more: runsc takes 64 KiB of one pipe write, so a helper that wrote
    // a frame in one call sent half of it and the host waited for the rest until its timeout.
    let big: Vec<u8> = (0..3 * 1024 * 1024 + 7)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    s.sandbox
        .write_file("/workspace/big.bin", &big)
        .await
        .unwrap();
    assert!(s.sandbox.read_file("/workspace/big.bin").await.unwrap() == big);

    // coreutils' statx (AT_NO_AUTOMOUNT), which Debian 12's runsc 0.0~20221219 refused.
    let ls = sh("ls /workspace && stat -c '%u %s' /workspace/big.bin").await;
    assert_eq!(
        ls.stdout_lossy(),
        "big.bin\nin.txt\n1000 3145735\n",
        "{}",
        ls.stderr_lossy()
    );

    // Chromium: about twenty processes, which the host pids limit must leave room for (under
    // gVisor it counts host tasks; the same 256 killed the whole sandbox).
    s.sandbox
        .write_file(
            "/workspace/page.html",
            b"<html><head><title>Under gVisor</title></head><body><p>kernel in user space</p></body></html>",
        )
        .await
        .unwrap();
    let browser = BrowserUse::new(s.sandbox.clone());
    let r = browser
        .execute(
            serde_json::json!({"action": "go_to_url", "url": "file:///workspace/page.html"}),
            &ToolContext::default(),
        )
        .await
        .unwrap();
    assert!(r.error.is_none(), "{}", r.render());
    let r = browser
        .execute(
            serde_json::json!({"action": "extract_content", "goal": "the text"}),
            &ToolContext::default(),
        )
        .await
        .unwrap();
    assert!(
        r.render().contains("kernel in user space"),
        "{}",
        r.render()
    );
    browser.shutdown().await;
    assert!(s.sandbox.is_alive().await);
}
