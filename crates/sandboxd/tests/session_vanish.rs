//! Sandboxes that end outside sandboxd, over the fake runtime under paused time: the
//! manager's watch (`SessionManager::spawn_vanish_watch`) ends the session at once with the
//! reason the runtime reported, exactly once; a command in progress there fails instead of
//! waiting for its timeout; a session the manager ended itself is never announced again; a
//! session the shared books say another replica hibernated is only forgotten (no end, its
//! records stay).
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use sandboxd_core::config::{LimitRequest, Limits, SessionsConfig};
use sandboxd_core::sandbox::ends::{EndReason, Ended};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::records::FileRecords;
use sandboxd_core::sandbox::shared::{ReapVerdict, SharedSessions, VanishVerdict};
use sandboxd_core::sandbox::vanished::{VanishKind, Vanished};
use sandboxd_core::sandbox::{CreateOptions, ExecRequest, Owner, SandboxError, SessionManager};
use support::fake_runtime::FakeRuntime;

fn manager(rt: &Arc<FakeRuntime>) -> Arc<SessionManager> {
    SessionManager::new(
        rt.clone(),
        Limits::default(),
        SessionsConfig::default(),
        Arc::new(sandboxd_core::sandbox::records::NoRecords),
    )
}

const EVICTION: &str = "The node was low on resource: memory.";

#[tokio::test(start_paused = true)]
async fn a_sandbox_evicted_mid_command_ends_its_session_with_the_reason_and_the_command_fails() {
    let rt = FakeRuntime::new();
    let m = manager(&rt);
    let watch = m.spawn_vanish_watch();
    let mut ends = m.subscribe_ends();
    let owner = Owner::new("a").unwrap();
    let s = m
        .create(&owner, &LimitRequest::default(), CreateOptions::default())
        .await
        .unwrap();
    let other = m
        .create(&owner, &LimitRequest::default(), CreateOptions::default())
        .await
        .unwrap();
    rt.hang_processes(true);
    let sandbox = s.sandbox.clone();
    let command = tokio::spawn(async move {
        sandbox
            .exec(ExecRequest::shell_line("sleep 3600").timeout(Duration::from_secs(3600)))
            .await
    });
    while rt.spawns() == 0 {
        tokio::task::yield_now().await;
    }

    assert!(rt.vanish(&s.handle, VanishKind::evicted(EVICTION)));
    let ended = ends.recv().await.unwrap();
    assert_eq!(
        ended,
        Ended {
            id: s.id.clone(),
            reason: EndReason::Vanished(VanishKind::evicted(EVICTION)),
            reading: None,
        }
    );
    assert_eq!(
        ended.reason.to_string(),
        format!("its sandbox was evicted: {EVICTION}")
    );
    assert!(m.held(&owner, &s.id).is_none(), "out of the table");
    assert!(
        m.held(&owner, &other.id).is_some(),
        "the other session lives on"
    );

    // Well before its own hour: the command notices that its sandbox is gone.
    let out = tokio::time::timeout(Duration::from_secs(60), command)
        .await
        .expect("the command in the vanished sandbox returns, it does not hang")
        .unwrap();
    assert!(
        matches!(out, Err(SandboxError::SandboxGone { .. })),
        "{out:?}"
    );

    // The same report again (a `die` then a `destroy`) ends nothing more.
    let again = Vanished {
        handle: s.handle.clone(),
        session_id: s.id.clone(),
        kind: VanishKind::Deleted,
    };
    assert!(!m.vanished(again).await);
    assert!(ends.try_recv().is_err(), "announced exactly once");
    watch.abort();
}

#[tokio::test(start_paused = true)]
async fn a_session_the_manager_ended_itself_is_not_announced_again() {
    let rt = FakeRuntime::new();
    let m = manager(&rt);
    let mut ends = m.subscribe_ends();
    let owner = Owner::new("a").unwrap();
    let s = m
        .create(&owner, &LimitRequest::default(), CreateOptions::default())
        .await
        .unwrap();
    m.remove(&owner, &s.id).await.unwrap();
    assert_eq!(ends.recv().await.unwrap().reason, EndReason::Removed);
    let late = Vanished {
        handle: s.handle.clone(),
        session_id: s.id.clone(),
        kind: VanishKind::OomKilled,
    };
    assert!(!m.vanished(late).await, "not held any more");
    assert!(
        ends.try_recv().is_err(),
        "its end was told once, as a removal"
    );
}

#[tokio::test(start_paused = true)]
async fn each_kind_of_end_is_told_as_what_happened() {
    let rt = FakeRuntime::new();
    let m = manager(&rt);
    let watch = m.spawn_vanish_watch();
    let mut ends = m.subscribe_ends();
    let owner = Owner::new("a").unwrap();
    for (kind, text) in [
        (
            VanishKind::Deleted,
            "its sandbox was removed outside sandboxd",
        ),
        (
            VanishKind::OomKilled,
            "its sandbox was killed for running out of memory",
        ),
        (
            VanishKind::Exited { code: 137 },
            "its sandbox stopped outside sandboxd (exit code 137)",
        ),
    ] {
        let s = m
            .create(&owner, &LimitRequest::default(), CreateOptions::default())
            .await
            .unwrap();
        assert!(rt.vanish(&s.handle, kind));
        let ended = ends.recv().await.unwrap();
        assert_eq!(ended.id, s.id);
        assert_eq!(ended.reason.to_string(), text);
    }
    assert!(rt.sessions().is_empty());
    watch.abort();
}

/// Shared books where some sessions are hibernated (by another replica).
struct Books(std::collections::HashSet<String>);

#[async_trait::async_trait]
impl SharedSessions for Books {
    async fn vet_idle(&self, _: &Session, _: Duration) -> ReapVerdict {
        ReapVerdict::Unknown
    }
    async fn live_replicas(&self) -> Option<Vec<String>> {
        None
    }
    async fn vet_vanished(&self, session: &Session) -> VanishVerdict {
        if self.0.contains(&session.id) {
            VanishVerdict::Forget
        } else {
            VanishVerdict::End
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_gone_with_another_replicas_hibernation_is_forgotten_and_its_records_stay() {
    let rt = FakeRuntime::new();
    let dir = tempfile::tempdir().unwrap();
    let m = SessionManager::new(
        rt.clone(),
        Limits::default(),
        SessionsConfig::default(),
        Arc::new(FileRecords::new(dir.path())),
    );
    let mut ends = m.subscribe_ends();
    let owner = Owner::new("a").unwrap();
    let keep = CreateOptions { keep: true };
    let hibernated = m
        .create(&owner, &LimitRequest::default(), keep)
        .await
        .unwrap();
    let live = m
        .create(&owner, &LimitRequest::default(), keep)
        .await
        .unwrap();
    m.share("b", Arc::new(Books([hibernated.id.clone()].into())));
    for s in [&hibernated, &live] {
        m.records().save(&s.id, "plan", b"steps").await.unwrap();
    }
    let report = |s: &Session| Vanished {
        handle: s.handle.clone(),
        session_id: s.id.clone(),
        kind: VanishKind::Deleted,
    };

    assert!(!m.vanished(report(&hibernated)).await, "not ended here");
    assert!(m.held(&owner, &hibernated.id).is_none(), "forgotten here");
    assert!(ends.try_recv().is_err(), "no end announced");
    assert_eq!(
        m.records().load(&hibernated.id, "plan").await.as_deref(),
        Some(&b"steps"[..]),
        "its shared records stay"
    );

    // A session the books still have live ends as before, its records with it.
    assert!(m.vanished(report(&live)).await);
    assert_eq!(ends.recv().await.unwrap().id, live.id);
    assert_eq!(m.records().load(&live.id, "plan").await, None);
}
