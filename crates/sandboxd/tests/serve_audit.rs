//! The audit log on a real serve (real engine and image): a scripted sequence of admin and
//! user actions (`sandboxd users` on the host, keys first used, a user made, rotated and
//! removed, a session made, looked at by an admin and ended, a failed and a good web
//! sign-in) gives exactly the expected entries in order, with request ids, the client
//! address, the session's limits and backend handle, and no key anywhere; a non-admin gets
//! 404 and no key 401; pages joined by their cursors and the JSON lines export are the log.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env};

async fn page(api: &Api, query: &str) -> Value {
    let (s, v) = api
        .json(Method::GET, &format!("/v1/audit{query}"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scripted_sequence_gives_exactly_the_expected_entries() {
    let env = Env::new("").await;
    let root_key = env.add_user("root", &["--admin"]);
    let bob_key = env.add_user("bob", &[]);
    let serve = env.start();
    let root = Api::new(&serve, &root_key);
    let bob = Api::new(&serve, &bob_key);

    let (s, v) = root
        .json(Method::POST, "/v1/users", Some(json!({"name": "carol"})))
        .await;
    assert_eq!(s, 201, "{v}");
    env.track_user(v["user"]["id"].as_str().unwrap());
    let carol_key = v["key"].as_str().unwrap().to_string();
    let id = bob.session().await;
    let (s, _) = root
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 200);
    let (s, v) = root
        .json(Method::POST, "/v1/users/carol/rotate", None)
        .await;
    assert_eq!(s, 200, "{v}");
    let carol_key2 = v["key"].as_str().unwrap().to_string();
    let (s, _) = bob
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 204);
    let web = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for (key, status) in [("sbx_not-a-key", 401), (bob_key.as_str(), 303)] {
        let r = web
            .post(serve.url("/login"))
            .form(&[("key", key)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status);
    }
    let (s, _) = root.json(Method::DELETE, "/v1/users/carol", None).await;
    assert_eq!(s, 204);

    // Only admins read it: a user's key is 404, none is 401.
    let (s, _) = bob.json(Method::GET, "/v1/audit", None).await;
    assert_eq!(s, 404);
    let anon = reqwest::get(serve.url("/v1/audit")).await.unwrap();
    assert_eq!(anon.status(), 401);

    let all = page(&root, "?limit=1000").await;
    assert!(all["next_cursor"].is_null(), "{all}");
    let entries = all["entries"].as_array().unwrap();
    let got: Vec<(String, String, String)> = entries
        .iter()
        .map(|e| {
            let f = |k: &str| e[k].as_str().unwrap().to_string();
            (f("actor"), f("action"), f("target"))
        })
        .collect();
    let t = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
    let expected = vec![
        t("cli", "user.create", "root"),
        t("cli", "user.create", "bob"),
        t("root", "key.use", "root"),
        t("root", "user.create", "carol"),
        t("bob", "key.use", "bob"),
        t("bob", "session.create", &id),
        t("root", "admin.session_access", &id),
        t("root", "key.rotate", "carol"),
        t("bob", "session.end", &id),
        t("-", "sign_in.failed", "-"),
        t("bob", "sign_in", "bob"),
        t("root", "user.remove", "carol"),
    ];
    assert_eq!(got, expected, "{all:#}");

    // What each entry carries: a request id and the client for those made by requests.
    for e in &entries[2..] {
        assert_eq!(e["client"], "127.0.0.1", "{e}");
        assert_eq!(e["request_id"].as_str().unwrap().len(), 32, "{e}");
    }
    let created = &entries[5]["details"];
    assert_eq!(created["backend"], "docker", "{created}");
    assert!(
        created["limits"]["memory_mb"].as_u64().unwrap() > 0,
        "{created}"
    );
    let handle = created["handle"].as_str().unwrap();
    assert!(!handle.is_empty());
    assert_eq!(entries[8]["details"]["handle"], handle);
    assert_eq!(entries[8]["details"]["reason"], "ended by its owner");
    let text = all.to_string();
    for key in [&root_key, &bob_key, &carol_key, &carol_key2] {
        assert!(!text.contains(key.as_str()), "a key is in the log");
    }
    assert!(!text.contains("sbx_not-a-key"), "a tried key is in the log");

    // Pages of 5 joined by their cursors are the log; so are the newest-first pages.
    let mut joined = Vec::new();
    let mut cursor = String::new();
    loop {
        let p = page(&root, &format!("?limit=5&cursor={cursor}")).await;
        joined.extend(p["entries"].as_array().unwrap().iter().cloned());
        match p["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    assert_eq!(&joined, entries);
    let newest = page(&root, "?limit=5&order=newest").await;
    let seqs: Vec<i64> = newest["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    let last: Vec<i64> = entries
        .iter()
        .rev()
        .take(5)
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, last);

    // The JSON lines export: every entry, in order, each line parsing alone.
    let resp = root
        .req(Method::GET, "/v1/audit?format=jsonl")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/jsonl")
    );
    let body = resp.text().await.unwrap();
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(&lines, entries);
}

/// The `session.*` entries of the log, as (actor, action, target), oldest first.
async fn session_entries(root: &Api) -> Vec<(String, String, String)> {
    let all = page(root, "?limit=1000").await;
    all["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"].as_str().unwrap().starts_with("session."))
        .map(|e| {
            let f = |k: &str| e[k].as_str().unwrap().to_string();
            (f("actor"), f("action"), f("target"))
        })
        .collect()
}

/// The ids of the caller's sessions of `kind`, ended ones too, oldest first.
async fn ids_of_kind(api: &Api, kind: &str) -> Vec<String> {
    let (s, v) = api
        .json(Method::GET, "/v1/sessions?include_ended=true", None)
        .await;
    assert_eq!(s, 200, "{v}");
    let mut rows: Vec<&Value> = v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == kind)
        .collect();
    rows.sort_by_key(|s| s["created_at"].as_str().unwrap().to_string());
    rows.iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

/// Sessions are audited whichever front end made them and whoever ended them: an MCP
/// sandbox is created by its user, the idle reaper's ends (API and MCP) are the service's,
/// and a session whose serve was killed is ended by the next start, once each.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_of_every_front_end_and_every_end_are_audited_once() {
    use crate::serve_mcp_quota::client::{Cleanup, Mcp, gone, mcp_containers, me, wait_until};
    use std::time::Duration;

    let env = Env::new("idle_timeout_secs = 2").await;
    let root_key = env.add_user("root", &["--admin"]);
    let key = env.add_user("hal", &["--sessions", "2"]);
    let mut serve = env.start();
    let api = Api::new(&serve, &key);
    let mut cleanup = Cleanup(Vec::new());

    let m = Mcp::open(&serve, &key).await;
    m.bash("true", None).await;
    cleanup.0.extend(mcp_containers(&env, &api).await);
    let id = api.session().await;
    // The reaper takes both idle sessions; their rows end with them.
    wait_until("both idle rows end", Duration::from_secs(60), async || {
        me(&api).await["usage"]["active_sessions"] == 0
    })
    .await;
    let first = ids_of_kind(&api, "mcp").await;
    assert_eq!(first.len(), 1, "{first:?}");
    // A new MCP sandbox, whose serve dies: the next start ends its row.
    m.bash("true", None).await;
    let containers = mcp_containers(&env, &api).await;
    cleanup.0.extend(containers.clone());
    serve.kill9();
    let serve = env.start();
    let root = Api::new(&serve, &root_key);
    let api = Api::new(&serve, &key);
    wait_until(
        "the killed serve's row ends",
        Duration::from_secs(30),
        async || me(&api).await["usage"]["active_sessions"] == 0,
    )
    .await;
    wait_until("its container goes", Duration::from_secs(30), async || {
        gone(&containers).await
    })
    .await;
    let mcp = ids_of_kind(&api, "mcp").await;
    assert_eq!(mcp.len(), 2, "{mcp:?}");

    let got = session_entries(&root).await;
    let t = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
    assert_eq!(
        got[..2],
        [
            t("hal", "session.create", &mcp[0]),
            t("hal", "session.create", &id)
        ]
    );
    // The reaper's two ends, in the order it found them.
    let mut ends = got[2..4].to_vec();
    ends.sort();
    let mut want = vec![
        t("system", "session.end", &mcp[0]),
        t("system", "session.end", &id),
    ];
    want.sort();
    assert_eq!(ends, want, "{got:?}");
    assert_eq!(
        got[4..],
        [
            t("hal", "session.create", &mcp[1]),
            t("system", "session.end", &mcp[1])
        ],
        "{got:?}"
    );
}
