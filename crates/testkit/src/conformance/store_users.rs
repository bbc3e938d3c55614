//! The store conformance case for finding a user by id, as the CPU quota finds a session's
//! owner (an admin acting in another user's session): the user of that id with their quota
//! override, none for an id that is not one (a name is not an id), none once removed.

use anyhow::{Context, Result, ensure};
use sandboxd_core::store::{QuotaOverride, now_ms};

use super::store::{StoreFactory, add_user, fresh};

pub(super) async fn case_user_by_id(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let alice = add_user(&*store, "alice", 1).await?;
    let bob = add_user(&*store, "bob", 2).await?;
    let a = store.user_by_id(&alice).await?.context("alice by id")?;
    ensure!(
        a.id == alice && a.name == "alice",
        "user_by_id finds the id's user, got {a:?}"
    );
    let b = store.user_by_id(&bob).await?.context("bob by id")?;
    ensure!(b.name == "bob", "each id its own user, got {b:?}");

    let q = QuotaOverride {
        cpu_seconds_per_day: Some(90),
        ..Default::default()
    };
    ensure!(store.set_quota("alice", q.clone()).await?, "set_quota true");
    let a = store.user_by_id(&alice).await?.context("alice again")?;
    ensure!(
        a.quota == q,
        "the override is the user's, got {:?}",
        a.quota
    );

    for nobody in ["alice", "usr-nobody", "", "' OR '1'='1"] {
        ensure!(
            store.user_by_id(nobody).await?.is_none(),
            "no user has the id {nobody:?}"
        );
    }
    ensure!(store.remove_user("alice", now_ms()).await?, "remove_user");
    ensure!(
        store.user_by_id(&alice).await?.is_none(),
        "a removed user is not found by id"
    );
    ensure!(
        store.user_by_id(&bob).await?.is_some(),
        "the other user stays"
    );
    Ok(())
}
