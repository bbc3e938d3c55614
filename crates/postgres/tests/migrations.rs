//! PgStore's migrations and connection handling on a real PostgreSQL (SANDBOXD_TEST_PG_URL):
//! replicas starting at once apply each migration exactly once, a schema newer than this build
//! is refused, `probe` reads without migrating, and a bad URL or an unreachable server is an
//! error that names the store without its password.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

mod support;

use sandboxd_core::store::{Store, StoreError};
use sandboxd_postgres::{PgStore, probe};
use support::Databases;
use tokio_postgres::NoTls;

async fn rows(url: &str, sql: &str) -> Vec<tokio_postgres::Row> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(conn);
    client.query(sql, &[]).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_at_once_apply_each_migration_once() {
    let Some(admin) = support::admin_url() else {
        return;
    };
    let dbs = Databases::new(admin);
    let (_, url) = dbs.create().await;

    let before = probe(&url).await.unwrap();
    assert_eq!(before.schema_version, 0, "probe of an empty database");
    assert!(before.known_version >= 1);
    assert!(
        before.server_version.starts_with(char::is_numeric),
        "the server's version: {}",
        before.server_version
    );
    assert!(
        rows(&url, "SELECT to_regclass('schema_migrations')::text").await[0]
            .get::<_, Option<String>>(0)
            .is_none(),
        "probe created nothing"
    );

    // Eight replicas open the same empty database at the same moment.
    let opens: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PgStore::open(&url).await })
        })
        .collect();
    let mut stores = Vec::new();
    for o in opens {
        stores.push(o.await.unwrap().expect("every replica opens the store"));
    }
    let applied: Vec<i64> = rows(
        &url,
        "SELECT version FROM schema_migrations ORDER BY version",
    )
    .await
    .iter()
    .map(|r| r.get(0))
    .collect();
    let known = before.known_version;
    assert_eq!(
        applied,
        (1..=known).collect::<Vec<_>>(),
        "each migration recorded exactly once"
    );
    for s in &stores {
        s.ping().await.unwrap();
    }
    let after = probe(&url).await.unwrap();
    assert_eq!(after.schema_version, known);
    drop(stores);
    dbs.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused() {
    let Some(admin) = support::admin_url() else {
        return;
    };
    let dbs = Databases::new(admin);
    let (_, url) = dbs.create().await;
    drop(PgStore::open(&url).await.unwrap());
    rows(
        &url,
        "INSERT INTO schema_migrations (version, applied_at) VALUES (999, 0)",
    )
    .await;
    match PgStore::open(&url).await {
        Err(StoreError::TooNew { found: 999, known }) => assert!(known < 999),
        Err(e) => panic!("expected TooNew, got {e}"),
        Ok(_) => panic!("a store with schema 999 opened"),
    }
    assert_eq!(probe(&url).await.unwrap().schema_version, 999);
    dbs.drop_all().await;
}

#[tokio::test]
async fn bad_urls_and_unreachable_servers_are_errors_without_the_password() {
    for bad in ["mysql://u:hunter2@127.0.0.1/x", "hunter2"] {
        let err = PgStore::open(bad).await.err().expect("refused").to_string();
        assert!(err.contains("postgres://"), "{err}");
        assert!(!err.contains("hunter2"), "the password is not shown: {err}");
    }
    // Nothing listens on port 1 of loopback.
    let url = "postgres://sandboxd:hunter2@127.0.0.1:1/sandboxd";
    let err = PgStore::open(url).await.err().expect("refused").to_string();
    assert!(!err.contains("hunter2"), "the password is not shown: {err}");
    assert!(
        err.contains("127.0.0.1:1"),
        "the error names the store: {err}"
    );
    let err = probe(url).await.expect_err("refused").to_string();
    assert!(!err.contains("hunter2"), "{err}");
    assert_eq!(
        sandboxd_postgres::redacted(url),
        "postgres://sandboxd:***@127.0.0.1:1/sandboxd"
    );
}

/// The bench's throw-away database: made empty with the prefix, a store opens (and migrates)
/// on its URL, and dropping it ends that store's open connections and removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scratch_database_is_made_used_and_dropped() {
    let Some(admin) = support::admin_url() else {
        return;
    };
    let exists = |name: String| {
        let admin = admin.clone();
        async move {
            let q = format!("SELECT count(*) FROM pg_database WHERE datname = '{name}'");
            rows(&admin, &q).await[0].get::<_, i64>(0)
        }
    };
    let db = sandboxd_postgres::create_scratch_database(&admin, "sbx_scratch_test")
        .await
        .unwrap();
    assert!(db.name().starts_with("sbx_scratch_test_"), "{}", db.name());
    assert!(
        db.url().ends_with(&format!("/{}", db.name())),
        "{}",
        db.url()
    );
    assert_eq!(exists(db.name().to_string()).await, 1);
    // The store stays open (its pool and listener connected) while the database is dropped.
    let store = PgStore::open(db.url()).await.unwrap();
    store.ping().await.unwrap();
    assert_eq!(
        probe(db.url()).await.unwrap().schema_version,
        probe(db.url()).await.unwrap().known_version
    );
    let name = db.name().to_string();
    db.drop_database().await.unwrap();
    assert_eq!(exists(name).await, 0, "the database is gone");
    drop(store);
    let refused = sandboxd_postgres::create_scratch_database(&admin, "Bad-Prefix").await;
    assert!(
        refused.is_err(),
        "a prefix that is no plain identifier is refused"
    );
}
