//! Run wake-ups across replicas on a real PostgreSQL (SANDBOXD_TEST_PG_URL): two stores on one
//! database are two replicas; an event appended through one wakes the other's receivers (the
//! NOTIFY of its transaction), and so does `wake_run`; when the listeners' connections are cut
//! (as a Postgres restart or a network loss cuts them), each reconnects and says `WAKE_ALL`,
//! then hears commits again; a dropped store's listener goes away (its task holds no handle
//! of the store).
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

mod support;

use std::time::{Duration, Instant};

use sandboxd_core::store::{
    NewUser, QuotaOverride, RunPatch, RunRow, SessionRow, Store, StoredEvent, StoredKey, WAKE_ALL,
    control_wake, now_ms,
};
use sandboxd_postgres::{PgStore, WAKES_APPLICATION_NAME};
use support::Databases;
use tokio::sync::broadcast::Receiver;
use tokio_postgres::NoTls;

const WAIT: Duration = Duration::from_secs(10);

/// The replica the test run is driven by.
const DRIVER: &str = "r-0123456789ab";

async fn sql(url: &str, statement: &str) -> Vec<tokio_postgres::Row> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(conn);
    client.query(statement, &[]).await.unwrap()
}

/// How many listener connections the database has.
async fn listeners(url: &str) -> i64 {
    let q = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = '{WAKES_APPLICATION_NAME}'"
    );
    sql(url, &q).await[0].get(0)
}

/// The next wake-up, within `WAIT`; `WAKE_ALL` is skipped unless `all` is what is awaited.
async fn next_wake(rx: &mut Receiver<String>, all: bool) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let id = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("a wake-up within the bound")
            .expect("the wake-ups work");
        if (id == WAKE_ALL) == all {
            return id;
        }
    }
}

fn event(seq: u64) -> StoredEvent {
    StoredEvent {
        seq,
        time: now_ms(),
        kind: "step".into(),
        payload: format!(r#"{{"type":"step","seq":{seq}}}"#),
    }
}

/// A run "r1" in the store, appended to by the tests.
async fn a_run(store: &dyn Store) {
    let key = StoredKey {
        hash: [7; 32],
        prefix: "sbx_07".into(),
        created_at: now_ms(),
        expires_at: None,
    };
    let user = NewUser {
        name: "ann".into(),
        admin: false,
        key,
        quota: QuotaOverride::default(),
    };
    let owner = store.add_user(user).await.unwrap().id;
    let row = SessionRow::creating(
        "s1",
        &owner,
        Default::default(),
        Default::default(),
        60,
        now_ms(),
    );
    store.reserve_session(row, 10).await.unwrap();
    store.replica_beat(DRIVER, 3_600_000).await.unwrap();
    let run = RunRow::queued("r1", "s1", &owner, "t", "agent", None, now_ms()).with_driver(DRIVER);
    store.insert_run(run, 10).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_wake_each_other_and_a_cut_listener_comes_back_with_wake_all() {
    let Some(admin) = support::admin_url() else {
        return;
    };
    let dbs = Databases::new(admin);
    let (_, url) = dbs.create().await;
    let a = PgStore::open(&url).await.unwrap();
    let b = PgStore::open(&url).await.unwrap();
    assert_eq!(listeners(&url).await, 2, "each replica listens once open");
    a_run(&a).await;

    let mut rx = b.run_wakes();
    a.append_event("r1", DRIVER, event(1), RunPatch::default())
        .await
        .unwrap();
    assert_eq!(next_wake(&mut rx, false).await, "r1", "A's commit wakes B");
    let seen = b.events_after("r1", 0, 10).await.unwrap();
    assert_eq!(seen.len(), 1, "B, woken, reads the event");
    a.wake_run("r1").await.unwrap();
    assert_eq!(
        next_wake(&mut rx, false).await,
        control_wake("r1"),
        "A's wake_run wakes B, in its control form"
    );

    // Cut every listener's connection.
    let mut rx_a = a.run_wakes();
    let cut = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = '{WAKES_APPLICATION_NAME}'"
    );
    assert_eq!(sql(&url, &cut).await.len(), 2);
    assert_eq!(
        next_wake(&mut rx, true).await,
        WAKE_ALL,
        "B listens again and says so"
    );
    assert_eq!(next_wake(&mut rx_a, true).await, WAKE_ALL, "so does A");
    a.append_event("r1", DRIVER, event(2), RunPatch::default())
        .await
        .unwrap();
    assert_eq!(
        next_wake(&mut rx, false).await,
        "r1",
        "B hears A's commits again"
    );

    // A dropped store's listener goes away; the other stays.
    assert_eq!(listeners(&url).await, 2, "both listen again");
    drop(b);
    let deadline = Instant::now() + WAIT;
    while listeners(&url).await != 1 {
        assert!(Instant::now() < deadline, "B's listener outlived B");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(a);
    dbs.drop_all().await;
}
