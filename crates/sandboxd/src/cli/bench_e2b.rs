//! `sandboxd bench e2b`: the E2B-compatible API through the official Python SDK against the
//! same operations through /v1 (bench/e2b.rs), on a server whose warm pool is full before
//! every create. The SDK's venv: SANDBOXD_BENCH_E2B_PYTHON, else `.venv-e2b/bin/python`
//! (what .ci/run makes: e2b 2.63.0, e2b-code-interpreter 2.11.5).

use std::path::PathBuf;

use super::Ctx;
use super::bench::{row, section};
use super::bench_pool::manager_with;

/// Warm sandboxes kept ready: enough for the SDK's create and /v1's, one after the other.
const POOL: usize = 2;

pub(crate) async fn e2b(ctx: &Ctx, n: usize) -> anyhow::Result<()> {
    let python = std::env::var_os("SANDBOXD_BENCH_E2B_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".venv-e2b/bin/python"));
    anyhow::ensure!(
        python.exists(),
        "bench e2b needs the E2B SDKs: python3 -m venv .venv-e2b && .venv-e2b/bin/pip install 'e2b==2.63.0' 'e2b-code-interpreter==2.11.5' (or set SANDBOXD_BENCH_E2B_PYTHON)"
    );
    let m = manager_with(ctx, POOL, ctx.config.pool.refill_delay_ms).await?;
    let task = m.spawn_pool();
    section(
        "E2B-compatible API through the official SDK (e2b-code-interpreter 2.11.5), against /v1",
    );
    let result =
        sandboxd::bench::e2b::bench_e2b(m.clone(), POOL, ctx.config.clone(), &python, n.min(50))
            .await;
    if let Some(task) = task {
        task.abort();
    }
    m.remove_all().await;
    let mut r = result?;
    row(
        "SDK: Sandbox.create() → first commands.run(\"true\") (warm pool)",
        &mut r.sdk_create,
        "POST /v1/sessions + exec true",
        &mut r.v1_create,
        "E2B cloud p50 442 ms, p99 4.1 s (create → echo → close)",
    );
    row(
        "SDK: commands.run(\"true\") round trip",
        &mut r.sdk_run,
        "POST /v1/sessions/{id}/exec true",
        &mut r.v1_run,
        "—",
    );
    row(
        "SDK: run_code(\"1+1\") round trip",
        &mut r.sdk_code,
        "POST /v1/sessions/{id}/tools/python 1+1",
        &mut r.v1_code,
        "—",
    );
    println!();
    Ok(())
}
