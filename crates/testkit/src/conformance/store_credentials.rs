//! Store conformance case of users' egress credentials (issue 24, item 5): rows per (owner,
//! host) kept exactly (the sealed bytes too), replaced by a second attach of the same host,
//! bounded per owner in the store's own transaction (concurrent attaches cannot pass the
//! bound together), listed and removed per owner only (another owner's host is "none"), and
//! gone with their user.

use anyhow::{Result, ensure};
use sandboxd_core::store::{StoreError, StoredCredential, now_ms};

use super::store::{StoreFactory, add_user, fresh};

fn cred(owner: &str, host: &str, sealed: &[u8]) -> StoredCredential {
    StoredCredential {
        owner: owner.into(),
        host: host.into(),
        header: "Authorization".into(),
        prefix: "Bearer ".into(),
        allow_http: false,
        sealed: sealed.to_vec(),
        created_ms: now_ms(),
    }
}

fn hosts(list: &[StoredCredential]) -> Vec<&str> {
    list.iter().map(|c| c.host.as_str()).collect()
}

pub(super) async fn case_egress_credentials(f: &dyn StoreFactory) -> Result<()> {
    let store = fresh(f).await?;
    let ann = add_user(&*store, "ann", 1).await?;
    let bob = add_user(&*store, "bob", 2).await?;
    // Bytes of every value, the zero byte too: the store keeps them exactly.
    let sealed: Vec<u8> = (0..=255u8).collect();
    let first = cred(&ann, "b.example.com", &sealed);
    ensure!(
        !store.put_egress_credential(&first, 3).await?,
        "a new host replaces nothing"
    );
    store
        .put_egress_credential(&cred(&ann, "a.example.com", b"x"), 3)
        .await?;
    let list = store.egress_credentials(&ann).await?;
    ensure!(
        hosts(&list) == ["a.example.com", "b.example.com"],
        "by host: {list:?}"
    );
    ensure!(list[1] == first, "kept exactly: {:?}", list[1]);

    // The same host again replaces (and does not count twice against the bound).
    let mut again = cred(&ann, "b.example.com", b"new");
    again.allow_http = true;
    again.prefix = "Token ".into();
    ensure!(store.put_egress_credential(&again, 2).await?, "replaced");
    let list = store.egress_credentials(&ann).await?;
    ensure!(
        list.len() == 2 && list[1] == again,
        "replaced in place: {list:?}"
    );

    // The bound: a third host at 2 is refused and changes nothing.
    match store
        .put_egress_credential(&cred(&ann, "c.example.com", b"c"), 2)
        .await
    {
        Err(StoreError::CredentialQuota { limit: 2 }) => {}
        other => anyhow::bail!("the bound of 2 must refuse a third host: {other:?}"),
    }
    ensure!(
        store.egress_credentials(&ann).await?.len() == 2,
        "nothing added"
    );

    // Concurrent attaches of new hosts never pass the bound together.
    let tries = (0..8).map(|i| {
        let store = store.clone();
        let row = cred(&bob, &format!("h{i}.example.com"), b"v");
        async move { store.put_egress_credential(&row, 3).await }
    });
    let results = futures::future::join_all(tries).await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    ensure!(
        ok == 3,
        "exactly the bound of concurrent attaches succeed: {results:?}"
    );
    ensure!(
        store.egress_credentials(&bob).await?.len() == 3,
        "three rows"
    );

    // Per owner: bob cannot see or remove ann's host.
    ensure!(
        !store
            .remove_egress_credential(&bob, "a.example.com")
            .await?,
        "another owner's host is none of bob's"
    );
    ensure!(
        store.egress_credentials(&ann).await?.len() == 2,
        "ann's intact"
    );
    ensure!(
        store
            .remove_egress_credential(&ann, "a.example.com")
            .await?,
        "removed"
    );
    ensure!(
        !store
            .remove_egress_credential(&ann, "a.example.com")
            .await?,
        "removed once"
    );
    ensure!(
        hosts(&store.egress_credentials(&ann).await?) == ["b.example.com"],
        "one left"
    );

    // Gone with the user.
    ensure!(store.remove_user("ann", now_ms()).await?, "ann removed");
    ensure!(
        store.egress_credentials(&ann).await?.is_empty(),
        "gone with ann"
    );
    ensure!(
        store.egress_credentials(&bob).await?.len() == 3,
        "bob's kept"
    );
    Ok(())
}
