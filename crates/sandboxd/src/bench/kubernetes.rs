//! `sandboxd bench kubernetes` (issue 23, "Speed"): the same operations through any
//! `Runtime`, so one run can time them on the Kubernetes backend (against the fake API server
//! of crates/kubernetes/examples, whose pods are Docker containers, or a real cluster) and
//! on the Docker runtime directly, and the difference is the backend's own overhead:
//! - a cold create (a manager with no pool): create → first `true` through the persistent
//!   shell answered, and the create's part of it;
//! - a command's round trip on a running session: `true` through the persistent shell (what
//!   the tools use) and as a one-shot exec (a new process each, what `spawn` costs);
//! - a warm claim from a full pool, as the manager claims (pool.rs: `mark_claimed`, then
//!   the sandbox is the session's): claim → first `true` answered; the refill is not timed;
//! - the drained pool: a pool of `pool` filled once and no refill running, then `pool +
//!   beyond` claims one after the other: the first take warm pods, the rest fall back to
//!   cold creates at once (no wait for the pool), each timed claim → first `true`.
//!
//! With an `ApiCalls` counter (the Kubernetes client's, calls.rs), each operation's API
//! server requests are counted too: what a real cluster adds is at least that many round
//! trips times its API server's latency (and, for a create, its pod start). The Lease's
//! renewals run in the background on their own clock and are left out of every count.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd_core::config::{LimitRequest, Limits, PoolConfig, SessionsConfig};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::records::NoRecords;
use sandboxd_core::sandbox::{
    CreateOptions, ExecRequest, Owner, Runtime, SessionManager, ShellOptions,
};
use sandboxd_kubernetes::ApiCalls;

/// How much of each to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    pub limits: Limits,
    /// Repetitions of the command round trips; the slower operations take fewer (`rounds`).
    pub iterations: usize,
    /// The warm pool's size (the drained measurement's too).
    pub pool: usize,
    /// Claims beyond the pool in the drained measurement.
    pub beyond: usize,
}

impl Plan {
    /// Repetitions of an operation that makes a sandbox (a cold create, a refill).
    pub fn rounds(&self) -> usize {
        self.iterations.clamp(1, 100)
    }
}

/// The API server requests of one kind of operation, summed over its repetitions.
#[derive(Debug, Default, Clone)]
pub struct Calls {
    pub by_kind: BTreeMap<String, u64>,
    pub ops: u64,
}

impl Calls {
    fn add(&mut self, sent: BTreeMap<String, u64>) {
        self.ops += 1;
        for (k, n) in sent {
            if !k.ends_with(" leases") {
                *self.by_kind.entry(k).or_default() += n;
            }
        }
    }

    /// Requests per operation.
    pub fn per_op(&self) -> f64 {
        self.by_kind.values().sum::<u64>() as f64 / self.ops.max(1) as f64
    }

    /// `POST pods 1 · GET pods 1`: each kind per operation.
    pub fn describe(&self) -> String {
        if self.by_kind.is_empty() {
            return "none".into();
        }
        self.by_kind
            .iter()
            .map(|(k, n)| format!("{k} {}", fmt_per_op(*n, self.ops)))
            .collect::<Vec<_>>()
            .join(" · ")
    }
}

fn fmt_per_op(n: u64, ops: u64) -> String {
    let v = n as f64 / ops.max(1) as f64;
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// One runtime's samples (each sorted) and, when counted, its operations' requests.
#[derive(Debug, Default)]
pub struct Side {
    pub cold: Vec<Duration>,
    pub cold_create: Vec<Duration>,
    pub shell: Vec<Duration>,
    pub exec: Vec<Duration>,
    pub warm: Vec<Duration>,
    pub drained_warm: Vec<Duration>,
    pub drained_cold: Vec<Duration>,
    /// By operation: "cold create", "first command", "command", "one-shot exec",
    /// "warm claim", "claim beyond the pool", "remove".
    pub calls: BTreeMap<&'static str, Calls>,
}

/// Counts the requests of the operations it is told about (nothing without a counter).
struct Counter<'a> {
    api: Option<&'a ApiCalls>,
    calls: BTreeMap<&'static str, Calls>,
}

impl Counter<'_> {
    fn mark(&self) -> BTreeMap<String, u64> {
        self.api.map(ApiCalls::snapshot).unwrap_or_default()
    }

    fn add(&mut self, op: &'static str, before: &BTreeMap<String, u64>) {
        if let Some(api) = self.api {
            self.calls.entry(op).or_default().add(api.since(before));
        }
    }
}

fn owner() -> anyhow::Result<Owner> {
    Ok(Owner::new("bench")?)
}

fn manager(runtime: &Arc<dyn Runtime>, plan: &Plan, pool: usize) -> Arc<SessionManager> {
    SessionManager::with_pool(
        runtime.clone(),
        plan.limits.clone(),
        SessionsConfig {
            max: 128,
            max_per_owner: 128,
            ..SessionsConfig::default()
        },
        PoolConfig {
            size: pool,
            ..PoolConfig::default()
        },
        Arc::new(NoRecords),
    )
}

async fn session(m: &SessionManager) -> anyhow::Result<Arc<Session>> {
    Ok(m.create(
        &owner()?,
        &LimitRequest::default(),
        CreateOptions::default(),
    )
    .await?)
}

async fn first_true(s: &Session) -> anyhow::Result<()> {
    let out = s.sandbox.shell("true", ShellOptions::default()).await?;
    anyhow::ensure!(out.exit_code == Some(0), "`true` failed: {out:?}");
    Ok(())
}

/// Every measurement on one runtime; `api` counts the Kubernetes client's requests.
pub async fn measure(
    runtime: Arc<dyn Runtime>,
    plan: &Plan,
    api: Option<&ApiCalls>,
) -> anyhow::Result<Side> {
    let mut side = Side::default();
    let mut count = Counter {
        api,
        calls: BTreeMap::new(),
    };
    let cold = manager(&runtime, plan, 0);
    let result = async {
        cold_creates(&cold, plan, &mut side, &mut count).await?;
        round_trips(&cold, plan, &mut side, &mut count).await?;
        warm_claims(&runtime, plan, &mut side, &mut count).await?;
        drained(&runtime, plan, &mut side, &mut count).await
    }
    .await;
    cold.remove_all().await;
    result?;
    side.calls = count.calls;
    for v in [
        &mut side.cold,
        &mut side.cold_create,
        &mut side.shell,
        &mut side.exec,
        &mut side.warm,
        &mut side.drained_warm,
        &mut side.drained_cold,
    ] {
        v.sort();
    }
    Ok(side)
}

async fn cold_creates(
    m: &SessionManager,
    plan: &Plan,
    side: &mut Side,
    count: &mut Counter<'_>,
) -> anyhow::Result<()> {
    for _ in 0..plan.rounds().min(10) {
        let before = count.mark();
        let t = Instant::now();
        let s = session(m).await?;
        side.cold_create.push(t.elapsed());
        count.add("cold create", &before);
        let before = count.mark();
        first_true(&s).await?;
        side.cold.push(t.elapsed());
        count.add("first command", &before);
        let before = count.mark();
        m.admin_remove(&s.id).await?;
        count.add("remove", &before);
    }
    Ok(())
}

async fn round_trips(
    m: &SessionManager,
    plan: &Plan,
    side: &mut Side,
    count: &mut Counter<'_>,
) -> anyhow::Result<()> {
    let s = session(m).await?;
    first_true(&s).await?;
    for _ in 0..plan.iterations.max(1) {
        let before = count.mark();
        let t = Instant::now();
        first_true(&s).await?;
        side.shell.push(t.elapsed());
        count.add("command", &before);
    }
    for _ in 0..plan.iterations.clamp(1, 50) {
        let req = ExecRequest::new(["true"]);
        let before = count.mark();
        let t = Instant::now();
        let out = s.sandbox.exec(req).await?;
        side.exec.push(t.elapsed());
        count.add("one-shot exec", &before);
        anyhow::ensure!(out.exit_code == Some(0), "exec `true` failed: {out:?}");
    }
    m.admin_remove(&s.id).await?;
    Ok(())
}

/// A claim → its first `true` answered; whether the pool gave it (the refill task does not
/// run here, so the pool shrinks by one exactly when a claim is warm).
async fn claim(m: &SessionManager) -> anyhow::Result<(Duration, bool, Arc<Session>)> {
    let ready = m.pool_ready();
    let t = Instant::now();
    let s = session(m).await?;
    first_true(&s).await?;
    let took = t.elapsed();
    Ok((took, m.pool_ready() < ready, s))
}

async fn warm_claims(
    runtime: &Arc<dyn Runtime>,
    plan: &Plan,
    side: &mut Side,
    count: &mut Counter<'_>,
) -> anyhow::Result<()> {
    let m = manager(runtime, plan, plan.pool.max(1));
    let result = async {
        for _ in 0..plan.rounds() {
            super::support::fill_pool(&m, plan.pool.max(1)).await?;
            let before = count.mark();
            let (took, warm, s) = claim(&m).await?;
            count.add("warm claim", &before);
            anyhow::ensure!(warm, "a claim from a full pool was not warm");
            side.warm.push(took);
            m.admin_remove(&s.id).await?;
        }
        Ok(())
    }
    .await;
    m.remove_all().await;
    result
}

async fn drained(
    runtime: &Arc<dyn Runtime>,
    plan: &Plan,
    side: &mut Side,
    count: &mut Counter<'_>,
) -> anyhow::Result<()> {
    let size = plan.pool.max(1);
    let m = manager(runtime, plan, size);
    let result = async {
        super::support::fill_pool(&m, size).await?;
        for i in 0..size + plan.beyond {
            let before = count.mark();
            let (took, warm, _kept) = claim(&m).await?;
            anyhow::ensure!(
                warm == (i < size),
                "claim {} of a pool of {size} was {} (expected the pool's {} first)",
                i + 1,
                if warm { "warm" } else { "cold" },
                size
            );
            if warm {
                side.drained_warm.push(took);
            } else {
                side.drained_cold.push(took);
                count.add("claim beyond the pool", &before);
            }
        }
        Ok(())
    }
    .await;
    m.remove_all().await;
    result
}
