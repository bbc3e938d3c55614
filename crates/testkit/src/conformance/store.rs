//! The store conformance suite: every behaviour of `Store` (and `Logins`) the service relies
//! on, through the traits only (no SQL, no backend type), so any store runs it unchanged.
//!
//! What it holds a store to: users and keys (a replaced or removed key stops at once),
//! sign-ins bound to the key they were made with, the session and run lifecycles, ownership
//! (the owner on every row, listings filtered by it), newest-first paging by cursor, the
//! session and run quotas and the usage they are counted from, event order and exactly-once
//! append (a seq that does not follow the run's last is refused and changes nothing),
//! quotas and appends under concurrent writers, history deletion and retention, and restart
//! recovery: the same database opened again holds everything. Kept sessions' tool records
//! (`ToolRecords`) have their cases in store_records.rs, run wake-ups in store_wakes.rs,
//! the replica registry (`Replicas`) in store_replicas.rs, how replicas share runs
//! (`RunControl`: turns, fencing, takeover, cancel requests and answers) in store_runs.rs,
//! the owner's daily tokens counted in an event's append in store_tokens.rs,
//! the sign-in throttle (`AuthFailures`) and MCP sessions (`McpSessions`) in store_edges.rs,
//! the audit log (`Audit`) in store_audit.rs, the code interpreter's contexts
//! (`CodeContexts`) in store_contexts.rs, usage metering (`Metering`) in
//! store_metering.rs.
//!
//! A store backend supplies a `StoreFactory`: a fresh, empty store per case (so cases do not
//! see each other's rows), and a way to open the same database again for the restart case.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, ensure};
use async_trait::async_trait;
use sandboxd_core::config::Limits;
use sandboxd_core::store::{
    NewLogin, NewUser, QuotaOverride, RunPatch, RunQuery, RunRow, RunState, SessionKind,
    SessionQuery, SessionRow, SessionState, Store, StoreError, StoredEvent, StoredKey,
    StoredQuestion, now_ms,
};

use super::run_case;
use super::store_edges as edges;
use super::store_egress as egress;
use super::store_records as records;
use super::store_replicas as replicas;
use super::store_sessions as shared;
use super::store_wakes as wakes;

/// How the suite gets stores of one backend.
#[async_trait]
pub trait StoreFactory: Send + Sync {
    /// A new, empty store, and the name `reopen` opens it again by (a file name, a database
    /// or schema name).
    async fn fresh(&self) -> Result<(Arc<dyn Store>, String), StoreError>;

    /// Opens the store `fresh` made under `name` again, as a restarted process does. The
    /// suite has dropped every handle of it first.
    async fn reopen(&self, name: &str) -> Result<Arc<dyn Store>, StoreError>;
}

/// Runs every case in order; the first failure is returned, naming its case.
pub async fn store_conformance(factory: &dyn StoreFactory) -> Result<()> {
    const S: &str = "store";
    run_case(S, "case_ping", case_ping(factory)).await?;
    run_case(S, "case_users_and_keys", case_users_and_keys(factory)).await?;
    run_case(
        S,
        "case_user_by_id",
        super::store_users::case_user_by_id(factory),
    )
    .await?;
    run_case(S, "case_logins", case_logins(factory)).await?;
    run_case(
        S,
        "case_sso_states",
        super::store_sso::case_sso_states(factory),
    )
    .await?;
    run_case(S, "case_session_lifecycle", case_session_lifecycle(factory)).await?;
    run_case(
        S,
        "case_ownership_and_paging",
        case_ownership_and_paging(factory),
    )
    .await?;
    run_case(S, "case_quotas_and_usage", case_quotas_and_usage(factory)).await?;
    run_case(S, "case_run_lifecycle", case_run_lifecycle(factory)).await?;
    run_case(
        S,
        "case_events_exactly_once",
        case_events_exactly_once(factory),
    )
    .await?;
    run_case(
        S,
        "case_images_and_conversation",
        case_images_and_conversation(factory),
    )
    .await?;
    run_case(
        S,
        "case_concurrent_writers",
        case_concurrent_writers(factory),
    )
    .await?;
    run_case(S, "case_delete_and_purge", case_delete_and_purge(factory)).await?;
    run_case(S, "case_restart_recovery", case_restart_recovery(factory)).await?;
    run_case(S, "case_run_wakes", wakes::case_run_wakes(factory)).await?;
    run_case(
        S,
        "case_owner_tokens_in_append",
        super::store_tokens::case_owner_tokens_in_append(factory),
    )
    .await?;
    run_case(
        S,
        "case_global_session_cap",
        shared::case_global_session_cap(factory),
    )
    .await?;
    run_case(S, "case_idle_end_once", shared::case_idle_end_once(factory)).await?;
    run_case(
        S,
        "case_set_idle_timeout",
        shared::case_set_idle_timeout(factory),
    )
    .await?;
    run_case(
        S,
        "case_session_holders",
        shared::case_session_holders(factory),
    )
    .await?;
    run_case(
        S,
        "case_hibernation",
        super::store_snapshots::case_hibernation(factory),
    )
    .await?;
    run_case(
        S,
        "case_code_contexts",
        super::store_contexts::case_code_contexts(factory),
    )
    .await?;
    super::store_runs::all(factory).await?;
    run_case(S, "case_tool_records", records::case_tool_records(factory)).await?;
    run_case(
        S,
        "case_tool_records_bounded",
        records::case_tool_records_bounded(factory),
    )
    .await?;
    run_case(
        S,
        "case_tool_records_restart",
        records::case_tool_records_restart(factory),
    )
    .await?;
    run_case(
        S,
        "case_replica_leases",
        replicas::case_replica_leases(factory),
    )
    .await?;
    run_case(
        S,
        "case_replicas_restart",
        replicas::case_replicas_restart(factory),
    )
    .await?;
    run_case(S, "case_auth_failures", edges::case_auth_failures(factory)).await?;
    run_case(
        S,
        "case_auth_failures_concurrent",
        edges::case_auth_failures_concurrent(factory),
    )
    .await?;
    run_case(
        S,
        "case_auth_failures_bounded",
        edges::case_auth_failures_bounded(factory),
    )
    .await?;
    run_case(S, "case_mcp_sessions", edges::case_mcp_sessions(factory)).await?;
    run_case(
        S,
        "case_session_egress",
        egress::case_session_egress(factory),
    )
    .await?;
    run_case(S, "case_egress_log", egress::case_egress_log(factory)).await?;
    run_case(
        S,
        "case_egress_log_bounded",
        egress::case_egress_log_bounded(factory),
    )
    .await?;
    run_case(
        S,
        "case_egress_credentials",
        super::store_credentials::case_egress_credentials(factory),
    )
    .await?;
    run_case(
        S,
        "case_audit_log",
        super::store_audit::case_audit_log(factory),
    )
    .await?;
    run_case(
        S,
        "case_usage_metering",
        super::store_metering::case_usage_metering(factory),
    )
    .await?;
    Ok(())
}

/// The replica the suite's runs are driven by (`run_row`); a case that appends events makes
/// it live first (`drive`).
pub(super) const DRIVER: &str = "r-c0ffee000001";

pub(super) async fn fresh(factory: &dyn StoreFactory) -> Result<Arc<dyn Store>> {
    Ok(factory.fresh().await.context("open a fresh store")?.0)
}

/// Makes `DRIVER` a live replica of `store` for an hour.
pub(super) async fn drive(store: &dyn Store) -> Result<()> {
    store
        .replica_beat(DRIVER, 3_600_000)
        .await
        .context("register the suite's replica")?;
    Ok(())
}

fn key(b: u8, created_at: i64) -> StoredKey {
    StoredKey {
        hash: [b; 32],
        prefix: format!("sbx_{b:02x}"),
        created_at,
        expires_at: None,
    }
}

fn new_user(name: &str, b: u8) -> NewUser {
    NewUser {
        name: name.into(),
        admin: false,
        key: key(b, now_ms()),
        quota: QuotaOverride::default(),
    }
}

pub(super) async fn add_user(store: &dyn Store, name: &str, b: u8) -> Result<String> {
    Ok(store
        .add_user(new_user(name, b))
        .await
        .with_context(|| format!("add user {name}"))?
        .id)
}

fn session_row(id: &str, owner: &str, now: i64) -> SessionRow {
    SessionRow::creating(
        id,
        owner,
        Limits::default(),
        BTreeMap::from([("app".to_string(), "x".to_string())]),
        60,
        now,
    )
}

pub(super) async fn reserve(store: &dyn Store, id: &str, owner: &str) -> Result<()> {
    store
        .reserve_session(session_row(id, owner, now_ms()), 100)
        .await
        .with_context(|| format!("reserve session {id}"))
}

pub(super) fn run_row(id: &str, session: &str, owner: &str) -> RunRow {
    RunRow::queued(id, session, owner, "a task", "agent", Some(5), now_ms()).with_driver(DRIVER)
}

pub(super) fn event(seq: u64, kind: &str) -> StoredEvent {
    StoredEvent {
        seq,
        time: now_ms(),
        kind: kind.into(),
        payload: format!(r#"{{"type":"{kind}","seq":{seq}}}"#),
    }
}

pub(super) async fn must_run(store: &dyn Store, id: &str) -> Result<RunRow> {
    store
        .run(id)
        .await?
        .ok_or_else(|| anyhow!("run {id} is missing"))
}

async fn must_session(store: &dyn Store, id: &str) -> Result<SessionRow> {
    store
        .session(id)
        .await?
        .ok_or_else(|| anyhow!("session {id} is missing"))
}

/// A day in unix milliseconds.
const DAY_MS: i64 = 86_400_000;

async fn case_ping(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    store.ping().await.context("a fresh store answers ping")?;
    ensure!(store.user_count().await? == 0, "a fresh store has no users");
    ensure!(
        store.active_sessions().await?.is_empty(),
        "a fresh store has no sessions"
    );
    Ok(())
}

async fn case_users_and_keys(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let quota = QuotaOverride {
        sessions: Some(2),
        cpus: Some(0.5),
        ..Default::default()
    };
    let mut bob = new_user("bob", 2);
    bob.admin = true;
    bob.quota = quota.clone();
    bob.key.expires_at = Some(now_ms() + DAY_MS);
    let bob = store.add_user(bob).await?;
    ensure!(bob.name == "bob" && bob.admin, "add_user returns the user");
    ensure!(bob.quota == quota, "the quota override round-trips");
    ensure!(bob.key_prefix == "sbx_02", "the key prefix round-trips");
    ensure!(bob.expires_at.is_some(), "the key's expiry round-trips");
    ensure!(bob.last_used_at.is_none(), "a new user was never used");
    let alice = store.add_user(new_user("alice", 1)).await?;
    ensure!(alice.id != bob.id, "every user has their own id");

    let dup = store.add_user(new_user("alice", 3)).await;
    ensure!(
        matches!(dup, Err(StoreError::UserExists { ref name }) if name == "alice"),
        "a second user of the same name is UserExists, got {dup:?}"
    );
    ensure!(
        store.user_by_key([3; 32]).await?.is_none(),
        "a refused user's key does not work"
    );
    ensure!(store.user_count().await? == 2, "two users");
    let names: BTreeSet<String> = store.users().await?.into_iter().map(|u| u.name).collect();
    ensure!(
        names == BTreeSet::from(["alice".to_string(), "bob".to_string()]),
        "users() lists both, got {names:?}"
    );

    let by_key = store.user_by_key([1; 32]).await?.context("alice by key")?;
    ensure!(by_key.id == alice.id, "user_by_key finds the key's user");
    let by_name = store.user_by_name("bob").await?.context("bob by name")?;
    ensure!(by_name.id == bob.id, "user_by_name finds the user");
    ensure!(store.user_by_name("carol").await?.is_none(), "no carol");

    let used = now_ms();
    store.touch_user(&alice.id, used).await?;
    let a = store.user_by_name("alice").await?.context("alice")?;
    ensure!(a.last_used_at == Some(used), "touch_user records the use");

    ensure!(
        store.replace_key("alice", key(9, now_ms())).await?,
        "replace_key of a user answers true"
    );
    ensure!(
        store.user_by_key([1; 32]).await?.is_none(),
        "a replaced key stops working at once"
    );
    let a = store.user_by_key([9; 32]).await?.context("the new key")?;
    ensure!(a.id == alice.id, "the new key is the same user's");
    ensure!(a.key_prefix == "sbx_09", "the new key's prefix is shown");
    ensure!(
        !store.replace_key("carol", key(10, now_ms())).await?,
        "replace_key of nobody answers false"
    );

    let q = QuotaOverride {
        runs: Some(7),
        cpu_seconds_per_day: Some(90),
        ..Default::default()
    };
    ensure!(store.set_quota("alice", q.clone()).await?, "set_quota true");
    let a = store.user_by_name("alice").await?.context("alice")?;
    ensure!(
        a.quota == q,
        "set_quota replaces the override (the daily CPU quota too)"
    );
    ensure!(
        !store.set_quota("carol", q).await?,
        "set_quota of nobody false"
    );

    ensure!(
        store.remove_user("bob", now_ms()).await?,
        "remove_user true"
    );
    ensure!(
        !store.remove_user("bob", now_ms()).await?,
        "removing a removed user answers false"
    );
    ensure!(
        store.user_by_key([2; 32]).await?.is_none(),
        "a removed user's key stops working"
    );
    ensure!(store.user_count().await? == 1, "one user left");
    // The name is free again.
    store.add_user(new_user("bob", 4)).await?;
    Ok(())
}

async fn case_logins(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    let bob = add_user(&*store, "bob", 2).await?;
    let now = now_ms();
    let login = |b: u8, user: &str, expires_at: i64| NewLogin {
        token_hash: [b; 32],
        user_id: user.to_string(),
        csrf: format!("csrf-{b}"),
        created_at: now,
        expires_at,
    };
    store.add_login(login(11, &alice, now + DAY_MS)).await?;
    store.add_login(login(12, &alice, now + 1000)).await?;
    store.add_login(login(21, &bob, now + DAY_MS)).await?;

    let l = store.login([11; 32], now).await?.context("alice's login")?;
    ensure!(
        l.user.id == alice && l.csrf == "csrf-11",
        "login finds its user and csrf"
    );
    ensure!(l.expires_at == now + DAY_MS, "the expiry round-trips");
    ensure!(
        store.login([12; 32], now + 1000).await?.is_none(),
        "a login at its expiry is refused"
    );
    ensure!(store.login([99; 32], now).await?.is_none(), "unknown token");

    store.remove_login([11; 32]).await?;
    ensure!(
        store.login([11; 32], now).await?.is_none(),
        "a removed login is gone"
    );
    store.remove_login([11; 32]).await?;

    // A sign-in is bound to the key it was made with.
    store.add_login(login(13, &alice, now + DAY_MS)).await?;
    store.replace_key("alice", key(5, now)).await?;
    ensure!(
        store.login([13; 32], now).await?.is_none(),
        "a rotated key ends its sign-ins"
    );
    store.remove_user("bob", now).await?;
    ensure!(
        store.login([21; 32], now).await?.is_none(),
        "a removed user's sign-ins end"
    );
    // The user as of now: a changed quota shows.
    store.add_login(login(14, &alice, now + DAY_MS)).await?;
    let q = QuotaOverride {
        sessions: Some(1),
        ..Default::default()
    };
    store.set_quota("alice", q.clone()).await?;
    let l = store.login([14; 32], now).await?.context("alice again")?;
    ensure!(l.user.quota == q, "a login sees the user as of now");
    Ok(())
}

async fn case_session_lifecycle(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let owner = add_user(&*store, "alice", 1).await?;
    let limits = Limits {
        memory_mb: 256,
        cpus: 0.5,
        pids: 64,
        ..Limits::default()
    };
    let meta = BTreeMap::from([
        ("app".to_string(), "x".to_string()),
        ("team".to_string(), "blue".to_string()),
    ]);
    let t0 = now_ms();
    let row = SessionRow::creating("s1", &owner, limits.clone(), meta.clone(), 300, t0)
        .with_kind(SessionKind::Mcp);
    store.reserve_session(row, 5).await?;

    let s = must_session(&*store, "s1").await?;
    ensure!(s.state == SessionState::Creating, "reserved is creating");
    ensure!(s.owner == owner, "the owner is on the row");
    ensure!(s.kind == SessionKind::Mcp, "the kind round-trips");
    ensure!(s.limits == limits, "the limits round-trip");
    ensure!(s.metadata == meta, "the metadata round-trips");
    ensure!(s.idle_timeout_secs == 300, "the idle timeout round-trips");
    ensure!(
        s.created_at == t0 && s.last_used_at == t0,
        "created and used now"
    );
    ensure!(
        s.runtime_id.is_none() && s.container_id.is_none() && s.ended_at.is_none(),
        "no container and no end yet"
    );

    store.session_started("s1", "rt1", "c1").await?;
    let s = must_session(&*store, "s1").await?;
    ensure!(s.state == SessionState::Running, "started is running");
    ensure!(
        s.runtime_id.as_deref() == Some("rt1") && s.container_id.as_deref() == Some("c1"),
        "the runtime's names are recorded"
    );

    // A use moves last_used forward only: the reconciler touches with what a process last
    // saw, which may be older than what the store holds.
    store.touch_session("s1", t0 + 5000).await?;
    store.touch_session("s1", t0 + 1000).await?;
    let s = must_session(&*store, "s1").await?;
    ensure!(
        s.last_used_at == t0 + 5000,
        "touch_session never moves last_used back (got {})",
        s.last_used_at
    );
    let active: Vec<String> = store
        .active_sessions()
        .await?
        .into_iter()
        .map(|s| s.id)
        .collect();
    ensure!(active == ["s1"], "active_sessions has it, got {active:?}");

    ensure!(
        store.end_session("s1", "deleted", t0 + 6000).await?,
        "ending an active session answers true"
    );
    ensure!(
        !store.end_session("s1", "again", t0 + 7000).await?,
        "ending an ended session answers false"
    );
    let s = must_session(&*store, "s1").await?;
    ensure!(s.state == SessionState::Ended, "ended");
    ensure!(s.ended_at == Some(t0 + 6000), "the first end's time stays");
    ensure!(
        s.end_reason.as_deref() == Some("deleted"),
        "the first end's reason stays"
    );
    ensure!(
        store.active_sessions().await?.is_empty(),
        "an ended session is not active"
    );

    // A container that comes up after its session was ended does not revive it.
    reserve(&*store, "s2", &owner).await?;
    store.end_session("s2", "deleted", now_ms()).await?;
    store.session_started("s2", "rt2", "c2").await?;
    let s = must_session(&*store, "s2").await?;
    ensure!(
        s.state == SessionState::Ended,
        "session_started does not revive an ended session"
    );
    ensure!(store.session("nope").await?.is_none(), "unknown session");
    ensure!(
        !store.end_session("nope", "x", now_ms()).await?,
        "ending an unknown session answers false"
    );
    Ok(())
}

async fn case_ownership_and_paging(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    let bob = add_user(&*store, "bob", 2).await?;
    for i in 0..7 {
        reserve(&*store, &format!("a{i}"), &alice).await?;
    }
    let mut other = session_row("b0", &bob, now_ms());
    other.metadata = BTreeMap::from([("app".to_string(), "y".to_string())]);
    store.reserve_session(other, 100).await?;
    store.end_session("a3", "deleted", now_ms()).await?;

    // Newest first, by cursor, no row twice, every row once.
    let mut q = SessionQuery {
        owner: Some(alice.clone()),
        include_ended: true,
        limit: 3,
        ..Default::default()
    };
    let mut seen = Vec::new();
    for page in 0.. {
        ensure!(page < 10, "paging does not end");
        let p = store.list_sessions(&q).await?;
        ensure!(p.sessions.len() <= 3, "a page holds at most its limit");
        ensure!(
            p.sessions.iter().all(|s| s.owner == alice),
            "an owner's listing holds only their sessions"
        );
        seen.extend(p.sessions.into_iter().map(|s| s.id));
        match p.next {
            Some(next) => q.before = Some(next),
            None => break,
        }
    }
    let expected: Vec<String> = (0..7).rev().map(|i| format!("a{i}")).collect();
    ensure!(
        seen == expected,
        "pages list every session once, newest first: {seen:?}"
    );

    q.before = None;
    q.include_ended = false;
    q.limit = 100;
    let live: Vec<String> = store
        .list_sessions(&q)
        .await?
        .sessions
        .into_iter()
        .map(|s| s.id)
        .collect();
    ensure!(
        !live.contains(&"a3".to_string()) && live.len() == 6,
        "ended sessions are left out unless asked for: {live:?}"
    );

    let all = store
        .list_sessions(&SessionQuery {
            limit: 100,
            ..Default::default()
        })
        .await?;
    ensure!(
        all.sessions.len() == 7 && all.next.is_none(),
        "an admin's listing (no owner) holds every owner's live sessions"
    );
    let ys = store
        .list_sessions(&SessionQuery {
            metadata: vec![("app".into(), "y".into())],
            limit: 100,
            ..Default::default()
        })
        .await?;
    ensure!(
        ys.sessions.len() == 1 && ys.sessions[0].id == "b0",
        "a metadata filter keeps only matching sessions"
    );
    let none = store
        .list_sessions(&SessionQuery {
            owner: Some(alice.clone()),
            metadata: vec![("app".into(), "y".into())],
            limit: 100,
            ..Default::default()
        })
        .await?;
    ensure!(none.sessions.is_empty(), "filters combine");

    // Runs: the same paging, by owner, session and state.
    for i in 0..5 {
        store
            .insert_run(run_row(&format!("r{i}"), "a0", &alice), 100)
            .await?;
    }
    store.insert_run(run_row("rb", "b0", &bob), 100).await?;
    store
        .patch_run(
            "r1",
            RunPatch {
                state: Some(RunState::Succeeded),
                ended_at: Some(now_ms()),
                ..Default::default()
            },
        )
        .await?;
    let mut rq = RunQuery {
        owner: Some(alice.clone()),
        limit: 2,
        ..Default::default()
    };
    let mut seen = Vec::new();
    for page in 0.. {
        ensure!(page < 10, "run paging does not end");
        let p = store.list_runs(&rq).await?;
        ensure!(
            p.runs.iter().all(|r| r.owner == alice),
            "an owner's run listing holds only their runs"
        );
        seen.extend(p.runs.into_iter().map(|r| r.id));
        match p.next {
            Some(next) => rq.before = Some(next),
            None => break,
        }
    }
    ensure!(
        seen == ["r4", "r3", "r2", "r1", "r0"],
        "run pages list every run once, newest first: {seen:?}"
    );
    let done = store
        .list_runs(&RunQuery {
            state: Some(RunState::Succeeded),
            limit: 100,
            ..Default::default()
        })
        .await?;
    ensure!(
        done.runs.len() == 1 && done.runs[0].id == "r1",
        "a state filter keeps only that state"
    );
    let of_b0 = store
        .list_runs(&RunQuery {
            session_id: Some("b0".into()),
            limit: 100,
            ..Default::default()
        })
        .await?;
    ensure!(
        of_b0.runs.len() == 1 && of_b0.runs[0].owner == bob,
        "a session filter keeps only that session's runs"
    );

    // The owners the reconciler may touch: users, and owners of rows of removed users.
    store.remove_user("bob", now_ms()).await?;
    let owners: BTreeSet<String> = store.owner_ids().await?.into_iter().collect();
    ensure!(
        owners.contains(&alice) && owners.contains(&bob),
        "owner_ids holds users and the owners of session rows, got {owners:?}"
    );
    let b0 = must_session(&*store, "b0").await?;
    ensure!(
        b0.state == SessionState::Ended,
        "removing a user ends their sessions"
    );
    ensure!(
        must_session(&*store, "a0").await?.state != SessionState::Ended,
        "removing a user leaves others' sessions alone"
    );
    Ok(())
}

async fn case_quotas_and_usage(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    let bob = add_user(&*store, "bob", 2).await?;
    let now = now_ms();
    for i in 0..2 {
        store
            .reserve_session(session_row(&format!("s{i}"), &alice, now), 3)
            .await?;
    }
    store
        .reserve_session(
            session_row("m0", &alice, now).with_kind(SessionKind::Mcp),
            3,
        )
        .await?;
    let over = store
        .reserve_session(session_row("s9", &alice, now), 3)
        .await;
    ensure!(
        matches!(
            over,
            Err(StoreError::SessionQuota {
                limit: 3,
                active: 3
            })
        ),
        "a fourth session over a quota of 3 is SessionQuota, got {over:?}"
    );
    ensure!(
        store.session("s9").await?.is_none(),
        "a refused session leaves no row"
    );
    store
        .reserve_session(session_row("b0", &bob, now), 3)
        .await
        .context("the quota is per owner")?;
    let u = store.usage(&alice, now).await?;
    ensure!(
        u.active_sessions == 3 && u.active_mcp_sessions == 1,
        "usage counts API and MCP sessions in one quota: {u:?}"
    );
    store.end_session("s0", "deleted", now).await?;
    store
        .reserve_session(session_row("s3", &alice, now), 3)
        .await
        .context("an ended session frees its slot")?;

    for i in 0..2 {
        store
            .insert_run(run_row(&format!("r{i}"), "s1", &alice), 2)
            .await?;
    }
    let over = store.insert_run(run_row("r9", "s1", &alice), 2).await;
    ensure!(
        matches!(
            over,
            Err(StoreError::RunQuota {
                limit: 2,
                active: 2
            })
        ),
        "a third run over a quota of 2 is RunQuota, got {over:?}"
    );
    ensure!(
        store.run("r9").await?.is_none(),
        "a refused run leaves no row"
    );
    store
        .patch_run(
            "r0",
            RunPatch {
                state: Some(RunState::WaitingForHuman),
                ..Default::default()
            },
        )
        .await?;
    ensure!(
        store.usage(&alice, now).await?.active_runs == 2,
        "a run waiting for a human is in flight"
    );
    store
        .patch_run(
            "r0",
            RunPatch {
                state: Some(RunState::Failed),
                ended_at: Some(now),
                ..Default::default()
            },
        )
        .await?;
    store
        .insert_run(run_row("r2", "s1", &alice), 2)
        .await
        .context("a finished run frees its slot")?;

    ensure!(
        store.add_input_tokens(&alice, 100, now).await? == 100,
        "the day's total after the first add"
    );
    ensure!(
        store.add_input_tokens(&alice, 50, now).await? == 150,
        "tokens add up within a day"
    );
    ensure!(
        store.add_input_tokens(&alice, 7, now + DAY_MS).await? == 7,
        "the next UTC day starts from zero"
    );
    store.add_input_tokens(&bob, 1000, now).await?;
    let u = store.usage(&alice, now).await?;
    ensure!(
        u.input_tokens_today == 150 && u.active_runs == 2 && u.active_sessions == 3,
        "usage of today: {u:?}"
    );
    ensure!(
        store.usage(&alice, now + DAY_MS).await?.input_tokens_today == 7,
        "usage reads the day of `now`"
    );
    let nobody = store.usage("usr-nobody", now).await?;
    ensure!(
        nobody == Default::default(),
        "an unknown owner uses nothing"
    );
    Ok(())
}

async fn case_run_lifecycle(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    reserve(&*store, "s1", &alice).await?;
    let row = run_row("r1", "s1", &alice).with_agent(Some("data".into()));
    let created = row.created_at;
    store.insert_run(row, 10).await?;
    store.insert_run(run_row("r0", "s1", &alice), 10).await?;
    ensure!(
        must_run(&*store, "r0").await?.agent.is_none(),
        "a run without a profile has none"
    );
    let r = must_run(&*store, "r1").await?;
    ensure!(
        r.agent.as_deref() == Some("data"),
        "the agent profile round-trips"
    );
    ensure!(
        r.state == RunState::Queued && r.session_id == "s1" && r.owner == alice,
        "a queued run"
    );
    ensure!(
        r.task == "a task" && r.mode == "agent" && r.max_steps == Some(5),
        "the request round-trips"
    );
    ensure!(
        r.created_at == created && r.last_seq == 0 && r.started_at.is_none(),
        "nothing happened yet"
    );
    let in_flight: Vec<String> = store
        .runs_in_flight()
        .await?
        .into_iter()
        .map(|r| r.id)
        .collect();
    ensure!(in_flight == ["r1", "r0"], "a queued run is in flight");

    let t = now_ms();
    let question = StoredQuestion {
        text: "which?".into(),
        asked_at: t,
        expires_at: t + 1000,
    };
    store
        .patch_run(
            "r1",
            RunPatch {
                state: Some(RunState::WaitingForHuman),
                steps: Some(2),
                add_input_tokens: 10,
                add_output_tokens: 3,
                question: Some(Some(question.clone())),
                started_at: Some(t),
                ..Default::default()
            },
        )
        .await?;
    store
        .patch_run(
            "r1",
            RunPatch {
                add_input_tokens: 5,
                ..Default::default()
            },
        )
        .await?;
    let r = must_run(&*store, "r1").await?;
    ensure!(r.state == RunState::WaitingForHuman, "the state is patched");
    ensure!(r.steps == 2, "steps are set");
    ensure!(
        r.input_tokens == 15 && r.output_tokens == 3,
        "token counts add up: {} / {}",
        r.input_tokens,
        r.output_tokens
    );
    ensure!(r.question == Some(question), "the question round-trips");
    ensure!(r.started_at == Some(t), "started_at is set");
    ensure!(r.last_seq == 0, "a patch without an event adds no seq");

    let outcome = serde_json::json!({"kind": "answered", "steps": 3});
    store
        .patch_run(
            "r1",
            RunPatch {
                state: Some(RunState::Succeeded),
                outcome: Some(outcome.clone()),
                answer: Some("42".into()),
                question: Some(None),
                ended_at: Some(t + 10),
                ..Default::default()
            },
        )
        .await?;
    let r = must_run(&*store, "r1").await?;
    ensure!(r.state == RunState::Succeeded, "succeeded");
    ensure!(r.outcome == Some(outcome), "the outcome round-trips");
    ensure!(r.answer.as_deref() == Some("42"), "the answer round-trips");
    ensure!(r.question.is_none(), "Some(None) clears the question");
    ensure!(r.ended_at == Some(t + 10), "ended_at is set");
    ensure!(r.steps == 2, "a patch without steps keeps them");
    ensure!(
        store.runs_in_flight().await?.iter().all(|r| r.id != "r1"),
        "a finished run is not in flight"
    );
    ensure!(store.run("nope").await?.is_none(), "unknown run");
    Ok(())
}

async fn case_events_exactly_once(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    drive(&*store).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    reserve(&*store, "s1", &alice).await?;
    store.insert_run(run_row("r1", "s1", &alice), 10).await?;
    store.insert_run(run_row("r2", "s1", &alice), 10).await?;

    for seq in 1..=10 {
        let patch = RunPatch {
            state: (seq == 1).then_some(RunState::Running),
            steps: Some(seq),
            add_input_tokens: 1,
            ..Default::default()
        };
        store
            .append_event("r1", DRIVER, event(seq, "step"), patch)
            .await
            .with_context(|| format!("append seq {seq}"))?;
        let r = must_run(&*store, "r1").await?;
        ensure!(r.last_seq == seq, "last_seq follows each commit");
        // A reader that sees last_seq = n finds events 1..n.
        let evs = store.events_after("r1", 0, 1000).await?;
        ensure!(
            evs.len() as u64 == seq,
            "a reader that sees last_seq {seq} finds {seq} events, found {}",
            evs.len()
        );
    }
    store
        .append_event("r2", DRIVER, event(1, "other"), RunPatch::default())
        .await?;

    let r = must_run(&*store, "r1").await?;
    ensure!(
        r.state == RunState::Running && r.steps == 10 && r.input_tokens == 10,
        "each event's patch is applied with it"
    );
    let all = store.events_after("r1", 0, 1000).await?;
    let seqs: Vec<u64> = all.iter().map(|e| e.seq).collect();
    ensure!(
        seqs == (1..=10).collect::<Vec<_>>(),
        "events come in seq order: {seqs:?}"
    );
    ensure!(
        all[0] == event_like(&all[0], 1, "step"),
        "the event round-trips"
    );
    ensure!(
        all.iter().all(|e| e.kind == "step"),
        "events are per run: another run's do not mix in"
    );
    let tail: Vec<u64> = store
        .events_after("r1", 7, 1000)
        .await?
        .iter()
        .map(|e| e.seq)
        .collect();
    ensure!(tail == [8, 9, 10], "resume after a cursor: {tail:?}");
    let limited: Vec<u64> = store
        .events_after("r1", 2, 3)
        .await?
        .iter()
        .map(|e| e.seq)
        .collect();
    ensure!(limited == [3, 4, 5], "at most `limit` events: {limited:?}");
    ensure!(
        store.events_after("r1", 10, 1000).await?.is_empty(),
        "nothing after the last"
    );

    // Exactly once: a repeated or skipped seq is refused and changes nothing.
    for (seq, what) in [
        (10, "a repeated seq"),
        (5, "an old seq"),
        (12, "a skipped seq"),
    ] {
        let patch = RunPatch {
            add_input_tokens: 100,
            state: Some(RunState::Failed),
            ..Default::default()
        };
        let r = store
            .append_event("r1", DRIVER, event(seq, "dup"), patch)
            .await;
        ensure!(r.is_err(), "{what} ({seq} after 10) is refused");
    }
    let r = must_run(&*store, "r1").await?;
    ensure!(
        r.last_seq == 10 && r.input_tokens == 10 && r.state == RunState::Running,
        "a refused append applies none of its patch"
    );
    let again = store.events_after("r1", 0, 1000).await?;
    ensure!(
        again == all,
        "a refused append leaves the events as they were"
    );
    ensure!(
        store
            .append_event("nope", DRIVER, event(1, "x"), RunPatch::default())
            .await
            .is_err(),
        "appending to an unknown run is refused"
    );
    ensure!(
        store.events_after("nope", 0, 10).await?.is_empty(),
        "an unknown run has no events"
    );
    Ok(())
}

/// `e` with the seq and kind expected and the payload `event` would have made.
fn event_like(e: &StoredEvent, seq: u64, kind: &str) -> StoredEvent {
    StoredEvent {
        seq,
        time: e.time,
        kind: kind.into(),
        payload: format!(r#"{{"type":"{kind}","seq":{seq}}}"#),
    }
}

async fn case_images_and_conversation(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    reserve(&*store, "s1", &alice).await?;
    store.insert_run(run_row("r1", "s1", &alice), 10).await?;
    store.insert_run(run_row("r2", "s1", &alice), 10).await?;
    let png = vec![0x89, b'P', b'N', b'G', 0, 255];
    store
        .put_image("r1", "img1", "image/png", png.clone())
        .await?;
    store
        .put_image("r1", "img1", "image/jpeg", vec![1, 2, 3])
        .await
        .context("a second put of the same image is not an error")?;
    let got = store.image("r1", "img1").await?.context("the image")?;
    ensure!(
        got == ("image/png".to_string(), png),
        "an image is kept once per run and id: the first put stays"
    );
    ensure!(
        store.image("r2", "img1").await?.is_none(),
        "images are per run"
    );
    ensure!(store.image("r1", "nope").await?.is_none(), "unknown image");

    ensure!(
        store.conversation("s1").await?.is_none(),
        "no conversation yet"
    );
    store
        .set_conversation("s1", r#"[{"role":"user"}]"#.into(), now_ms())
        .await?;
    store
        .set_conversation(
            "s1",
            r#"[{"role":"user"},{"role":"assistant"}]"#.into(),
            now_ms(),
        )
        .await?;
    ensure!(
        store.conversation("s1").await?.as_deref()
            == Some(r#"[{"role":"user"},{"role":"assistant"}]"#),
        "set_conversation replaces the conversation"
    );
    Ok(())
}

async fn case_concurrent_writers(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    drive(&*store).await?;
    let alice = add_user(&*store, "alice", 1).await?;

    // 16 concurrent creates against a quota of 3: exactly 3 get in.
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (store, alice) = (store.clone(), alice.clone());
            tokio::spawn(async move {
                store
                    .reserve_session(session_row(&format!("c{i}"), &alice, now_ms()), 3)
                    .await
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await? {
            Ok(()) => ok += 1,
            Err(StoreError::SessionQuota { limit: 3, .. }) => {}
            Err(e) => return Err(anyhow!("a concurrent create failed otherwise: {e}")),
        }
    }
    ensure!(
        ok == 3,
        "concurrent creates overshot or undershot: {ok} of 3"
    );
    ensure!(
        store.usage(&alice, now_ms()).await?.active_sessions == 3,
        "three sessions recorded"
    );

    let session = store.active_sessions().await?[0].id.clone();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (store, alice, session) = (store.clone(), alice.clone(), session.clone());
            tokio::spawn(async move {
                store
                    .insert_run(run_row(&format!("r{i}"), &session, &alice), 4)
                    .await
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await? {
            Ok(()) => ok += 1,
            Err(StoreError::RunQuota { limit: 4, .. }) => {}
            Err(e) => return Err(anyhow!("a concurrent run insert failed otherwise: {e}")),
        }
    }
    ensure!(ok == 4, "concurrent runs overshot or undershot: {ok} of 4");

    // Writers racing for the same next seq: each seq is committed exactly once, in order.
    let run = store
        .runs_in_flight()
        .await?
        .first()
        .map(|r| r.id.clone())
        .context("a run in flight")?;
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (store, run) = (store.clone(), run.clone());
            tokio::spawn(async move {
                let mut committed = 0u64;
                for _ in 0..10 {
                    let Some(r) = store.run(&run).await? else {
                        return Err(anyhow!("the run vanished"));
                    };
                    let patch = RunPatch {
                        add_output_tokens: 1,
                        ..Default::default()
                    };
                    if store
                        .append_event(&run, DRIVER, event(r.last_seq + 1, &format!("w{w}")), patch)
                        .await
                        .is_ok()
                    {
                        committed += 1;
                    }
                }
                Ok::<_, anyhow::Error>(committed)
            })
        })
        .collect();
    let mut committed = 0;
    for w in writers {
        committed += w.await??;
    }
    let evs = store.events_after(&run, 0, 10_000).await?;
    let seqs: Vec<u64> = evs.iter().map(|e| e.seq).collect();
    ensure!(committed > 0, "some append won");
    ensure!(
        seqs == (1..=committed).collect::<Vec<_>>(),
        "{committed} appends won, the events are {seqs:?}"
    );
    let r = must_run(&*store, &run).await?;
    ensure!(
        r.last_seq == committed && r.output_tokens == committed,
        "the run saw each won append's patch once: last_seq {}, tokens {}",
        r.last_seq,
        r.output_tokens
    );

    // Counters under concurrent adds lose nothing.
    let now = now_ms();
    let adds: Vec<_> = (0..20)
        .map(|_| {
            let (store, alice) = (store.clone(), alice.clone());
            tokio::spawn(async move { store.add_input_tokens(&alice, 3, now).await })
        })
        .collect();
    for a in adds {
        a.await??;
    }
    ensure!(
        store.usage(&alice, now).await?.input_tokens_today == 60,
        "concurrent token adds add up"
    );
    Ok(())
}

async fn case_delete_and_purge(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    drive(&*store).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    for s in ["s1", "s2", "s3"] {
        reserve(&*store, s, &alice).await?;
        let run = format!("{s}r");
        store.insert_run(run_row(&run, s, &alice), 10).await?;
        store
            .append_event(&run, DRIVER, event(1, "step"), RunPatch::default())
            .await?;
        store.put_image(&run, "i", "image/png", vec![1]).await?;
        store.set_conversation(s, "[]".into(), now_ms()).await?;
    }

    // Ending keeps the history; deleting takes all of it.
    store.end_session("s1", "deleted", now_ms()).await?;
    ensure!(store.run("s1r").await?.is_some(), "ending keeps the runs");
    ensure!(
        store.conversation("s1").await?.is_some(),
        "ending keeps the conversation"
    );
    ensure!(store.delete_session("s1").await?, "delete answers true");
    ensure!(!store.delete_session("s1").await?, "then false");
    ensure!(store.session("s1").await?.is_none(), "the row is gone");
    ensure!(store.run("s1r").await?.is_none(), "its runs go with it");
    ensure!(
        store.events_after("s1r", 0, 10).await?.is_empty(),
        "their events go with them"
    );
    ensure!(
        store.image("s1r", "i").await?.is_none(),
        "their images go with them"
    );
    ensure!(
        store.conversation("s1").await?.is_none(),
        "its conversation goes with it"
    );
    ensure!(
        store.run("s2r").await?.is_some(),
        "other sessions' runs stay"
    );

    // Retention: ended sessions and finished runs that ended before the cutoff.
    let t = now_ms();
    store.end_session("s2", "idle", t - 10_000).await?;
    store
        .patch_run(
            "s2r",
            RunPatch {
                state: Some(RunState::Succeeded),
                ended_at: Some(t - 10_000),
                ..Default::default()
            },
        )
        .await?;
    store
        .patch_run(
            "s3r",
            RunPatch {
                state: Some(RunState::Failed),
                ended_at: Some(t + 10_000),
                ..Default::default()
            },
        )
        .await?;
    let purged = store.purge_before(t).await?;
    ensure!(purged > 0, "purge_before counts what it deleted");
    ensure!(
        store.session("s2").await?.is_none(),
        "an old ended session goes"
    );
    ensure!(
        store.run("s2r").await?.is_none(),
        "an old finished run goes"
    );
    ensure!(store.session("s3").await?.is_some(), "a live session stays");
    ensure!(
        store.run("s3r").await?.is_some(),
        "a run that ended after the cutoff stays"
    );
    ensure!(
        store.events_after("s3r", 0, 10).await?.len() == 1,
        "a kept run keeps its events"
    );
    ensure!(
        store.purge_before(t).await? == 0,
        "a second purge finds nothing"
    );
    Ok(())
}

async fn case_restart_recovery(f: &dyn StoreFactory) -> Result<()> {
    let (store, name) = f.fresh().await.context("open a fresh store")?;
    drive(&*store).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    let t = now_ms();
    store
        .add_login(NewLogin {
            token_hash: [7; 32],
            user_id: alice.clone(),
            csrf: "c".into(),
            created_at: t,
            expires_at: t + DAY_MS,
        })
        .await?;
    reserve(&*store, "s1", &alice).await?;
    store.session_started("s1", "rt1", "c1").await?;
    reserve(&*store, "s2", &alice).await?;
    store.end_session("s2", "deleted", t).await?;
    store.insert_run(run_row("r1", "s1", &alice), 10).await?;
    for seq in 1..=3 {
        store
            .append_event("r1", DRIVER, event(seq, "step"), RunPatch::default())
            .await?;
    }
    store.put_image("r1", "i", "image/png", vec![9]).await?;
    store.set_conversation("s1", "[1]".into(), t).await?;
    store.add_input_tokens(&alice, 42, t).await?;
    let before = store.events_after("r1", 0, 100).await?;
    drop(store);

    let store = f.reopen(&name).await.context("reopen the same store")?;
    store.ping().await.context("a reopened store is writable")?;
    ensure!(
        store.user_by_key([1; 32]).await?.map(|u| u.id) == Some(alice.clone()),
        "users and keys survive a restart"
    );
    ensure!(
        store.login([7; 32], t).await?.is_some(),
        "sign-ins survive a restart"
    );
    let s1 = must_session(&*store, "s1").await?;
    ensure!(
        s1.state == SessionState::Running && s1.runtime_id.as_deref() == Some("rt1"),
        "a running session survives with its runtime id"
    );
    ensure!(
        must_session(&*store, "s2").await?.state == SessionState::Ended,
        "an ended session stays ended"
    );
    let active: Vec<String> = store
        .active_sessions()
        .await?
        .into_iter()
        .map(|s| s.id)
        .collect();
    ensure!(
        active == ["s1"],
        "active sessions after a restart: {active:?}"
    );
    let in_flight: Vec<String> = store
        .runs_in_flight()
        .await?
        .into_iter()
        .map(|r| r.id)
        .collect();
    ensure!(
        in_flight == ["r1"],
        "what a restart interrupts is found: {in_flight:?}"
    );
    ensure!(
        store.events_after("r1", 0, 100).await? == before,
        "events survive a restart"
    );
    ensure!(
        must_run(&*store, "r1").await?.last_seq == 3,
        "last_seq survives a restart"
    );
    store
        .append_event("r1", DRIVER, event(4, "step"), RunPatch::default())
        .await
        .context("appending continues at last_seq + 1 after a restart")?;
    ensure!(
        store
            .append_event("r1", DRIVER, event(4, "step"), RunPatch::default())
            .await
            .is_err(),
        "and stays exactly once"
    );
    ensure!(
        store.image("r1", "i").await?.is_some(),
        "images survive a restart"
    );
    ensure!(
        store.conversation("s1").await?.as_deref() == Some("[1]"),
        "the conversation survives a restart"
    );
    ensure!(
        store.usage(&alice, t).await?.input_tokens_today == 42,
        "token counts survive a restart"
    );
    let u = store.usage(&alice, t).await?;
    ensure!(
        u.active_sessions == 1 && u.active_runs == 1,
        "usage after a restart: {u:?}"
    );
    drop(store);
    // A second reopen (migrations, if any, are not applied twice).
    let store = f.reopen(&name).await.context("reopen a second time")?;
    ensure!(store.user_count().await? == 1, "still one user");
    Ok(())
}
