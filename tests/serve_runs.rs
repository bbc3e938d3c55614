//! The runs API of `sandboxd serve` as a real process on loopback, with the real engine and
//! image and a fake LLM at the HTTP boundary: SSE that resumes exactly once and in order,
//! two followers, `?after`, `?follow=false`, images, a continued conversation, other users'
//! 404s, cancel that kills the command in flight, cancel of a queued run (it never starts),
//! the admin's filter by user, quotas, ask_human answered and timed out, plan mode, and runs
//! interrupted by `kill -9` and by SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

mod serve;
mod support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env, Serve, code};
use support::fake_llm::{FakeLlm, Reply};

fn llm_config(llm: &FakeLlm) -> String {
    format!(
        "[llm]\nbase_url = {:?}\nmodel = \"fake-model\"\napi_key = \"sk-fake\"\nmax_retries = 1\n",
        llm.base_url()
    )
}

const SERVER: &str = "[server]\ndrain_secs = 2\nbody_limit_kb = 64\nupload_limit_mb = 4\nauth_failures_per_minute = 10000\n";

/// One SSE event as received.
#[derive(Debug, Clone, PartialEq)]
struct Sse {
    id: u64,
    event: String,
    data: Value,
}

/// Reads SSE events from a response until it ends or `stop_after` events came.
async fn read_sse(resp: reqwest::Response, stop_after: Option<usize>) -> Vec<Sse> {
    let mut resp = resp;
    read_sse_on(&mut resp, &mut String::new(), stop_after).await
}

/// `read_sse` on a stream that stays open: `buf` keeps what was read past the last event.
async fn read_sse_on(
    resp: &mut reqwest::Response,
    buf: &mut String,
    stop_after: Option<usize>,
) -> Vec<Sse> {
    let mut out = Vec::new();
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.parse().ok();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if let Some(id) = id {
                out.push(Sse {
                    id,
                    event,
                    data: serde_json::from_str(&data).unwrap(),
                });
                if stop_after == Some(out.len()) {
                    return out;
                }
            }
        }
        match tokio::time::timeout(Duration::from_secs(120), resp.chunk()).await {
            Ok(Ok(Some(c))) => buf.push_str(&String::from_utf8_lossy(&c)),
            Ok(Ok(None)) => return out,
            Ok(Err(e)) => panic!("stream failed: {e}"),
            Err(_) => panic!("no event within 120 s; got {out:?}"),
        }
    }
}

async fn events(
    api: &Api,
    run: &str,
    query: &str,
    last_event_id: Option<u64>,
) -> reqwest::Response {
    let mut r = api.req(Method::GET, &format!("/v1/runs/{run}/events{query}"));
    if let Some(n) = last_event_id {
        r = r.header("Last-Event-ID", n.to_string());
    }
    let resp = r.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    resp
}

/// Follows the run to its end and returns every event.
async fn follow_all(api: &Api, run: &str) -> Vec<Sse> {
    read_sse(events(api, run, "", None).await, None).await
}

/// Follows the run until an event of type `kind` and returns the events so far.
async fn until(api: &Api, run: &str, kind: &str) -> Vec<Sse> {
    until_with(api, run, kind, "").await
}

/// Follows the run until an event of type `kind` whose JSON contains `needle`.
async fn until_with(api: &Api, run: &str, kind: &str, needle: &str) -> Vec<Sse> {
    let resp = events(api, run, "", None).await;
    let mut resp = resp;
    let mut got = Vec::new();
    let mut buf = String::new();
    loop {
        let c = tokio::time::timeout(Duration::from_secs(120), resp.chunk())
            .await
            .expect("an event in time")
            .unwrap()
            .unwrap_or_else(|| panic!("the stream ended before {kind}: {got:?}"));
        buf.push_str(&String::from_utf8_lossy(&c));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            if let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) {
                let v: Value = serde_json::from_str(data).unwrap();
                let t = v["type"].as_str().unwrap().to_string();
                got.push(v);
                if t == kind && data.contains(needle) {
                    return got
                        .into_iter()
                        .map(|d| Sse {
                            id: d["seq"].as_u64().unwrap(),
                            event: d["type"].as_str().unwrap().into(),
                            data: d,
                        })
                        .collect();
                }
            }
        }
    }
}

async fn start_run(api: &Api, body: Value) -> Value {
    let (s, v) = api.json(Method::POST, "/v1/runs", Some(body)).await;
    assert_eq!(s, 201, "start run: {v}");
    v
}

async fn get_run(api: &Api, run: &str) -> Value {
    let (s, v) = api
        .json(Method::GET, &format!("/v1/runs/{run}"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    v
}

fn kinds(evs: &[Sse]) -> Vec<String> {
    evs.iter().map(|e| e.event.clone()).collect()
}

fn assert_numbered(evs: &[Sse], from: u64) {
    let ids: Vec<u64> = evs.iter().map(|e| e.id).collect();
    let want: Vec<u64> = (from..from + evs.len() as u64).collect();
    assert_eq!(ids, want, "ids are consecutive from {from}");
    for e in evs {
        assert_eq!(e.data["seq"].as_u64(), Some(e.id));
        assert_eq!(e.data["type"].as_str(), Some(e.event.as_str()));
    }
}

const PLOT: &str =
    "import matplotlib.pyplot as plt\nplt.plot([0, 1, 2], [2, 0, 1], linewidth=4)\nplt.show()";

#[tokio::test(flavor = "multi_thread")]
async fn a_run_streams_resumes_serves_images_continues_and_is_private() {
    let llm = FakeLlm::start(vec![
        Reply::tool("bash", json!({"command": "echo one > /workspace/a.txt"})),
        Reply::tool("python", json!({"code": PLOT})),
        Reply::tool("bash", json!({"command": "cat /workspace/a.txt"})),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "first done"}),
        ),
        // The continued run.
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "second done"}),
        ),
    ])
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let alice = env.add_user("alice", &[]);
    let bob = env.add_user("bob", &[]);
    let root = env.add_user("root", &["--admin"]);
    let serve = env.start();
    let a = Api::new(&serve, &alice);
    let b = Api::new(&serve, &bob);
    let admin = Api::new(&serve, &root);

    let run = start_run(
        &a,
        json!({"task": "FIRST-TASK-MARKER: write and plot", "session": {}}),
    )
    .await;
    let id = run["id"].as_str().unwrap().to_string();
    let session = run["session_id"].as_str().unwrap().to_string();
    assert_eq!(run["mode"], "agent");
    assert!(
        ["queued", "running"].contains(&run["state"].as_str().unwrap()),
        "{run}"
    );

    // Two followers from the start, and one that leaves after 3 events and resumes.
    let (f1, f2, partial) = tokio::join!(follow_all(&a, &id), follow_all(&a, &id), async {
        read_sse(events(&a, &id, "", None).await, Some(3)).await
    });
    assert_numbered(&f1, 1);
    assert_eq!(f1, f2, "two followers see the same sequence");
    assert_eq!(partial, f1[..3].to_vec());
    let resumed = read_sse(events(&a, &id, "", Some(3)).await, None).await;
    assert_eq!(
        resumed,
        f1[3..].to_vec(),
        "Last-Event-ID 3 gives 4..n exactly once"
    );
    let k = kinds(&f1);
    assert_eq!(k[0], "run_state");
    assert_eq!(f1[0].data["state"], "queued");
    assert_eq!(f1[1].data["state"], "running");
    assert!(k.contains(&"run_started".to_string()));
    let finished = k.iter().position(|t| t == "run_finished").unwrap();
    assert_eq!(finished, k.len() - 2, "{k:?}");
    assert_eq!(f1.last().unwrap().data["state"], "succeeded");

    let n = f1.len() as u64;
    let after = read_sse(events(&a, &id, "?after=5&follow=false", None).await, None).await;
    assert_eq!(after, f1[5..].to_vec());
    let all = read_sse(events(&a, &id, "?follow=false", None).await, None).await;
    assert_eq!(all, f1);

    let got = get_run(&a, &id).await;
    assert_eq!(got["state"], "succeeded", "{got}");
    assert_eq!(got["answer"], "first done");
    assert_eq!(got["outcome"]["kind"], "terminated");
    assert_eq!(got["last_seq"].as_u64(), Some(n));
    assert_eq!(got["steps"].as_u64(), Some(4));
    assert!(got["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(got["ended_at"].is_string() && got["started_at"].is_string());

    // The plot's image, by the id in its tool_result event.
    let img = f1
        .iter()
        .find_map(|e| e.data["image"]["id"].as_str().map(String::from))
        .expect("the python tool_result references an image");
    let r = a
        .req(Method::GET, &format!("/v1/runs/{id}/images/{img}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["content-type"], "image/png");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert!(
        r.headers()["cache-control"]
            .to_str()
            .unwrap()
            .contains("immutable")
    );
    let bytes = r.bytes().await.unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let fake = format!("sha256:{}", "0".repeat(64));
    let (s, _) = a
        .json(Method::GET, &format!("/v1/runs/{id}/images/{fake}"), None)
        .await;
    assert_eq!(s, 404);

    // A second run in the same session continues its conversation.
    let second = start_run(&a, json!({"task": "second task", "session_id": session})).await;
    let second_id = second["id"].as_str().unwrap().to_string();
    let evs = follow_all(&a, &second_id).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded");
    let last_req = llm.requests().last().unwrap().to_string();
    assert!(
        last_req.contains("FIRST-TASK-MARKER") && last_req.contains("second task"),
        "the continued run's request carries the earlier conversation"
    );
    let started = evs.iter().find(|e| e.event == "run_started").unwrap();
    assert!(started.data["continued_messages"].as_u64().unwrap() > 0);

    // Another user: 404 on every route that takes the run's id; lists are one's own.
    for (m, path, body) in [
        (Method::GET, format!("/v1/runs/{id}"), None),
        (
            Method::GET,
            format!("/v1/runs/{id}/events?follow=false"),
            None,
        ),
        (Method::GET, format!("/v1/runs/{id}/images/{img}"), None),
        (Method::POST, format!("/v1/runs/{id}/cancel"), None),
        (
            Method::POST,
            format!("/v1/runs/{id}/answer"),
            Some(json!({"answer": "x"})),
        ),
    ] {
        let (s, v) = b.json(m, &path, body).await;
        assert_eq!((s, code(&v)), (404, "not_found"), "{path}: {v}");
    }
    let (s, v) = b
        .json(
            Method::POST,
            "/v1/runs",
            Some(json!({"task": "x", "session_id": session})),
        )
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    let (_, v) = b.json(Method::GET, "/v1/runs", None).await;
    assert_eq!(v["runs"].as_array().unwrap().len(), 0);
    let (_, v) = a.json(Method::GET, "/v1/runs?limit=1", None).await;
    assert_eq!(v["runs"][0]["id"], second_id.as_str(), "newest first");
    let cursor = v["next_cursor"].as_str().unwrap().to_string();
    let (_, v) = a
        .json(
            Method::GET,
            &format!("/v1/runs?limit=1&cursor={cursor}"),
            None,
        )
        .await;
    assert_eq!(v["runs"][0]["id"], id.as_str());
    assert!(v["next_cursor"].is_null());
    let (_, v) = admin.json(Method::GET, "/v1/runs", None).await;
    assert_eq!(
        v["runs"].as_array().unwrap().len(),
        2,
        "admin sees alice's runs"
    );
    let (s, _) = admin
        .json(
            Method::GET,
            &format!("/v1/runs/{id}/events?follow=false"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    // Answering a run that asks nothing is a 409.
    let (s, v) = a
        .json(
            Method::POST,
            &format!("/v1/runs/{id}/answer"),
            Some(json!({"answer": "x"})),
        )
        .await;
    assert_eq!((s, code(&v)), (409, "not_waiting"), "{v}");
    // Bad input names the field.
    let (s, v) = a
        .json(Method::POST, "/v1/runs", Some(json!({"task": "  "})))
        .await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("task"),
        "{v}"
    );
    drop(serve);
}

fn sleeps_in(api_container: &str) -> usize {
    let out = std::process::Command::new("docker")
        .args([
            "exec",
            api_container,
            "sh",
            "-c",
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("sleep 100"))
        .count()
}

async fn container_of(env: &Env, session: &str) -> String {
    let store = sandboxd::store::SqliteStore::open(&env.db()).await.unwrap();
    use sandboxd::store::Store;
    store
        .session(session)
        .await
        .unwrap()
        .unwrap()
        .container_id
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_kills_the_command_in_flight_and_the_run_quota_holds() {
    let llm = FakeLlm::start_with_fallback(
        vec![Reply::tool("bash", json!({"command": "sleep 100"}))],
        Reply::tool("terminate", json!({"status": "success", "answer": "late"})),
    )
    .await;
    let env = Env::new(&format!("{}{SERVER}[quotas]\nruns = 1\n", llm_config(&llm))).await;
    let key = env.add_user("cat", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(&api, json!({"task": "wait a long time", "session": {}})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let session = run["session_id"].as_str().unwrap().to_string();
    until(&api, &id, "tool_call").await;
    let container = container_of(&env, &session).await;
    let t = Instant::now();
    while sleeps_in(&container) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the sleep never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The concurrent-runs quota (1) is taken by this run.
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/runs",
            Some(json!({"task": "another", "session_id": session})),
        )
        .await;
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    assert_eq!(v["error"]["quota"], "runs");
    assert_eq!(v["error"]["limit"], "1");

    let t = Instant::now();
    let (s, v) = api
        .json(Method::POST, &format!("/v1/runs/{id}/cancel"), None)
        .await;
    let took = t.elapsed();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "cancelled", "{v}");
    assert_eq!(v["outcome"]["kind"], "cancelled");
    assert!(took < Duration::from_secs(2), "cancel took {took:?}");
    assert_eq!(
        sleeps_in(&container),
        0,
        "the sleep is gone from the container"
    );
    let evs = read_sse(events(&api, &id, "?follow=false", None).await, None).await;
    let k = kinds(&evs);
    assert_eq!(&k[k.len() - 2..], ["run_finished", "run_state"]);
    assert_eq!(evs.last().unwrap().data["state"], "cancelled");
    // Cancelling again returns the ended run as it is.
    let (s, v) = api
        .json(Method::POST, &format!("/v1/runs/{id}/cancel"), None)
        .await;
    assert_eq!((s, v["state"].as_str()), (200, Some("cancelled")));
    // The quota is free again.
    let again = start_run(&api, json!({"task": "now", "session_id": session})).await;
    let evs = follow_all(&api, again["id"].as_str().unwrap()).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded");
}

/// Opens the gate file a run's command waits for (as the sandbox user, beside the shell the
/// run holds busy).
fn open_gate(container: &str, gate: &str) {
    let st = std::process::Command::new("docker")
        .args(["exec", container, "touch", gate])
        .status()
        .unwrap();
    assert!(st.success(), "docker exec touch {gate}: {st}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_queued_run_ends_it_unstarted_and_spares_the_running_one() {
    let gate = "/workspace/gate";
    let llm = FakeLlm::start_with_fallback(
        vec![
            Reply::tool(
                "bash",
                json!({"command": format!("until [ -e {gate} ]; do sleep 0.1; done; echo GATE-OPEN")}),
            ),
            Reply::tool(
                "terminate",
                json!({"status": "success", "answer": "first done"}),
            ),
            Reply::tool(
                "terminate",
                json!({"status": "success", "answer": "third done"}),
            ),
        ],
        // What a run that should never have asked would be given.
        Reply::tool("terminate", json!({"status": "success", "answer": "extra"})),
    )
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let key = env.add_user("hal", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let first = start_run(
        &api,
        json!({"task": "FIRST: wait for the gate", "session": {}}),
    )
    .await;
    let first_id = first["id"].as_str().unwrap().to_string();
    let session = first["session_id"].as_str().unwrap().to_string();
    until_with(&api, &first_id, "tool_call", "GATE-OPEN").await;

    // The second run of the session waits for the first, which waits for the gate.
    let queued = start_run(
        &api,
        json!({"task": "QUEUED-TASK-MARKER", "session_id": session}),
    )
    .await;
    let id = queued["id"].as_str().unwrap().to_string();
    assert_eq!(queued["state"], "queued", "{queued}");
    // A follower connected while it is queued has its queued state live.
    let mut open = events(&api, &id, "", None).await;
    let mut buf = String::new();
    let mut live = read_sse_on(&mut open, &mut buf, Some(1)).await;
    assert_eq!(live[0].data["state"], "queued", "{live:?}");

    let (s, v) = api
        .json(Method::POST, &format!("/v1/runs/{id}/cancel"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "cancelled", "{v}");
    assert_eq!(v["outcome"]["kind"], "cancelled", "{v}");
    assert!(v["started_at"].is_null(), "it never started: {v}");
    assert!(v["ended_at"].is_string(), "{v}");
    assert_eq!(v["steps"], 0);
    // The cancel did not wait for the session's lock: the first run is still at the gate.
    assert_eq!(get_run(&api, &first_id).await["state"], "running");

    live.extend(read_sse_on(&mut open, &mut buf, None).await);
    assert_numbered(&live, 1);
    assert_eq!(
        kinds(&live),
        ["run_state", "run_finished", "run_state"],
        "no step events: {live:?}"
    );
    assert_eq!(live[1].data["reason"]["kind"], "cancelled");
    assert_eq!(live[2].data["state"], "cancelled");
    let replay = read_sse(events(&api, &id, "?follow=false", None).await, None).await;
    assert_eq!(replay, live, "the stream after the fact is the same");
    let store = sandboxd::store::SqliteStore::open(&env.db()).await.unwrap();
    use sandboxd::store::Store;
    let stored = store.events_after(&id, 0, 100).await.unwrap();
    let stored: Vec<(u64, String, Value)> = stored
        .iter()
        .map(|e| {
            (
                e.seq,
                e.kind.clone(),
                serde_json::from_str(&e.payload).unwrap(),
            )
        })
        .collect();
    let streamed: Vec<(u64, String, Value)> = live
        .iter()
        .map(|e| (e.id, e.event.clone(), e.data.clone()))
        .collect();
    assert_eq!(stored, streamed, "the store holds what was streamed");
    let row = store.run(&id).await.unwrap().unwrap();
    assert_eq!(row.state, sandboxd::store::RunState::Cancelled);
    assert_eq!((row.started_at, row.last_seq), (None, 3));

    // The first run goes on as if nothing happened, and the session takes a next run.
    let container = container_of(&env, &session).await;
    open_gate(&container, gate);
    let evs = follow_all(&api, &first_id).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded", "{evs:?}");
    assert!(
        evs.iter()
            .any(|e| e.event == "tool_result" && e.data.to_string().contains("GATE-OPEN")),
        "{evs:?}"
    );
    assert_eq!(get_run(&api, &first_id).await["answer"], "first done");
    let third = start_run(&api, json!({"task": "THIRD", "session_id": session})).await;
    let evs = follow_all(&api, third["id"].as_str().unwrap()).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded", "{evs:?}");
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3, "two for the first run, one for the third");
    assert!(
        reqs.iter()
            .all(|r| !r.to_string().contains("QUEUED-TASK-MARKER")),
        "the cancelled run never reached the model, nor the conversation"
    );
    assert!(reqs[2].to_string().contains("FIRST: wait for the gate"));
    assert_eq!(get_run(&api, &id).await["state"], "cancelled");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_admin_filters_runs_by_user_and_a_user_sees_only_their_own() {
    let llm = FakeLlm::start_with_fallback(
        vec![],
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    )
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let alice = env.add_user("ann", &[]);
    let bob = env.add_user("ben", &[]);
    let root = env.add_user("boss", &["--admin"]);
    let serve = env.start();
    let a = Api::new(&serve, &alice);
    let b = Api::new(&serve, &bob);
    let admin = Api::new(&serve, &root);
    let mut runs = Vec::new();
    for (api, task) in [(&a, "ann's first"), (&b, "ben's"), (&a, "ann's second")] {
        let run = start_run(api, json!({"task": task, "session": {}})).await;
        let id = run["id"].as_str().unwrap().to_string();
        follow_all(api, &id).await;
        runs.push(id);
    }
    let (ann_runs, ben_runs) = (
        vec![runs[2].clone(), runs[0].clone()],
        vec![runs[1].clone()],
    );
    // The ids the web UI's filter offers: GET /v1/users.
    let (s, users) = admin.json(Method::GET, "/v1/users", None).await;
    assert_eq!(s, 200, "{users}");
    let id_of = |name: &str| {
        users
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {users}"))["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (ann, ben) = (id_of("ann"), id_of("ben"));
    let ids = |v: &Value| -> Vec<String> {
        v["runs"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect()
    };
    let list = |api: &Api, q: String| {
        let api = api.clone();
        async move {
            let (s, v) = api.json(Method::GET, &format!("/v1/runs{q}"), None).await;
            assert_eq!(s, 200, "{q}: {v}");
            v
        }
    };

    // The admin: everyone's by default (also with an empty filter, the UI's "everyone"),
    // one user's with the filter, newest first, paged within it.
    let mut all = runs.clone();
    all.reverse();
    assert_eq!(ids(&list(&admin, String::new()).await), all);
    assert_eq!(ids(&list(&admin, "?owner=".into()).await), all);
    assert_eq!(ids(&list(&admin, format!("?owner={ann}")).await), ann_runs);
    assert_eq!(ids(&list(&admin, format!("?owner={ben}")).await), ben_runs);
    let page = list(&admin, format!("?owner={ann}&limit=1")).await;
    assert_eq!(ids(&page), ann_runs[..1]);
    let cursor = page["next_cursor"].as_str().unwrap().to_string();
    let page = list(&admin, format!("?owner={ann}&limit=1&cursor={cursor}")).await;
    assert_eq!(ids(&page), ann_runs[1..]);
    assert!(page["next_cursor"].is_null(), "{page}");
    let v = list(&admin, format!("?owner={ann}&state=succeeded")).await;
    assert_eq!(ids(&v), ann_runs);
    assert!(ids(&list(&admin, "?owner=usr_nobody".into()).await).is_empty());

    // A user: their own, with or without their own id; another user's id lists nothing,
    // the same as an id nobody has.
    assert_eq!(ids(&list(&a, String::new()).await), ann_runs);
    assert_eq!(ids(&list(&a, format!("?owner={ann}")).await), ann_runs);
    for q in [format!("?owner={ben}"), "?owner=usr_nobody".into()] {
        let v = list(&a, q.clone()).await;
        assert!(ids(&v).is_empty(), "{q}: {v}");
        assert!(v["next_cursor"].is_null(), "{q}: {v}");
    }
    let v = list(&b, format!("?owner={ann}&limit=1")).await;
    assert!(ids(&v).is_empty(), "{v}");
    let (s, v) = b
        .json(Method::GET, &format!("/v1/runs/{}", runs[0]), None)
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    // Nor can a user list the users to learn their ids.
    let (s, v) = a.json(Method::GET, "/v1/users", None).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ask_human_is_answered_through_the_api_or_times_out() {
    let llm = FakeLlm::start(vec![
        Reply::tool("ask_human", json!({"inquire": "Which colour?"})),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "painted"}),
        ),
        Reply::tool("ask_human", json!({"inquire": "Anyone there?"})),
        Reply::tool("terminate", json!({"status": "success", "answer": "alone"})),
    ])
    .await;
    let server = SERVER.replace("[server]\n", "[server]\nquestion_timeout_secs = 2\n");
    let env = Env::new(&format!("{}{server}", llm_config(&llm))).await;
    let key = env.add_user("dee", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(&api, json!({"task": "paint it", "session": {}})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let session = run["session_id"].as_str().unwrap().to_string();
    let evs = until(&api, &id, "run_state").await;
    assert_eq!(evs.len(), 1);
    let asked = until(&api, &id, "question_asked").await;
    assert_eq!(asked.last().unwrap().data["question"], "Which colour?");
    // The run is visibly waiting.
    let t = Instant::now();
    let v = loop {
        let v = get_run(&api, &id).await;
        if v["state"] == "waiting_for_human" {
            break v;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(v["question"]["text"], "Which colour?");
    assert!(v["question"]["expires_at"].is_string());
    // A second run of the same session waits, queued, for this one to end.
    let queued = start_run(&api, json!({"task": "ask again", "session_id": session})).await;
    let queued_id = queued["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get_run(&api, &queued_id).await["state"], "queued");
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/runs/{id}/answer"),
            Some(json!({"answer": "BLUE-ANSWER"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(v["question"].is_null(), "{v}");
    let evs = follow_all(&api, &id).await;
    assert_eq!(evs.last().unwrap().data["state"], "succeeded");
    let answered = evs.iter().find(|e| e.event == "question_answered").unwrap();
    assert_eq!(answered.data["by"], "user");
    let k = kinds(&evs);
    let qa = k.iter().position(|t| t == "question_asked").unwrap();
    assert_eq!(evs[qa + 1].data["state"], "waiting_for_human");
    assert_eq!(k[qa + 2], "question_answered");
    assert_eq!(evs[qa + 3].data["state"], "running");
    assert!(
        llm.requests()[1].to_string().contains("BLUE-ANSWER"),
        "the answer reached the model"
    );

    // Unanswered: the question expires and the run goes on without an answer. It started
    // only after the first run ended.
    let first_ended = get_run(&api, &id).await["ended_at"]
        .as_str()
        .unwrap()
        .to_string();
    let id = queued_id;
    let evs = follow_all(&api, &id).await;
    let running = evs
        .iter()
        .find(|e| e.event == "run_state" && e.data["state"] == "running")
        .unwrap();
    let t = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap();
    assert!(t(running.data["at"].as_str().unwrap()) >= t(&first_ended));
    assert_eq!(evs[0].data["state"], "queued");
    let answered = evs.iter().find(|e| e.event == "question_answered").unwrap();
    assert_eq!(answered.data["by"], "timeout");
    assert_eq!(evs.last().unwrap().data["state"], "succeeded");
    let v = get_run(&api, &id).await;
    assert!(v["question"].is_null());
    assert_eq!(v["answer"], "alone");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daily_token_quota_stops_a_run_and_refuses_the_next() {
    let llm = FakeLlm::start_with_fallback(
        vec![],
        Reply::tool("bash", json!({"command": "echo again"})),
    )
    .await;
    let env = Env::new(&format!(
        "{}{SERVER}[quotas]\ninput_tokens_per_day = 50\n",
        llm_config(&llm)
    ))
    .await;
    let key = env.add_user("eve", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(
        &api,
        json!({"task": "loop forever", "session": {}, "max_steps": 50}),
    )
    .await;
    let id = run["id"].as_str().unwrap().to_string();
    let evs = follow_all(&api, &id).await;
    let v = get_run(&api, &id).await;
    assert_eq!(v["state"], "failed", "{v}");
    assert_eq!(v["outcome"]["kind"], "quota_exceeded", "{v}");
    assert_eq!(v["outcome"]["quota"], "input_tokens_per_day");
    assert!(v["steps"].as_u64().unwrap() < 50);
    let fin = evs.iter().find(|e| e.event == "run_finished").unwrap();
    assert_eq!(fin.data["reason"]["kind"], "quota_exceeded");
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/runs",
            Some(json!({"task": "more", "session": {}})),
        )
        .await;
    assert_eq!((s, code(&v)), (429, "quota_exceeded"), "{v}");
    assert_eq!(v["error"]["quota"], "input_tokens_per_day");
    assert_eq!(v["error"]["limit"], "50");
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_mode_streams_the_flow_in_the_runs_sequence() {
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "planning",
            json!({"command": "create", "title": "Data", "steps": ["Write the data"]}),
        ),
        Reply::tool("bash", json!({"command": "seq 3 > /workspace/data.txt"})),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "data.txt has 1..3"}),
        ),
        Reply::text("The data is in data.txt."),
    ])
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let key = env.add_user("fay", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(
        &api,
        json!({"task": "make data", "mode": "plan", "session": {}}),
    )
    .await;
    assert_eq!(run["mode"], "plan");
    let id = run["id"].as_str().unwrap().to_string();
    let evs = follow_all(&api, &id).await;
    assert_numbered(&evs, 1);
    let k = kinds(&evs);
    let pos = |t: &str| {
        k.iter()
            .position(|x| x == t)
            .unwrap_or_else(|| panic!("{t} in {k:?}"))
    };
    assert!(pos("plan_created") < pos("step_started"));
    assert!(pos("step_started") < pos("step_finished"));
    assert!(pos("step_finished") < pos("flow_finished"));
    assert!(evs.iter().all(|e| e.data["run_id"] == id.as_str()));
    let v = get_run(&api, &id).await;
    assert_eq!(v["state"], "succeeded", "{v}");
    assert!(v["answer"].as_str().unwrap().contains("data.txt"));
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_and_sigterm_leave_runs_interrupted_with_their_events() {
    let llm = FakeLlm::start_with_fallback(
        vec![Reply::tool(
            "bash",
            json!({"command": "echo before the crash > /workspace/f.txt"}),
        )],
        Reply::tool("bash", json!({"command": "sleep 100"})),
    )
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let key = env.add_user("gus", &[]);
    let mut serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(&api, json!({"task": "write then wait", "session": {}})).await;
    let id = run["id"].as_str().unwrap().to_string();
    let session = run["session_id"].as_str().unwrap().to_string();
    let before = until(&api, &id, "tool_result").await;
    until_with(&api, &id, "tool_call", "sleep 100").await;
    let seen = read_sse(events(&api, &id, "?follow=false", None).await, None).await;
    let first_pid = serve.pid();
    serve.kill9();

    let mut serve: Serve = env.start();
    let api = Api::new(&serve, &key);
    let v = get_run(&api, &id).await;
    assert_eq!(v["state"], "interrupted", "{v}");
    assert_eq!(v["outcome"]["kind"], "interrupted");
    let evs = read_sse(events(&api, &id, "", None).await, None).await;
    assert_eq!(
        evs[..seen.len()].to_vec(),
        seen,
        "the events before the crash are kept"
    );
    assert_numbered(&evs, 1);
    let k = kinds(&evs);
    assert_eq!(&k[k.len() - 2..], ["run_finished", "run_state"]);
    assert_eq!(evs[evs.len() - 2].data["reason"]["kind"], "interrupted");
    assert!(before.iter().any(|e| e.event == "tool_result"));
    let r = api
        .req(
            Method::GET,
            &format!("/v1/sessions/{session}/files/content?path=f.txt"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "the session was re-attached");
    assert_eq!(r.text().await.unwrap(), "before the crash\n");
    // No orphan: of what the killed serve made for this user or in its warm pool (the session
    // may have come from it), only the session's container is left.
    let user = env.user_ids()[0].clone();
    let owners = [format!("serve:{user}"), env.pool_owner()];
    let rt = env.runtime_id(&session).await;
    serve::wait_for_leftovers(&owners, first_pid, &[rt]).await;

    // SIGTERM with a run in a sleep and a follower connected: the run ends interrupted and
    // the open stream does not hold the exit.
    let run = start_run(&api, json!({"task": "wait again", "session_id": session})).await;
    let id2 = run["id"].as_str().unwrap().to_string();
    until_with(&api, &id2, "tool_call", "sleep 100").await;
    let open = events(&api, &id2, "", None).await;
    let took = serve.sigterm(Duration::from_secs(15));
    assert!(took < Duration::from_secs(8), "shutdown took {took:?}");
    drop(open);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let v = get_run(&api, &id2).await;
    assert_eq!(v["state"], "interrupted", "{v}");
    let evs = read_sse(events(&api, &id2, "?follow=false", None).await, None).await;
    assert_numbered(&evs, 1);
    assert_eq!(evs.last().unwrap().data["state"], "interrupted");
    assert_eq!(
        evs.iter().filter(|e| e.event == "run_finished").count(),
        1,
        "one ending, written by the stopping serve: {:?}",
        kinds(&evs)
    );
}
