//! Ending a session keeps its history (issue 20, point 6), against a real `serve`, the real
//! engine and image, and a fake LLM: `DELETE /v1/sessions/{id}` removes the container and
//! ends the session, which stays listed with `include_ended` while its run, events and image
//! stay readable and it no longer counts against the sessions quota; deleting it again is
//! 204; the history goes only with the separate `DELETE /v1/sessions/{id}/history`, which
//! another user cannot call on it (404, nothing removed).
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use reqwest::Method;
use serde_json::{Value, json};

use serve::runs::{SERVER, events, follow_all, llm_config, read_sse, start_run};
use serve::{Api, Env, code, container_of};
use support::fake_llm::{FakeLlm, Reply};

const PLOT: &str =
    "import matplotlib.pyplot as plt\nplt.plot([0, 1, 2], [2, 0, 1], linewidth=4)\nplt.show()";

fn ids(list: &Value) -> Vec<String> {
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

/// What the owner can read of the run: its record, its events (finite) and its image.
async fn readable(api: &Api, session: &str, run: &str, image: &str) -> (u16, u16, u16, u16) {
    let (list, runs) = api
        .json(Method::GET, &format!("/v1/runs?session_id={session}"), None)
        .await;
    let listed = runs["runs"]
        .as_array()
        .is_some_and(|r| r.iter().any(|r| r["id"] == run));
    let (got, _) = api
        .json(Method::GET, &format!("/v1/runs/{run}"), None)
        .await;
    let evs = api
        .req(Method::GET, &format!("/v1/runs/{run}/events?follow=false"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    let img = api
        .req(Method::GET, &format!("/v1/runs/{run}/images/{image}"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    (if listed { list } else { 404 }, got, evs, img)
}

#[tokio::test(flavor = "multi_thread")]
async fn ending_a_session_keeps_its_history_until_the_explicit_purge() {
    let llm = FakeLlm::start(vec![
        Reply::tool("bash", json!({"command": "echo kept > /workspace/a.txt"})),
        Reply::tool("python", json!({"code": PLOT})),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    ])
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let alice = env.add_user("alice", &["--sessions", "1"]);
    let bob = env.add_user("bob", &[]);
    let serve = env.start();
    let a = Api::new(&serve, &alice);
    let b = Api::new(&serve, &bob);

    let run = start_run(&a, json!({"task": "write and plot", "session": {}})).await;
    let run_id = run["id"].as_str().unwrap().to_string();
    let session = run["session_id"].as_str().unwrap().to_string();
    let evs = follow_all(&a, &run_id).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded", "{evs:?}");
    let image = evs
        .iter()
        .find_map(|e| e.data["image"]["id"].as_str().map(String::from))
        .expect("the python tool_result references an image");
    let rt = env.runtime_id(&session).await;
    assert!(container_of(&rt, true));

    // Another user can neither end it nor delete its history.
    for path in [
        format!("/v1/sessions/{session}"),
        format!("/v1/sessions/{session}/history"),
    ] {
        let (s, v) = b.json(Method::DELETE, &path, None).await;
        assert_eq!((s, code(&v)), (404, "not_found"), "{path}: {v}");
    }
    assert!(container_of(&rt, true), "bob's calls ended nothing");

    // Ending it: the container goes, the session stays (ended), with its history.
    let (s, v) = a
        .json(Method::DELETE, &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!(s, 204, "{v}");
    assert!(!container_of(&rt, false), "the container is gone");
    let (s, got) = a
        .json(Method::GET, &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!(s, 200, "the ended session is still there: {got}");
    assert_eq!(got["state"], "ended", "{got}");
    assert_eq!(got["end_reason"], "ended by its owner", "{got}");
    let (_, live) = a.json(Method::GET, "/v1/sessions", None).await;
    assert!(!ids(&live).contains(&session), "not listed as live: {live}");
    let (_, all) = a
        .json(Method::GET, "/v1/sessions?include_ended=true", None)
        .await;
    assert!(ids(&all).contains(&session), "listed as ended: {all}");
    assert_eq!(
        readable(&a, &session, &run_id, &image).await,
        (200, 200, 200, 200),
        "the run, its events and its image stay readable"
    );
    let kept = read_sse(events(&a, &run_id, "?follow=false", None).await, None).await;
    assert_eq!(kept, evs, "every event is kept");
    // Exec in an ended session is the usual clear conflict.
    let (s, v) = a
        .json(
            Method::POST,
            &format!("/v1/sessions/{session}/exec"),
            Some(json!({"command": "true"})),
        )
        .await;
    assert_eq!((s, code(&v)), (409, "conflict"), "{v}");

    // Ending it again is the same answer, and changes nothing.
    let (s, v) = a
        .json(Method::DELETE, &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!(s, 204, "ending an ended session again: {v}");
    let (_, again) = a
        .json(Method::GET, &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!(again["ended_at"], got["ended_at"], "{again}");

    // The ended session does not count against the quota of one session.
    let (_, me) = a.json(Method::GET, "/v1/me", None).await;
    assert_eq!(me["usage"]["active_sessions"], 0, "{me}");
    let other = a.session().await;

    // Bob cannot delete the ended session's history either; it is all still there.
    let (s, v) = b
        .json(
            Method::DELETE,
            &format!("/v1/sessions/{session}/history"),
            None,
        )
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    assert_eq!(
        readable(&a, &session, &run_id, &image).await,
        (200, 200, 200, 200)
    );

    // The owner's explicit purge: session, run, events and image are gone.
    let (s, v) = a
        .json(
            Method::DELETE,
            &format!("/v1/sessions/{session}/history"),
            None,
        )
        .await;
    assert_eq!(s, 204, "{v}");
    let (s, _) = a
        .json(Method::GET, &format!("/v1/sessions/{session}"), None)
        .await;
    assert_eq!(s, 404);
    assert_eq!(
        readable(&a, &session, &run_id, &image).await,
        (404, 404, 404, 404)
    );
    let (_, all) = a
        .json(Method::GET, "/v1/sessions?include_ended=true", None)
        .await;
    assert_eq!(ids(&all), vec![other.clone()], "{all}");

    // Purging a live session ends it first: its container goes too.
    let other_rt = env.runtime_id(&other).await;
    let (s, v) = a
        .json(
            Method::DELETE,
            &format!("/v1/sessions/{other}/history"),
            None,
        )
        .await;
    assert_eq!(s, 204, "{v}");
    assert!(!container_of(&other_rt, false), "its container is gone");
    let (s, _) = a
        .json(Method::GET, &format!("/v1/sessions/{other}"), None)
        .await;
    assert_eq!(s, 404);
}

/// The admin page lists ended sessions and deletes one's history only after a confirmation.
#[tokio::test(flavor = "multi_thread")]
async fn the_admin_page_deletes_an_ended_sessions_history_after_a_confirmation() {
    use support::web_browser::{WebBrowser, click, eval, goto, type_into, wait_for};
    const WAIT: std::time::Duration = std::time::Duration::from_secs(20);

    let env = Env::new("").await;
    let root = env.add_user("root", &["--admin"]);
    let bob_key = env.add_user("bob", &[]);
    let serve = env.start();
    let bob = Api::new(&serve, &bob_key);
    let id = bob.session().await;
    let (s, _) = bob
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204);

    let browser = WebBrowser::start().await;
    let page = browser.page().await;
    goto(&page, &serve.url("/login")).await;
    type_into(&page, "#key", &root).await;
    click(&page, "form button[type=submit]").await;
    wait_for(&page, "location.pathname === '/runs'", WAIT, "signed in").await;
    goto(&page, &serve.url("/admin")).await;
    let row = format!("#ended-sessions tr[data-session={id:?}]");
    wait_for(
        &page,
        &format!("document.querySelector('{row}') !== null"),
        WAIT,
        "the ended session listed",
    )
    .await;

    // Declined: nothing is deleted.
    eval(
        &page,
        "window.asked = []; window.confirm = (m) => { window.asked.push(m); return false; }",
    )
    .await;
    click(&page, &format!("{row} button")).await;
    wait_for(&page, "window.asked.length === 1", WAIT, "the confirmation").await;
    let asked = eval(&page, "window.asked[0]").await;
    assert!(
        asked.as_str().unwrap().contains(&id),
        "the confirmation names the session: {asked}"
    );
    let (s, _) = bob
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 200, "declining kept the history");

    // Confirmed: the history is gone, and so is the row.
    eval(&page, "window.confirm = () => true").await;
    click(&page, &format!("{row} button")).await;
    wait_for(
        &page,
        &format!("document.querySelector('{row}') === null"),
        WAIT,
        "the row gone",
    )
    .await;
    let (s, _) = bob
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 404, "the history was deleted");
}
