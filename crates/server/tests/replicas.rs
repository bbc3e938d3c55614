//! Sessions across replicas, in-process: several `Server`s on one SQLite store file and one
//! fake runtime (the shared engine), each a replica with its own id and lease. A session
//! made through one is used through another (attached on demand, owner checked, the live
//! replica's shell left alone); a replica that stopped has its shells killed where the
//! session goes on; one replica's reaper never ends a session another keeps using, and
//! exactly one ends it once nobody does; a third replica's start removes nothing a live
//! replica owns, and the global session cap holds across replicas.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::harness::{Serve, Setup, code, start_on};

/// The ids of the replicas holding `session` (an API id), as the store records them.
async fn holders(setup: &Setup, session: &str) -> Vec<String> {
    let store = setup.store().await;
    let mut hs: Vec<String> = store
        .session_holders()
        .await
        .unwrap()
        .into_iter()
        .filter(|(s, _)| s == session)
        .map(|(_, r)| r)
        .collect();
    hs.sort();
    hs
}

/// Uses the session through `serve`: a tool call (the fake runtime's sandboxes run no shell),
/// to a tool that does not exist, so it ends right after the session was looked up, attached
/// and marked used. 200 for the caller's live session (`used`), else the error's status.
async fn use_it(serve: &Serve, key: &str, session: &str) -> (u16, serde_json::Value) {
    let (s, v) = serve
        .call(
            key,
            Method::POST,
            &format!("/v1/sessions/{session}/tools/no_such_tool"),
            Some(json!({})),
        )
        .await;
    let message = v["error"]["message"].as_str().unwrap_or_default();
    if s == 404 && message.starts_with("no tool") {
        (200, v)
    } else {
        (s, v)
    }
}

/// The session's row as the list shows it: a store read, which is no use of the session
/// (GET /v1/sessions/{id} on a replica that holds it is one).
async fn listed(serve: &Serve, key: &str, session: &str) -> serde_json::Value {
    let v = serve
        .until(key, "/v1/sessions?include_ended=true", |_| true)
        .await;
    v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == session)
        .cloned()
        .unwrap_or_else(|| panic!("session {session} is not listed: {v}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_made_on_one_replica_is_used_through_another() {
    let setup = Setup::new();
    let (a, keys) = start_on(&setup, &[("ann", None), ("bob", None)]).await;
    let (ann, bob) = (keys[0].clone(), keys[1].clone());
    let (b, _) = start_on(&setup, &[]).await;
    let id = a.session(&ann).await;
    let made_on_a = holders(&setup, &id).await;
    assert_eq!(
        made_on_a.len(),
        1,
        "the creating replica holds it: {made_on_a:?}"
    );
    assert!(b.manager.live().await.is_empty(), "B holds nothing yet");

    let (s, v) = use_it(&b, &ann, &id).await;
    assert_eq!(s, 200, "B attaches the session on demand: {v}");
    assert_eq!(
        setup.runtime.creates(),
        1,
        "the same sandbox, not a new one"
    );
    assert_eq!(b.manager.live().await.len(), 1, "B holds it now");
    assert_eq!(holders(&setup, &id).await.len(), 2, "both replicas hold it");
    assert!(
        setup.runtime.kills().is_empty(),
        "a live replica's shell is never killed: {:?}",
        setup.runtime.kills()
    );
    // Another user is told it does not exist, on either replica.
    let (s, v) = use_it(&b, &bob, &id).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    // Ended through B, it is gone for A too.
    let (s, v) = b
        .call(&ann, Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204, "{v}");
    assert!(
        setup.runtime.sessions().is_empty(),
        "its sandbox is removed"
    );
    let (s, v) = use_it(&a, &ann, &id).await;
    assert_eq!((s, code(&v)), (409, "conflict"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shell_of_a_stopped_replica_is_killed_where_its_session_goes_on() {
    let setup = Setup::new();
    let (a, keys) = start_on(&setup, &[("ann", None)]).await;
    let ann = keys[0].clone();
    let (b, _) = start_on(&setup, &[]).await;
    let id = a.session(&ann).await;
    let a_id = holders(&setup, &id).await.remove(0);
    a.stop().await;

    let (s, v) = use_it(&b, &ann, &id).await;
    assert_eq!(s, 200, "{v}");
    let tags: Vec<String> = setup.runtime.kills().into_iter().map(|(_, t)| t).collect();
    assert_eq!(
        tags,
        vec![format!("sandboxd-shell-{a_id}")],
        "the stopped replica's shell, and only it, was killed before B used the session"
    );
    let now = holders(&setup, &id).await;
    assert!(
        now.len() == 1 && now[0] != a_id,
        "the stopped replica is forgotten as a holder: {now:?}"
    );
    let (s, _) = use_it(&b, &ann, &id).await;
    assert_eq!(s, 200);
    assert_eq!(
        setup.runtime.kills().len(),
        1,
        "killed once, not on every use"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_used_on_one_replica_is_not_reaped_by_another() {
    let setup = Setup::new().reaping_every(1);
    let (a, keys) = start_on(&setup, &[("ann", None)]).await;
    let ann = keys[0].clone();
    let (b, _) = start_on(&setup, &[]).await;
    let (s, v) = a
        .call(
            &ann,
            Method::POST,
            "/v1/sessions",
            Some(json!({"idle_timeout": 3})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();

    // B uses it for three timeouts; A, which holds it too, sees no use of its own.
    let until = Instant::now() + Duration::from_secs(9);
    while Instant::now() < until {
        let (s, v) = use_it(&b, &ann, &id).await;
        assert_eq!(s, 200, "A's reaper ended a session B keeps using: {v}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(a.manager.live().await.len(), 1, "A still holds it");
    assert_eq!(listed(&a, &ann, &id).await["state"], "running");

    // Once nobody uses it, exactly one replica ends it, with why, and the sandbox goes.
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        let row = listed(&a, &ann, &id).await;
        if row["state"] == "ended" {
            break row;
        }
        assert!(Instant::now() < deadline, "never idled out: {row}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(row["end_reason"], "idle for more than 3 s", "{row}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(a.manager.live().await.is_empty() && b.manager.live().await.is_empty()) {
        assert!(Instant::now() < deadline, "a replica kept an ended session");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        setup.runtime.sessions().is_empty(),
        "its sandbox is removed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_third_replica_starting_removes_nothing_a_live_replica_owns() {
    let setup = Setup::new();
    let (a, keys) = start_on(&setup, &[("ann", None)]).await;
    let ann = keys[0].clone();
    let id = a.session(&ann).await;
    let a_id = holders(&setup, &id).await.remove(0);
    let user = setup.store().await.users().await.unwrap()[0].id.clone();
    let owner = format!("serve:{user}");
    // A container A is still making (no row names it yet), and one of a replica long gone.
    setup
        .runtime
        .insert_by_replica("00000000aaaa", &owner, &a_id);
    setup
        .runtime
        .insert_by_replica("00000000dead", &owner, "r-000000000000");

    let (c, _) = start_on(&setup, &[]).await;
    assert!(
        c.reconciled.reattached.is_empty() && c.reconciled.ended.is_empty(),
        "C takes over nothing a live replica holds: {:?}",
        c.reconciled
    );
    assert_eq!(
        c.reconciled.removed_containers,
        vec!["00000000dead".to_string()],
        "only the gone replica's stray container goes"
    );
    let mut left = setup.runtime.sessions();
    left.retain(|s| s != "00000000aaaa");
    assert_eq!(left.len(), 1, "A's session keeps its sandbox: {left:?}");
    assert!(setup.runtime.kills().is_empty(), "A's shell is left alone");
    let (s, v) = use_it(&a, &ann, &id).await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_global_session_cap_holds_across_replicas() {
    let setup = Setup::new().with_max_sessions(2);
    let (a, keys) = start_on(&setup, &[("ann", None), ("bob", None)]).await;
    let (ann, bob) = (keys[0].clone(), keys[1].clone());
    let (b, _) = start_on(&setup, &[]).await;
    a.session(&ann).await;
    b.session(&bob).await;
    let (s, v) = a
        .call(&bob, Method::POST, "/v1/sessions", Some(json!({})))
        .await;
    assert_eq!(s, 503, "the third session over a global cap of 2: {v}");
    let (s, v) = b
        .call(&ann, Method::POST, "/v1/sessions", Some(json!({})))
        .await;
    assert_eq!(s, 503, "on either replica: {v}");
    assert_eq!(setup.runtime.creates(), 2, "no sandbox was made for them");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_whose_replica_stopped_is_taken_over_and_reaped_by_another() {
    let setup = Setup::new().reaping_every(1);
    let (a, keys) = start_on(&setup, &[("ann", None)]).await;
    let ann = keys[0].clone();
    let (b, _) = start_on(&setup, &[]).await;
    let (s, v) = a
        .call(
            &ann,
            Method::POST,
            "/v1/sessions",
            Some(json!({"idle_timeout": 2})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let a_id = holders(&setup, &id).await.remove(0);
    a.stop().await;

    // Nobody uses it: B's upkeep attaches the orphan (killing A's shell), and B's reaper,
    // the only one left, ends it after its timeout.
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        let row = listed(&b, &ann, &id).await;
        if row["state"] == "ended" {
            break row;
        }
        assert!(
            Instant::now() < deadline,
            "the orphan was never reaped: {row}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(row["end_reason"], "idle for more than 2 s", "{row}");
    let tags: Vec<String> = setup.runtime.kills().into_iter().map(|(_, t)| t).collect();
    assert_eq!(tags, vec![format!("sandboxd-shell-{a_id}")]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !setup.runtime.sessions().is_empty() {
        assert!(Instant::now() < deadline, "its sandbox was never removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn another_services_replicas_and_their_sandboxes_are_not_this_ones_to_judge() {
    let setup = Setup::new();
    // An /mcp sandbox (not kept) of a replica of another service on this engine, whose
    // process lives: this store knows nothing of its replica.
    setup.runtime.insert_by_replica_kept(
        "0000000000cc",
        "serve-mcp:usr-other",
        "r-0123456789ab",
        false,
    );
    let (_x, _) = start_on(&Setup::beside(&setup), &[]).await;
    let (_y, _) = start_on(&setup, &[]).await;
    assert_eq!(
        setup.runtime.sessions(),
        vec!["0000000000cc".to_string()],
        "a replica unknown here is no proof its sandbox is an orphan"
    );
}
