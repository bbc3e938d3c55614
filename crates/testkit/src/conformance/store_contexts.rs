//! Store conformance case of the code interpreter's contexts (`CodeContexts`, issue 25,
//! item 3): added only to a running session and at most `cap` per session, counted
//! atomically (concurrent adds never pass it); listed oldest first, per session; removed
//! once; the replica connected last recorded; marked lost by a hibernation, the mark taken exactly once; gone when the session
//! ends or its row is deleted.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Result, ensure};
use sandboxd_core::config::Limits;
use sandboxd_core::store::{CodeContextRow, ContextAdded, SessionRow, Store, now_ms};

use super::store::{StoreFactory, add_user, fresh};

fn ctx(session: &str, id: &str, at: i64) -> CodeContextRow {
    CodeContextRow {
        session_id: session.into(),
        id: id.into(),
        language: "python".into(),
        cwd: format!("/tmp/{id}"),
        created_at: at,
        lost: false,
        holder: Some("r-a".into()),
    }
}

async fn ids(store: &dyn Store, session: &str) -> Result<Vec<String>> {
    Ok(store
        .code_contexts(session)
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect())
}

async fn started(store: &dyn Store, id: &str, owner: &str, t0: i64) -> Result<()> {
    let row = SessionRow::creating(id, owner, Limits::default(), BTreeMap::new(), 10, t0);
    store.reserve_session(row, 10).await?;
    store
        .session_started(id, &format!("rt-{id}"), &format!("c-{id}"))
        .await?;
    Ok(())
}

pub(super) async fn case_code_contexts(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let ann = add_user(&*store, "ann", 1).await?;
    let t0 = now_ms();
    let row = SessionRow::creating("k0", &ann, Limits::default(), BTreeMap::new(), 10, t0);
    store.reserve_session(row, 10).await?;
    ensure!(
        store.add_code_context(ctx("k0", "a", t0), 3).await? == ContextAdded::NoSession,
        "a session still being created gets no context"
    );
    ensure!(
        store.add_code_context(ctx("nope", "a", t0), 3).await? == ContextAdded::NoSession,
        "a session that does not exist gets no context"
    );
    store.session_started("k0", "rt-k0", "c-k0").await?;
    started(&*store, "k1", &ann, t0).await?;
    for (i, id) in ["c", "a", "b"].into_iter().enumerate() {
        let added = store
            .add_code_context(ctx("k0", id, t0 + i as i64), 3)
            .await?;
        ensure!(added == ContextAdded::Added, "{id}: {added:?}");
    }
    ensure!(
        store.add_code_context(ctx("k0", "d", t0 + 9), 3).await? == ContextAdded::Full,
        "the fourth of a cap of three is refused"
    );
    ensure!(
        store.add_code_context(ctx("k1", "a", t0), 3).await? == ContextAdded::Added,
        "another session has its own count, and ids of its own"
    );
    ensure!(
        ids(&*store, "k0").await? == ["c", "a", "b"],
        "listed oldest first: {:?}",
        ids(&*store, "k0").await?
    );
    ensure!(ids(&*store, "k1").await? == ["a"], "only the session's own");
    let got = store.code_context("k0", "a").await?;
    ensure!(
        got == Some(ctx("k0", "a", t0 + 1)),
        "one context as added: {got:?}"
    );
    ensure!(store.code_context("k1", "b").await?.is_none());
    ensure!(store.hold_code_context("k0", "a", "r-b").await?);
    let held = store.code_context("k0", "a").await?.and_then(|c| c.holder);
    ensure!(
        held.as_deref() == Some("r-b"),
        "the holder is recorded: {held:?}"
    );
    ensure!(
        !store.hold_code_context("k1", "b", "r-b").await?,
        "no such context to hold"
    );
    ensure!(store.remove_code_context("k0", "a").await?, "removed");
    ensure!(!store.remove_code_context("k0", "a").await?, "removed once");
    ensure!(
        store.code_context("k1", "a").await?.is_some(),
        "another session's context of that id stays"
    );
    ensure!(
        store.add_code_context(ctx("k0", "d", t0 + 9), 3).await? == ContextAdded::Added,
        "a removal frees its place"
    );
    hibernation_marks_them_lost(&*store, t0).await?;
    concurrent_adds_hold_the_cap(store.clone(), &ann, t0).await?;
    // Gone with the session: ended, or its row deleted.
    ensure!(store.end_session("k0", "done", t0 + 20_000).await?);
    ensure!(
        ids(&*store, "k0").await?.is_empty(),
        "an ended session has no contexts"
    );
    ensure!(
        store.add_code_context(ctx("k0", "e", t0), 3).await? == ContextAdded::NoSession,
        "an ended session gets no context"
    );
    ensure!(store.end_session("k1", "done", t0 + 20_000).await?);
    ensure!(store.delete_session("k1").await?);
    ensure!(ids(&*store, "k1").await?.is_empty());
    Ok(())
}

/// A hibernation marks every context of the session lost; the mark is taken once each.
async fn hibernation_marks_them_lost(store: &dyn Store, t0: i64) -> Result<()> {
    ensure!(
        !store.take_code_context_loss("k0", "c").await?,
        "nothing lost yet"
    );
    ensure!(store.hibernate_session("k0", "k0.tar", t0 + 10_000).await?);
    let lost: Vec<bool> = store
        .code_contexts("k0")
        .await?
        .iter()
        .map(|c| c.lost)
        .collect();
    ensure!(lost == [true, true, true], "all marked lost: {lost:?}");
    ensure!(
        !store.code_context("k1", "a").await?.is_some_and(|c| c.lost),
        "another session's are not"
    );
    ensure!(
        store
            .resume_session("k0", "k0.tar", "c-k0b", t0 + 11_000)
            .await?
    );
    ensure!(
        store.code_context("k0", "c").await?.is_some_and(|c| c.lost),
        "a resume keeps the mark for the next use"
    );
    ensure!(store.take_code_context_loss("k0", "c").await?, "taken");
    ensure!(
        !store.take_code_context_loss("k0", "c").await?,
        "taken once"
    );
    ensure!(
        store.code_context("k0", "b").await?.is_some_and(|c| c.lost),
        "each context's mark is its own"
    );
    Ok(())
}

/// Twelve adds at once to a session with room for two: exactly two are added.
async fn concurrent_adds_hold_the_cap(store: Arc<dyn Store>, owner: &str, t0: i64) -> Result<()> {
    started(&*store, "k2", owner, t0).await?;
    let adds = (0..12).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .add_code_context(ctx("k2", &format!("x{i}"), t0 + i), 2)
                .await
        })
    });
    let mut added = 0;
    for add in futures::future::join_all(adds).await {
        match add?? {
            ContextAdded::Added => added += 1,
            ContextAdded::Full => {}
            ContextAdded::NoSession => anyhow::bail!("the session is running"),
        }
    }
    ensure!(
        added == 2,
        "{added} of 12 concurrent adds passed a cap of 2"
    );
    ensure!(store.code_contexts("k2").await?.len() == 2);
    Ok(())
}
