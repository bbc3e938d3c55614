//! `sandboxd bench serve`'s second table: `serve` as replicas on one PostgreSQL (issue 22's
//! speed targets), each measured beside one replica on SQLite in the same run, with whether
//! each target is met. The Postgres cluster is `--store-url`, else `SANDBOXD_BENCH_PG_URL`,
//! else `SANDBOXD_TEST_PG_URL` (what scripts/pg-test.sh exports); without one the table says
//! how to get it and nothing is measured.

use std::time::Duration;

use anyhow::Context as _;
use sandboxd::bench::replicas::{ReplicaBench, bench_replicas};
use sandboxd::bench::server_runs::Load;
use sandboxd::bench::stats::percentile;

use super::Ctx;

const USERS: usize = 20;
const STEPS: usize = 5;

/// The cluster to measure on: the flag, else the environment, empty values ignored.
fn cluster_url(flag: Option<&str>) -> Option<String> {
    let env = |k: &str| std::env::var(k).ok();
    [
        flag.map(String::from),
        env("SANDBOXD_BENCH_PG_URL"),
        env("SANDBOXD_TEST_PG_URL"),
    ]
    .into_iter()
    .flatten()
    .map(|u| u.trim().to_string())
    .find(|u| !u.is_empty())
}

pub(crate) async fn serve_replicas(
    ctx: &Ctx,
    store_url: Option<&str>,
    n: usize,
) -> anyhow::Result<()> {
    println!(
        "### Service across replicas (`serve` ×{} on one PostgreSQL, one Docker engine; baseline: one `serve` on SQLite, same run)",
        sandboxd::bench::replicas::REPLICAS
    );
    println!();
    let Some(url) = cluster_url(store_url) else {
        println!(
            "Not measured: no PostgreSQL cluster. Give one whose user may CREATE DATABASE with `--store-url postgres://USER:PASSWORD@HOST:PORT/postgres` or SANDBOXD_BENCH_PG_URL, or run on a throw-away cluster: `bash scripts/pg-test.sh -- target/release/sandboxd bench serve`."
        );
        println!();
        return Ok(());
    };
    let runtime = ctx
        .runtime()
        .await
        .context("cannot prepare the sandbox runtime")?;
    match bench_replicas(runtime, &url, ctx.config.clone(), n, USERS, STEPS).await {
        Ok(b) => table(&b),
        Err(e) => println!("Not measured: {e:#}"),
    }
    println!();
    Ok(())
}

fn ms(samples: &[Duration], q: f64) -> f64 {
    percentile(samples, q).as_secs_f64() * 1e3
}

/// One row: the replicas' p50/p95 beside the baseline's, the target and its verdict.
fn row(what: &str, ours: &[Duration], base: &[Duration], target: &str, met: Option<bool>) {
    let (o50, b50) = (ms(ours, 0.5), ms(base, 0.5));
    let verdict = match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "—",
    };
    println!(
        "| {what} | {o50:.2} | {:.2} | {b50:.2} | {:.2} | {:.2}× | {target} | {verdict} |",
        ms(ours, 0.95),
        ms(base, 0.95),
        o50 / b50
    );
}

fn table(b: &ReplicaBench) {
    println!(
        "| measurement | replicas on Postgres p50 ms | p95 ms | one on SQLite p50 ms | p95 ms | ratio (p50) | target | result |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let p50 = |s: &[Duration]| ms(s, 0.5);
    row(
        "event latency: agent emits (`at`) on replica A → SSE client on replica B has it (every event; `at` is ms-truncated)",
        &b.cross_latency.by_stamp,
        &b.sqlite_latency.by_stamp,
        "p50 ≤ 10 ms",
        Some(p50(&b.cross_latency.by_stamp) <= 10.0),
    );
    row(
        "event latency: model answer handed over on A → client on B has `token_usage` (µs clock)",
        &b.cross_latency.by_answer,
        &b.sqlite_latency.by_answer,
        "p50 ≤ 10 ms",
        Some(p50(&b.cross_latency.by_answer) <= 10.0),
    );
    row(
        "the same with run and client both on A (the store's part without the crossing)",
        &b.same_latency.by_answer,
        &b.sqlite_latency.by_answer,
        "—",
        None,
    );
    let (pg, one) = (&b.pg_load, &b.sqlite_load);
    let all = pg.completed == pg.users && one.completed == one.users;
    row(
        &format!(
            "step latency, {USERS} users × {STEPS}-step runs at once, spread over {} replicas (posted to one, followed on the next), two rounds each; runs complete: {}/{} and {}/{}",
            b.replicas, pg.completed, pg.users, one.completed, one.users
        ),
        &pg.step_latency,
        &one.step_latency,
        "all complete, p50 ≤ 1.5× SQLite",
        Some(all && p50(&pg.step_latency) <= 1.5 * p50(&one.step_latency)),
    );
    // Postgres's own cost, told apart from the spread's: the same load on one replica.
    let alone = &b.pg_one_load;
    row(
        &format!(
            "the same load on replica A alone (Postgres without the spread); runs complete: {}/{}",
            alone.completed, alone.users
        ),
        &alone.step_latency,
        &one.step_latency,
        "—",
        None,
    );
    row(
        "`true` via POST /v1/sessions/{id}/exec through replica A (auth, session lookup in the store)",
        &b.pg_exec,
        &b.sqlite_exec,
        "p50 ≤ 1.2× SQLite",
        Some(p50(&b.pg_exec) <= 1.2 * p50(&b.sqlite_exec)),
    );
    println!();
    println!("PostgreSQL {}.", b.postgres);
    println!("Load on {} replicas: {}", b.replicas, load_note(pg));
    println!("Load on replica A alone: {}", load_note(alone));
    println!("Load on one SQLite: {}", load_note(one));
}

/// A load's completions, events per second and slowest start, and its first failures.
pub(crate) fn load_note(l: &Load) -> String {
    let per_s = |d: Duration| l.events as f64 / d.as_secs_f64().max(1e-9);
    let mut note = format!(
        "{}/{} runs succeeded; {} events in {:.2} s from the first POST ({:.0} events/s), {:.2} s from the first event to the last ({:.0} events/s); the slowest run's first step came {:.2} s after its POST.",
        l.completed,
        l.users,
        l.events,
        l.wall.as_secs_f64(),
        per_s(l.wall),
        l.event_window.as_secs_f64(),
        per_s(l.event_window),
        l.slowest_start.as_secs_f64(),
    );
    for f in l.failures.iter().take(5) {
        note.push_str(&format!("\n- failed: {f}"));
    }
    note
}
