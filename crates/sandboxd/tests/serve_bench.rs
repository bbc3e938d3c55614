//! `sandboxd bench serve`'s replica measurements work end to end on a real PostgreSQL
//! (SANDBOXD_TEST_PG_URL, as scripts/pg-test.sh exports it) and the real engine: three replicas
//! on one fresh database beside one SQLite server, every run completed on both, every sample
//! taken, and the bench's database dropped after (`bench_replicas` fails when the drop does).
//! The numbers are printed, never asserted.

use crate::support;

use std::sync::Arc;

use sandboxd::bench::replicas::{REPLICAS, bench_replicas};
use sandboxd_core::config::Config;

/// The cluster, or None when the Postgres tests are skipped on purpose (as the store's own
/// tests: without the variable this fails and says how to set it).
fn cluster() -> Option<String> {
    match std::env::var("SANDBOXD_TEST_PG_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("SANDBOXD_TEST_PG").as_deref() == Ok("skip") => {
            eprintln!("SKIPPED: the replica bench test (SANDBOXD_TEST_PG=skip)");
            None
        }
        _ => panic!(
            "SANDBOXD_TEST_PG_URL is not set: run under `bash scripts/pg-test.sh -- cargo test …`, or set SANDBOXD_TEST_PG=skip"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_bench_completes_every_run_on_three_replicas_and_drops_its_database() {
    let Some(url) = cluster() else {
        return;
    };
    let config = Config {
        limits: support::test_limits(),
        ..Config::default()
    };
    let runtime = Arc::new(support::runtime().await);
    let (users, steps, samples) = (4, 2, 3);
    let b = bench_replicas(runtime, &url, config, samples, users, steps)
        .await
        .expect("the replica bench runs");
    assert_eq!(b.replicas, REPLICAS);
    for (what, load) in [
        ("replicas", &b.pg_load),
        ("replica A alone", &b.pg_one_load),
        ("SQLite", &b.sqlite_load),
    ] {
        // Two rounds of the load on each.
        assert_eq!(
            (load.users, load.completed, load.failures.clone()),
            (2 * users, 2 * users, vec![]),
            "every run on {what} succeeded"
        );
        // One latency per step: `thinking` to `thinking`, the last to `run_finished`.
        assert_eq!(load.step_latency.len(), 2 * users * steps, "{what}");
    }
    for l in [&b.sqlite_latency, &b.cross_latency, &b.same_latency] {
        assert!(l.by_answer.len() >= samples && !l.by_stamp.is_empty());
    }
    assert_eq!((b.pg_exec.len(), b.sqlite_exec.len()), (samples, samples));
    assert!(b.postgres.starts_with(char::is_numeric), "{}", b.postgres);
    println!(
        "replica bench: event latency A→B p50 {:?}, SQLite {:?}; step p50 {:?} vs {:?}",
        b.cross_latency.by_answer[b.cross_latency.by_answer.len() / 2],
        b.sqlite_latency.by_answer[b.sqlite_latency.by_answer.len() / 2],
        b.pg_load.step_latency[b.pg_load.step_latency.len() / 2],
        b.sqlite_load.step_latency[b.sqlite_load.step_latency.len() / 2],
    );
}
