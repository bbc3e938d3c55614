//! Revocation revokes (issue 20, point 5) and a user's open streams are capped (point 4),
//! against a real `sandboxd serve` with a fake LLM: a run that asks a question waits for the
//! answer, so its event stream stays open while the test rotates the key (over the API, or
//! with `sandboxd users rotate` from another process, which serve sees only through its
//! periodic re-check), removes the user or signs out. Each stream then ends with a last
//! `credential_revoked` error; a removed user's run ends `cancelled`.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use serve::runs::{SERVER, get_run, llm_config, start_run, until};
use serve::{Api, Env, Serve, code};
use support::fake_llm::{FakeLlm, Reply};

/// The bound on "promptly": far above what a revocation takes, so a loaded machine passes.
const ENDS_WITHIN: Duration = Duration::from_secs(30);

/// A fake LLM whose runs ask a question, then finish once answered.
async fn asking_llm() -> FakeLlm {
    FakeLlm::start_with_fallback(
        vec![],
        Reply::tool("ask_human", json!({"inquire": "which colour?"})),
    )
    .await
}

/// Starts a run that waits for an answer; returns its id once it is waiting.
async fn waiting_run(api: &Api) -> String {
    let run = start_run(api, json!({"task": "ask me", "session": {}})).await;
    let id = run["id"].as_str().unwrap().to_string();
    until(api, &id, "question_asked").await;
    id
}

/// GET the run's events with `auth` applied (a key or a cookie), once it delivered the
/// question: the stream is open and delivering.
async fn open_events(
    serve: &Serve,
    run: &str,
    auth: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
) -> (reqwest::Response, String) {
    let r = auth(reqwest::Client::new().get(serve.url(&format!("/v1/runs/{run}/events"))));
    let mut resp = r.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut text = String::new();
    read_until(&mut resp, &mut text, "event: question_asked").await;
    (resp, text)
}

/// Reads until `needle` arrived (bounded).
async fn read_until(resp: &mut reqwest::Response, text: &mut String, needle: &str) {
    let deadline = Instant::now() + ENDS_WITHIN;
    while !text.contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, resp.chunk()).await {
            Ok(Ok(Some(c))) => text.push_str(&String::from_utf8_lossy(&c)),
            Ok(Ok(None)) => panic!("the stream ended before {needle:?}: {text}"),
            Ok(Err(e)) => panic!("the stream failed before {needle:?}: {e}; {text}"),
            Err(_) => panic!("no {needle:?} within {ENDS_WITHIN:?}: {text}"),
        }
    }
}

/// Reads the stream to its end, which must come within `ENDS_WITHIN`; returns what came.
async fn read_to_end(mut resp: reqwest::Response, mut text: String) -> String {
    let deadline = Instant::now() + ENDS_WITHIN;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, resp.chunk()).await {
            Ok(Ok(Some(c))) => text.push_str(&String::from_utf8_lossy(&c)),
            Ok(Ok(None)) | Ok(Err(_)) => return text,
            Err(_) => panic!("the stream was still open {ENDS_WITHIN:?} after revocation: {text}"),
        }
    }
}

/// The stream ended with the `credential_revoked` error event as its last event.
fn assert_revoked(text: &str) {
    let last = text
        .trim_end()
        .rsplit("\n\n")
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        last.contains("event: error") && last.contains("\"credential_revoked\""),
        "the last event says the credential was revoked: {text}"
    );
}

/// A streamed exec that printed its first line and is still running.
async fn exec_stream(api: &Api, session: &str, command: &str) -> (reqwest::Response, String) {
    let mut resp = api
        .req(Method::POST, &format!("/v1/sessions/{session}/exec/stream"))
        .json(&json!({"command": command, "timeout": 600}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut text = String::new();
    read_until(&mut resp, &mut text, "started").await;
    (resp, text)
}

/// How many `sleep 600` run in the session (through the API, with a valid key).
async fn sleeps(api: &Api, session: &str) -> u64 {
    let v = api
        .exec(
            session,
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 60[0]' || true",
        )
        .await;
    v["stdout"].as_str().unwrap().trim().parse().unwrap()
}

fn env_config(llm: &FakeLlm) -> String {
    format!("{}{SERVER}", llm_config(llm))
}

#[tokio::test(flavor = "multi_thread")]
async fn rotating_a_key_over_the_api_ends_its_event_and_exec_streams() {
    let llm = asking_llm().await;
    let env = Env::new(&env_config(&llm)).await;
    let admin = env.add_user("root", &["--admin"]);
    let key = env.add_user("ann", &[]);
    let serve = env.start();
    let ann = Api::new(&serve, &key);
    let run = waiting_run(&ann).await;
    let (events, seen) = open_events(&serve, &run, |r| r.bearer_auth(&key)).await;
    let session = ann.session().await;
    let (exec, out) = exec_stream(&ann, &session, "echo started; sleep 600").await;

    let (s, v) = Api::new(&serve, &admin)
        .json(Method::POST, "/v1/users/ann/rotate", None)
        .await;
    assert_eq!(s, 200, "{v}");
    let new_key = v["key"].as_str().unwrap().to_string();

    assert_revoked(&read_to_end(events, seen).await);
    assert_revoked(&read_to_end(exec, out).await);
    // The streamed command was killed with its stream; the run itself goes on (a rotation
    // ends what the old key opened, not the user's work).
    let ann = Api::new(&serve, &new_key);
    let deadline = Instant::now() + ENDS_WITHIN;
    while sleeps(&ann, &session).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the streamed sleep was not killed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(get_run(&ann, &run).await["state"], "waiting_for_human");
    // The old key is refused; the new one follows the run again.
    let (s, v) = Api::new(&serve, &key)
        .json(Method::GET, "/v1/me", None)
        .await;
    assert_eq!((s, code(&v)), (401, "unauthorized"), "{v}");
    open_events(&serve, &run, |r| r.bearer_auth(&new_key)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rotating_a_key_ends_a_long_sync_exec_and_tool_call() {
    let env = Env::new("").await;
    let admin = env.add_user("root", &["--admin"]);
    let key = env.add_user("gus", &[]);
    let serve = env.start();
    let gus = Api::new(&serve, &key);
    let exec_session = gus.session().await;
    let tool_session = gus.session().await;
    let exec = {
        let gus = gus.clone();
        let id = exec_session.clone();
        tokio::spawn(async move {
            gus.json(
                Method::POST,
                &format!("/v1/sessions/{id}/exec"),
                Some(json!({"command": "sleep 600", "timeout": 600})),
            )
            .await
        })
    };
    let tool = {
        let gus = gus.clone();
        let id = tool_session.clone();
        tokio::spawn(async move {
            gus.json(
                Method::POST,
                &format!("/v1/sessions/{id}/tools/bash"),
                Some(json!({"command": "sleep 600", "timeout": 600})),
            )
            .await
        })
    };
    // Both commands are running before the key is rotated.
    for id in [&exec_session, &tool_session] {
        let deadline = Instant::now() + ENDS_WITHIN;
        while sleeps_in(&env, id).await == 0 {
            assert!(Instant::now() < deadline, "the sleep never started");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let (s, v) = Api::new(&serve, &admin)
        .json(Method::POST, "/v1/users/gus/rotate", None)
        .await;
    assert_eq!(s, 200, "{v}");
    for call in [exec, tool] {
        let (s, v) = tokio::time::timeout(ENDS_WITHIN, call)
            .await
            .expect("the call still ran after the rotation")
            .unwrap();
        assert_eq!((s, code(&v)), (401, "credential_revoked"), "{v}");
    }
    for id in [&exec_session, &tool_session] {
        let deadline = Instant::now() + ENDS_WITHIN;
        while sleeps_in(&env, id).await > 0 {
            assert!(Instant::now() < deadline, "the sleep was not killed");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// How many `sleep 600` run in the session's container (seen with docker, not the API, whose
/// shell the command holds).
async fn sleeps_in(env: &Env, session: &str) -> usize {
    use sandboxd_core::store::Store as _;
    let store = sandboxd_sqlite::SqliteStore::open(&env.db()).await.unwrap();
    let container = store
        .session(session)
        .await
        .unwrap()
        .unwrap()
        .container_id
        .unwrap();
    let out = std::process::Command::new("docker")
        .args([
            "exec",
            &container,
            "sh",
            "-c",
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("sleep 600"))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn rotating_a_key_from_the_cli_ends_its_streams_through_the_recheck() {
    let llm = asking_llm().await;
    let env = Env::new(&env_config(&llm)).await;
    let key = env.add_user("ben", &[]);
    let serve = env.start();
    let ben = Api::new(&serve, &key);
    let run = waiting_run(&ben).await;
    let (events, seen) = open_events(&serve, &run, |r| r.bearer_auth(&key)).await;

    // Another process changes the store; this serve learns of it only by looking again.
    let out = env.cmd().args(["users", "rotate", "ben"]).output().unwrap();
    assert!(
        out.status.success(),
        "users rotate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_revoked(&read_to_end(events, seen).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_a_user_ends_their_streams_and_cancels_their_runs() {
    let llm = asking_llm().await;
    let env = Env::new(&env_config(&llm)).await;
    let admin = env.add_user("root", &["--admin"]);
    let key = env.add_user("cid", &[]);
    let serve = env.start();
    let cid = Api::new(&serve, &key);
    let run = waiting_run(&cid).await;
    let (events, seen) = open_events(&serve, &run, |r| r.bearer_auth(&key)).await;

    let root = Api::new(&serve, &admin);
    let (s, v) = root.json(Method::DELETE, "/v1/users/cid", None).await;
    assert_eq!(s, 204, "{v}");
    let text = read_to_end(events, seen).await;
    // The run's own ending may come first (it was cancelled at once); the stream ends with
    // the revocation either way, and never delivers after it.
    assert_revoked(&text);
    let row = get_run(&root, &run).await;
    assert_eq!(row["state"], "cancelled", "{row}");
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_a_user_from_the_cli_ends_their_streams_and_cancels_their_runs() {
    let llm = asking_llm().await;
    let env = Env::new(&env_config(&llm)).await;
    let admin = env.add_user("root", &["--admin"]);
    let key = env.add_user("hank", &[]);
    let serve = env.start();
    let hank = Api::new(&serve, &key);
    let run = waiting_run(&hank).await;
    let (events, seen) = open_events(&serve, &run, |r| r.bearer_auth(&key)).await;

    // Another process removes the user: the upkeep finds the session ended in the store and
    // cancels its run before removing the container, and the re-check revokes the stream;
    // whichever comes first ends it.
    let out = env.cmd().args(["users", "rm", "hank"]).output().unwrap();
    assert!(
        out.status.success(),
        "users rm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = read_to_end(events, seen).await;
    let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
    assert!(
        last.contains("\"credential_revoked\"") || last.contains("\"state\":\"cancelled\""),
        "the stream ends revoked or with the cancelled run: {text}"
    );
    let root = Api::new(&serve, &admin);
    let deadline = Instant::now() + ENDS_WITHIN;
    loop {
        let row = get_run(&root, &run).await;
        if row["state"] != "waiting_for_human" {
            assert_eq!(row["state"], "cancelled", "{row}");
            break;
        }
        assert!(Instant::now() < deadline, "the run still waits: {row}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn signing_out_ends_the_cookies_stream_and_not_the_keys() {
    let llm = FakeLlm::start_with_fallback(
        vec![Reply::tool(
            "ask_human",
            json!({"inquire": "which colour?"}),
        )],
        Reply::tool("terminate", json!({"status": "success", "answer": "blue"})),
    )
    .await;
    let env = Env::new(&env_config(&llm)).await;
    let key = env.add_user("dee", &[]);
    let serve = env.start();
    let dee = Api::new(&serve, &key);
    let run = waiting_run(&dee).await;

    // Sign in as a browser would; the runs page carries the CSRF token sign-out needs.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = http
        .post(serve.url("/login"))
        .form(&[("key", key.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let set = r.headers()["set-cookie"].to_str().unwrap();
    let cookie = set.split(';').next().unwrap().trim().to_string();
    let page = http
        .get(serve.url("/runs"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = page
        .split("<meta name=\"csrf-token\" content=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_string();

    let (by_cookie, seen) = open_events(&serve, &run, |r| r.header("cookie", &cookie)).await;
    let (mut by_key, mut key_seen) = open_events(&serve, &run, |r| r.bearer_auth(&key)).await;
    let r = http
        .post(serve.url("/logout"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_revoked(&read_to_end(by_cookie, seen).await);

    // The key's stream was not the sign-in's: it delivers the rest of the run.
    let (s, v) = dee
        .json(
            Method::POST,
            &format!("/v1/runs/{run}/answer"),
            Some(json!({"answer": "blue"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    read_until(&mut by_key, &mut key_seen, "event: question_answered").await;
    let text = read_to_end(by_key, key_seen).await;
    assert!(
        text.contains("\"succeeded\"") && !text.contains("credential_revoked"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_holds_at_most_streams_per_user_streams_and_a_closed_one_frees_its_slot() {
    let llm = asking_llm().await;
    let env = Env::new(&format!(
        "{}[server]\ndrain_secs = 2\nauth_failures_per_minute = 10000\nstreams_per_user = 2\n",
        llm_config(&llm)
    ))
    .await;
    let key_a = env.add_user("eve", &[]);
    let key_b = env.add_user("fay", &[]);
    let serve = env.start();
    let eve = Api::new(&serve, &key_a);
    let fay = Api::new(&serve, &key_b);
    let run = waiting_run(&eve).await;
    let session_a = eve.session().await;
    let session_b = fay.session().await;

    let first = open_when_free(&eve, &run).await;
    let _second = open_when_free(&eve, &run).await;
    // A third stream of any kind is refused, and says what to do.
    let r = eve
        .req(Method::GET, &format!("/v1/runs/{run}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(code(&v), "too_many_streams", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("streams_per_user"),
        "{v}"
    );
    let r = eve
        .req(
            Method::POST,
            &format!("/v1/sessions/{session_a}/exec/stream"),
        )
        .json(&json!({"command": "echo never"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429, "a streamed exec counts too");
    // A finite read of the events is not a held stream.
    let r = eve
        .req(Method::GET, &format!("/v1/runs/{run}/events?follow=false"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Another user is not affected.
    let (b, text) = exec_stream(&fay, &session_b, "echo started").await;
    assert!(read_to_end(b, text).await.contains("event: exit"));

    // Closing one frees its slot.
    drop(first);
    open_when_free(&eve, &run).await;
}

/// Opens the run's event stream, retrying while the caller is at the cap: a stream the
/// client closed (the one `waiting_run` followed, say) frees its slot once serve sees the
/// connection gone, which is soon but not at once (bounded wait).
async fn open_when_free(api: &Api, run: &str) -> reqwest::Response {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = api
            .req(Method::GET, &format!("/v1/runs/{run}/events"))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            return r;
        }
        assert_eq!(r.status(), 429);
        assert!(
            Instant::now() < deadline,
            "a closed stream's slot was never freed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
