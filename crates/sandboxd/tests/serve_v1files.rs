//! Issue 25, item 4 (what migrating users need on `/v1`), against a real `serve` process, the
//! real engine and image: the file API reads anywhere the sandbox user can read and writes
//! only inside /workspace (hostile paths refused with the reason); an upload's `mode` lands
//! and an uploaded 0755 script runs; an exec timeout above the cap answers with the one
//! applied; a session shows its backend and handle. Templates are in serve_templates.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use reqwest::Method;
use serde_json::{Value, json};

use serve::{Api, Env, code};

/// GET of a file's content: the status and the body as text.
async fn get(api: &Api, id: &str, path: &str) -> (u16, String) {
    let url = format!("/v1/sessions/{id}/files/content");
    let r = api
        .req(Method::GET, &url)
        .query(&[("path", path)])
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// PUT of a file's content with the query `query`: the status and the JSON answer.
async fn put(api: &Api, id: &str, query: &[(&str, &str)], body: &str) -> (u16, Value) {
    let url = format!("/v1/sessions/{id}/files/content");
    let r = api
        .req(Method::PUT, &url)
        .query(query)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

fn message(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn reads_reach_the_container_and_writes_stay_in_the_workspace() {
    let env = Env::new("").await;
    let key = env.add_user("rita", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;

    // Outside /workspace, read-only: the file, a 404, a listing.
    let (s, text) = get(&api, &id, "/etc/os-release").await;
    assert_eq!(s, 200, "{text}");
    assert!(text.contains("ID=debian"), "{text}");
    let (s, text) = get(&api, &id, "/etc/no-such-file").await;
    assert_eq!(s, 404, "{text}");
    let (s, v) = api
        .json(
            Method::GET,
            &format!("/v1/sessions/{id}/files?path=/etc"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["path"], "/etc");
    let names: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(names.contains(&"os-release"), "{names:?}");
    // What the sandbox user cannot read stays unread.
    api.exec(
        &id,
        "echo s > /workspace/locked && chmod 000 /workspace/locked",
    )
    .await;
    let (s, text) = get(&api, &id, "/workspace/locked").await;
    assert_eq!(s, 409, "{text}");
    assert!(text.to_lowercase().contains("permission"), "{text}");
    // A read through a link in /workspace reads its target.
    api.exec(
        &id,
        "ln -s /etc/os-release /workspace/osr && ln -s /tmp /workspace/out",
    )
    .await;
    let (s, text) = get(&api, &id, "osr").await;
    assert_eq!((s, text.contains("ID=debian")), (200, true), "{text}");

    // Hostile reads: refused with the reason.
    let long = format!("/{}", "a/".repeat(2100));
    for (path, says) in [
        ("/..", "goes above /"),
        ("../../..", "goes above /"),
        ("/etc/os-release\0", "control character"),
        (long.as_str(), "longer than 4096"),
    ] {
        let (s, text) = get(&api, &id, path).await;
        assert_eq!(s, 400, "{path:.40}: {text}");
        assert!(text.contains(says), "{path:.40}: {text}");
    }

    // Writes stay inside /workspace, and not through a link out of it.
    for (path, says) in [
        ("/etc/x", "outside /workspace"),
        ("/tmp/x", "outside /workspace"),
        ("../etc/x", "leaves /workspace"),
        ("/workspace/../tmp/x", "leaves /workspace"),
        ("out/x", "symbolic link /workspace/out"),
        ("a\0b", "control character"),
    ] {
        let (s, v) = put(&api, &id, &[("path", path)], "x").await;
        assert_eq!((s, code(&v)), (400, "invalid_request"), "{path}: {v}");
        assert!(message(&v).contains(says), "{path}: {v}");
    }
    let out = api.exec(&id, "ls /tmp/x 2>&1; ls -A /workspace/out").await;
    assert!(
        out["stdout"].as_str().unwrap().contains("No such file"),
        "{out}"
    );
    let (s, v) = put(&api, &id, &[("path", "in/ok.txt")], "fine").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        get(&api, &id, "/workspace/in/ok.txt").await,
        (200, "fine".into())
    );
}

#[tokio::test]
async fn an_uploaded_script_keeps_its_mode_and_runs() {
    let env = Env::new("").await;
    let key = env.add_user("moe", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    let script = "#!/bin/sh\necho ran-ok\n";

    let (s, v) = put(&api, &id, &[("path", "run.sh"), ("mode", "0755")], script).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["mode"], "0755");
    let out = api.exec(&id, "./run.sh && stat -c %a run.sh").await;
    assert_eq!(out["exit_code"], 0, "{out}");
    assert_eq!(out["stdout"], "ran-ok\n755\n");
    // Another spelling, and a replaced file takes the new mode.
    let (s, v) = put(&api, &id, &[("path", "run.sh"), ("mode", "0o700")], script).await;
    assert_eq!((s, v["mode"].as_str()), (200, Some("0700")), "{v}");
    let out = api.exec(&id, "stat -c %a run.sh").await;
    assert_eq!(out["stdout"], "700\n");

    // Without a mode a new file is not executable: the failure users hit before.
    let (s, v) = put(&api, &id, &[("path", "plain.sh")], script).await;
    assert_eq!((s, v["mode"].is_null()), (200, true), "{v}");
    let out = api.exec(&id, "./plain.sh").await;
    assert_eq!(out["exit_code"], 126, "{out}");

    for (mode, says) in [
        ("4755", "setuid"),
        ("1777", "sticky"),
        ("0789", "octal"),
        ("rwx", "not an octal"),
        ("77777", "not a file mode"),
    ] {
        let (s, v) = put(&api, &id, &[("path", "bad.sh"), ("mode", mode)], script).await;
        assert_eq!((s, code(&v)), (400, "invalid_request"), "{mode}: {v}");
        assert!(message(&v).contains(says), "{mode}: {v}");
    }
    let out = api.exec(&id, "test -e bad.sh").await;
    assert_eq!(out["exit_code"], 1, "a refused upload wrote nothing: {out}");
}

#[tokio::test]
async fn an_exec_timeout_above_the_cap_answers_with_the_one_applied() {
    let env = Env::new("[limits]\nmax_timeout_secs = 5\n").await;
    let key = env.add_user("tim", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    let exec = |timeout: u64, stream: bool| {
        let path = match stream {
            true => format!("/v1/sessions/{id}/exec/stream"),
            false => format!("/v1/sessions/{id}/exec"),
        };
        api.req(Method::POST, &path)
            .json(&json!({"command": "echo hi", "timeout": timeout}))
            .send()
    };

    for (asked, applied) in [(600, 5), (3, 3)] {
        let r = exec(asked, false).await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(
            r.headers()["sandboxd-timeout"],
            applied.to_string().as_str()
        );
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            (v["timeout"].as_u64(), v["stdout"].as_str()),
            (Some(applied), Some("hi\n")),
            "{v}"
        );

        let r = exec(asked, true).await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(
            r.headers()["sandboxd-timeout"],
            applied.to_string().as_str()
        );
        let text = r.text().await.unwrap();
        let exit = text
            .split("\n\n")
            .find(|e| e.contains("event: exit"))
            .and_then(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .unwrap_or_else(|| panic!("no exit event: {text}"));
        let exit: Value = serde_json::from_str(exit).unwrap();
        assert_eq!(exit["timeout"].as_u64(), Some(applied), "{exit}");
    }
    // And the applied timeout is the one enforced.
    let r = api
        .req(Method::POST, &format!("/v1/sessions/{id}/exec"))
        .json(&json!({"command": "sleep 30", "timeout": 600}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["timed_out"].as_bool(), v["timeout"].as_u64()),
        (Some(true), Some(5)),
        "{v}"
    );
}

#[tokio::test]
async fn a_session_shows_its_backend_and_handle() {
    let env = Env::new("").await;
    let key = env.add_user("hank", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);
    let (s, created) = api
        .json(Method::POST, "/v1/sessions", Some(json!({})))
        .await;
    assert_eq!(s, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let container = env.container(id).await;
    assert_eq!(created["backend"], "docker");
    assert_eq!(created["handle"], container.as_str());
    let (_, got) = api
        .json(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(
        (got["backend"].as_str(), got["handle"].as_str()),
        (Some("docker"), Some(container.as_str()))
    );
    let (_, list) = api.json(Method::GET, "/v1/sessions", None).await;
    assert_eq!(list["sessions"][0]["handle"], container.as_str(), "{list}");
    // The handle is the engine's container: it runs the session's label.
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", &container])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "true");
}
