//! The store conformance cases for single sign-on: an attempt's state is found once (the
//! second take, as a replayed callback's, finds nothing), an expired one is not found, an
//! unknown one is not found, concurrent takes of one state give it to exactly one; and the
//! admin flag the group claim sets.

use anyhow::{Context, Result, ensure};
use sandboxd_core::store::{SsoState, now_ms};

use super::store::{StoreFactory, add_user, fresh};

pub(super) async fn case_sso_states(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let now = now_ms();
    let state = |b: u8, expires_at: i64| SsoState {
        state_hash: [b; 32],
        pkce_verifier: format!("verifier-{b}"),
        nonce: format!("nonce-{b}"),
        created_at: now,
        expires_at,
    };
    store.add_sso_state(state(1, now + 600_000)).await?;
    store.add_sso_state(state(2, now + 1_000)).await?;
    let got = store
        .take_sso_state([1; 32], now)
        .await?
        .context("the kept attempt is found")?;
    ensure!(got == state(1, now + 600_000), "it round-trips: {got:?}");
    ensure!(
        store.take_sso_state([1; 32], now).await?.is_none(),
        "a state is found once: the second take (a replayed callback) finds nothing"
    );
    ensure!(
        store.take_sso_state([2; 32], now + 1_000).await?.is_none(),
        "an attempt at its expiry is not found"
    );
    ensure!(
        store.take_sso_state([9; 32], now).await?.is_none(),
        "an unknown state is not found"
    );
    // Two callbacks with one state at once (two replicas): exactly one gets it.
    store.add_sso_state(state(3, now + 600_000)).await?;
    let (a, b) = tokio::join!(
        store.take_sso_state([3; 32], now),
        store.take_sso_state([3; 32], now)
    );
    ensure!(
        a?.is_some() ^ b?.is_some(),
        "of two concurrent takes exactly one finds the state"
    );

    add_user(&*store, "carol", 7).await?;
    ensure!(store.set_admin("carol", true).await?, "carol is named");
    let carol = store.user_by_name("carol").await?.context("carol")?;
    ensure!(carol.admin, "set_admin(true) makes an admin");
    store.set_admin("carol", false).await?;
    let carol = store.user_by_name("carol").await?.context("carol")?;
    ensure!(!carol.admin, "set_admin(false) unmakes one");
    ensure!(
        !store.set_admin("nobody", true).await?,
        "no user of that name: false"
    );
    Ok(())
}
