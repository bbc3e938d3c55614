//! Runs the browser benchmark once against the real engine and prints its table (the numbers
//! go to BENCHMARKS.md; timing targets are not asserted here, only that every step worked).
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use sandboxd::bench::browser::bench_browser;

#[tokio::test]
async fn browser_bench_runs_and_prints_a_table() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let bench = bench_browser(s.sandbox.clone(), 20)
        .await
        .expect("the benchmark ran");
    assert_eq!(bench.go_to_url.len(), 20);
    assert_eq!(bench.screenshot.len(), 20);
    println!("{}", bench.table());
}
