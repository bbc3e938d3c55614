//! The exec protocol's edges through the fake API server: against a v4-only server a
//! process that needs end of input gets an error that says why (not a hang) while framed
//! helpers still run; a pod evicted under a running command ends the call as gone, with
//! the eviction as the reason; the readiness probe reports the NetworkPolicy.

use std::time::Duration;

use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::runtime::{Runtime, SandboxSpec};
use sandboxd_core::sandbox::{ExecRequest, Owner, SandboxError, ShellOptions, SpawnRequest};
use tokio::io::AsyncWriteExt;

use crate::conformance::runtime;
use crate::fake::FakeApi;

/// A session spec with a unique id (`what` says which test made it).
pub(crate) fn spec(what: &str) -> SandboxSpec {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    SandboxSpec {
        session_id: format!("proto{what}{}x{nanos:x}", std::process::id()),
        owner: Some(Owner::new("protocol").unwrap()),
        pooled: false,
        limits: Limits {
            memory_mb: 256,
            ..Limits::default()
        },
        keep: false,
        replica: None,
        image: None,
        restore_bytes: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v4_only_server_refuses_stdin_close_with_a_reason() -> anyhow::Result<()> {
    let fake = FakeApi::start(true).await?;
    let rt = runtime(&fake).await;
    let (handle, sb) = rt.create(&spec("vfour")).await?;
    // Processes without end of input run: output, stderr and exit codes come back.
    let out = sb
        .exec(ExecRequest::shell_line("echo hi; echo err >&2; exit 4"))
        .await?;
    assert_eq!(
        (
            out.stdout_lossy().as_str(),
            out.stderr_lossy().as_str(),
            out.exit_code
        ),
        ("hi\n", "err\n", Some(4))
    );
    // The persistent shell frames its own commands, so it needs no stdin close.
    let sh = sb
        .shell(
            "echo shell",
            ShellOptions {
                timeout: Duration::from_secs(30),
                ..ShellOptions::default()
            },
        )
        .await?;
    assert_eq!(sh.stdout_lossy(), "shell\n");
    // A process that reads to end of input cannot be told where it is.
    let mut p = sb.spawn(SpawnRequest::new(["cat"])).await?;
    p.stdin.write_all(b"x").await?;
    let e = tokio::time::timeout(Duration::from_secs(10), p.stdin.shutdown())
        .await
        .expect("the shutdown answers at once, it does not hang")
        .unwrap_err();
    assert!(e.to_string().contains("v4.channel.k8s.io"), "{e}");
    // A one-shot exec with input (which closes it) ends at once with the reason.
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        sb.exec(
            ExecRequest::new(["cat"])
                .stdin(b"in".to_vec())
                .timeout(Duration::from_secs(60)),
        ),
    )
    .await
    .expect("an exec with input does not hang on a v4 server");
    let e = r.unwrap_err().to_string();
    assert!(e.contains("v4.channel.k8s.io"), "{e}");
    rt.remove(&handle).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_ends_the_running_command_with_the_reason() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    let rt = runtime(&fake).await;
    for (check, result) in rt.readiness().await {
        assert!(result.is_ok(), "{check}: {result:?}");
    }
    let (handle, sb) = rt.create(&spec("evict")).await?;
    let running = tokio::spawn({
        let sb = sb.clone();
        async move {
            sb.exec(ExecRequest::shell_line("sleep 60").timeout(Duration::from_secs(90)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fake.evict("sandboxd", &handle);
    let r = tokio::time::timeout(Duration::from_secs(30), running).await??;
    match r {
        Err(SandboxError::SandboxGone { message, .. }) => {
            assert!(message.contains("evicted"), "{message}")
        }
        other => panic!("an eviction under a command is SandboxGone with the reason: {other:?}"),
    }
    assert!(!sb.is_alive().await);
    rt.remove(&handle).await?;
    assert!(rt.find(sb.session_id()).await?.is_none());
    Ok(())
}
