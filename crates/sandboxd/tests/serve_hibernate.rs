//! Hibernation of `sandboxd serve`'s API sessions (issue 28, item 5), on a real serve, the
//! real engine and image, the LLM faked at the HTTP boundary: files (a 200 MB one, names
//! with spaces, unicode and a newline), an editor undo history and a plan survive hibernate
//! → resume; an exec on a hibernated session answers correctly and says it resumed it (the
//! next run's events too); a hibernated session has no container; an idle session
//! hibernates by itself and ends at its idle timeout, its snapshot deleted; `kill -9` in
//! the middle of a save leaves the live session; a hostile or damaged snapshot is refused
//! with a clear error; the session's environment is given back at resume. Deadlines on every wait; no timing is asserted.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::Method;
use sandboxd_core::store::{Store as _, ToolRecords as _};
use serde_json::{Value, json};

use serve::runs::{SERVER, follow_all, kinds, llm_config, start_run};
use serve::{Api, Env, code, container_of};
use support::fake_llm::{FakeLlm, Reply};

/// Every file of /workspace with its digest, names printed escaped (`%q`): what must survive.
const LISTING: &str = "cd /workspace && find . -type f -print0 | sort -z | xargs -0 sha256sum | sed 's/^\\\\//' ; find . -print0 | sort -z | xargs -0 printf '%q\\n'";

/// Files worth keeping: a 200 MB one, odd names, a nested directory, an executable.
const MAKE_FILES: &str = "cd /workspace && head -c 200M /dev/urandom > big.bin \
    && echo spaced > 'with space.txt' && echo ü > 'ünïcødé ✓.txt' \
    && echo nl > $'new\\nline.txt' && mkdir -p deep/er && echo deep > deep/er/f.txt \
    && printf '#!/bin/sh\\necho run\\n' > deep/run.sh && chmod +x deep/run.sh";

fn snapshots(env: &Env) -> PathBuf {
    env.dir.path().join("data/snapshots")
}

/// The snapshot files (not temporaries) in the snapshot directory.
fn snapshot_files(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tar") && !n.starts_with('.'))
        .collect()
}

async fn session_view(api: &Api, id: &str) -> Value {
    let (s, v) = api
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    v
}

/// Waits (at most 90 s) until the session's state is `state`.
async fn until_state(api: &Api, id: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let v = session_view(api, id).await;
        if v["state"] == state {
            return v;
        }
        assert!(Instant::now() < deadline, "never {state}: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (at most 60 s) until the engine has no container of runtime session `rt`.
async fn until_no_container(rt: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while container_of(rt, false) {
        assert!(Instant::now() < deadline, "the container of {rt} stays");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn admin_post(admin: &Api, id: &str, what: &str) -> (u16, Value) {
    admin
        .json(Method::POST, &format!("/v1/sessions/{id}/{what}"), None)
        .await
}

async fn tool(api: &Api, id: &str, name: &str, args: Value) -> Value {
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/{name}"),
            Some(args),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    v
}

async fn record(env: &Env, runtime_id: &str, kind: &str) -> Option<Vec<u8>> {
    env.store().await.record(runtime_id, kind).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn files_undo_history_and_plan_survive_hibernate_and_resume() {
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "planning",
            json!({"command": "create", "title": "Keep", "steps": ["Write data"]}),
        ),
        Reply::tool("bash", json!({"command": "seq 3 > /workspace/data.txt"})),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
        Reply::text("Done."),
        // The run after the second hibernation.
        Reply::tool("terminate", json!({"status": "success", "answer": "again"})),
    ])
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let key = env.add_user("hal", &[]);
    let root = env.add_user("root", &["--admin"]);
    let serve = env.start();
    let (api, admin) = (Api::new(&serve, &key), Api::new(&serve, &root));
    let run = start_run(&api, json!({"task": "plan", "mode": "plan", "session": {}})).await;
    let id = run["session_id"].as_str().unwrap().to_string();
    follow_all(&api, run["id"].as_str().unwrap()).await;
    let rt = env.runtime_id(&id).await;
    let create = json!({"command": "create", "path": "/workspace/notes.txt", "file_text": "one\n"});
    tool(&api, &id, "str_replace_editor", create).await;
    let edit = json!({"command": "str_replace", "path": "/workspace/notes.txt", "old_str": "one", "new_str": "two"});
    tool(&api, &id, "str_replace_editor", edit).await;
    tool(&api, &id, "python", json!({"code": "x = 41"})).await;
    let made = api.exec(&id, MAKE_FILES).await;
    assert_eq!(made["exit_code"], 0, "{made}");
    let before = api.exec(&id, LISTING).await;
    assert_eq!(before["exit_code"], 0, "{before}");
    let listing = before["stdout"].as_str().unwrap().to_string();
    assert!(
        listing.contains("new\\nline.txt") && listing.contains("big.bin"),
        "{listing}"
    );
    let plans = record(&env, &rt, "plans")
        .await
        .expect("the run made a plan");
    let undo = record(&env, &rt, "undo")
        .await
        .expect("the edits left an undo history");

    // A user cannot hibernate by hand (the route is the admin's); the admin can.
    let (s, v) = admin_post(&api, &id, "hibernate").await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    let (s, v) = admin_post(&admin, &id, "hibernate").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "hibernated", "{v}");
    assert!(v["handle"].is_null(), "no container: {v}");
    assert!(
        !container_of(&rt, false),
        "the engine has no container of it"
    );
    assert_eq!(snapshot_files(&snapshots(&env)).len(), 1);
    assert_eq!(
        record(&env, &rt, "plans").await.as_deref(),
        Some(&plans[..])
    );
    assert_eq!(record(&env, &rt, "undo").await.as_deref(), Some(&undo[..]));
    let listed = env.cmd().args(["sessions", "list"]).output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed.contains(&id) && listed.contains("hibernated"),
        "{listed}"
    );

    // The next exec resumes it, answers, and says so.
    let r = api
        .req(Method::POST, &format!("/v1/sessions/{id}/exec"))
        .json(&json!({"command": LISTING}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let resumed = r
        .headers()
        .get("sandboxd-resumed")
        .map(|v| v.to_str().unwrap().to_string());
    let after: Value = r.json().await.unwrap();
    assert_eq!(
        after["stdout"].as_str().unwrap(),
        listing,
        "every file came back"
    );
    let note = after["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("resumed") && note.contains("python variables"),
        "{after}"
    );
    assert!(resumed.unwrap().contains("resumed"));
    assert_eq!(session_view(&api, &id).await["state"], "running");
    assert!(
        container_of(&rt, true),
        "a container again, under the same runtime id"
    );
    assert!(
        snapshot_files(&snapshots(&env)).is_empty(),
        "the snapshot is gone once resumed"
    );
    let run_sh = api.exec(&id, "/workspace/deep/run.sh").await;
    assert_eq!(run_sh["stdout"], "run\n", "modes survive: {run_sh}");

    // The undo history works on the restored file; python's variables are gone.
    tool(
        &api,
        &id,
        "str_replace_editor",
        json!({"command": "undo_edit", "path": "/workspace/notes.txt"}),
    )
    .await;
    let notes = api.exec(&id, "cat /workspace/notes.txt").await;
    assert_eq!(notes["stdout"], "one\n", "{notes}");
    let py = tool(&api, &id, "python", json!({"code": "print(x)"})).await;
    assert!(py.to_string().contains("NameError"), "{py}");
    assert_eq!(
        record(&env, &rt, "plans").await.as_deref(),
        Some(&plans[..])
    );

    // Hibernated again, a run resumes it and its events say so first.
    assert_eq!(admin_post(&admin, &id, "hibernate").await.0, 200);
    let run = start_run(&api, json!({"task": "again", "session_id": id})).await;
    let evs = follow_all(&api, run["id"].as_str().unwrap()).await;
    let k = kinds(&evs);
    let notice = evs.iter().find(|e| e.event == "notice").expect("a notice");
    assert!(notice.data.to_string().contains("resumed"), "{k:?}");
    let big = api.exec(&id, "stat -c %s /workspace/big.bin").await;
    assert_eq!(big["stdout"], "209715200\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_session_hibernates_by_itself_then_ends_at_its_idle_timeout() {
    let env = Env::new("hibernate_after_secs = 2\n").await;
    let key = env.add_user("ida", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let (s, v) = api
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"idle_timeout": 20})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let rt = env.runtime_id(&id).await;
    api.exec(&id, "echo kept > /workspace/k.txt").await;
    until_state(&api, &id, "hibernated").await;
    // The row changes first, then the container goes.
    until_no_container(&rt).await;
    let out = api.exec(&id, "cat /workspace/k.txt").await;
    assert_eq!(out["stdout"], "kept\n", "{out}");
    assert!(out["note"].as_str().unwrap().contains("resumed"), "{out}");
    // Idle again: hibernated again, then ended at its own idle timeout, snapshot and all.
    until_state(&api, &id, "hibernated").await;
    let v = until_state(&api, &id, "ended").await;
    assert!(v["end_reason"].as_str().unwrap().contains("idle"), "{v}");
    assert!(snapshot_files(&snapshots(&env)).is_empty());
    assert!(!container_of(&rt, false));
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_the_save_leaves_a_usable_session() {
    let env = Env::new("hibernate_after_secs = 1\n").await;
    let key = env.add_user("kit", &[]);
    let pause = tempfile::tempdir().unwrap();
    let mut cmd = env.cmd();
    cmd.env(sandboxd_core::sandbox::snapshot::PAUSE_ENV, pause.path())
        .args(["serve", "--listen", "127.0.0.1:0"]);
    let mut serve = serve::Serve::spawn(cmd);
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    let rt = env.runtime_id(&id).await;
    api.exec(&id, "seq 100000 > /workspace/n.txt").await;
    // The save has its archive on disk and waits before the rename: kill it there.
    let deadline = Instant::now() + Duration::from_secs(90);
    while std::fs::read_dir(pause.path()).unwrap().next().is_none() {
        assert!(
            Instant::now() < deadline,
            "the save never reached its pause"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    serve.kill9();
    let row = env.store().await.session(&id).await.unwrap().unwrap();
    assert!(
        !row.hibernated(),
        "the row changes only after the snapshot: {row:?}"
    );
    assert!(
        container_of(&rt, true),
        "the live session's container stays"
    );
    assert!(
        snapshot_files(&snapshots(&env)).is_empty(),
        "no snapshot that looks complete"
    );

    let serve = env.start();
    let api = Api::new(&serve, &key);
    let out = api.exec(&id, "wc -l < /workspace/n.txt").await;
    assert_eq!(out["stdout"], "100000\n", "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_or_damaged_snapshot_is_refused() {
    let env = Env::new("").await;
    let key = env.add_user("eve", &[]);
    let root = env.add_user("root", &["--admin"]);
    let serve = env.start();
    let (api, admin) = (Api::new(&serve, &key), Api::new(&serve, &root));
    let hostile = crate::tar_support::Tar::new()
        .file("ok.txt", b"fine")
        .file("../escape.txt", b"out")
        .file("/abs.txt", b"abs")
        .symlink("link", "/etc")
        .file("link/passwd", b"x")
        .finish();
    let damaged = vec![0x5a_u8; 4096];
    for (what, bytes) in [("hostile", hostile), ("damaged", damaged)] {
        let id = api.session().await;
        api.exec(&id, "echo mine > /workspace/m.txt").await;
        assert_eq!(admin_post(&admin, &id, "hibernate").await.0, 200);
        let name = env
            .store()
            .await
            .session(&id)
            .await
            .unwrap()
            .unwrap()
            .snapshot
            .unwrap();
        std::fs::write(snapshots(&env).join(&name), &bytes).unwrap();
        let (s, v) = api
            .json(
                Method::POST,
                &format!("/v1/sessions/{id}/exec"),
                Some(json!({"command": "ls -a /workspace /"})),
            )
            .await;
        assert_eq!((s, code(&v)), (409, "conflict"), "{what}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("refused") && msg.contains("cannot be resumed"),
            "{what}: {msg}"
        );
        let row = session_view(&api, &id).await;
        assert_eq!(row["state"], "ended", "{what}: {row}");
        assert!(!container_of(&env.runtime_id(&id).await, false), "{what}");
    }
    let data = env.dir.path().join("data");
    assert!(!data.join("escape.txt").exists() && !env.dir.path().join("escape.txt").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sessions_environment_is_given_back_at_resume() {
    let env = Env::new("").await;
    let key = env.add_user("eli", &[]);
    let root = env.add_user("root", &["--admin"]);
    let serve = env.start();
    let (api, admin) = (Api::new(&serve, &key), Api::new(&serve, &root));
    let id = api
        .session_with(json!({"env": {"TOKEN": "s3cr3t value", "MODE": "x"}}))
        .await;
    let show = "printf '%s|%s' \"$TOKEN\" \"$MODE\"";
    assert_eq!(api.exec(&id, show).await["stdout"], "s3cr3t value|x");
    assert_eq!(admin_post(&admin, &id, "hibernate").await.0, 200);
    let out = api.exec(&id, show).await;
    assert_eq!(out["stdout"], "s3cr3t value|x", "{out}");
    assert!(
        out["note"].as_str().unwrap_or("").contains("resumed"),
        "{out}"
    );
    // A value is never shown back: not in the session's view.
    let view = session_view(&api, &id).await;
    assert!(!view.to_string().contains("s3cr3t"), "{view}");
}
