//! The store conformance cases for kept sessions' tool records (`ToolRecords`): a round
//! trip byte for byte (non-UTF-8 and empty records included), replacing and clearing one
//! record, forgetting a session (its kinds returned sorted, every record of it gone and
//! nobody else's), the listing of sessions with records, the size bound (a record over
//! `MAX_RECORD_BYTES` refused with `RecordTooLarge` and nothing changed), records across a
//! restart, and the same through `StoreRecords`, the records home serve installs.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use sandboxd_core::sandbox::records::{MAX_RECORD_BYTES, SessionRecords};
use sandboxd_core::store::{Store, StoreError, StoreRecords};

use super::store::{StoreFactory, fresh};

/// Bytes no text encoding accepts, with a NUL and every byte value.
fn binary() -> Vec<u8> {
    let mut b = vec![0xff, 0xfe, 0x00, 0xc3, 0x28];
    b.extend(0..=255u8);
    b
}

async fn kinds_of(store: &dyn Store, session: &str, kinds: &[&str]) -> Result<Vec<String>> {
    let mut held = Vec::new();
    for kind in kinds {
        if store.record(session, kind).await?.is_some() {
            held.push(kind.to_string());
        }
    }
    Ok(held)
}

pub(super) async fn case_tool_records(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    ensure!(
        store.record("rt1", "undo").await?.is_none(),
        "no record before one is put"
    );
    ensure!(
        store.record_sessions().await?.is_empty(),
        "a fresh store lists no sessions with records"
    );
    store.put_record("rt1", "undo", binary()).await?;
    ensure!(
        store.record("rt1", "undo").await?.as_deref() == Some(&binary()[..]),
        "a record comes back byte for byte, non-UTF-8 included"
    );
    store.put_record("rt1", "undo", b"second".to_vec()).await?;
    ensure!(
        store.record("rt1", "undo").await?.as_deref() == Some(&b"second"[..]),
        "a put replaces the record"
    );
    store.put_record("rt1", "plans", Vec::new()).await?;
    ensure!(
        store.record("rt1", "plans").await?.as_deref() == Some(&[][..]),
        "an empty record is a record"
    );
    ensure!(
        store.clear_record("rt1", "plans").await? && !store.clear_record("rt1", "plans").await?,
        "clear says whether there was a record"
    );
    ensure!(
        store.record("rt1", "plans").await?.is_none(),
        "a cleared record is gone"
    );
    ensure!(
        store.record("rt1", "undo").await?.is_some(),
        "clearing one kind leaves the others"
    );
    forget_and_list(&*store).await
}

/// Forgetting takes a whole session and nothing else; the listing follows.
async fn forget_and_list(store: &dyn Store) -> Result<()> {
    for kind in ["undo", "browser", "plans", "some_future_tool"] {
        store.put_record("rt2", kind, vec![2]).await?;
    }
    store.put_record("rt10", "undo", vec![10]).await?;
    ensure!(
        store.record_sessions().await? == ["rt1", "rt10", "rt2"],
        "the sessions with records, sorted, each once: {:?}",
        store.record_sessions().await?
    );
    let kinds = store.forget_records("rt2").await?;
    ensure!(
        kinds == ["browser", "plans", "some_future_tool", "undo"],
        "forget returns the kinds it deleted, sorted: {kinds:?}"
    );
    ensure!(
        kinds_of(
            store,
            "rt2",
            &["undo", "browser", "plans", "some_future_tool"]
        )
        .await?
        .is_empty(),
        "a forgotten session's records are gone"
    );
    ensure!(
        store.record("rt10", "undo").await?.as_deref() == Some(&[10][..])
            && store.record("rt1", "undo").await?.is_some(),
        "forgetting one session leaves the others' records"
    );
    ensure!(
        store.forget_records("rt2").await?.is_empty(),
        "forgetting again deletes nothing"
    );
    ensure!(
        store.record_sessions().await? == ["rt1", "rt10"],
        "a forgotten session is no longer listed"
    );
    Ok(())
}

pub(super) async fn case_tool_records_bounded(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    store.put_record("rt1", "undo", b"kept".to_vec()).await?;
    let limit = MAX_RECORD_BYTES as usize;
    store
        .put_record("rt1", "big", vec![7; limit])
        .await
        .context("a record of exactly the limit is kept")?;
    ensure!(
        store.record("rt1", "big").await?.map(|b| b.len()) == Some(limit),
        "a record of the limit comes back whole"
    );
    match store.put_record("rt1", "undo", vec![7; limit + 1]).await {
        Err(StoreError::RecordTooLarge { len, max, .. }) => ensure!(
            len == limit as u64 + 1 && max == MAX_RECORD_BYTES,
            "the error names the size and the limit: {len} {max}"
        ),
        other => anyhow::bail!("a record over the limit must be refused, got {other:?}"),
    }
    ensure!(
        store.record("rt1", "undo").await?.as_deref() == Some(&b"kept"[..]),
        "a refused put changes nothing"
    );
    let e = store.put_record("rt2", "undo", vec![0; limit + 1]).await;
    ensure!(
        e.is_err() && store.record_sessions().await? == ["rt1"],
        "a refused put of a new session leaves no trace"
    );
    Ok(())
}

pub(super) async fn case_tool_records_restart(f: &dyn StoreFactory) -> Result<()> {
    let (store, name) = f.fresh().await.context("open a fresh store")?;
    store.put_record("rt1", "browser", binary()).await?;
    drop(store);
    let store = f.reopen(&name).await.context("reopen the same store")?;
    ensure!(
        store.record("rt1", "browser").await?.as_deref() == Some(&binary()[..]),
        "records survive a restart"
    );
    through_store_records(store).await
}

/// `StoreRecords`, the `SessionRecords` home over a store: what the tools and the session
/// manager see of the same rows.
async fn through_store_records(store: Arc<dyn Store>) -> Result<()> {
    let records = StoreRecords::new(store.clone());
    ensure!(
        records.load("rt1", "browser").await.as_deref() == Some(&binary()[..]),
        "StoreRecords reads the store's records"
    );
    records.save("rt3", "undo", &binary()).await?;
    ensure!(
        store.record("rt3", "undo").await?.as_deref() == Some(&binary()[..]),
        "StoreRecords writes the store's records"
    );
    let too_big = vec![1; MAX_RECORD_BYTES as usize + 1];
    let e = records.save("rt3", "undo", &too_big).await;
    ensure!(
        e.as_ref().is_err_and(|e| e.to_string().contains("limit")),
        "an oversized save is an error that says why: {e:?}"
    );
    ensure!(
        records.sessions().await.into_iter().collect::<Vec<_>>() == ["rt1", "rt3"],
        "StoreRecords lists the sessions with records"
    );
    records.clear("rt1", "browser").await;
    ensure!(
        records.load("rt1", "browser").await.is_none(),
        "StoreRecords clears a record"
    );
    ensure!(
        records.forget("rt3").await == ["undo"] && records.sessions().await.is_empty(),
        "StoreRecords forgets a session's records"
    );
    Ok(())
}
