//! Store conformance cases of sessions' egress (issue 24): the policy on the session row
//! (recorded at the reservation, changed while the session lives, refused once it ended),
//! the user's quota of the widest policy, and the egress log with its counters: bounded per
//! session, newest first, gone with its session.

use std::collections::BTreeMap;

use anyhow::{Result, anyhow, ensure};
use sandboxd_core::config::Limits;
use sandboxd_core::config::egress::EgressPolicy;
use sandboxd_core::egress::EgressRecord;
use sandboxd_core::store::egress::{MAX_RECORD_TEXT, MAX_RECORDS_PER_SESSION};
use sandboxd_core::store::{EgressCounters, QuotaOverride, SessionRow, Store, now_ms};

use super::store::{StoreFactory, add_user, fresh};

fn row(id: &str, owner: &str, egress: &str) -> Result<SessionRow> {
    let policy = EgressPolicy::parse(egress).map_err(|e| anyhow!(e))?;
    Ok(
        SessionRow::creating(id, owner, Limits::default(), BTreeMap::new(), 60, now_ms())
            .with_egress(policy),
    )
}

fn record(
    session: &str,
    owner: &str,
    host: &str,
    allowed: bool,
    up: u64,
    down: u64,
    at: i64,
) -> EgressRecord {
    EgressRecord {
        session: session.into(),
        owner: owner.into(),
        method: "CONNECT".into(),
        host: host.into(),
        port: 443,
        allowed,
        rule: if allowed {
            "*.example.org".into()
        } else {
            "not in the allowlist".into()
        },
        reason: (!allowed).then(|| format!("{host} is not in the allowlist")),
        bytes_up: up,
        bytes_down: down,
        started_ms: at,
        duration_ms: 7,
    }
}

async fn policy_of(store: &dyn Store, id: &str) -> Result<EgressPolicy> {
    Ok(store
        .session(id)
        .await?
        .ok_or_else(|| anyhow!("session {id} is missing"))?
        .egress)
}

/// The policy is recorded by the reservation in its canonical form, read back equal,
/// replaced while the session lives (never after it ended), and a user's quota keeps the
/// widest policy they may set.
pub(super) async fn case_session_egress(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let ann = add_user(&*store, "ann", 1).await?;
    store.reserve_session(row("e0", &ann, "off")?, 10).await?;
    store
        .reserve_session(
            row("e1", &ann, "*.Example.org, a.net,!ads.example.org")?,
            10,
        )
        .await?;
    ensure!(policy_of(&*store, "e0").await?.is_off(), "off is kept");
    let e1 = policy_of(&*store, "e1").await?;
    ensure!(
        e1.to_string() == "*.example.org,a.net,!ads.example.org",
        "the canonical policy is kept: {e1}"
    );
    let any = EgressPolicy::any();
    ensure!(
        store.set_session_egress("e0", &any).await?,
        "a live session's policy changes"
    );
    ensure!(
        policy_of(&*store, "e0").await? == any,
        "the new policy is read back"
    );
    ensure!(
        !store.set_session_egress("nope", &any).await?,
        "a missing session has no policy to change"
    );
    store.end_session("e1", "deleted", now_ms()).await?;
    ensure!(
        !store.set_session_egress("e1", &any).await?,
        "an ended session's policy does not change"
    );
    ensure!(policy_of(&*store, "e1").await? == e1, "and stays as it was");
    let listed = store.active_sessions().await?;
    ensure!(
        listed.iter().any(|r| r.id == "e0" && r.egress == any),
        "listings carry the policy: {listed:?}"
    );
    let quota = QuotaOverride {
        egress: Some(EgressPolicy::parse("*.example.org").map_err(|e| anyhow!(e))?),
        ..Default::default()
    };
    ensure!(
        store.set_quota("ann", quota.clone()).await?,
        "ann's quota is set"
    );
    let user = store
        .user_by_name("ann")
        .await?
        .ok_or_else(|| anyhow!("ann is missing"))?;
    ensure!(
        user.quota == quota,
        "the quota's egress is kept: {:?}",
        user.quota
    );
    Ok(())
}

/// Records add to the counters of their session only, come back newest first (with a
/// `since` bound), are cut to the stored length, and a record of an unknown session is
/// dropped without an error.
pub(super) async fn case_egress_log(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let ann = add_user(&*store, "ann", 1).await?;
    store.reserve_session(row("l0", &ann, "any")?, 10).await?;
    store.reserve_session(row("l1", &ann, "any")?, 10).await?;
    let t = now_ms();
    store
        .add_egress_record(&record("l0", &ann, "a.example.org", true, 100, 2000, t))
        .await?;
    store
        .add_egress_record(&record("l0", &ann, "evil.test", false, 0, 0, t + 1))
        .await?;
    let long = "x".repeat(5000);
    store
        .add_egress_record(&record("l0", &ann, &long, true, 5, 6, t + 2))
        .await?;
    store
        .add_egress_record(&record("l1", &ann, "b.example.org", true, 1, 1, t))
        .await?;
    store
        .add_egress_record(&record("gone", &ann, "c.example.org", true, 1, 1, t))
        .await?;
    let c = store.egress_counters("l0").await?;
    let want = EgressCounters {
        connections: 2,
        refused: 1,
        bytes_up: 105,
        bytes_down: 2006,
    };
    ensure!(c == want, "l0's counters: {c:?}");
    ensure!(
        store.egress_counters("gone").await? == EgressCounters::default(),
        "an unknown session counts nothing"
    );
    let recs = store.egress_records("l0", None, 10).await?;
    let hosts: Vec<usize> = recs.iter().map(|r| r.host.len()).collect();
    ensure!(recs.len() == 3, "three records of l0, got {}", recs.len());
    ensure!(
        hosts[0] == MAX_RECORD_TEXT,
        "the long host is cut to the stored length: {hosts:?}"
    );
    ensure!(
        recs[1] == record("l0", &ann, "evil.test", false, 0, 0, t + 1),
        "a record reads back as written: {:?}",
        recs[1]
    );
    let since = store.egress_records("l0", Some(t + 1), 10).await?;
    ensure!(
        since.len() == 2,
        "two records since t+1, got {}",
        since.len()
    );
    ensure!(
        store.egress_records("l0", None, 1).await?.len() == 1,
        "the limit holds"
    );
    ensure!(
        store.egress_records("l1", None, 10).await?.len() == 1,
        "l1 has its own"
    );
    Ok(())
}

/// The log keeps the newest `MAX_RECORDS_PER_SESSION` records of a session while the
/// counters keep counting all; deleting the session's history takes its log with it.
pub(super) async fn case_egress_log_bounded(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let ann = add_user(&*store, "ann", 1).await?;
    store.reserve_session(row("b0", &ann, "any")?, 10).await?;
    let t = now_ms();
    let n = MAX_RECORDS_PER_SESSION + 5;
    for i in 0..n {
        let host = format!("h{i}.example.org");
        store
            .add_egress_record(&record("b0", &ann, &host, true, 1, 2, t + i as i64))
            .await?;
    }
    let c = store.egress_counters("b0").await?;
    ensure!(
        c.connections == n && c.bytes_up == n && c.bytes_down == 2 * n,
        "the counters count every record: {c:?}"
    );
    let kept = store.egress_records("b0", None, u32::MAX).await?;
    ensure!(
        kept.len() as u64 == MAX_RECORDS_PER_SESSION,
        "{} records kept, not {MAX_RECORDS_PER_SESSION}",
        kept.len()
    );
    ensure!(
        kept[0].host == format!("h{}.example.org", n - 1)
            && kept.last().map(|r| r.host.as_str()) == Some("h5.example.org"),
        "the newest are kept, newest first"
    );
    ensure!(store.delete_session("b0").await?, "the session is deleted");
    ensure!(
        store.egress_records("b0", None, 10).await?.is_empty(),
        "its log went with it"
    );
    Ok(())
}
