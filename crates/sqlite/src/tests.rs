//! The SQLite store against a real file: users, sessions, the quota, paging and reopening.

use super::*;
use sandboxd_core::store::{SessionState, now_ms};

fn key(b: u8) -> StoredKey {
    StoredKey {
        hash: [b; 32],
        prefix: format!("sbx_{b}"),
        created_at: now_ms(),
        expires_at: None,
    }
}

fn session(id: &str, owner: &str) -> SessionRow {
    SessionRow::creating(
        id,
        owner,
        Default::default(),
        [("app".to_string(), "x".to_string())].into(),
        60,
        now_ms(),
    )
}

#[tokio::test]
async fn users_sessions_quota_paging_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let alice = store
        .add_user(NewUser {
            name: "alice".into(),
            admin: false,
            key: key(1),
            quota: Default::default(),
        })
        .await
        .unwrap();
    let dup = store
        .add_user(NewUser {
            name: "alice".into(),
            admin: true,
            key: key(2),
            quota: Default::default(),
        })
        .await;
    assert!(matches!(dup, Err(StoreError::UserExists { .. })));
    assert_eq!(
        store.user_by_key([1; 32]).await.unwrap().unwrap().name,
        "alice"
    );
    assert!(store.user_by_key([2; 32]).await.unwrap().is_none());

    for i in 0..3 {
        store
            .reserve_session(session(&format!("s{i}"), &alice.id), 3)
            .await
            .unwrap();
    }
    let over = store.reserve_session(session("s9", &alice.id), 3).await;
    assert!(matches!(
        over,
        Err(StoreError::SessionQuota {
            limit: 3,
            active: 3
        })
    ));
    store.session_started("s0", "r0", "c0").await.unwrap();
    let s0 = store.session("s0").await.unwrap().unwrap();
    assert_eq!(s0.state, SessionState::Running);
    assert_eq!(s0.runtime_id.as_deref(), Some("r0"));

    let mut q = SessionQuery {
        owner: Some(alice.id.clone()),
        limit: 2,
        metadata: vec![("app".into(), "x".into())],
        ..Default::default()
    };
    let p1 = store.list_sessions(&q).await.unwrap();
    assert_eq!(p1.sessions.len(), 2);
    assert_eq!(p1.sessions[0].id, "s2", "newest first");
    q.before = p1.next;
    let p2 = store.list_sessions(&q).await.unwrap();
    assert_eq!(p2.sessions.len(), 1);
    assert!(p2.next.is_none());
    q.before = None;
    q.metadata = vec![("app".into(), "y".into())];
    assert!(store.list_sessions(&q).await.unwrap().sessions.is_empty());

    assert!(store.end_session("s1", "deleted", now_ms()).await.unwrap());
    assert!(!store.end_session("s1", "deleted", now_ms()).await.unwrap());
    assert_eq!(
        store
            .usage(&alice.id, now_ms())
            .await
            .unwrap()
            .active_sessions,
        2
    );
    drop(store);

    // Reopening applies no migration twice and keeps the rows.
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.active_sessions().await.unwrap().len(), 2);
    assert!(store.remove_user("alice", now_ms()).await.unwrap());
    assert!(store.active_sessions().await.unwrap().is_empty());
    assert_eq!(store.purge_before(now_ms() + 1).await.unwrap(), 3);
    store.ping().await.unwrap();
}
