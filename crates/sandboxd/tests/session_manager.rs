//! The SessionManager's logic over the fake runtime (tests/support/fake_runtime.rs), under
//! `tokio::time::pause()`: the session cap and the per-owner cap (also under concurrent
//! creates), owner checks, limits kept across re-attaching, the idle reaper (which never
//! takes a session held in use), the reconciler, the end hook every way of destroying a
//! session tells, and a create that is abandoned half-way. No Docker; virtual time.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use sandboxd_core::config::{LimitRequest, Limits, SessionsConfig};
use sandboxd_core::sandbox::{
    CreateOptions, Owner, SandboxError, SandboxState, SessionManager, Viewer,
};
use support::fake_runtime::{FakeRuntime, ME};

fn owner(name: &str) -> Owner {
    Owner::new(name).unwrap()
}

fn manager(rt: &Arc<FakeRuntime>, config: SessionsConfig) -> Arc<SessionManager> {
    SessionManager::new(
        rt.clone(),
        Limits::default(),
        config,
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    )
}

fn caps(max: usize, max_per_owner: usize) -> SessionsConfig {
    SessionsConfig {
        max,
        max_per_owner,
        ..SessionsConfig::default()
    }
}

const FRESH: CreateOptions = CreateOptions { keep: false };
const KEPT: CreateOptions = CreateOptions { keep: true };

#[tokio::test(start_paused = true)]
async fn the_session_cap_holds_under_concurrent_creates() {
    let rt = FakeRuntime::new();
    rt.set_create_delay(Duration::from_secs(2));
    let m = manager(&rt, caps(2, 2));
    let a = owner("a");
    let tries: Vec<_> = (0..5)
        .map(|_| {
            let (m, a) = (m.clone(), a.clone());
            tokio::spawn(async move { m.create(&a, &LimitRequest::default(), FRESH).await })
        })
        .collect();
    let mut ok = Vec::new();
    let mut refused = 0;
    for t in tries {
        match t.await.unwrap() {
            Ok(s) => ok.push(s),
            Err(SandboxError::TooManySessions { limit: 2 })
            | Err(SandboxError::TooManySessionsForOwner { limit: 2, .. }) => refused += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!((ok.len(), refused), (2, 3));
    assert_eq!(
        rt.creates(),
        2,
        "a refused create must not reach the runtime"
    );
    // Another owner is refused by the global cap, with the global message.
    let err = m
        .create(&owner("b"), &LimitRequest::default(), FRESH)
        .await
        .err()
        .expect("over the global cap");
    assert!(
        matches!(err, SandboxError::TooManySessions { limit: 2 }),
        "{err}"
    );
    assert!(err.to_string().contains("[sessions] max"), "{err}");
    // Removing one makes room again.
    m.remove(&a, &ok[0].id).await.unwrap();
    m.create(&owner("b"), &LimitRequest::default(), FRESH)
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_per_owner_cap_refuses_one_owner_while_another_can_create() {
    let rt = FakeRuntime::new();
    let m = manager(&rt, caps(8, 2));
    let (alice, bob) = (owner("alice"), owner("bob"));
    for _ in 0..2 {
        m.create(&alice, &LimitRequest::default(), FRESH)
            .await
            .unwrap();
    }
    let err = m
        .create(&alice, &LimitRequest::default(), FRESH)
        .await
        .err()
        .expect("alice is at her cap");
    assert!(
        matches!(&err, SandboxError::TooManySessionsForOwner { owner, limit: 2 } if owner == "alice"),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("alice already has 2 sessions") && msg.contains("max_per_owner"),
        "{msg}"
    );
    m.create(&bob, &LimitRequest::default(), FRESH)
        .await
        .expect("bob is not limited by alice's sessions");
    assert_eq!(rt.sessions().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn another_owner_cannot_get_remove_or_list_a_session() {
    let rt = FakeRuntime::new();
    let m = manager(&rt, caps(8, 8));
    let (alice, bob) = (owner("alice"), owner("bob"));
    let s = m
        .create(&alice, &LimitRequest::default(), KEPT)
        .await
        .unwrap();
    let b_get = m.get(&bob, &s.id).await.err().expect("bob must not get it");
    assert!(
        matches!(b_get, SandboxError::SessionNotFound { .. }),
        "{b_get}"
    );
    // Exactly the answer for an id that does not exist: nothing tells them apart.
    let missing = m.get(&bob, "000000000000").await.err().unwrap();
    assert_eq!(
        b_get.to_string().replace(&s.id, "ID"),
        missing.to_string().replace("000000000000", "ID")
    );
    let b_rm = m
        .remove(&bob, &s.id)
        .await
        .expect_err("bob must not remove it");
    assert!(
        matches!(b_rm, SandboxError::SessionNotFound { .. }),
        "{b_rm}"
    );
    assert_eq!(rt.sessions(), vec![s.id.clone()], "the session survived");
    assert!(m.list(&Viewer::from(bob.clone())).await.unwrap().is_empty());
    let mine = m.list(&Viewer::from(alice.clone())).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].owner, "alice");
    assert_eq!(m.list(&Viewer::Admin).await.unwrap().len(), 1);

    // A second process (a new manager on the same backend) finds the kept session by its
    // labels, with the same owner check.
    let later = manager(&rt, caps(8, 8));
    let err = later.get(&bob, &s.id).await.err().unwrap();
    assert!(matches!(err, SandboxError::SessionNotFound { .. }), "{err}");
    assert!(later.remove(&bob, &s.id).await.is_err());
    let again = later.get(&alice, &s.id).await.unwrap();
    assert_eq!(again.owner, alice);
    assert!(again.keep);
    // Ids that cannot be ours are not even looked up.
    for hostile in ["", "../x", "a=b", "sandboxd.owner=alice"] {
        assert!(later.get(&alice, hostile).await.is_err(), "{hostile:?}");
    }
    later.remove(&alice, &s.id).await.unwrap();
    assert!(rt.sessions().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_reattached_session_keeps_the_limits_it_was_created_with() {
    let rt = FakeRuntime::new();
    let m = manager(&rt, caps(8, 8));
    let a = owner("a");
    let req = LimitRequest {
        memory_mb: Some(256),
        pids: Some(64),
        ..LimitRequest::default()
    };
    let s = m.create(&a, &req, KEPT).await.unwrap();
    assert_eq!((s.limits.memory_mb, s.limits.pids), (256, 64));
    // A new process whose admin has since lowered the per-call timeout ceiling.
    let lowered = Limits {
        max_timeout_secs: 30,
        ..Limits::default()
    };
    let later = SessionManager::new(
        rt.clone(),
        lowered,
        caps(8, 8),
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    let again = later.get(&a, &s.id).await.unwrap();
    assert_eq!(
        again.limits.memory_mb, 256,
        "the container was made with 256 MiB"
    );
    assert_eq!(again.limits.pids, 64);
    assert_eq!(
        again.limits.max_timeout_secs, 30,
        "host-enforced limits follow today's ceilings"
    );
    // A sandbox that recorded no limits (an older sandboxd) gets the ceilings.
    rt.insert("0123456789ab", "a", SandboxState::Running, true, "gone:1");
    let old = later.get(&a, "0123456789ab").await.unwrap();
    assert_eq!(old.limits.memory_mb, Limits::default().memory_mb);
}

#[tokio::test(start_paused = true)]
async fn the_idle_reaper_removes_only_sessions_nobody_uses() {
    let rt = FakeRuntime::new();
    let m = manager(
        &rt,
        SessionsConfig {
            idle_timeout_secs: 60,
            reap_interval_secs: 10,
            ..SessionsConfig::default()
        },
    );
    let _reaper = m.spawn_reaper();
    let a = owner("a");
    let idle = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
    let busy = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(25)).await;
        m.get(&a, &busy.id).await.expect("a used session stays");
    }
    // 100 s without use: the idle one went at the first tick past 60 s.
    assert_eq!(rt.sessions(), vec![busy.id.clone()]);
    assert!(!idle.sandbox.is_alive().await);
    let err = m.get(&a, &idle.id).await.err().unwrap();
    assert!(matches!(err, SandboxError::SessionNotFound { .. }), "{err}");
    tokio::time::sleep(Duration::from_secs(75)).await;
    assert!(rt.sessions().is_empty(), "the other one idles out too");
    assert!(m.live().await.is_empty());
    // The reaper stops with the manager.
    let weak = Arc::downgrade(&m);
    drop(m);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(weak.upgrade().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_held_session_is_never_idle_and_idles_from_its_release() {
    let rt = FakeRuntime::new();
    let m = manager(
        &rt,
        SessionsConfig {
            idle_timeout_secs: 60,
            reap_interval_secs: 10,
            ..SessionsConfig::default()
        },
    );
    let _reaper = m.spawn_reaper();
    let a = owner("a");
    let s = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
    // A run (or a tool call) that lasts five idle timeouts, nothing touching the session.
    let run = s.hold();
    let nested = s.hold();
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(rt.sessions(), vec![s.id.clone()], "held: never reaped");
    assert_eq!(s.idle_for(), Duration::ZERO);
    drop(nested);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(rt.sessions(), vec![s.id.clone()], "one holder is left");
    drop(run);
    // Its idle time starts at the release, not at the last touch 420 s ago.
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert_eq!(rt.sessions(), vec![s.id.clone()], "45 s after the release");
    assert!(s.idle_for() >= Duration::from_secs(45) && s.idle_for() < Duration::from_secs(60));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(rt.sessions().is_empty(), "idle past 60 s after the release");
    assert!(m.live().await.is_empty());

    // A re-attached session whose last use an earlier process recorded 50 s ago goes on
    // from there (serve re-attaches with the store's last use): 15 s more is too much.
    let earlier = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
    earlier.used_ago(Duration::from_secs(50));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(m.reap_idle().await.is_empty(), "55 s idle");
    assert_eq!(rt.sessions(), vec![earlier.id.clone()]);
    tokio::time::sleep(Duration::from_secs(10)).await;
    m.reap_idle().await; // the reaper's own tick may come a little later
    assert!(rt.sessions().is_empty(), "65 s idle");
}

#[tokio::test(start_paused = true)]
async fn the_reconciler_removes_orphans_and_nothing_in_use() {
    let rt = FakeRuntime::new();
    rt.set_alive("other:1", true);
    let m = manager(&rt, caps(8, 8));
    let a = owner("a");
    let mine = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
    use SandboxState::*;
    // (session, state, kept, creator) and whether the reconciler must remove it.
    let cases = [
        ("aaaaaaaaaa01", Running, false, "dead:1", true),
        ("aaaaaaaaaa02", Starting, false, "dead:1", true),
        ("aaaaaaaaaa03", Stopped, false, "other:1", true),
        ("aaaaaaaaaa04", Stopped, true, "dead:1", true),
        ("aaaaaaaaaa05", Paused, true, "dead:1", true),
        ("aaaaaaaaaa06", Running, false, "other:1", false),
        ("aaaaaaaaaa07", Starting, false, "other:1", false),
        ("aaaaaaaaaa08", Running, true, "dead:1", false),
        ("aaaaaaaaaa09", Running, false, ME, false),
    ];
    for (id, state, keep, creator, _) in cases {
        rt.insert(id, "a", state, keep, creator);
    }
    let mut removed = m.reconcile().await.unwrap();
    removed.sort();
    let expected: Vec<String> = cases
        .iter()
        .filter(|c| c.4)
        .map(|c| c.0.to_string())
        .collect();
    assert_eq!(removed, expected);
    let left = rt.sessions();
    assert!(left.contains(&mine.id), "a session of this process stays");
    for c in cases.iter().filter(|c| !c.4) {
        assert!(left.contains(&c.0.to_string()), "{} must stay", c.0);
    }
    // The creator of the "other" process dies: its running session is an orphan now.
    rt.set_alive("other:1", false);
    let removed = m.reconcile().await.unwrap();
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert!(
        m.reconcile().await.unwrap().is_empty(),
        "nothing left to do"
    );
}

#[tokio::test(start_paused = true)]
async fn removal_reconcile_and_the_reaper_each_tell_the_end_hook_once() {
    let rt = FakeRuntime::new();
    let m = manager(
        &rt,
        SessionsConfig {
            idle_timeout_secs: 60,
            reap_interval_secs: 10,
            ..SessionsConfig::default()
        },
    );
    let ended = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let heard = ended.clone();
    m.on_session_end(Arc::new(move |id: &str| {
        heard.lock().unwrap().push(id.to_string())
    }));
    let a = owner("a");
    let removed = m.create(&a, &LimitRequest::default(), KEPT).await.unwrap();
    let reaped = m.create(&a, &LimitRequest::default(), KEPT).await.unwrap();
    rt.insert("aaaaaaaaaa04", "a", SandboxState::Stopped, true, "dead:1");
    m.remove(&a, &removed.id).await.unwrap();
    assert!(
        m.remove(&owner("b"), &reaped.id).await.is_err(),
        "another owner ends nothing"
    );
    assert_eq!(m.reconcile().await.unwrap(), vec!["aaaaaaaaaa04"]);
    let _reaper = m.spawn_reaper();
    tokio::time::sleep(Duration::from_secs(75)).await;
    assert!(rt.sessions().is_empty());
    assert_eq!(
        *ended.lock().unwrap(),
        vec![removed.id.clone(), "aaaaaaaaaa04".into(), reaped.id.clone()]
    );
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_create_leaves_no_sandbox_and_frees_its_place() {
    let rt = FakeRuntime::new();
    rt.set_create_delay(Duration::from_secs(5));
    let m = manager(&rt, caps(1, 1));
    let a = owner("a");
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        m.create(&a, &LimitRequest::default(), FRESH),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the caller gave up before the create finished"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        rt.sessions().is_empty(),
        "the abandoned sandbox was removed"
    );
    rt.set_create_delay(Duration::ZERO);
    let s = m
        .create(&a, &LimitRequest::default(), FRESH)
        .await
        .expect("the abandoned create no longer counts against the cap");
    // The fake's sandboxes are real ExecSandboxes: the generic layer runs over FakeExec.
    let out = s
        .sandbox
        .exec(sandboxd_core::sandbox::ExecRequest::new(["true"]))
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0));
}

/// A session with its own idle timeout is reaped after it and not before, whatever the
/// configured one; a held one is not reaped at all; and each end event says why.
#[tokio::test(start_paused = true)]
async fn a_session_idles_out_after_its_own_timeout_and_its_end_event_says_why() {
    use sandboxd_core::sandbox::ends::{EndReason, Ended};
    let rt = FakeRuntime::new();
    let m = manager(
        &rt,
        SessionsConfig {
            idle_timeout_secs: 600,
            reap_interval_secs: 10,
            ..SessionsConfig::default()
        },
    );
    let mut ends = m.subscribe_ends();
    let a = owner("a");
    let req = LimitRequest::default();
    let own = m.create(&a, &req, KEPT).await.unwrap();
    own.set_idle_timeout(Duration::from_secs(30));
    let held = m.create(&a, &req, KEPT).await.unwrap();
    held.set_idle_timeout(Duration::from_secs(30));
    let configured = m.create(&a, &req, FRESH).await.unwrap();
    assert_eq!(
        configured.idle_timeout(),
        None,
        "the configured one applies"
    );
    let run = held.hold();

    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(m.reap_idle().await.is_empty(), "29 s: within its own 30 s");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(m.reap_idle().await, vec![own.id.clone()], "31 s idle");
    let ended = ends.try_recv().unwrap();
    assert_eq!(
        ended,
        Ended {
            id: own.id.clone(),
            reason: EndReason::Idle(Duration::from_secs(30)),
            reading: None
        }
    );
    assert_eq!(ended.reason.to_string(), "idle for more than 30 s");
    assert!(ends.try_recv().is_err(), "nothing else ended");
    assert!(!own.sandbox.is_alive().await);
    assert!(m.held(&a, &own.id).is_none(), "out of the table");

    // Held for ten times its timeout: never idle. The configured ten minutes still hold.
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert!(m.reap_idle().await.is_empty(), "held, and within 600 s");
    let mut left = rt.sessions();
    left.sort();
    let mut expected = vec![held.id.clone(), configured.id.clone()];
    expected.sort();
    assert_eq!(left, expected);
    drop(run);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(m.reap_idle().await.is_empty(), "29 s after its release");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(m.reap_idle().await, vec![held.id.clone()]);
    assert_eq!(
        ends.try_recv().unwrap().reason,
        EndReason::Idle(Duration::from_secs(30))
    );

    // 362 s so far: the one on the configured timeout goes past 600 s, and says so.
    tokio::time::sleep(Duration::from_secs(237)).await;
    assert!(m.reap_idle().await.is_empty(), "599 s idle");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(m.reap_idle().await, vec![configured.id.clone()]);
    let ended = ends.try_recv().unwrap();
    assert_eq!(ended.reason.to_string(), "idle for more than 600 s");
    assert!(rt.sessions().is_empty());

    // A removal says it was removed, not idle.
    let closed = m.create(&a, &req, FRESH).await.unwrap();
    m.remove(&a, &closed.id).await.unwrap();
    assert_eq!(
        ends.try_recv().unwrap(),
        Ended {
            id: closed.id.clone(),
            reason: EndReason::Removed,
            reading: None
        }
    );
}
