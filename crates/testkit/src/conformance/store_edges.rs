//! The store conformance cases for the sign-in throttle (`AuthFailures`) and serve's MCP
//! sessions (`McpSessions`).
//!
//! The throttle: a window per source that starts at its first failure and counts each
//! failure once, sources apart; a failure after the window starts a new one; concurrent
//! failures of one source (what several replicas send) each get a distinct count; the table
//! stays within its bound of sources, the oldest windows going first. MCP sessions: a round
//! trip with and without a sandbox, the last use only moving forward, removal, and the purge
//! of sessions unused since a cutoff (and nothing else).

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::{Result, ensure};
use sandboxd_core::store::{McpSandbox, McpSessionRow, Store};

use super::store::{StoreFactory, fresh};

const MIN: i64 = 60_000;

pub(super) async fn case_auth_failures(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let t0 = 1_000_000_000_000;
    for n in 1..=3u32 {
        let w = store
            .auth_failed("10.0.0.1", t0 + i64::from(n), MIN, 100)
            .await?;
        ensure!(
            w.failures == n && w.ends_at == t0 + 1 + MIN,
            "failure {n} of one source: {w:?}"
        );
    }
    let other = store.auth_failed("2001:db8::", t0 + 10, MIN, 100).await?;
    ensure!(
        other.failures == 1 && other.ends_at == t0 + 10 + MIN,
        "another source has its own window: {other:?}"
    );
    // Just before the window ends it still counts; at its end a new one starts.
    let last = store.auth_failed("10.0.0.1", t0 + MIN, MIN, 100).await?;
    ensure!(last.failures == 4, "inside the window: {last:?}");
    let next = store
        .auth_failed("10.0.0.1", t0 + 1 + MIN, MIN, 100)
        .await?;
    ensure!(
        next.failures == 1 && next.ends_at == t0 + 1 + 2 * MIN,
        "a failure after the window starts a new one: {next:?}"
    );
    Ok(())
}

pub(super) async fn case_auth_failures_concurrent(f: &dyn StoreFactory) -> Result<()> {
    let store: Arc<dyn Store> = fresh(f).await?;
    let now = sandboxd_core::store::now_ms();
    let tasks: Vec<_> = (0..24)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.auth_failed("192.0.2.9", now, MIN, 100).await })
        })
        .collect();
    let mut counts = BTreeSet::new();
    for t in tasks {
        counts.insert(t.await??.failures);
    }
    ensure!(
        counts == (1..=24).collect::<BTreeSet<u32>>(),
        "24 concurrent failures of one source must be counted 1..=24 exactly once: {counts:?}"
    );
    Ok(())
}

pub(super) async fn case_auth_failures_bounded(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let t0 = 1_000_000_000_000;
    for i in 0..8i64 {
        store
            .auth_failed(&format!("198.51.100.{i}"), t0 + i, MIN, 5)
            .await?;
    }
    // At most 5 sources are kept: the three oldest windows went, so their next failure is a
    // first one again, while the newest source's count goes on.
    let newest = store.auth_failed("198.51.100.7", t0 + 20, MIN, 5).await?;
    ensure!(newest.failures == 2, "the newest source kept: {newest:?}");
    let oldest = store.auth_failed("198.51.100.0", t0 + 21, MIN, 5).await?;
    ensure!(
        oldest.failures == 1,
        "the oldest source's window was dropped to stay within the bound: {oldest:?}"
    );
    // Ended windows go with any later failure, whatever the source.
    store
        .auth_failed("203.0.113.1", t0 + 10 * MIN, MIN, 5)
        .await?;
    let again = store
        .auth_failed("198.51.100.7", t0 + 10 * MIN + 1, MIN, 5)
        .await?;
    ensure!(
        again.failures == 1,
        "an ended window starts over: {again:?}"
    );
    Ok(())
}

fn mcp_row(id: &str, owner: &str, at: i64) -> McpSessionRow {
    McpSessionRow {
        id: id.into(),
        owner: owner.into(),
        init: r#"{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}"#.into(),
        sandbox: None,
        created_at: at,
        last_used_at: at,
    }
}

pub(super) async fn case_mcp_sessions(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    ensure!(store.mcp_session("m1").await?.is_none(), "none before put");
    let a = mcp_row("m1", "usr-a", 1_000);
    store.put_mcp_session(a.clone()).await?;
    store.put_mcp_session(mcp_row("m2", "usr-b", 1_000)).await?;
    ensure!(
        store.mcp_session("m1").await?.as_ref() == Some(&a),
        "round trip"
    );
    let sandbox = McpSandbox {
        row: "ses_1".into(),
        runtime_id: "rt-1".into(),
    };
    store
        .set_mcp_sandbox("m1", Some(sandbox.clone()), 2_000)
        .await?;
    let got = store.mcp_session("m1").await?;
    ensure!(
        got.as_ref()
            .is_some_and(|r| r.sandbox.as_ref() == Some(&sandbox) && r.last_used_at == 2_000),
        "the sandbox and its use recorded: {got:?}"
    );
    store.touch_mcp_session("m1", 1_500).await?;
    store.touch_mcp_session("m2", 5_000).await?;
    let m1 = store.mcp_session("m1").await?;
    ensure!(
        m1.as_ref().is_some_and(|r| r.last_used_at == 2_000),
        "a use is never moved back: {m1:?}"
    );
    store.set_mcp_sandbox("m1", None, 2_100).await?;
    let m1 = store.mcp_session("m1").await?;
    ensure!(
        m1.as_ref().is_some_and(|r| r.sandbox.is_none()),
        "the sandbox cleared: {m1:?}"
    );
    // m1 was last used at 2100, m2 at 5000: a cutoff between them purges m1 only.
    ensure!(store.purge_mcp_sessions(3_000).await? == 1, "purge one");
    ensure!(store.mcp_session("m1").await?.is_none(), "m1 purged");
    ensure!(store.mcp_session("m2").await?.is_some(), "m2 kept");
    ensure!(store.remove_mcp_session("m2").await?, "m2 removed");
    ensure!(!store.remove_mcp_session("m2").await?, "twice is false");
    ensure!(store.mcp_session("m2").await?.is_none(), "m2 gone");
    Ok(())
}
