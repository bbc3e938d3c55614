//! The hibernation timer of the SessionManager over the fake runtime, under
//! `tokio::time::pause()`: a kept session unused past `[sessions] hibernate_after_secs` is
//! offered to the hibernator once (a used, held or unkept one never; one past its idle
//! timeout is reaped instead); a hibernated session leaves the table without an end; one the
//! hibernator declined is offered again only after a new use and a new idle stretch; and
//! `recreate` makes the sandbox again under the same id and limits. No Docker; virtual time.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandboxd_core::config::{LimitRequest, Limits, SessionsConfig};
use sandboxd_core::sandbox::hibernate::Hibernator;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::{CreateOptions, Owner, SandboxError, SessionManager};
use support::fake_runtime::FakeRuntime;

const KEPT: CreateOptions = CreateOptions { keep: true };
const FRESH: CreateOptions = CreateOptions { keep: false };

/// Records what it is offered; hibernates (takes the session out, removes its sandbox) or
/// declines.
struct Recorder {
    manager: Mutex<Option<Arc<SessionManager>>>,
    offered: Mutex<Vec<String>>,
    accept: bool,
}

#[async_trait]
impl Hibernator for Recorder {
    async fn hibernate(&self, session: Arc<Session>) -> bool {
        self.offered.lock().unwrap().push(session.id.clone());
        if !self.accept {
            return false;
        }
        let m = self.manager.lock().unwrap().clone().unwrap();
        assert!(m.take_idle(&session, Duration::ZERO));
        m.remove_kept(&session).await.unwrap();
        true
    }
}

impl Recorder {
    fn offered(&self) -> Vec<String> {
        self.offered.lock().unwrap().clone()
    }
}

fn setup(
    rt: &Arc<FakeRuntime>,
    hibernate_after: u64,
    idle: u64,
    accept: bool,
) -> (Arc<SessionManager>, Arc<Recorder>) {
    let m = SessionManager::new(
        rt.clone(),
        Limits::default(),
        SessionsConfig {
            idle_timeout_secs: idle,
            reap_interval_secs: 10,
            hibernate_after_secs: hibernate_after,
            ..SessionsConfig::default()
        },
        Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    let rec = Arc::new(Recorder {
        manager: Mutex::new(Some(m.clone())),
        offered: Mutex::default(),
        accept,
    });
    m.set_hibernator(rec.clone());
    (m, rec)
}

fn owner() -> Owner {
    Owner::new("serve:ann").unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_idle_kept_session_hibernates_once_and_does_not_end() {
    let rt = FakeRuntime::new();
    let (m, rec) = setup(&rt, 60, 600, true);
    let mut ends = m.subscribe_ends();
    let _reaper = m.spawn_reaper();
    let a = owner();
    let idle = m.create(&a, &LimitRequest::default(), KEPT).await.unwrap();
    let used = m.create(&a, &LimitRequest::default(), KEPT).await.unwrap();
    let held = m.create(&a, &LimitRequest::default(), KEPT).await.unwrap();
    let unkept = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
    let _holding = held.hold();
    tokio::time::sleep(Duration::from_secs(55)).await;
    assert!(rec.offered().is_empty(), "not before 60 s");
    for _ in 0..6 {
        m.get(&a, &used.id).await.unwrap();
        tokio::time::sleep(Duration::from_secs(25)).await;
    }
    // 205 s: the idle one was offered at the first tick past 60 s, once.
    assert_eq!(rec.offered(), vec![idle.id.clone()]);
    assert!(m.held(&a, &idle.id).is_none(), "out of the table");
    assert!(!rt.sessions().contains(&idle.id), "its sandbox is gone");
    assert!(rt.sessions().contains(&used.id) && rt.sessions().contains(&held.id));
    assert!(
        rt.sessions().contains(&unkept.id),
        "an unkept session never hibernates"
    );
    assert!(ends.try_recv().is_err(), "hibernation is no end");
}

#[tokio::test(start_paused = true)]
async fn a_declined_session_is_offered_again_only_after_a_new_idle_stretch() {
    let rt = FakeRuntime::new();
    let (m, rec) = setup(&rt, 30, 600, false);
    let _reaper = m.spawn_reaper();
    let a = owner();
    let s = m.create(&a, &LimitRequest::default(), KEPT).await.unwrap();
    tokio::time::sleep(Duration::from_secs(200)).await;
    assert_eq!(
        rec.offered(),
        vec![s.id.clone()],
        "declined: not offered every tick"
    );
    m.get(&a, &s.id).await.unwrap();
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert_eq!(
        rec.offered().len(),
        2,
        "used, then idle again: offered again"
    );
    assert!(m.held(&a, &s.id).is_some(), "declined: it stays live");
}

#[tokio::test(start_paused = true)]
async fn past_its_idle_timeout_a_session_ends_instead() {
    let rt = FakeRuntime::new();
    // hibernate_after not below the idle timeout: hibernation never happens.
    let (m, rec) = setup(&rt, 120, 120, true);
    let mut ends = m.subscribe_ends();
    let _reaper = m.spawn_reaper();
    let a = owner();
    let s = m.create(&a, &LimitRequest::default(), KEPT).await.unwrap();
    // Its own timeout shorter than hibernate_after: ended, never offered.
    let (m2, rec2) = setup(&rt, 60, 600, true);
    let _reaper2 = m2.spawn_reaper();
    let short = m2.create(&a, &LimitRequest::default(), KEPT).await.unwrap();
    short.set_idle_timeout(Duration::from_secs(40));
    tokio::time::sleep(Duration::from_secs(200)).await;
    assert!(rec.offered().is_empty() && rec2.offered().is_empty());
    assert_eq!(
        ends.try_recv().unwrap().id,
        s.id,
        "reaped at its idle timeout"
    );
    assert!(rt.sessions().is_empty(), "both ended: {:?}", rt.sessions());
}

#[tokio::test(start_paused = true)]
async fn recreate_makes_the_same_session_again_within_the_caps() {
    let rt = FakeRuntime::new();
    let (m, _rec) = setup(&rt, 60, 600, true);
    let a = owner();
    let req = LimitRequest {
        memory_mb: Some(256),
        ..LimitRequest::default()
    };
    let s = m.create(&a, &req, KEPT).await.unwrap();
    let (id, limits) = (s.id.clone(), s.limits.clone());
    assert!(m.take_idle(&s, Duration::ZERO));
    m.remove_kept(&s).await.unwrap();
    drop(s);
    let again = m
        .recreate(&a, &id, &limits, None, None, None)
        .await
        .unwrap();
    assert_eq!(again.id, id);
    assert_eq!(again.limits.memory_mb, 256);
    assert!(again.keep);
    assert_eq!(rt.sessions(), vec![id.clone()]);
    assert!(Arc::ptr_eq(&m.held(&a, &id).unwrap(), &again));
    // A second recreate of a held session is that session, not a second sandbox.
    let same = m
        .recreate(&a, &id, &limits, None, None, None)
        .await
        .unwrap();
    assert!(Arc::ptr_eq(&same, &again));
    assert_eq!(rt.creates(), 2);
}

#[tokio::test(start_paused = true)]
async fn recreate_removes_only_the_hibernated_sandbox_never_another_resume() {
    let rt = FakeRuntime::new();
    let (m, _rec) = setup(&rt, 60, 600, true);
    let a = owner();
    let s = m.create(&a, &LimitRequest::default(), KEPT).await.unwrap();
    let (id, limits, handle) = (s.id.clone(), s.limits.clone(), s.handle.clone());
    // Taken out of the table, its sandbox left running: as another process's resume looks.
    assert!(m.take_idle(&s, Duration::ZERO));
    drop(s);
    let busy = m
        .recreate(&a, &id, &limits, None, Some("another-handle"), None)
        .await;
    assert!(
        matches!(busy, Err(SandboxError::Busy(_))),
        "{:?}",
        busy.err()
    );
    assert_eq!(rt.sessions(), vec![id.clone()], "left alone");
    assert_eq!(rt.creates(), 1);
    // The hibernated sandbox itself (a hibernation that stopped after its record) goes.
    let again = m
        .recreate(&a, &id, &limits, None, Some(&handle), None)
        .await
        .unwrap();
    assert_ne!(again.handle, handle);
    assert_eq!(rt.sessions(), vec![id.clone()]);
    assert_eq!(rt.creates(), 2);
}
