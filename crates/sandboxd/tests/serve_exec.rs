//! The streamed exec (`POST /v1/sessions/{id}/exec/stream`) against a real `serve` process,
//! engine and image: it shares the persistent shell with the sync exec, streams output while
//! the command runs, keeps the sync exec's caps (middle cut reported), replaces invalid UTF-8,
//! kills the command when the client leaves or the timeout hits (the process is gone from the
//! container), and does not hold up shutdown. Also: a session whose container is removed
//! under its calls answers "gone" (409) or 404, never a 5xx.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env, code, containers_of};

/// One SSE event: its type and its JSON data.
#[derive(Debug, Clone)]
struct Sse {
    event: String,
    data: Value,
}

/// Reads an SSE response event by event.
struct Reader {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Reader {
    /// The next event, or None when the stream ended.
    async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(block).expect("SSE is UTF-8");
                let (mut event, mut data) = (String::from("message"), Vec::new());
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim_start().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
                    }
                }
                if data.is_empty() {
                    continue; // a comment (keep-alive)
                }
                let data = serde_json::from_str(&data.join("\n")).expect("data is JSON");
                return Some(Sse { event, data });
            }
            match self.resp.chunk().await {
                Ok(Some(b)) => self.buf.extend_from_slice(&b),
                _ => return None,
            }
        }
    }

    /// Every event up to the end of the stream.
    async fn all(mut self) -> Vec<Sse> {
        let mut v = Vec::new();
        while let Some(e) = self.next().await {
            v.push(e);
        }
        v
    }
}

async fn stream(api: &Api, id: &str, body: Value) -> Reader {
    let resp = api
        .req(Method::POST, &format!("/v1/sessions/{id}/exec/stream"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    Reader {
        resp,
        buf: Vec::new(),
    }
}

/// The concatenated text of one stream's events.
fn text(events: &[Sse], kind: &str) -> String {
    events
        .iter()
        .filter(|e| e.event == kind)
        .map(|e| e.data["text"].as_str().unwrap())
        .collect()
}

fn last_exit(events: &[Sse]) -> &Value {
    let last = events.last().expect("no events");
    assert_eq!(last.event, "exit", "the stream ends with exit: {events:?}");
    &last.data
}

/// `pgrep -f PATTERN` inside the container: whether such a process runs.
fn running_in(container: &str, pattern: &str) -> bool {
    let out = Command::new("docker")
        .args(["exec", container, "pgrep", "-f", pattern])
        .output()
        .unwrap();
    out.status.success()
}

/// Waits (bounded) until no process matching `pattern` is left in the container. Async, so
/// the client's connection tasks keep running on the test's runtime meanwhile.
async fn gone_within(container: &str, pattern: &str, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !running_in(container, pattern) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

fn the_container(env: &Env) -> String {
    let ids = env.user_ids();
    let found: Vec<String> = ids
        .iter()
        .flat_map(|u| containers_of(&format!("serve:{u}")))
        .collect();
    assert_eq!(found.len(), 1, "one session container: {found:?}");
    found[0].clone()
}

#[tokio::test]
async fn streamed_exec_shares_the_shell_and_sends_output_while_the_command_runs() {
    let env = Env::new("").await;
    let key = env.add_user("ann", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;

    // State set by the sync exec is seen by the streamed one, and back.
    api.exec(&id, "cd /tmp && export GREETING=hello").await;
    let events = stream(
        &api,
        &id,
        json!({"command": "pwd; echo $GREETING; echo oops >&2; cd /var; (exit 3)"}),
    )
    .await
    .all()
    .await;
    assert_eq!(text(&events, "stdout"), "/tmp\nhello\n", "{events:?}");
    assert_eq!(text(&events, "stderr"), "oops\n");
    let exit = last_exit(&events);
    assert_eq!(exit["exit_code"], 3, "{exit}");
    assert_eq!(exit["timed_out"], false);
    assert_eq!(api.exec(&id, "pwd").await["stdout"], "/var\n");

    // Live: the command waits for a file the client writes only after it saw the first
    // line. Were the output sent only at the end, the command would hit its timeout.
    let mut r = stream(
        &api,
        &id,
        json!({"command": "echo first; until [ -e /workspace/go ]; do sleep 0.05; done; echo second", "timeout": 60}),
    )
    .await;
    let first = r.next().await.unwrap();
    assert_eq!(
        (first.event.as_str(), &first.data["text"]),
        ("stdout", &json!("first\n")),
        "{first:?}"
    );
    let put = api
        .req(
            Method::PUT,
            &format!("/v1/sessions/{id}/files/content?path=go"),
        )
        .body("x")
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.status());
    let rest = r.all().await;
    assert_eq!(text(&rest, "stdout"), "second\n", "{rest:?}");
    let exit = last_exit(&rest);
    assert_eq!(
        (exit["exit_code"].clone(), exit["timed_out"].clone()),
        (json!(0), json!(false))
    );

    // Errors before the command starts are plain HTTP errors, as for the sync exec.
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/exec/stream"),
            Some(json!({"command": " "})),
        )
        .await;
    assert_eq!((s, code(&v)), (400, "invalid_request"), "{v}");
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions/ses_nope/exec/stream",
            Some(json!({"command": "id"})),
        )
        .await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    let other = env.add_user("ben", &[]);
    let ben = Api::new(&serve, &other);
    let (s, _) = ben
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/exec/stream"),
            Some(json!({"command": "id"})),
        )
        .await;
    assert_eq!(s, 404, "another user's session");
}

#[tokio::test]
async fn streamed_output_keeps_the_sync_caps_reports_the_cut_and_replaces_invalid_utf8() {
    let env = Env::new("[limits]\noutput_cap_kb = 64\n").await;
    let key = env.add_user("ann", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    // 200 000 numbered lines on stdout, then bytes that are not UTF-8; a character split by
    // nothing in particular on stderr.
    let cmd = "seq 1 200000; printf 'bad \\xff\\xfe end\\n'; printf 'caf\\xc3\\xa9\\n' >&2";
    let events = stream(&api, &id, json!({"command": cmd})).await.all().await;
    let exit = last_exit(&events).clone();
    assert_eq!(exit["stdout_truncated"], true, "{exit}");
    assert_eq!(exit["stderr_truncated"], false, "{exit}");
    assert_eq!(text(&events, "stderr"), "café\n");

    let pos = |kind: &str| events.iter().position(|e| e.event == kind);
    let (holding, cut) = (pos("holding").unwrap(), pos("cut").unwrap());
    assert!(holding < cut, "holding comes first: {holding} {cut}");
    assert_eq!(events[cut].data["stream"], "stdout");
    let head: String = text(&events[..cut], "stdout");
    let tail: String = text(&events[cut..], "stdout");
    // Every piece is bounded.
    for e in &events {
        if let Some(t) = e.data["text"].as_str() {
            assert!(t.len() <= 16 * 1024 * 3, "a piece of {} bytes", t.len());
        }
    }
    assert!(
        tail.ends_with("bad \u{fffd}\u{fffd} end\n"),
        "{:?}",
        &tail[tail.len() - 40..]
    );

    // The same command through the sync exec keeps exactly the same bytes.
    let sync = api.exec(&id, cmd).await;
    let sync_out = sync["stdout"].as_str().unwrap();
    let marker = format!(
        "\n[... {} bytes cut by sandboxd ...]\n",
        events[cut].data["bytes"]
    );
    assert_eq!(
        sync_out,
        format!("{head}{marker}{tail}"),
        "the sync exec cuts the same middle"
    );
    assert_eq!(head.len(), 32 * 1024);

    // An OOM kill is named in the exit's note, as the sync exec names it.
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"limits": {"memory_mb": 128}})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let small = v["id"].as_str().unwrap().to_string();
    let events = stream(
        &api,
        &small,
        json!({"command": "python3 -c 'x = bytearray(512 * 1024 * 1024); print(len(x))'"}),
    )
    .await
    .all()
    .await;
    let exit = last_exit(&events);
    assert_eq!(exit["exit_code"], 137, "{events:?}");
    assert!(
        exit["note"]
            .as_str()
            .unwrap_or("")
            .contains("out-of-memory"),
        "{exit}"
    );
}

#[tokio::test]
async fn the_command_is_killed_when_the_client_leaves_or_the_timeout_hits_and_the_shell_survives() {
    let env = Env::new("").await;
    let key = env.add_user("ann", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    api.exec(&id, "cd /tmp && export KEEP=kept").await;
    let container = the_container(&env);

    // The client disconnects after the first event.
    let mut r = stream(
        &api,
        &id,
        json!({"command": "echo started; sleep 4242; echo never"}),
    )
    .await;
    let first = r.next().await.unwrap();
    assert_eq!(first.data["text"], "started\n", "{first:?}");
    assert!(running_in(&container, "sleep 4242"));
    drop(r);
    assert!(
        gone_within(&container, "sleep 4242", Duration::from_secs(20)).await,
        "the command outlived its client"
    );
    // The shell and its state are kept: only the command's processes were killed.
    let out = api.exec(&id, "pwd; echo $KEEP").await;
    assert_eq!(out["stdout"], "/tmp\nkept\n", "{out}");

    // The timeout: the exit says so, and the process is gone when it is sent.
    let events = stream(
        &api,
        &id,
        json!({"command": "echo a; sleep 4343", "timeout": 2}),
    )
    .await
    .all()
    .await;
    let exit = last_exit(&events);
    assert_eq!(
        (exit["timed_out"].clone(), exit["exit_code"].clone()),
        (json!(true), Value::Null),
        "{exit}"
    );
    assert_eq!(text(&events, "stdout"), "a\n");
    assert!(
        !running_in(&container, "sleep 4343"),
        "the timed-out command still runs"
    );
    assert_eq!(api.exec(&id, "echo $KEEP").await["stdout"], "kept\n");

    // A client that leaves while its command still waits for the one before it: it never runs.
    let mut busy = stream(&api, &id, json!({"command": "echo busy; sleep 3"})).await;
    assert_eq!(busy.next().await.unwrap().data["text"], "busy\n");
    let waiting = api
        .req(Method::POST, &format!("/v1/sessions/{id}/exec/stream"))
        .json(&json!({"command": "touch /workspace/should-not-exist"}))
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(waiting.is_err(), "the streamed call waits for the shell");
    let busy = busy.all().await;
    assert_eq!(last_exit(&busy)["exit_code"], 0, "{busy:?}");
    let out = api.exec(&id, "ls /workspace").await;
    assert!(
        !out["stdout"].as_str().unwrap().contains("should-not-exist"),
        "{out}"
    );
}

#[tokio::test]
async fn an_open_stream_does_not_hold_up_shutdown() {
    let env = Env::new("").await;
    let key = env.add_user("ann", &[]);
    let mut serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    let mut r = stream(
        &api,
        &id,
        json!({"command": "echo up; sleep 600", "timeout": 600}),
    )
    .await;
    assert_eq!(r.next().await.unwrap().data["text"], "up\n");
    let reading = tokio::spawn(async move { r.all().await });
    // drain_secs is 2 in the test config; the stream must not keep serve up past it.
    serve.sigterm(Duration::from_secs(15));
    let rest = reading.await.unwrap();
    if let Some(last) = rest.last() {
        assert_eq!(last.event, "error", "{rest:?}");
        assert_eq!(last.data["error"]["code"], "shutting_down");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_removed_under_its_calls_answers_gone_never_a_server_error() {
    // No warm pool: a claimed container carries the pool's owner label, not the user's, and
    // this test removes the user's containers from outside.
    let env = Env::new("[quotas]\nsessions = 8\n[pool]\nsize = 0\n").await;
    let key = env.add_user("ann", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let mut statuses = Vec::new();
    for _round in 0..4 {
        let id = api.session().await;
        api.exec(&id, "echo x > /workspace/f").await;
        let (_, s) = api
            .json(Method::GET, &format!("/v1/sessions/{id}"), None)
            .await;
        assert_eq!(s["state"], "running");
        let containers = containers_of(&format!("serve:{}", env.user_ids()[0]));
        // Removed from outside (on a thread of its own: `docker rm -f` blocks) while calls
        // of every kind keep coming in, before, during and after the removal.
        let removal = std::thread::spawn(move || {
            for c in &containers {
                let _ = Command::new("docker").args(["rm", "-f", c]).output();
            }
        });
        let mut calls = Vec::new();
        for i in 0..24u64 {
            let api = api.clone();
            let id = id.clone();
            calls.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 20)).await;
                let (method, path, body) = match i % 6 {
                    0 => (Method::POST, "exec", Some(json!({"command": "echo hi"}))),
                    1 => (
                        Method::POST,
                        "exec/stream",
                        Some(json!({"command": "echo hi"})),
                    ),
                    2 => (
                        Method::POST,
                        "tools/bash",
                        Some(json!({"command": "echo hi"})),
                    ),
                    3 => (Method::GET, "files?path=/workspace", None),
                    4 => (Method::GET, "files/content?path=f", None),
                    _ => (
                        Method::POST,
                        "exec",
                        Some(json!({"command": "sleep 0.1; echo hi"})),
                    ),
                };
                let mut r = api.req(method, &format!("/v1/sessions/{id}/{path}"));
                if let Some(b) = body {
                    r = r.json(&b);
                }
                let r = r.send().await.unwrap();
                let status = r.status().as_u16();
                (path, status, r.text().await.unwrap_or_default())
            }));
        }
        for c in calls {
            statuses.push(c.await.unwrap());
        }
        removal.join().unwrap();
        // Afterwards the session is ended, and says why.
        let (s, v) = api
            .json(
                Method::POST,
                &format!("/v1/sessions/{id}/exec"),
                Some(json!({"command": "true"})),
            )
            .await;
        assert!(s == 409 || s == 404, "exec after the removal: {s} {v}");
        let (_, v) = api
            .json(Method::GET, &format!("/v1/sessions/{id}"), None)
            .await;
        assert_eq!(v["state"], "ended", "{v}");
        let _ = api
            .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
            .await;
    }
    for (path, status, body) in &statuses {
        assert!(
            matches!(status, 200 | 404 | 409),
            "{path} answered {status} while its container was removed: {body}"
        );
        // A stream that started before the removal ends with an error event, not an internal one.
        assert!(!body.contains("\"internal\""), "{path}: {body}");
    }
}
