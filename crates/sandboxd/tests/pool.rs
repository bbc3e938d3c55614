//! The warm pool's logic over the fake runtime (tests/support/fake_runtime.rs), under
//! `tokio::time::pause()`: it fills to its size, claims take warm sandboxes and wake a
//! refill, nothing is ever handed out twice, the global cap holds for warm plus live
//! sandboxes, old and stale-image sandboxes are replaced, lowered limits are applied or
//! fall back to a cold create, mismatches and kept sessions create cold (unless the pool is
//! scoped: then kept sessions claim, and only the caller's records adopt a claim later), the
//! refill a claim wakes waits `refill_delay_ms`, the reconciler tells a crashed process's
//! pool from a live one's. No Docker; virtual time.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sandboxd_core::config::{LimitRequest, Limits, PoolConfig, SessionsConfig};
use sandboxd_core::sandbox::{CreateOptions, Owner, SandboxError, SessionManager, Viewer};
use support::fake_runtime::{FakeRuntime, ME};

fn owner(name: &str) -> Owner {
    Owner::new(name).unwrap()
}

fn pooled(rt: &Arc<FakeRuntime>, size: usize, max: usize) -> Arc<SessionManager> {
    SessionManager::with_pool(
        rt.clone(),
        Limits::default(),
        SessionsConfig {
            max,
            max_per_owner: max,
            ..SessionsConfig::default()
        },
        PoolConfig {
            size,
            max_age_secs: 600,
            refill_interval_secs: 10,
            ..PoolConfig::default()
        },
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    )
}

const FRESH: CreateOptions = CreateOptions { keep: false };

/// Lets spawned tasks (fills, the refill loop) run to their next timer.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_pool_fills_to_its_size_and_a_claim_takes_a_warm_sandbox() {
    let rt = FakeRuntime::new();
    rt.set_create_delay(Duration::from_millis(300));
    let m = pooled(&rt, 2, 16);
    let report = m.refill_pool().await;
    assert_eq!((report.added, report.failed), (2, 0));
    assert_eq!(m.pool_ready(), 2);
    assert_eq!(
        rt.warm_ups(),
        2,
        "a warm sandbox has its shell and helper up"
    );
    let warm_ids = rt.sessions();

    let s = m
        .create(&owner("a"), &LimitRequest::default(), FRESH)
        .await
        .unwrap();
    assert!(warm_ids.contains(&s.id), "{} not from the pool", s.id);
    assert_eq!(rt.creates(), 2, "a claim creates nothing on the spot");
    assert_eq!(m.pool_ready(), 1);
    // The binding lives in this process's records: the owner gets it, nobody else does.
    assert_eq!(m.get(&owner("a"), &s.id).await.unwrap().id, s.id);
    assert!(matches!(
        m.get(&owner("b"), &s.id).await,
        Err(SandboxError::SessionNotFound { .. })
    ));
    // Nobody can reach an unclaimed warm sandbox by its id.
    let other = warm_ids.iter().find(|id| **id != s.id).unwrap();
    assert!(matches!(
        m.get(&owner("a"), other).await,
        Err(SandboxError::SessionNotFound { .. })
    ));
    assert!(m.list(&Viewer::Owner(owner("a"))).await.unwrap().is_empty());
    let admin = m.list(&Viewer::Admin).await.unwrap();
    assert_eq!(admin.len(), 2);
    assert!(admin.iter().all(|i| i.pooled && i.owner.is_empty()));

    // The refill task tops the pool up after the claim.
    let _task = m.spawn_pool().expect("the pool is on");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(m.pool_ready(), 2);
    assert_eq!(rt.creates(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_is_never_handed_out_twice_and_is_destroyed_at_session_end() {
    let rt = FakeRuntime::new();
    rt.set_create_delay(Duration::from_millis(100));
    let m = pooled(&rt, 2, 16);
    let _task = m.spawn_pool().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut seen = HashSet::new();
    for i in 0..10 {
        let a = owner(if i % 2 == 0 { "a" } else { "b" });
        let s = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
        assert!(
            seen.insert(s.id.clone()),
            "session id {} handed out twice",
            s.id
        );
        m.remove(&a, &s.id).await.unwrap();
        assert!(
            !rt.sessions().contains(&s.id),
            "an ended session's sandbox must be gone"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let made = rt.made();
    assert_eq!(
        made.len(),
        made.iter().collect::<HashSet<_>>().len(),
        "handles are unique"
    );
    // Ten claimed and destroyed, two warm left: nothing came back.
    assert_eq!(rt.handles().len(), 2);
    assert_eq!(m.pool_ready(), 2);
    m.remove_all().await;
    assert!(
        rt.handles().is_empty(),
        "closing the pool removes its sandboxes"
    );
    settle().await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(rt.handles().is_empty(), "a closed pool does not refill");
}

#[tokio::test(start_paused = true)]
async fn warm_and_live_sandboxes_never_exceed_the_global_cap() {
    let rt = FakeRuntime::new();
    rt.set_create_delay(Duration::from_millis(200));
    let m = pooled(&rt, 2, 3);
    let _task = m.spawn_pool().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(m.pool_ready(), 2);
    let a = owner("a");
    let s1 = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
    let s2 = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(rt.handles().len() <= 3, "{:?}", rt.handles());
    }
    assert_eq!(m.pool_ready(), 1, "only one place is left under the cap");
    // A cold create (a profile the pool does not hold) at the cap evicts a warm sandbox.
    let small = LimitRequest {
        workspace_mb: Some(64),
        ..LimitRequest::default()
    };
    let s3 = m.create(&a, &small, FRESH).await.unwrap();
    settle().await;
    assert_eq!(m.pool_ready(), 0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(rt.handles().len() <= 3, "{:?}", rt.handles());
    assert!(matches!(
        m.create(&a, &LimitRequest::default(), FRESH).await,
        Err(SandboxError::TooManySessions { limit: 3 })
    ));
    for s in [s1, s2, s3] {
        m.remove(&a, &s.id).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(m.pool_ready(), 2, "the pool grows back once there is room");
}

#[tokio::test(start_paused = true)]
async fn old_and_stale_image_sandboxes_are_replaced() {
    let rt = FakeRuntime::new();
    let m = pooled(&rt, 2, 16);
    let _task = m.spawn_pool().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first = rt.handles();
    assert_eq!(first.len(), 2);

    // A rebuilt image: the next refill replaces both.
    rt.set_revision("image-2");
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(rt.revisions(), vec!["image-2", "image-2"]);
    let second = rt.handles();
    assert!(second.iter().all(|h| !first.contains(h)));

    // Past max_age (600 s): replaced again, from the same image.
    tokio::time::sleep(Duration::from_secs(605)).await;
    let third = rt.handles();
    assert_eq!(third.len(), 2);
    assert!(
        third.iter().all(|h| !second.contains(h)),
        "{third:?} {second:?}"
    );
    assert_eq!(m.pool_ready(), 2);
}

#[tokio::test(start_paused = true)]
async fn lower_limits_are_applied_at_claim_or_the_claim_creates_cold() {
    let rt = FakeRuntime::new();
    let m = pooled(&rt, 2, 16);
    m.refill_pool().await;
    let warm = rt.sessions();
    let a = owner("a");
    let req = LimitRequest {
        memory_mb: Some(256),
        cpus: Some(0.5),
        pids: Some(64),
        ..LimitRequest::default()
    };
    let s = m.create(&a, &req, FRESH).await.unwrap();
    assert!(warm.contains(&s.id));
    assert_eq!((s.limits.memory_mb, s.limits.pids), (256, 64));
    let updates = rt.updates();
    assert_eq!(updates.len(), 1);
    assert_eq!(
        (updates[0].1.memory_mb, updates[0].1.cpus, updates[0].1.pids),
        (256, 0.5, 64)
    );

    // A backend that declines: the warm sandbox is discarded (it would have the wrong
    // limits) and the session is created cold, with the limits asked for.
    rt.accept_updates(false);
    let creates = rt.creates();
    let s2 = m.create(&a, &req, FRESH).await.unwrap();
    assert!(
        !warm.contains(&s2.id),
        "a declined update must not hand the sandbox out"
    );
    assert_eq!(rt.creates(), creates + 1);
    assert_eq!(s2.limits.memory_mb, 256);
    let f = rt
        .found()
        .into_iter()
        .find(|f| f.session_id == s2.id)
        .unwrap();
    assert_eq!(f.limits.unwrap().memory_mb, 256);
    settle().await;
    assert_eq!(m.pool_ready(), 0);
    assert!(
        warm.iter()
            .all(|id| *id == s.id || !rt.sessions().contains(id)),
        "the declined warm sandbox was removed"
    );
}

#[tokio::test(start_paused = true)]
async fn mismatched_profiles_and_kept_sessions_create_cold_and_leave_the_pool_alone() {
    let rt = FakeRuntime::new();
    let m = pooled(&rt, 2, 16);
    m.refill_pool().await;
    let a = owner("a");
    let small_disk = LimitRequest {
        tmp_mb: Some(16),
        ..LimitRequest::default()
    };
    let s = m.create(&a, &small_disk, FRESH).await.unwrap();
    let kept = m
        .create(&a, &LimitRequest::default(), CreateOptions { keep: true })
        .await
        .unwrap();
    assert_eq!(m.pool_ready(), 2);
    assert_eq!(rt.creates(), 4);
    let found = rt.found();
    for id in [&s.id, &kept.id] {
        let f = found.iter().find(|f| &f.session_id == id).unwrap();
        assert!(!f.pooled);
        assert_eq!(
            f.owner.as_ref(),
            Some(&a),
            "a cold session carries its owner"
        );
    }
    // An empty pool is a cold create, not an error.
    let off = pooled(&rt, 0, 16);
    assert!(off.spawn_pool().is_none());
    off.create(&a, &LimitRequest::default(), FRESH)
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_reconciler_removes_a_dead_process_pool_and_keeps_a_live_one() {
    let rt = FakeRuntime::new();
    let m = pooled(&rt, 2, 16);
    m.refill_pool().await;
    let claimed = m
        .create(&owner("a"), &LimitRequest::default(), FRESH)
        .await
        .unwrap();
    // This process's warm and claimed sandboxes survive a reconcile.
    assert!(m.reconcile().await.unwrap().is_empty());
    assert_eq!(rt.handles().len(), 2);

    // Another process's: it dies, and a fresh manager (no records) reconciles.
    let other = FakeRuntime::new();
    let m2 = pooled(&other, 2, 16);
    m2.refill_pool().await;
    m2.create(&owner("a"), &LimitRequest::default(), FRESH)
        .await
        .unwrap();
    assert_eq!(other.handles().len(), 2);
    let survivor = pooled(&other, 2, 16);
    assert!(
        survivor.reconcile().await.unwrap().is_empty(),
        "the creator lives: its pool and claims stay"
    );
    other.set_alive(ME, false);
    let removed = survivor.reconcile().await.unwrap();
    assert_eq!(
        removed.len(),
        2,
        "a claimed and an unclaimed pooled sandbox"
    );
    assert!(other.handles().is_empty());
    drop(claimed);
}

#[tokio::test(start_paused = true)]
async fn a_warm_sandbox_removed_from_outside_is_replaced_not_handed_out() {
    use sandboxd_core::sandbox::Runtime as _;
    let rt = FakeRuntime::new();
    let m = pooled(&rt, 2, 16);
    m.refill_pool().await;
    let warm = rt.handles();
    // The admin removes one by its id: it leaves the pool at once.
    m.admin_remove(&rt.found()[0].session_id).await.unwrap();
    assert_eq!(m.pool_ready(), 1);
    // `docker rm` behind sandboxd's back: the next refill's listing notices.
    rt.remove(&rt.handles()[0]).await.unwrap();
    let report = m.refill_pool().await;
    assert_eq!((report.retired, report.added), (1, 2));
    assert_eq!(m.pool_ready(), 2);
    assert!(rt.handles().iter().all(|h| !warm.contains(h)));
    let s = m
        .create(&owner("a"), &LimitRequest::default(), FRESH)
        .await
        .unwrap();
    assert!(rt.sessions().contains(&s.id));
}

#[tokio::test(start_paused = true)]
async fn the_memory_budget_shrinks_the_pool_first_then_reaps_the_longest_idle() {
    const MIB: u64 = 1 << 20;
    let rt = FakeRuntime::new();
    rt.set_memory_each(30 * MIB);
    let m = SessionManager::with_pool(
        rt.clone(),
        Limits::default(),
        SessionsConfig {
            max: 16,
            max_per_owner: 16,
            memory_budget_mb: 100,
            reap_interval_secs: 60,
            ..SessionsConfig::default()
        },
        PoolConfig {
            size: 4,
            max_age_secs: 600,
            refill_interval_secs: 10,
            ..PoolConfig::default()
        },
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    // One sandbox measured, 30 MiB each: only three fit in 100 MiB.
    let a = owner("a");
    let cold = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
    m.refill_pool().await;
    assert_eq!(m.pool_ready(), 2, "1 session + 2 warm = 90 MiB ≤ 100");
    assert!(m.enforce_memory_budget().await.is_empty());

    // The sandboxes grow: 45 MiB each is 135 MiB. Warm ones go first.
    rt.set_memory_each(45 * MIB);
    let removed = m.enforce_memory_budget().await;
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert_eq!(m.pool_ready(), 1);
    assert!(m.refill_pool().await.added == 0, "no room in the budget");

    // A second session (claimed) and more growth: the pool empties, then the longest-idle
    // session goes, and only one idle for at least a reap interval.
    let fresh = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
    rt.set_memory_each(60 * MIB);
    assert_eq!(m.pool_ready(), 0, "the claim took the last warm one");
    assert!(
        m.enforce_memory_budget().await.is_empty(),
        "over the budget, but no session has been idle for a reap interval yet"
    );
    tokio::time::sleep(Duration::from_secs(61)).await;
    fresh.touch();
    let removed = m.enforce_memory_budget().await;
    assert_eq!(removed, vec![cold.id.clone()], "the longest-idle one");
    assert!(m.get(&a, &fresh.id).await.is_ok());
    assert!(rt.sessions().contains(&fresh.id) && !rt.sessions().contains(&cold.id));

    // Without a budget nothing is measured or removed.
    let none = pooled(&rt, 2, 16);
    assert!(none.enforce_memory_budget().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_refill_a_claim_wakes_waits_refill_delay_ms_before_it_creates() {
    let rt = FakeRuntime::new();
    let m = SessionManager::with_pool(
        rt.clone(),
        Limits::default(),
        SessionsConfig::default(),
        PoolConfig {
            size: 1,
            refill_interval_secs: 3600,
            refill_delay_ms: 200,
            ..PoolConfig::default()
        },
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    let _task = m.spawn_pool().unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((m.pool_ready(), rt.creates()), (1, 1));
    let a = owner("a");
    let s = m.create(&a, &LimitRequest::default(), FRESH).await.unwrap();
    assert_eq!(m.pool_ready(), 0);
    // Within the delay the claimed session has the host to itself: no create has started.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(rt.creates(), 1, "the refill started before refill_delay_ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        rt.creates(),
        2,
        "the refill did not start after refill_delay_ms"
    );
    assert_eq!(m.pool_ready(), 1);
    m.remove(&a, &s.id).await.unwrap();
    m.remove_all().await;
}

#[tokio::test(start_paused = true)]
async fn a_scoped_pool_serves_kept_sessions_and_only_its_records_can_adopt_a_claim() {
    let rt = FakeRuntime::new();
    let scope = owner("serve-pool:abc");
    let scoped = |rt: &Arc<FakeRuntime>| {
        SessionManager::with_scoped_pool(
            rt.clone(),
            Limits::default(),
            SessionsConfig::default(),
            PoolConfig {
                size: 1,
                ..PoolConfig::default()
            },
            scope.clone(),
            std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
        )
    };
    let m = scoped(&rt);
    m.refill_pool().await;
    let warm = rt.found();
    assert_eq!(warm.len(), 1);
    assert!(warm[0].pooled && warm[0].keep && warm[0].owner.as_ref() == Some(&scope));
    // A kept session claims from a scoped pool (an unscoped one creates kept sessions cold).
    let a = owner("serve:a");
    let kept = CreateOptions { keep: true };
    let s = m.create(&a, &LimitRequest::default(), kept).await.unwrap();
    assert_eq!(
        s.id, warm[0].session_id,
        "the kept session is the warm sandbox"
    );
    assert!(s.keep);

    // A later process: the labels name only the scope, so the user cannot find it; the
    // records' adopt binds it to its owner with the recorded limits.
    let later = scoped(&rt);
    let err = later.get(&a, &s.id).await.err().unwrap();
    assert!(matches!(err, SandboxError::SessionNotFound { .. }), "{err}");
    let recorded = Limits {
        memory_mb: 256,
        ..Limits::default()
    };
    let adopted = later.adopt(&a, &s.id, &recorded).await.unwrap();
    assert_eq!(adopted.limits.memory_mb, 256);
    assert_eq!(later.get(&a, &s.id).await.unwrap().id, s.id);
    let b = owner("serve:b");
    assert!(
        later.get(&b, &s.id).await.is_err(),
        "another owner sees nothing"
    );
    assert!(later.adopt(&b, &s.id, &recorded).await.is_err());

    // Without a scope, or for a sandbox outside it, nothing is adopted.
    let unscoped = pooled(&rt, 1, 16);
    assert!(unscoped.adopt(&a, &s.id, &recorded).await.is_err());
    let other = SessionManager::with_scoped_pool(
        rt.clone(),
        Limits::default(),
        SessionsConfig::default(),
        PoolConfig::default(),
        owner("serve-pool:other"),
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    assert!(other.adopt(&a, &s.id, &recorded).await.is_err());
    // A process's reconcile leaves a running kept sandbox of a scope alone, live creator or not.
    rt.set_alive(ME, false);
    assert!(unscoped.reconcile().await.unwrap().is_empty());
    rt.set_alive(ME, true);
}

#[tokio::test(start_paused = true)]
async fn a_claim_is_marked_on_the_backend_once_or_the_session_is_created_cold() {
    let rt = FakeRuntime::new();
    let m = pooled(&rt, 2, 16);
    m.refill_pool().await;
    let warm = rt.sessions();
    let s = m
        .create(&owner("a"), &LimitRequest::default(), FRESH)
        .await
        .unwrap();
    assert!(warm.contains(&s.id));
    assert_eq!(rt.claims(), [(s.handle.clone(), "a".to_string())]);
    // A mark the backend refuses: that warm sandbox is not handed out but removed, and the
    // session is made cold.
    rt.fail_claims(true);
    let creates = rt.creates();
    let s2 = m
        .create(&owner("b"), &LimitRequest::default(), FRESH)
        .await
        .unwrap();
    assert!(
        !warm.contains(&s2.id),
        "an unmarked warm sandbox is not handed out"
    );
    assert_eq!(rt.creates(), creates + 1);
    settle().await;
    assert!(
        warm.iter()
            .all(|id| *id == s.id || !rt.sessions().contains(id)),
        "the unmarked warm sandbox was removed"
    );
    assert_eq!(rt.claims().len(), 1);
}
