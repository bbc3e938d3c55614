//! Store conformance case of the audit log (issue 28, item 3): entries kept exactly (details
//! JSON too) with increasing sequence numbers, paged oldest first after a cursor and newest
//! first before one, hostile text cut to its bound (a NUL replaced), and the bound applied by
//! the append itself: entries past the retention and past the row cap are gone, newer ones
//! stay. The log survives a reopen.

use anyhow::{Result, ensure};
use sandboxd_core::store::audit::MAX_AUDIT_TEXT;
use sandboxd_core::store::{AuditBound, AuditQuery, NewAudit};

use super::store::StoreFactory;

fn entry(at: i64, action: &str, target: &str) -> NewAudit {
    NewAudit {
        at,
        actor: "ann".into(),
        action: action.into(),
        target: target.into(),
        request_id: format!("req-{at}"),
        client: "192.0.2.1".into(),
        details: serde_json::json!({"limits": {"memory_mb": 512}, "n": at}),
    }
}

const KEEP_ALL: AuditBound = AuditBound {
    before: 0,
    max_rows: 1000,
};

fn oldest(after: Option<i64>, limit: u32) -> AuditQuery {
    AuditQuery {
        after,
        before: None,
        newest_first: false,
        limit,
    }
}

pub(super) async fn case_audit_log(f: &dyn StoreFactory) -> Result<()> {
    let (store, name) = f.fresh().await?;
    let mut seqs = Vec::new();
    for i in 1..=5 {
        seqs.push(
            store
                .append_audit(&entry(1000 + i, "user.create", &format!("u{i}")), KEEP_ALL)
                .await?,
        );
    }
    ensure!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "sequence numbers increase: {seqs:?}"
    );
    let page = store.audit_page(oldest(None, 2)).await?;
    ensure!(
        page.len() == 2 && page[0].seq == seqs[0] && page[1].seq == seqs[1],
        "{page:?}"
    );
    ensure!(
        page[0].entry == entry(1001, "user.create", "u1"),
        "kept exactly: {:?}",
        page[0]
    );
    let next = store.audit_page(oldest(Some(page[1].seq), 10)).await?;
    let targets: Vec<_> = next.iter().map(|e| e.entry.target.as_str()).collect();
    ensure!(
        targets == ["u3", "u4", "u5"],
        "the next page after the cursor: {targets:?}"
    );
    let newest = store
        .audit_page(AuditQuery {
            after: None,
            before: Some(seqs[4]),
            newest_first: true,
            limit: 2,
        })
        .await?;
    let targets: Vec<_> = newest.iter().map(|e| e.entry.target.as_str()).collect();
    ensure!(
        targets == ["u4", "u3"],
        "newest first before the cursor: {targets:?}"
    );

    // Hostile text is cut, not refused.
    let mut long = entry(2000, "sign_in.failed", &"x".repeat(10_000));
    long.actor = "\u{0}\u{202e}".repeat(1000);
    let seq = store.append_audit(&long, KEEP_ALL).await?;
    let got = store.audit_page(oldest(Some(seq - 1), 1)).await?;
    ensure!(
        got.len() == 1 && got[0].entry.target.chars().count() == MAX_AUDIT_TEXT,
        "cut target"
    );
    ensure!(
        got[0].entry.actor.chars().count() == MAX_AUDIT_TEXT,
        "cut actor"
    );
    ensure!(
        got[0].entry.actor.starts_with("\u{FFFD}\u{202e}"),
        "NUL replaced, the rest kept"
    );

    // The retention: everything at or before 1003 goes with the next append.
    store
        .append_audit(
            &entry(3000, "session.create", "s1"),
            AuditBound {
                before: 1003,
                max_rows: 1000,
            },
        )
        .await?;
    let all = store.audit_page(oldest(None, 100)).await?;
    let targets: Vec<_> = all.iter().map(|e| e.entry.target.as_str()).collect();
    ensure!(
        targets.len() == 4 && targets[0] == "u4" && targets[3] == "s1",
        "retention: {targets:?}"
    );
    // The row cap: two stay, the newest.
    store
        .append_audit(
            &entry(3001, "session.end", "s1"),
            AuditBound {
                before: 0,
                max_rows: 2,
            },
        )
        .await?;
    let all = store.audit_page(oldest(None, 100)).await?;
    let actions: Vec<_> = all.iter().map(|e| e.entry.action.as_str()).collect();
    ensure!(
        actions == ["session.create", "session.end"],
        "row cap: {actions:?}"
    );

    drop(store);
    let again = f.reopen(&name).await?;
    let all = again.audit_page(oldest(None, 100)).await?;
    ensure!(
        all.len() == 2 && all[1].entry == entry(3001, "session.end", "s1"),
        "after a reopen: {all:?}"
    );
    Ok(())
}
