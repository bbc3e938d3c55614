//! A kept session's host-side tool records (the CLI's files `<data>/runs/sessions/<id>.browser.json`
//! and `<id>.undo.json`; serve's rows of its store) end with the session, whichever way it
//! is destroyed: `sandboxd sessions rm`; `sandboxd sessions gc` of a kept session whose
//! container stopped (the reconciler); serve's `DELETE /v1/sessions/{id}` of a session a run
//! used the editor in; serve's next start finding a kept session's container gone. A session
//! whose container was removed outside sandboxd (`docker rm -f`) loses its records to
//! `sessions rm`, `sessions gc`, serve's next start, or (held by a running serve) serve's
//! watch of the engine's events at once, and never to another serve user naming it. Another session's records stay. upgrade.rs: serve's start moves an earlier version's
//! record files into its store. The real binary, engine and image; the LLM faked at the HTTP
//! boundary.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

mod upgrade;

use crate::serve;
use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env, container_of, ended_session};
use support::cli::{kept_session_id, sandboxd};
use support::fake_llm::{FakeLlm, Reply};

/// Runs `sandboxd ARGS…` in `dir`, asserts it succeeded, and returns its stdout and stderr.
fn ok(dir: &Path, args: &[&str]) -> (String, String) {
    let out = sandboxd(dir).args(args).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "sandboxd {args:?}: {stdout}{stderr}");
    (stdout, stderr)
}

/// The kinds of tool record file `data` holds for session `id` (`<id>.<kind>.json`), sorted.
pub(super) fn records(data: &Path, id: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(data.join("runs/sessions")) else {
        return Vec::new();
    };
    let mut kinds: Vec<String> = entries
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| {
            n.strip_prefix(&format!("{id}."))?
                .strip_suffix(".json")
                .map(String::from)
        })
        .collect();
    kinds.sort();
    kinds
}

/// Removes session `id`'s container as someone other than sandboxd would: `docker rm -f`
/// of the container id the engine gives it (found by the session label).
pub(super) fn remove_outside_sandboxd(id: &str) {
    let ids = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=sandboxd.session={id}"),
        ])
        .output()
        .unwrap();
    let ids = String::from_utf8_lossy(&ids.stdout).into_owned();
    assert!(!ids.trim().is_empty(), "the kept container is there");
    for c in ids.split_whitespace() {
        let rm = Command::new("docker")
            .args(["rm", "-f", c])
            .output()
            .unwrap();
        assert!(rm.status.success(), "{rm:?}");
    }
    assert!(!container_of(id, false));
}

/// A kept session made by `sandboxd tool`, with an editor edit (the undo record).
fn kept_session_with_an_edit(dir: &Path) -> String {
    let create =
        json!({"command": "create", "path": "/workspace/notes.txt", "file_text": "kept\n"});
    let (_, err) = ok(
        dir,
        &["tool", "--keep", "str_replace_editor", &create.to_string()],
    );
    kept_session_id(&err)
}

#[test]
fn sessions_rm_and_gc_take_a_kept_sessions_tool_records_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");

    let a = kept_session_with_an_edit(dir.path());
    let _cleanup_a = support::cli::cleanup(&a);
    let open = json!({"action": "go_to_url", "url": "data:text/html,<title>kept</title>"});
    ok(
        dir.path(),
        &["tool", "--session", &a, "browser_use", &open.to_string()],
    );
    assert_eq!(records(&data, &a), ["browser", "undo"]);
    let b = kept_session_with_an_edit(dir.path());
    let cleanup_b = support::cli::cleanup(&b);
    assert_eq!(records(&data, &b), ["undo"]);

    // `sessions rm`: the container and both of its records go; b's stay.
    let (out, _) = ok(dir.path(), &["sessions", "rm", &a]);
    assert!(out.contains(&a), "{out}");
    assert!(!container_of(&a, false));
    assert_eq!(records(&data, &a), Vec::<String>::new());
    assert_eq!(
        records(&data, &b),
        ["undo"],
        "another session's records stay"
    );

    // A kept session whose container stopped is garbage to `sessions gc`; so are its records.
    let stop = Command::new("docker")
        .args(["stop", "-t", "1", &cleanup_b.0])
        .output()
        .unwrap();
    assert!(stop.status.success(), "{stop:?}");
    let (out, _) = ok(dir.path(), &["sessions", "gc"]);
    assert!(out.contains(&b), "{out}");
    assert!(!container_of(&b, false));
    assert_eq!(records(&data, &b), Vec::<String>::new());
}

#[test]
fn records_of_a_session_whose_container_vanished_go_with_sessions_rm_or_gc() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut ids, mut cleanup) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let id = kept_session_with_an_edit(dir.path());
        cleanup.push(support::cli::cleanup(&id));
        ids.push(id);
    }
    let [a, b, c] = [0, 1, 2].map(|i| ids[i].clone());
    remove_outside_sandboxd(&a);
    remove_outside_sandboxd(&c);
    assert_eq!(records(&data, &a), ["undo"], "nothing ran in between");

    // `sessions rm` of the vanished session says it was already gone and drops its records
    // (and only its own); asked again, there is nothing left: "not found", as for any id.
    let (out, _) = ok(dir.path(), &["sessions", "rm", &a]);
    assert!(
        out.contains("already gone") && out.contains("undo"),
        "{out}"
    );
    assert_eq!(records(&data, &a), Vec::<String>::new());
    assert_eq!(
        records(&data, &b),
        ["undo"],
        "a live session's records stay"
    );
    assert_eq!(records(&data, &c), ["undo"], "rm ID touches only that id");
    let again = sandboxd(dir.path())
        .args(["sessions", "rm", &a])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && err.contains("no session"),
        "{err}"
    );

    // `sessions gc` sweeps the records of every session without a container; b still runs.
    let (out, _) = ok(dir.path(), &["sessions", "gc"]);
    assert!(out.contains(&c) && !out.contains(&b), "{out}");
    assert_eq!(records(&data, &c), Vec::<String>::new());
    assert_eq!(
        records(&data, &b),
        ["undo"],
        "a live session's records stay"
    );
    assert!(container_of(&b, true));
}

const SERVER: &str = "[server]\ndrain_secs = 2\nbody_limit_kb = 64\nupload_limit_mb = 4\nauth_failures_per_minute = 10000\n";

/// Polls the run until it has ended; returns its state.
async fn finished(api: &Api, run: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (s, v) = api
            .json(Method::GET, &format!("/v1/runs/{run}"), None)
            .await;
        assert_eq!(s, 200, "{v}");
        if !["queued", "running", "waiting_for_human"].contains(&v["state"].as_str().unwrap()) {
            return v;
        }
        assert!(Instant::now() < deadline, "the run did not end: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn serves_delete_takes_the_records_a_run_left_with_the_session() {
    let create = json!({"command": "create", "path": "/workspace/a.txt", "file_text": "a\n"});
    let llm = FakeLlm::start(vec![
        Reply::tool("str_replace_editor", create.clone()),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
        Reply::tool("str_replace_editor", create),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    ])
    .await;
    let llm_config = format!(
        "[llm]\nbase_url = {:?}\nmodel = \"fake-model\"\napi_key = \"sk-fake\"\nmax_retries = 1\n",
        llm.base_url()
    );
    let env = Env::new(&format!("{llm_config}{SERVER}")).await;
    let key = env.add_user("ann", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);

    // Two sessions, each with a run that edited a file: each has its undo record (in serve's
    // store).
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (s, run) = api
            .json(
                Method::POST,
                "/v1/runs",
                Some(json!({"task": "write a.txt", "session": {}})),
            )
            .await;
        assert_eq!(s, 201, "{run}");
        let v = finished(&api, run["id"].as_str().unwrap()).await;
        assert_eq!(v["state"], "succeeded", "{v}");
        let id = run["session_id"].as_str().unwrap().to_string();
        let runtime_id = env.runtime_id(&id).await;
        assert_eq!(env.stored_records(&runtime_id).await, ["undo"]);
        sessions.push((id, runtime_id));
    }
    let (gone, stays) = (&sessions[0], &sessions[1]);
    let (s, v) = api
        .json(Method::DELETE, &format!("/v1/sessions/{}", gone.0), None)
        .await;
    assert_eq!(s, 204, "{v}");
    assert!(!container_of(&gone.1, false));
    assert_eq!(env.stored_records(&gone.1).await, Vec::<String>::new());
    assert_eq!(
        env.stored_records(&stays.1).await,
        ["undo"],
        "the other session's stays"
    );

    // A container that vanished while serve was down: the next start ends the session,
    // and its records with it.
    let mut serve = serve;
    serve.sigterm(Duration::from_secs(30));
    remove_outside_sandboxd(&stays.1);
    assert_eq!(
        env.stored_records(&stays.1).await,
        ["undo"],
        "nothing ran in between"
    );
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let (s, v) = api
        .json(Method::GET, &format!("/v1/sessions/{}", stays.0), None)
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "ended", "{v}");
    assert_eq!(env.stored_records(&stays.1).await, Vec::<String>::new());
}

/// An undo record for API session `id`, made through serve's tool endpoint.
pub(super) async fn edit_through_the_api(api: &Api, id: &str) {
    let create = json!({"command": "create", "path": "/workspace/a.txt", "file_text": "a\n"});
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/str_replace_editor"),
            Some(create),
        )
        .await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test]
async fn in_serve_nobody_ends_another_users_vanished_records_and_the_start_sweeps_orphans() {
    let env = Env::new("").await;
    // Only a start sweeps here: the upkeep's sweep ends a row whose container is gone too
    // (rightly), and at Env's one second it could do so before bob's requests are checked.
    let config = std::fs::read_to_string(&env.config).unwrap();
    let slow = config.replace("reap_interval_secs = 1\n", "reap_interval_secs = 3600\n");
    assert_ne!(config, slow, "Env's config names its reap interval");
    std::fs::write(&env.config, slow).unwrap();
    let ann = env.add_user("ann", &[]);
    let bob = env.add_user("bob", &[]);
    let serve = env.start();
    let (ann, bob) = (Api::new(&serve, &ann), Api::new(&serve, &bob));
    let data = env.dir.path().join("data");
    let (vanished, stays) = (ann.session().await, ann.session().await);
    for id in [&vanished, &stays] {
        edit_through_the_api(&ann, id).await;
    }
    let (vanished_rt, stays_rt) = (
        env.runtime_id(&vanished).await,
        env.runtime_id(&stays).await,
    );

    // A kept CLI session in the same data directory (its records are files); its command's
    // start-up sweep leaves serve's records alone (their containers run).
    let create = json!({"command": "create", "path": "/workspace/c.txt", "file_text": "c\n"});
    let out = env
        .cmd()
        .args(["tool", "--keep", "str_replace_editor", &create.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let cli = kept_session_id(&String::from_utf8_lossy(&out.stderr));
    let _cleanup = support::cli::cleanup(&cli);
    for id in [&vanished_rt, &stays_rt] {
        assert_eq!(env.stored_records(id).await, ["undo"], "{id}");
    }
    assert_eq!(records(&data, &cli), ["undo"], "the CLI session's");
    assert_eq!(
        records(&data, &stays_rt),
        Vec::<String>::new(),
        "serve's are not files"
    );
    remove_outside_sandboxd(&vanished_rt);
    remove_outside_sandboxd(&cli);
    // Serve holds ann's session: the engine's events end it at once, with its records.
    let v = ended_session(&ann, &vanished).await;
    assert_eq!(v["end_reason"], "its sandbox was removed outside sandboxd");
    assert_eq!(env.stored_records(&vanished_rt).await, Vec::<String>::new());

    // Bob names ann's vanished session, by its API id and by its runtime id: the same 404
    // as for an id nobody has, and ann's other session keeps its records.
    let answer = |id: &str| {
        let bob = bob.clone();
        let id = id.to_string();
        async move {
            let (s, v) = bob
                .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
                .await;
            (s, v.to_string().replace(&id, "ID"))
        }
    };
    let nobodys = answer("ses_nobodys0000").await;
    assert_eq!(nobodys.0, 404, "{}", nobodys.1);
    for id in [&vanished, &vanished_rt] {
        assert_eq!(answer(id).await, nobodys, "{id}");
    }
    assert_eq!(
        env.stored_records(&stays_rt).await,
        ["undo"],
        "bob ended nothing"
    );

    // The next start sweeps the CLI session's records, which no row names; the session whose container runs keeps its own.
    let mut serve = serve;
    serve.sigterm(Duration::from_secs(30));
    let _serve = env.start();
    assert_eq!(env.stored_records(&vanished_rt).await, Vec::<String>::new());
    assert_eq!(records(&data, &cli), Vec::<String>::new(), "the orphan");
    assert_eq!(
        env.stored_records(&stays_rt).await,
        ["undo"],
        "a running session's"
    );
}
