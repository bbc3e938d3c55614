//! The daily CPU quota (`cpu_seconds_per_day`) on a real serve (real engine and image, a
//! scripted fake LLM), sampling every second: a user allowed 1 CPU-second whose session burns
//! 1.5 (a busy loop under the CPU limit) is refused, once the sample lands, a new exec,
//! session, tool call, process, run and /mcp call (429 `quota_exceeded` naming the quota,
//! today's figure, the limit and the reset; E2B's code cell too, with `Retry-After`), while
//! reading their files still works and another user is not affected; an admin is held to
//! the session owner's quota (refused in the spent user's session with a clear day of their
//! own, let into another user's once their own day is spent); `sandboxd users quota` lifts it (0 = no limit) and sets it
//! again; and a run whose tool calls burn past the quota stops at its next tool call,
//! ending `failed` with that quota, as the token quota ends one.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::serve_mcp_quota::client::{Cleanup, Mcp, mcp_containers, me, wait_until};
use crate::support;

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use serve::runs::{ended_run, llm_config, start_run};
use serve::{Api, Env, code};
use support::fake_llm::{FakeLlm, Reply};

/// Burns 1.5 s of its own CPU time (not wall time: the limit may slow it), past a quota of 1.
const BURN: &str = "python3 -c 'import time\nwhile time.process_time() < 1.5: pass'";

/// Sampling every second, no warm pool (a claimed warm sandbox's CPU before the claim is
/// nobody's), and an LLM for runs.
async fn env(llm: &FakeLlm) -> Env {
    Env::new(&format!(
        "usage_sample_secs = 1\n[pool]\nsize = 0\n{}",
        llm_config(llm)
    ))
    .await
}

/// Waits until the store's figure of today (`/v1/me`) has reached `secs`.
async fn wait_for_cpu(api: &Api, secs: f64) {
    wait_until(
        "the CPU sample lands",
        Duration::from_secs(30),
        async || {
            me(api).await["usage"]["cpu_seconds_today"]
                .as_f64()
                .is_some_and(|s| s >= secs)
        },
    )
    .await;
}

/// A refusal by the CPU quota: 429 `quota_exceeded`, the quota and limit named, the
/// figure and the reset in the message.
fn assert_cpu_refusal(what: &str, s: u16, v: &Value) {
    assert_eq!((s, code(v)), (429, "quota_exceeded"), "{what}: {v}");
    assert_eq!(v["error"]["quota"], "cpu_seconds_per_day", "{what}: {v}");
    assert_eq!(v["error"]["limit"], "1", "{what}: {v}");
    let m = v["error"]["message"].as_str().unwrap();
    for part in ["cpu_seconds_per_day", "of your 1 CPU-seconds", "00:00 UTC"] {
        assert!(m.contains(part), "{what}: {part:?} in {m}");
    }
}

/// `sandboxd users quota NAME --cpu-seconds-per-day N`, which must succeed.
fn set_cpu_quota(env: &Env, name: &str, n: u64) {
    let out = env
        .cmd()
        .args([
            "users",
            "quota",
            name,
            "--cpu-seconds-per-day",
            &n.to_string(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "users quota: {err}");
    assert!(err.contains(&format!("{n} CPU-seconds/day")), "{err}");
}

async fn exec(api: &Api, id: &str, command: &str) -> (u16, Value) {
    let body = json!({ "command": command });
    let path = format!("/v1/sessions/{id}/exec");
    api.json(Method::POST, &path, Some(body)).await
}

/// Every kind of new work of `api`'s user in session `id`, refused by the CPU quota.
async fn assert_new_work_refused(api: &Api, id: &str) {
    let (s, v) = exec(api, id, "true").await;
    assert_cpu_refusal("exec", s, &v);
    let r = api
        .req(Method::POST, &format!("/v1/sessions/{id}/exec"))
        .json(&json!({"command": "true"}))
        .send()
        .await
        .unwrap();
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=86_400).contains(&retry),
        "seconds to midnight: {retry}"
    );
    let (s, v) = api
        .json(Method::POST, "/v1/sessions", Some(json!({})))
        .await;
    assert_cpu_refusal("session create", s, &v);
    let path = format!("/v1/sessions/{id}/tools/bash");
    let (s, v) = api
        .json(Method::POST, &path, Some(json!({"command": "true"})))
        .await;
    assert_cpu_refusal("tool call", s, &v);
    let path = format!("/v1/sessions/{id}/processes");
    let (s, v) = api
        .json(Method::POST, &path, Some(json!({"command": "true"})))
        .await;
    assert_cpu_refusal("process", s, &v);
    let body = json!({"task": "more", "session_id": id});
    let (s, v) = api.json(Method::POST, "/v1/runs", Some(body)).await;
    assert_cpu_refusal("run", s, &v);
    // E2B's code cell: the same refusal, in E2B's shape, with the same Retry-After.
    let r = api
        .req(Method::POST, "/e2b/sandbox/execute")
        .header("E2b-Sandbox-Id", id)
        .json(&json!({"code": "1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429, "an E2B cell");
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let body: Value = r.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("cpu_seconds_per_day"),
        "{body}"
    );
    let retry: u64 = retry
        .expect("E2B's refusal carries Retry-After")
        .parse()
        .unwrap();
    assert!(
        (1..=86_400).contains(&retry),
        "seconds to midnight: {retry}"
    );
}

/// An admin (quota 1, not yet used) in the spent user's session `spent` is refused, though
/// their own day is clear; once the admin's own day is spent, they can still work in
/// `fresh`, another user's session with CPU to spare.
async fn admin_acts_in_users_sessions(admin: &Api, spent: &str, fresh: &str) {
    assert_eq!(me(admin).await["usage"]["cpu_seconds_today"], 0.0);
    let (s, v) = exec(admin, spent, "true").await;
    assert_cpu_refusal("an admin's exec in a spent user's session", s, &v);
    let path = format!("/v1/sessions/{spent}/tools/bash");
    let (s, v) = admin
        .json(Method::POST, &path, Some(json!({"command": "true"})))
        .await;
    assert_cpu_refusal("an admin's tool call in a spent user's session", s, &v);
    let body = json!({"task": "more", "session_id": spent});
    let (s, v) = admin.json(Method::POST, "/v1/runs", Some(body)).await;
    assert_cpu_refusal("an admin's run in a spent user's session", s, &v);

    let own = admin.session().await;
    assert_eq!(admin.exec(&own, BURN).await["exit_code"], 0);
    wait_for_cpu(admin, 1.0).await;
    let (s, v) = exec(admin, &own, "true").await;
    assert_cpu_refusal("an admin's exec in their own spent session", s, &v);
    let out = admin.exec(fresh, "echo as-admin").await;
    assert_eq!(
        out["stdout"], "as-admin\n",
        "in a user's session with CPU left: {out}"
    );
    let path = format!("/v1/sessions/{fresh}/processes");
    let (s, v) = admin
        .json(Method::POST, &path, Some(json!({"command": "true"})))
        .await;
    assert_eq!(
        s, 201,
        "an admin's process in a user's session with CPU left: {v}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spent_daily_cpu_quota_refuses_new_work_and_the_override_lifts_it() {
    let llm = FakeLlm::start_with_fallback(
        vec![],
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    )
    .await;
    let env = env(&llm).await;
    let key = env.add_user("cpu", &["--cpu-seconds-per-day", "1"]);
    let other_key = env.add_user("other", &[]);
    let admin_key = env.add_user("root", &["--admin", "--cpu-seconds-per-day", "1"]);
    let serve = env.start();
    let (api, other) = (Api::new(&serve, &key), Api::new(&serve, &other_key));
    let admin = Api::new(&serve, &admin_key);
    let mut cleanup = Cleanup(Vec::new());
    assert_eq!(me(&api).await["quota"]["cpu_seconds_per_day"], 1);

    // An /mcp sandbox made while the quota holds, used again once it is spent.
    let mcp = Mcp::open(&serve, &key).await;
    let (err, text) = mcp.call("bash", json!({"command": "echo before"})).await;
    assert!(!err && text.contains("before"), "{text}");
    cleanup.0.extend(mcp_containers(&env, &api).await);

    let id = api.session().await;
    let out = api.exec(&id, BURN).await;
    assert_eq!(
        out["exit_code"], 0,
        "the burn itself starts under the quota: {out}"
    );
    wait_for_cpu(&api, 1.0).await;

    assert_new_work_refused(&api, &id).await;
    let (err, text) = mcp.call("bash", json!({"command": "true"})).await;
    assert!(
        err && text.contains("cpu_seconds_per_day"),
        "an /mcp tool call: {text}"
    );
    let fresh = Mcp::open(&serve, &key).await;
    let (err, text) = fresh.call("bash", json!({"command": "true"})).await;
    assert!(
        err && text.contains("cpu_seconds_per_day"),
        "a new /mcp sandbox: {text}"
    );
    // What costs no CPU stays open: the user can still fetch their results.
    let path = format!("/v1/sessions/{id}/files?path=/workspace");
    let (s, v) = api.json(Method::GET, &path, None).await;
    assert_eq!(s, 200, "listing files: {v}");

    // Another user is not affected.
    let theirs = other.session().await;
    assert_eq!(other.exec(&theirs, "echo fine").await["stdout"], "fine\n");

    // The CPU is the session owner's, whoever asks: an admin is held to their quota in
    // their sessions, and to their own only in their own.
    admin_acts_in_users_sessions(&admin, &id, &theirs).await;

    // 0 is no limit: the override takes effect at the next request.
    set_cpu_quota(&env, "cpu", 0);
    assert_eq!(api.exec(&id, "echo again").await["stdout"], "again\n");
    let second = api.session().await;
    let (err, text) = mcp.call("bash", json!({"command": "echo mcp-again"})).await;
    assert!(!err && text.contains("mcp-again"), "{text}");
    // And set again, it refuses again.
    set_cpu_quota(&env, "cpu", 1);
    let (s, v) = exec(&api, &second, "true").await;
    assert_cpu_refusal("exec after the quota is set again", s, &v);
    cleanup.0.extend(mcp_containers(&env, &api).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_burns_past_the_cpu_quota_stops_at_its_next_tool_call() {
    // Every step burns 1.5 CPU-seconds, forever: only the quota (or max_steps) ends it.
    let llm =
        FakeLlm::start_with_fallback(vec![], Reply::tool("bash", json!({"command": BURN}))).await;
    let env = env(&llm).await;
    let key = env.add_user("cpu", &["--cpu-seconds-per-day", "1"]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let run = start_run(
        &api,
        json!({"task": "burn", "session": {}, "max_steps": 30}),
    )
    .await;
    let id = run["id"].as_str().unwrap().to_string();
    let v = ended_run(&api, &id).await;
    assert_eq!(v["state"], "failed", "{v}");
    assert_eq!(v["outcome"]["kind"], "quota_exceeded", "{v}");
    assert_eq!(v["outcome"]["quota"], "cpu_seconds_per_day", "{v}");
    assert_eq!(v["outcome"]["limit"], 1, "{v}");
    assert!(
        v["steps"].as_u64().unwrap() < 10,
        "stopped within a few tool calls of the sample: {v}"
    );
    // And the next run is refused before it starts.
    let body = json!({"task": "more", "session": {}});
    let (s, v) = api.json(Method::POST, "/v1/runs", Some(body)).await;
    assert_cpu_refusal("the next run", s, &v);
}
