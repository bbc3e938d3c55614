//! Store conformance case of usage metering (issue 28, item 2): cgroup samples add the CPU
//! counter's difference and memory × time from the stored last reading (which survives a
//! reopen), a late reading adds nothing, a new container's counter counts from zero, counts
//! add bytes, tool calls and
//! tokens per model; each session's totals and its owner's days agree, the days of one owner
//! never show another's, and samples racing on one session count its CPU once.

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use sandboxd_core::config::Limits;
use sandboxd_core::store::metering::ModelTokens;
use sandboxd_core::store::{Counted, Reading, SessionRow, Store, UsageQuery, UsageTotals};

use super::store::{StoreFactory, add_user};

const DAY: i64 = 86_400_000;
/// Midnight UTC of a day in 2024.
const T0: i64 = 19_800 * DAY;
const GIB: u64 = 1 << 30;

async fn started(store: &dyn Store, id: &str, owner: &str, at: i64) -> Result<()> {
    let row = SessionRow::creating(id, owner, Limits::default(), BTreeMap::new(), 60, at);
    store.reserve_session(row, 100).await?;
    store
        .session_started(id, &format!("rt-{id}"), &format!("c-{id}"))
        .await?;
    Ok(())
}

fn reading(container: &str, at: i64, cpu_usec: Option<u64>, memory_bytes: Option<u64>) -> Reading {
    Reading {
        container: container.into(),
        at,
        cpu_usec,
        memory_bytes,
    }
}

fn tokens(model: &str, tokens_in: u64, tokens_out: u64) -> Counted {
    Counted {
        model: Some(model.into()),
        tokens_in,
        tokens_out,
        ..Counted::default()
    }
}

fn near(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

fn query(owner: Option<&str>) -> UsageQuery {
    UsageQuery {
        owner: owner.map(str::to_string),
        from: T0 - DAY,
        to: T0 + 3 * DAY,
        limit: 100,
    }
}

/// The sum of several totals (tokens summed per model).
fn sum<'a>(all: impl Iterator<Item = &'a UsageTotals>) -> UsageTotals {
    let mut s = UsageTotals::default();
    let mut models: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for t in all {
        s.cpu_seconds += t.cpu_seconds;
        s.memory_gib_seconds += t.memory_gib_seconds;
        s.wall_seconds += t.wall_seconds;
        s.bytes_in += t.bytes_in;
        s.bytes_out += t.bytes_out;
        s.tool_calls += t.tool_calls;
        for m in &t.tokens {
            let e = models.entry(m.model.clone()).or_default();
            e.0 += m.tokens_in;
            e.1 += m.tokens_out;
        }
    }
    s.tokens = models
        .into_iter()
        .map(|(model, (tokens_in, tokens_out))| ModelTokens {
            model,
            tokens_in,
            tokens_out,
        })
        .collect();
    s
}

fn same(a: &UsageTotals, b: &UsageTotals) -> bool {
    near(a.cpu_seconds, b.cpu_seconds)
        && near(a.memory_gib_seconds, b.memory_gib_seconds)
        && near(a.wall_seconds, b.wall_seconds)
        && (a.bytes_in, a.bytes_out, a.tool_calls) == (b.bytes_in, b.bytes_out, b.tool_calls)
        && a.tokens == b.tokens
}

pub(super) async fn case_usage_metering(f: &dyn StoreFactory) -> Result<()> {
    let (store, name) = f.fresh().await?;
    let alice = add_user(store.as_ref(), "alice", 1).await?;
    let bob = add_user(store.as_ref(), "bob", 2).await?;
    started(store.as_ref(), "a1", &alice, T0).await?;
    started(store.as_ref(), "a2", &alice, T0).await?;
    started(store.as_ref(), "b1", &bob, T0).await?;
    let r = reading("c", T0, Some(1), Some(1));
    ensure!(
        !store.meter_sample("rt-nobody", &r).await?,
        "no row names it"
    );
    ensure!(
        !store.meter_count("nobody", &tokens("m", 1, 1), T0).await?,
        "no such session"
    );
    // 10 s at 1 GiB with 1 s of CPU, then 10 s at 2 GiB with 2 s more.
    let r = reading("c1", T0 + 10_000, Some(1_000_000), Some(GIB));
    ensure!(
        store.meter_sample("rt-a1", &r).await?,
        "a sample of a known sandbox is kept"
    );
    let r = reading("c1", T0 + 20_000, Some(3_000_000), Some(2 * GIB));
    store.meter_sample("rt-a1", &r).await?;
    // A reading of the same container taken before that one, arriving late: nothing.
    let late = reading("c1", T0 + 15_000, Some(2_000_000), Some(GIB));
    ensure!(store.meter_sample("rt-a1", &late).await?, "known, if late");
    let files = Counted {
        bytes_in: 100,
        bytes_out: 50,
        tool_calls: 2,
        ..Counted::default()
    };
    ensure!(
        store.meter_count("a1", &files, T0 + 20_500).await?,
        "counted"
    );
    store
        .meter_count("a1", &tokens("m1", 10, 5), T0 + 21_000)
        .await?;
    store
        .meter_count("a1", &tokens("m2", 1, 1), T0 + 21_000)
        .await?;
    store
        .meter_count("a1", &tokens("m1", 10, 5), T0 + 22_000)
        .await?;
    store.meter_count("b1", &files, T0 + 1_000).await?;

    // A restart goes on from the stored reading: 0.5 s more, no memory reading.
    drop(store);
    let store = f.reopen(&name).await?;
    let r = reading("c1", T0 + 30_000, Some(3_500_000), None);
    store.meter_sample("rt-a1", &r).await?;
    // A new container (resumed): its CPU counts from zero, no memory for the gap.
    let r = reading("c2", T0 + 40_000, Some(200_000), Some(GIB));
    store.meter_sample("rt-a1", &r).await?;
    // The next day: a2's first sample counts from its start.
    let r = reading("c3", T0 + DAY + 1_000, Some(1_000_000), Some(0));
    store.meter_sample("rt-a2", &r).await?;

    let sessions = store.usage_sessions(&query(Some(&alice))).await?;
    let ids: Vec<_> = sessions.iter().map(|s| s.session_id.as_str()).collect();
    ensure!(
        ids == ["a1", "a2"],
        "alice's sessions only, oldest first: {ids:?}"
    );
    let a1 = &sessions[0].totals;
    ensure!(
        near(a1.cpu_seconds, 3.7) && near(a1.wall_seconds, 40.0),
        "a1's CPU and wall time: {a1:?}"
    );
    ensure!(near(a1.memory_gib_seconds, 30.0), "a1's memory: {a1:?}");
    ensure!(
        (a1.bytes_in, a1.bytes_out, a1.tool_calls) == (100, 50, 2),
        "a1's counts: {a1:?}"
    );
    let want = vec![
        ModelTokens {
            model: "m1".into(),
            tokens_in: 20,
            tokens_out: 10,
        },
        ModelTokens {
            model: "m2".into(),
            tokens_in: 1,
            tokens_out: 1,
        },
    ];
    ensure!(a1.tokens == want, "a1's tokens per model: {:?}", a1.tokens);
    let a2 = &sessions[1].totals;
    ensure!(
        near(a2.wall_seconds, (DAY + 1_000) as f64 / 1e3) && near(a2.cpu_seconds, 1.0),
        "a2 counts from its start: {a2:?}"
    );

    let days = store.usage_days(&query(Some(&alice))).await?;
    let names: Vec<_> = days.iter().map(|d| d.day.as_str()).collect();
    ensure!(
        names == ["2024-03-18", "2024-03-19"],
        "alice's days: {names:?}"
    );
    ensure!(days.iter().all(|d| d.owner == alice), "only alice's days");
    let by_days = sum(days.iter().map(|d| &d.totals));
    let by_sessions = sum(sessions.iter().map(|s| &s.totals));
    ensure!(
        same(&by_days, &by_sessions),
        "the days sum to the sessions: {by_days:?} vs {by_sessions:?}"
    );
    let everyone = store.usage_days(&query(None)).await?;
    ensure!(
        everyone.len() == 3 && everyone.iter().any(|d| d.owner == bob),
        "everyone's days: {everyone:?}"
    );
    let bobs = store.usage_sessions(&query(Some(&bob))).await?;
    ensure!(
        bobs.len() == 1 && bobs[0].totals.bytes_in == 100,
        "bob's: {bobs:?}"
    );

    // Samples racing on one session with one reading count its CPU once.
    started(store.as_ref(), "a3", &alice, T0 + DAY).await?;
    let racing = (0..8).map(|_| {
        let store = store.clone();
        tokio::spawn(async move {
            let r = reading("c4", T0 + DAY + 5_000, Some(5_000_000), None);
            store.meter_sample("rt-a3", &r).await
        })
    });
    for r in futures::future::join_all(racing).await {
        ensure!(r??, "the racing sample was kept");
    }
    let a3 = store.usage_sessions(&query(Some(&alice))).await?;
    let a3 = a3.iter().find(|s| s.session_id == "a3");
    ensure!(
        a3.is_some_and(|s| near(s.totals.cpu_seconds, 5.0) && near(s.totals.wall_seconds, 5.0)),
        "racing samples count once: {a3:?}"
    );
    Ok(())
}
