//! `/v1/sessions/{id}/processes` and `env`/`cwd` on `/exec`, against a real `serve`, engine
//! and image: two processes run at once beside the shell, each with its env and cwd; list,
//! the SSE stream (replayed for a late reader, then the exit), stdin, a signal that kills the
//! whole tree; the per-session bound; another user's session is 404; an exec's env stays out
//! of the shell; what the session's state refuses is a 404 or 409, never a 400; a session's
//! own `env` reaches its shell, processes and python without showing in its view.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env, code};

/// Every SSE event of a finished stream, as (event, data).
async fn events(api: &Api, path: &str) -> Vec<(String, Value)> {
    let text = api
        .req(Method::GET, path)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.split("\n\n")
        .filter_map(|block| {
            let event = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((event.to_string(), serde_json::from_str(data).unwrap()))
        })
        .collect()
}

async fn start(api: &Api, id: &str, body: Value) -> (u16, Value) {
    api.json(
        Method::POST,
        &format!("/v1/sessions/{id}/processes"),
        Some(body),
    )
    .await
}

#[tokio::test]
async fn processes_run_beside_the_shell() {
    let env = Env::new("").await;
    let key = env.add_user("alice", &[]);
    let other = env.add_user("bob", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;

    let (s, a) = start(
        &api,
        &id,
        json!({"command": "echo $WHO; pwd; sleep 60", "env": {"WHO": "a"}, "cwd": "/tmp"}),
    )
    .await;
    assert_eq!(s, 201, "{a}");
    let (s, b) = start(
        &api,
        &id,
        json!({"argv": ["cat"], "stdin": true, "tag": "cat"}),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    // The shell is free meanwhile.
    assert_eq!(api.exec(&id, "echo shell").await["stdout"], "shell\n");
    let (s, listed) = api
        .json(Method::GET, &format!("/v1/sessions/{id}/processes"), None)
        .await;
    assert_eq!(s, 200);
    let pids: Vec<&Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["pid"])
        .collect();
    assert_eq!(pids, [&a["pid"], &b["pid"]], "{listed}");
    assert_eq!(listed[1]["tag"], "cat");

    // stdin, then EOF: cat echoes and exits 0; a late reader gets it all, then the exit.
    let (pa, pb) = (a["pid"].as_u64().unwrap(), b["pid"].as_u64().unwrap());
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/processes/{pb}/stdin"),
            Some(json!({"data": "typed\n", "close": true})),
        )
        .await;
    assert_eq!(s, 204, "{v}");
    let got = events(&api, &format!("/v1/sessions/{id}/processes/{pb}/stream")).await;
    assert_eq!(
        got[0],
        ("stdout".to_string(), json!({"text": "typed\n"})),
        "{got:?}"
    );
    assert_eq!(got.last().unwrap().0, "exit");
    assert_eq!(got.last().unwrap().1["exit_code"], 0);

    // A signal ends the first (and its sleep); its stream shows its env and cwd, then exit.
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/processes/{pa}/signal"),
            Some(json!({"signal": "KILL"})),
        )
        .await;
    assert_eq!(s, 204, "{v}");
    let out = api.exec(&id, "pgrep -f 'sleep 60' || echo none").await;
    assert_eq!(out["stdout"], "none\n", "{out}");
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/processes/{pa}/signal"),
            Some(json!({"signal": "KILL"})),
        )
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");

    // Bounded: 16 at once.
    for i in 0..16 {
        let (s, v) = start(&api, &id, json!({"command": "sleep 60"})).await;
        assert_eq!(s, 201, "process {i}: {v}");
    }
    let (s, v) = start(&api, &id, json!({"command": "true"})).await;
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("16"),
        "{v}"
    );
    let (s, v) = start(
        &api,
        &id,
        json!({"command": "true", "env": {"BAD=NAME": "x"}}),
    )
    .await;
    assert_eq!(s, 400, "{v}");

    // Another user's session is 404, as one that never existed.
    let bob = Api::new(&serve, &other);
    let (s, v) = bob
        .json(Method::GET, &format!("/v1/sessions/{id}/processes"), None)
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    let (s, _) = start(&bob, &id, json!({"command": "true"})).await;
    assert_eq!(s, 404);

    // env and cwd on an exec: its own process; the shell does not keep them.
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/exec"),
            Some(json!({"command": "echo $TOKEN; pwd", "env": {"TOKEN": "t0k"}, "cwd": "/tmp"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["stdout"], "t0k\n/tmp\n", "{v}");
    assert_eq!(api.exec(&id, "echo \"[$TOKEN]\"").await["stdout"], "[]\n");
}

/// What a document-valid start can still meet in the session's state: a working directory
/// that is missing (404) or a file (409), a tag already taken (409), stdin not kept (409).
#[tokio::test]
async fn the_session_state_refuses_with_404_and_409_never_400() {
    let env = Env::new("").await;
    let key = env.add_user("alice", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    api.exec(&id, "touch /workspace/file").await;
    for (cwd, status) in [("/nowhere", 404), ("file", 409)] {
        let (s, v) = start(&api, &id, json!({"command": "true", "cwd": cwd})).await;
        assert_eq!(s, status, "{cwd}: {v}");
        let (s, v) = api
            .json(
                Method::POST,
                &format!("/v1/sessions/{id}/exec"),
                Some(json!({"command": "true", "cwd": cwd})),
            )
            .await;
        assert_eq!(s, status, "exec in {cwd}: {v}");
    }
    let (s, v) = start(&api, &id, json!({"command": "sleep 60", "tag": "t"})).await;
    assert_eq!(s, 201, "{v}");
    let pid = v["pid"].as_u64().unwrap();
    let (s, v) = start(&api, &id, json!({"command": "true", "tag": "t"})).await;
    assert_eq!((s, code(&v)), (409, "conflict"), "{v}");
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/processes/{pid}/stdin"),
            Some(json!({"data": "x"})),
        )
        .await;
    assert_eq!((s, code(&v)), (409, "conflict"), "{v}");
    // Both or neither of command and argv: the document's oneOf refuses them too.
    for body in [json!({}), json!({"command": "true", "argv": ["true"]})] {
        let (s, v) = start(&api, &id, body).await;
        assert_eq!(s, 400, "{v}");
    }
}

/// `env` on POST /v1/sessions reaches the persistent shell, a process and the python
/// interpreter, and the session's view does not show it.
#[tokio::test]
async fn a_session_env_reaches_shell_processes_and_python() {
    let env = Env::new("").await;
    let key = env.add_user("alice", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"env": {"SESSION_SECRET": "s3cr3t-value"}})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    assert!(!v.to_string().contains("s3cr3t"), "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let out = api.exec(&id, "echo $SESSION_SECRET").await;
    assert_eq!(out["stdout"], "s3cr3t-value\n", "{out}");
    let (s, p) = start(&api, &id, json!({"argv": ["printenv", "SESSION_SECRET"]})).await;
    assert_eq!(s, 201, "{p}");
    let got = events(
        &api,
        &format!("/v1/sessions/{id}/processes/{}/stream", p["pid"]),
    )
    .await;
    assert_eq!(got[0].1["text"], "s3cr3t-value\n", "{got:?}");
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/python"),
            Some(json!({"code": "import os; print(os.environ['SESSION_SECRET'])"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["output"].as_str().unwrap().trim(), "s3cr3t-value", "{v}");
    let (s, v) = api
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 200);
    assert!(!v.to_string().contains("s3cr3t"), "{v}");
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"env": {"SANDBOXD_TAG": "x"}})),
        )
        .await;
    assert_eq!((s, code(&v)), (400, "invalid_request"), "{v}");
}
