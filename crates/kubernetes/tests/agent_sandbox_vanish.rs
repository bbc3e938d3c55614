//! agent-sandbox mode's vanish watch against the fake API server and its minimal controller:
//! the runtime's vanish conformance case on claims (a claim's pod deleted behind the
//! runtime's back is reported under the claim's handle, one it removed itself is not), and
//! through the core's manager, unchanged, a session whose pod (a warm one it was bound to,
//! or a cold one) is evicted, OOM-killed or deleted by someone else ends at once with that
//! reason and the report names `<claim>/<pod>` and the session; a session the manager removes
//! itself ends as removed, never as vanished; and a warm pod nobody claimed is no report.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandboxd_core::config::{LimitRequest, Limits, SessionsConfig};
use sandboxd_core::sandbox::ends::{EndReason, Ended};
use sandboxd_core::sandbox::records::NoRecords;
use sandboxd_core::sandbox::runtime::Runtime;
use sandboxd_core::sandbox::vanished::{VanishKind, Vanished};
use sandboxd_core::sandbox::{CreateOptions, Owner, SessionManager};
use sandboxd_kubernetes::AgentSandboxRuntime;
use sandboxd_testkit::conformance::{OutOfBand, vanish_conformance};
use tokio::sync::broadcast::Receiver;

use crate::conformance::runtime;
use crate::fake::FakeApi;

/// A bound on waiting for an end event, never a pause.
const WAIT: Duration = Duration::from_secs(60);

/// The pod of a handle `<claim>/<pod>`.
fn pod_of(handle: &str) -> &str {
    handle.split_once('/').map(|(_, p)| p).unwrap_or_default()
}

struct DeletePodBehind(Arc<FakeApi>);

#[async_trait]
impl OutOfBand for DeletePodBehind {
    async fn delete(&self, handle: &str) -> anyhow::Result<()> {
        self.0.delete_behind("sandboxd", pod_of(handle));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_runtime_reports_pods_deleted_behind_its_back() -> anyhow::Result<()> {
    let fake = Arc::new(FakeApi::start(false).await?);
    fake.install_agent_sandbox(true)?;
    let rt = AgentSandboxRuntime::new(runtime(&fake).await, Limits::default(), 0);
    vanish_conformance(Arc::new(rt), Arc::new(DeletePodBehind(fake))).await
}

async fn next_end(ends: &mut Receiver<Ended>) -> Ended {
    tokio::time::timeout(WAIT, ends.recv())
        .await
        .expect("the session ends within the bound")
        .expect("an end event")
}

async fn next_report(reports: &mut Receiver<Vanished>) -> Vanished {
    tokio::time::timeout(WAIT, reports.recv())
        .await
        .expect("a report within the bound")
        .expect("a report")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_pod_evicted_oom_killed_or_deleted_ends_its_session_with_the_reason()
-> anyhow::Result<()> {
    let fake = FakeApi::start(false).await?;
    fake.install_agent_sandbox(true)?;
    let limits = Limits::default();
    // One warm sandbox: the first session adopts it, the others are cold starts.
    let rt = Arc::new(AgentSandboxRuntime::new(
        runtime(&fake).await,
        limits.clone(),
        1,
    ));
    rt.write_defaults().await?;
    let m = SessionManager::new(
        rt.clone(),
        limits,
        SessionsConfig::default(),
        Arc::new(NoRecords),
    );
    let watch = m.spawn_vanish_watch();
    let mut ends = m.subscribe_ends();
    let mut reports = rt.vanished();
    let alice = Owner::new("alice")?;
    let mut sessions = Vec::new();
    for _ in 0..4 {
        let s = m
            .create(&alice, &LimitRequest::default(), CreateOptions::default())
            .await?;
        assert!(
            s.handle.starts_with(&format!("sandboxd-{}/", s.id)),
            "{}",
            s.handle
        );
        sessions.push(s);
    }
    assert!(
        pod_of(&sessions[0].handle).starts_with("sandboxd-w"),
        "the first session has the warm pod: {}",
        sessions[0].handle
    );

    // The warm pod it was bound to, evicted: reported under the claim's handle.
    fake.evict("sandboxd", pod_of(&sessions[0].handle));
    let report = next_report(&mut reports).await;
    assert_eq!(report.handle, sessions[0].handle);
    assert_eq!(report.session_id, sessions[0].id);
    let ended = next_end(&mut ends).await;
    assert_eq!(ended.id, sessions[0].id);
    assert_eq!(
        ended.reason,
        EndReason::Vanished(VanishKind::evicted("The node was low on resource: memory."))
    );
    assert!(
        rt.find(&sessions[0].id).await?.is_none(),
        "what was left of the evicted claim is removed"
    );

    fake.oom_kill("sandboxd", pod_of(&sessions[1].handle));
    let ended = next_end(&mut ends).await;
    assert_eq!(ended.id, sessions[1].id);
    assert_eq!(ended.reason, EndReason::Vanished(VanishKind::OomKilled));

    // Removed by the manager itself: an end, but not a vanish.
    m.remove(&alice, &sessions[2].id).await?;
    let ended = next_end(&mut ends).await;
    assert_eq!(ended.id, sessions[2].id);
    assert_eq!(ended.reason, EndReason::Removed);

    // Deleted while the watch was cut and its resourceVersion expired: listed again.
    fake.cut_watches();
    fake.delete_behind("sandboxd", pod_of(&sessions[3].handle));
    let ended = next_end(&mut ends).await;
    assert_eq!(ended.id, sessions[3].id);
    assert_eq!(ended.reason, EndReason::Vanished(VanishKind::Deleted));

    // The pool's new warm sandbox, nobody's session, deleted: no report.
    let warm = fake.agent_sandbox_objects("sandboxes", "sandboxd");
    // Still the pool's (an adopted one keeps its name but loses the warm label).
    let spare = warm
        .iter()
        .filter(|s| s["metadata"]["labels"]["agents.x-k8s.io/warm-pool-sandbox"].is_string())
        .filter_map(|s| s["metadata"]["name"].as_str())
        .find(|n| n.starts_with("sandboxd-w"))
        .expect("the pool refilled")
        .to_string();
    fake.delete_behind("sandboxd", &spare);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut others = Vec::new();
    while let Ok(r) = reports.try_recv() {
        others.push(r);
    }
    assert!(
        others.iter().all(|r| !r.handle.is_empty()
            && r.handle.split_once('/').map(|(_, p)| p) != Some(spare.as_str())),
        "{others:?}"
    );
    assert!(
        others.iter().all(|r| r.session_id != sessions[2].id),
        "the manager's own removal is not reported: {others:?}"
    );
    assert!(m.live().await.is_empty(), "every session ended");
    assert!(ends.try_recv().is_err(), "each ended exactly once");
    watch.abort();
    Ok(())
}
