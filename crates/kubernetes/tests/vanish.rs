//! Pods that end outside sandboxd, against the fake API server's watch (fake/watch.rs): the
//! runtime conformance case (a pod deleted behind the runtime's back is reported, one it
//! deleted itself is not), and through the core's manager, unchanged, a session whose pod
//! is evicted (mid-command), OOM-killed or deleted by someone else ends at once with that
//! reason, also after the watch was cut and its resourceVersion expired (410: list again);
//! and a resumed session's pod, which has the name of the one the runtime deleted, is
//! reported when it is evicted.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandboxd_core::config::{LimitRequest, Limits, SessionsConfig};
use sandboxd_core::sandbox::ends::{EndReason, Ended};
use sandboxd_core::sandbox::records::NoRecords;
use sandboxd_core::sandbox::runtime::{Runtime, SandboxSpec};
use sandboxd_core::sandbox::vanished::VanishKind;
use sandboxd_core::sandbox::{CreateOptions, ExecRequest, Owner, SandboxError, SessionManager};
use sandboxd_testkit::conformance::{OutOfBand, vanish_conformance};
use tokio::sync::broadcast::Receiver;

use crate::conformance::runtime;
use crate::fake::FakeApi;

/// A bound on waiting for an end event, never a pause.
const WAIT: Duration = Duration::from_secs(60);

struct DeleteBehind(Arc<FakeApi>);

#[async_trait]
impl OutOfBand for DeleteBehind {
    async fn delete(&self, handle: &str) -> anyhow::Result<()> {
        self.0.delete_behind("sandboxd", handle);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_runtime_reports_pods_deleted_behind_its_back() -> anyhow::Result<()> {
    let fake = Arc::new(FakeApi::start(false).await?);
    let rt: Arc<dyn Runtime> = Arc::new(runtime(&fake).await);
    vanish_conformance(rt, Arc::new(DeleteBehind(fake))).await
}

async fn next_end(ends: &mut Receiver<Ended>) -> Ended {
    tokio::time::timeout(WAIT, ends.recv())
        .await
        .expect("the session ends within the bound")
        .expect("an end event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_evicted_oom_killed_or_deleted_ends_its_session_with_the_reason() -> anyhow::Result<()>
{
    let fake = FakeApi::start(false).await?;
    let rt = Arc::new(runtime(&fake).await);
    let limits = Limits {
        memory_mb: 256,
        ..Limits::default()
    };
    let m = SessionManager::new(
        rt.clone(),
        limits,
        SessionsConfig::default(),
        Arc::new(NoRecords),
    );
    let watch = m.spawn_vanish_watch();
    let mut ends = m.subscribe_ends();
    let alice = Owner::new("alice")?;
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(
            m.create(&alice, &LimitRequest::default(), CreateOptions::default())
                .await?,
        );
    }

    // Evicted in the middle of a command: the command fails instead of waiting an hour.
    let evicted = sessions[0].clone();
    let sandbox = evicted.sandbox.clone();
    let command = tokio::spawn(async move {
        sandbox
            .exec(ExecRequest::shell_line("sleep 3600").timeout(Duration::from_secs(3600)))
            .await
    });
    fake.evict("sandboxd", &evicted.handle);
    let ended = next_end(&mut ends).await;
    assert_eq!(ended.id, evicted.id);
    assert_eq!(
        ended.reason,
        EndReason::Vanished(VanishKind::evicted("The node was low on resource: memory."))
    );
    assert_eq!(
        ended.reason.to_string(),
        "its sandbox was evicted: The node was low on resource: memory."
    );
    let out = tokio::time::timeout(WAIT, command).await??;
    assert!(
        matches!(out, Err(SandboxError::SandboxGone { .. })),
        "{out:?}"
    );
    assert!(
        rt.find(&evicted.id).await?.is_none(),
        "what was left of the evicted pod is removed"
    );

    fake.oom_kill("sandboxd", &sessions[1].handle);
    let ended = next_end(&mut ends).await;
    assert_eq!(ended.id, sessions[1].id);
    assert_eq!(
        ended.reason.to_string(),
        "its sandbox was killed for running out of memory"
    );

    fake.delete_behind("sandboxd", &sessions[2].handle);
    let ended = next_end(&mut ends).await;
    assert_eq!(ended.id, sessions[2].id);
    assert_eq!(
        ended.reason.to_string(),
        "its sandbox was removed outside sandboxd"
    );

    // The watch drops and its resourceVersion is gone (410): the runtime lists again, and a
    // pod deleted meanwhile is still told.
    fake.cut_watches();
    fake.delete_behind("sandboxd", &sessions[3].handle);
    let ended = next_end(&mut ends).await;
    assert_eq!(ended.id, sessions[3].id);
    assert_eq!(ended.reason, EndReason::Vanished(VanishKind::Deleted));

    assert!(m.live().await.is_empty(), "every session ended");
    assert!(ends.try_recv().is_err(), "each ended exactly once");
    watch.abort();
    Ok(())
}

fn spec(id: &str) -> anyhow::Result<SandboxSpec> {
    Ok(SandboxSpec {
        session_id: id.to_string(),
        owner: Some(Owner::new("alice")?),
        limits: Limits {
            memory_mb: 256,
            ..Limits::default()
        },
        keep: true,
        pooled: false,
        replica: None,
        image: None,
        restore_bytes: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_sessions_pod_of_the_same_name_is_reported_when_evicted() -> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    let rt = runtime(&fake).await;
    let mut reports = rt.vanished();
    let id = format!("resumed{:x}", std::process::id());
    // Hibernated: its pod deleted by the runtime itself (not news)...
    let (first, _) = rt.create(&spec(&id)?).await?;
    rt.remove(&first).await?;
    // ...then resumed under the same session id, so the same pod name.
    let (second, _) = rt.create(&spec(&id)?).await?;
    assert_eq!(first, second, "the same pod name");
    fake.evict("sandboxd", &second);
    let report = tokio::time::timeout(WAIT, reports.recv())
        .await
        .expect("the eviction of the resumed pod is reported")?;
    assert_eq!(report.handle, second);
    assert_eq!(report.session_id, id);
    assert!(
        matches!(report.kind, VanishKind::Evicted { .. }),
        "the eviction, not the runtime's own deletion: {report:?}"
    );
    rt.remove(&second).await?;
    Ok(())
}
