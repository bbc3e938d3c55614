//! The runs API of `sandboxd serve` as a real process on loopback, with the real engine and
//! image and a fake LLM at the HTTP boundary: SSE that resumes exactly once and in order,
//! two followers, `?after`, `?follow=false`, images, a continued conversation, other users'
//! 404s, and plan mode's flow in the run's sequence. Cancelling runs is in
//! serve_runs_cancel.rs, users and quotas in serve_runs_users.rs, ask_human and interrupted
//! runs in serve_runs_lifecycle.rs; the shared SSE helpers in tests/serve/runs.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use reqwest::Method;
use serde_json::json;

use serve::runs::{
    SERVER, assert_numbered, events, follow_all, get_run, kinds, llm_config, read_sse, start_run,
};
use serve::{Api, Env, code};
use support::fake_llm::{FakeLlm, Reply};

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
