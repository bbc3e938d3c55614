//! The agent-overhead benchmark function works end to end (it is what `sandboxd bench`
//! calls); the numbers are printed, never asserted — timing does not belong in tests.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::time::Duration;

use sandboxd::bench::agent::bench_agent_step;

#[tokio::test]
async fn bench_agent_step_measures_every_step() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let mut d = bench_agent_step(s.sandbox.clone(), 200)
        .await
        .expect("the benchmark runs");
    assert_eq!(
        d.len(),
        200,
        "one duration per measured step (the warm-up step is extra)"
    );
    assert!(d.iter().all(|x| *x > Duration::ZERO));
    d.sort();
    let pct = |p: f64| d[((d.len() - 1) as f64 * p) as usize];
    println!(
        "agent step overhead: p50 {:?}  p90 {:?}  p99 {:?}  max {:?}",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        d[d.len() - 1]
    );
}
