//! sandboxd's E2B-compatible API against the official SDKs from PyPI (`e2b` 2.63.0 and
//! `e2b-code-interpreter` 2.11.5, unmodified, in the venv .ci/run makes): a real `serve`,
//! engine and image, driven by tests/e2b/sdk_check.py as the SDKs' documentation shows.
//! Commands (output, exit codes, streaming, background processes beside a foreground one with
//! their own env and cwd, list, kill, stdin), files (text, bytes, several at once, list with
//! depth, make_dir, rename, remove, exists), timeout, connect, kill (the container is gone);
//! the code interpreter (state kept, a PNG figure, an error with its traceback, stdout live
//! as the cell prints and capped, a caller that leaves interrupts the cell, separate code
//! contexts: own variables and cwd, restart, remove, at most 8); two users (404 across them,
//! each lists only their own); no network; refused requests say why;
//! pause and resume (hibernation), set timeout up to the admin's cap, templates by name.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use serve::{Env, Serve, container_of};

/// SANDBOXD_TEST_E2B_PYTHON (CI sets it: a missing venv fails there), else .venv-e2b in the
/// repo.
pub(crate) fn python() -> PathBuf {
    if let Ok(p) = std::env::var("SANDBOXD_TEST_E2B_PYTHON") {
        return PathBuf::from(p);
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv-e2b/bin/python");
    assert!(
        repo.exists(),
        "the E2B SDKs are missing: python3 -m venv .venv-e2b && .venv-e2b/bin/pip install 'e2b==2.63.0' 'e2b-code-interpreter==2.11.5'"
    );
    repo
}

async fn sdk(serve: &Serve, key: &str, mode: &str, extra: &[(&str, &str)]) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/sdk_check.py");
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(script)
        .arg(mode)
        .env("E2B_API_URL", serve.url("/e2b"))
        .env("E2B_SANDBOX_URL", serve.url("/e2b/sandbox"))
        .env("E2B_API_KEY", key)
        // Plain HTTP to a local server: HTTP/1.1, as a proxy in front of it would speak.
        .env("E2B_HTTP_VERSION", "1.1")
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(300), cmd.output())
        .await
        .expect("sdk_check.py finishes")
        .expect("run sdk_check.py");
    assert!(
        out.status.success(),
        "sdk_check.py {mode} failed:\n{}\n--- serve log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        serve.log.lock().unwrap()
    );
    serde_json::from_slice(&out.stdout).expect("sdk_check.py prints JSON")
}

async fn wait_gone(env: &Env, id: &str) {
    let runtime = env.runtime_id(id).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while container_of(&runtime, false) {
        assert!(
            Instant::now() < deadline,
            "the container of {id} is still there"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn e2b_sdk_commands_files_and_lifecycle() {
    let env = Env::new("").await;
    let key = env.add_user("alice", &[]);
    let serve = env.start();
    let o = sdk(&serve, &key, "commands_and_files", &[]).await;
    let id = o["sandbox_id"].as_str().unwrap();
    assert_eq!(o["echo"]["stdout"], "hi\n", "{o}");
    assert_eq!(o["echo"]["exit_code"], 0);
    assert_eq!(
        strs(&o["streamed"]).concat(),
        "line1\nline2\nline3\n",
        "{o}"
    );
    assert_eq!(o["exit3"]["exit_code"], 3, "{o}");
    assert_eq!(o["exit3"]["stderr"], "oops\n");
    assert_eq!(o["session_env"], "from-create\n", "{o}");
    // Background processes beside a foreground command, each with its env and cwd.
    assert_eq!(o["fg_while_bg"], "fg-/tmp\n", "{o}");
    assert_eq!(o["listed"], o["bg_pids"], "{o}");
    assert_eq!(o["bg1_file"], "first\n/workspace/wd\n", "{o}");
    assert_eq!(o["killed"], serde_json::json!([true, true]), "{o}");
    assert_eq!(o["kill_missing"], false);
    assert_eq!(o["after_kill"], serde_json::json!([]), "{o}");
    assert_eq!(o["stdin_echo"], "typed\n", "{o}");
    // Files.
    assert_eq!(o["text"], "hello text");
    assert_eq!(o["bytes"], serde_json::json!([0, 1, 2, 255]));
    assert_eq!(strs(&o["multi"]), ["a.txt", "b.txt"]);
    assert_eq!(o["make_dir"], serde_json::json!([true, false]), "{o}");
    assert_eq!(
        strs(&o["list_depth2"]),
        ["/workspace/multi/a.txt", "/workspace/multi/b.txt"]
    );
    assert_eq!(o["renamed"], "/workspace/renamed.txt");
    assert_eq!(o["exists"], serde_json::json!([true, false]));
    assert_eq!(o["removed"], true);
    assert_eq!(o["missing"], "FileNotFoundException", "{o}");
    assert_eq!(o["script"], "ran-script\n", "{o}");
    // No network: curl fails (no route, no name resolution).
    assert_ne!(o["curl_exit"], 0, "{o}");
    // Control plane.
    assert_eq!(o["info_metadata"]["suite"], "e2b-sdk", "{o}");
    assert_eq!(strs(&o["list_ids"]), [id.to_string()], "{o}");
    assert_eq!(o["list_none"], 0);
    assert_eq!(o["connected"], "again\n");
    assert_eq!(o["is_running"], true);
    assert_eq!(o["kill"], true);
    assert_eq!(o["kill_again"], false, "{o}");
    wait_gone(&env, id).await;

    // The session is sandboxd's: /v1 sees it, ended.
    let api = serve::Api::new(&serve, &key);
    let (status, s) = api
        .json(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["state"], "ended", "{s}");
    assert_eq!(s["metadata"]["suite"], "e2b-sdk");

    let r = sdk(&serve, &key, "refused", &[]).await;
    let template = r["template"].as_str().unwrap();
    assert!(
        template.contains("no-such-template") && template.contains("base, code-interpreter-v1"),
        "{r}"
    );
    assert!(
        r["internet"].as_str().unwrap().contains("no network"),
        "{r}"
    );
}

#[tokio::test]
async fn e2b_code_interpreter_sdk() {
    let env = Env::new("").await;
    let key = env.add_user("carol", &[]);
    let serve = env.start();
    let o = sdk(&serve, &key, "code_interpreter", &[]).await;
    assert_eq!(o["env_in_python"], "'in-python'", "{o}");
    assert_eq!(o["result"], "42", "{o}");
    assert_eq!(o["count"], 3, "{o}");
    assert_eq!(strs(&o["logs"]["stdout"]), ["out\n"], "{o}");
    assert_eq!(strs(&o["logs"]["stderr"]), ["err\n"], "{o}");
    // base64 of the PNG signature.
    assert_eq!(o["png_prefix"], "iVBORw0KGgoA", "{o}");
    assert_eq!(o["error"]["name"], "ZeroDivisionError", "{o}");
    assert_eq!(o["error"]["value"], "division by zero");
    assert!(
        o["error"]["traceback"]
            .as_str()
            .unwrap()
            .contains("Traceback"),
        "{o}"
    );
    assert!(o["js"].as_str().unwrap().contains("python only"), "{o}");
    assert_eq!(strs(&o["contexts"]), ["default"]);
    live_output_streams(&o["live"]);
    code_contexts_are_separate(&o);
    wait_gone(&env, o["sandbox_id"].as_str().unwrap()).await;
}

/// `on_stdout` fired as the cell printed: each `tick i` in its own callback, in order, the
/// first before the cell's last print happened (the cell printed its own clock), and the
/// callbacks spread over the cell's sleeps rather than coming together at its end.
fn live_output_streams(live: &Value) {
    let calls = live["callbacks"].as_array().unwrap();
    let ticks: Vec<(f64, usize, f64)> = calls
        .iter()
        .flat_map(|c| {
            let at = c[0].as_f64().unwrap();
            let lines: Vec<(f64, usize, f64)> = c[1]
                .as_str()
                .unwrap()
                .lines()
                .map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    assert_eq!(f[0], "tick", "{live}");
                    (at, f[1].parse().unwrap(), f[2].parse().unwrap())
                })
                .collect();
            lines
        })
        .collect();
    assert_eq!(
        ticks.iter().map(|t| t.1).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4],
        "{live}"
    );
    let (first_callback, last_print) = (ticks[0].0, ticks[4].2);
    assert!(
        first_callback < last_print,
        "the first callback came after the cell's last print: {live}"
    );
    assert!(
        calls.len() >= 4 && ticks[4].0 - ticks[0].0 > 1.0,
        "the callbacks came together, not as the cell printed: {live}"
    );
    assert_eq!(
        live["stdout"].as_str().unwrap().lines().count(),
        5,
        "{live}"
    );
    // The SDK's timeout: its exception, the cell interrupted (the next one did not wait for
    // the 60 s sleep), the variables kept.
    let left = &live["left"];
    assert_eq!(left[0], "TimeoutException", "{left}");
    assert_eq!(left[1], "41", "{left}");
    assert!(left[2].as_f64().unwrap() < 30.0, "{left}");
    // 600 KB printed: the first 256 KiB live, then a marker and the last 128 KiB.
    let big = &live["big"];
    let len = big[0].as_u64().unwrap();
    assert!(
        (262_144 + 131_072..262_144 + 131_072 + 100).contains(&len),
        "{big}"
    );
    assert_eq!(big[1], 262_144, "{big}");
    assert_eq!(big[2], 131_071, "{big}");
    assert_eq!(big[3], true, "{big}");
}

fn code_contexts_are_separate(o: &Value) {
    assert_eq!(o["ctx_cwd"], "/tmp", "{o}");
    assert_eq!(o["ctx_sees_x"], "False", "{o}");
    assert_eq!(o["ctx_y"], "42", "{o}");
    assert_eq!(o["ctx_getcwd"], "'/tmp'", "{o}");
    assert_eq!(o["default_sees_y"], "False", "{o}");
    assert_eq!(
        o["listed"],
        serde_json::json!([[false, "/workspace"], [true, "/tmp"]]),
        "{o}"
    );
    assert_eq!(o["ctx_y_after_restart"], "False", "{o}");
    assert_eq!(o["default_x_after"], "41", "{o}");
    assert_eq!(o["pids_differ"], true, "{o}");
    assert_eq!(o["ctx_pid_gone"], "True", "{o}");
    assert_eq!(o["removed_run"], "NotFoundException", "{o}");
    assert_eq!(strs(&o["listed_after_remove"]), ["default"], "{o}");
    assert!(
        o["ninth"].as_str().unwrap().contains("8 code contexts"),
        "{o}"
    );
    assert_eq!(o["eighth_runs"], "'/workspace'", "{o}");
}

#[tokio::test]
async fn e2b_sdk_users_do_not_see_each_other() {
    let env = Env::new("").await;
    let alice = env.add_user("alice", &[]);
    let bob = env.add_user("bob", &[]);
    let serve = env.start();
    let a = sdk(&serve, &alice, "keep", &[]).await;
    let id = a["sandbox_id"].as_str().unwrap();
    let b = sdk(&serve, &bob, "foreign", &[("SANDBOX_ID", id)]).await;
    assert_eq!(b["connect"], "SandboxNotFoundException", "{b}");
    assert_eq!(b["kill"], false, "{b}");
    assert_eq!(b["listed"], serde_json::json!([]), "{b}");
    assert_eq!(
        b["forged_list"],
        serde_json::json!([503, "unavailable"]),
        "{b}"
    );
    // Alice's sandbox is untouched.
    let api = serve::Api::new(&serve, &alice);
    let (status, s) = api
        .json(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(s["state"], "running", "{s}");
}

/// An admin's template (jq, built offline as tests/serve_templates.rs does; later runs find
/// it by its content hash) chosen by name from the SDK; an unknown name is E2B's not-found
/// listing the names this server knows.
#[tokio::test]
async fn e2b_sdk_chooses_a_template_by_name() {
    let env = Env::new("[[templates]]\nname = \"jq\"\npackages = [\"jq\"]\n").await;
    let out = env
        .cmd()
        .env("SANDBOXD_IMAGE_KEEP_OLD", "1")
        .args(["image", "build", "--template", "jq"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "image build --template jq: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = env.add_user("tess", &[]);
    let serve = env.start();
    let o = sdk(&serve, &key, "template", &[("TEMPLATE", "jq")]).await;
    assert_eq!(o["jq"], "42\n", "{o}");
    assert_eq!(o["template_id"], "jq", "{o}");
    assert_eq!(o["listed_template"], serde_json::json!(["jq"]), "{o}");
    let unknown = o["unknown"].as_str().unwrap();
    assert!(
        unknown.contains("no-such-template")
            && unknown.contains("base, code-interpreter-v1, default, jq"),
        "{o}"
    );
    // /v1 sees the session, made from the template.
    let id = o["sandbox_id"].as_str().unwrap();
    let api = serve::Api::new(&serve, &key);
    let (status, s) = api
        .json(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["metadata"]["e2b.template"], "jq", "{s}");
    assert_eq!(
        s["template"], "jq",
        "the session view names its template: {s}"
    );
    wait_gone(&env, id).await;

    // Sessions made through /v1: the view names the template (`default` for the default
    // image), and E2B's get names it too (E2B's `base` for the default image).
    for (asked, view, e2b) in [
        (serde_json::json!({"template": "jq"}), "jq", "jq"),
        (serde_json::json!({}), "default", "base"),
    ] {
        let (status, v) = api
            .json(reqwest::Method::POST, "/v1/sessions", Some(asked))
            .await;
        assert_eq!(status, 201, "{v}");
        assert_eq!(v["template"], view, "{v}");
        let sid = v["id"].as_str().unwrap();
        let (status, got) = api
            .json(reqwest::Method::GET, &format!("/v1/sessions/{sid}"), None)
            .await;
        assert_eq!((status, &got["template"]), (200, &serde_json::json!(view)));
        let (status, e) = api
            .json(reqwest::Method::GET, &format!("/e2b/sandboxes/{sid}"), None)
            .await;
        assert_eq!(status, 200, "{e}");
        assert_eq!(e["templateID"], e2b, "{e}");
        let (status, _) = api
            .json(
                reqwest::Method::DELETE,
                &format!("/v1/sessions/{sid}"),
                None,
            )
            .await;
        assert_eq!(status, 204);
    }
}

/// E2B's pause is sandboxd's hibernation: the owner pauses their sandbox, it shows
/// `paused`, its container is gone; connecting resumes it with its /workspace (not /tmp),
/// and an in-sandbox call to a paused sandbox resumes it too.
#[tokio::test]
async fn e2b_sdk_pause_and_resume() {
    let env = Env::new("").await;
    let key = env.add_user("paula", &[]);
    let serve = env.start();
    let p = sdk(&serve, &key, "pause", &[]).await;
    let id = p["sandbox_id"].as_str().unwrap();
    assert_eq!(p["paused"], true, "{p}");
    assert_eq!(p["pause_again"], false, "{p}");
    assert!(
        p["full"].as_str().unwrap().contains("not its memory"),
        "{p}"
    );
    assert_eq!(p["state"], "paused", "{p}");
    assert_eq!(strs(&p["listed_paused"]), [id.to_string()], "{p}");
    assert_eq!(p["listed_running"], serde_json::json!([]), "{p}");
    assert_eq!(strs(&p["listed_any"]), [id.to_string()], "{p}");
    assert_eq!(p["is_running"], false, "{p}");
    assert_eq!(p["state_after_probe"], "paused", "{p}");
    let runtime = env.runtime_id(id).await;
    assert!(
        !container_of(&runtime, false),
        "a paused sandbox has no container"
    );
    let api = serve::Api::new(&serve, &key);
    let (status, s) = api
        .json(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["state"], "hibernated", "{s}");

    let r = sdk(&serve, &key, "resume", &[("SANDBOX_ID", id)]).await;
    assert_eq!(r["state"], "running", "{r}");
    assert_eq!(r["file"], "kept across a pause", "{r}");
    assert_eq!(r["tmp_kept"], false, "{r}");
    assert_eq!(r["echo"], "back\n", "{r}");
    assert_eq!(r["connect_running"], "running", "{r}");
    assert_eq!(r["paused_again"], true, "{r}");
    assert_eq!(r["auto_resumed"], "kept across a pause", "{r}");
    assert_eq!(r["state_after"], "running", "{r}");
    assert!(container_of(&runtime, true), "the resumed sandbox runs");

    // Another user neither sees nor pauses it.
    let bob = env.add_user("bob", &[]);
    let b = sdk(&serve, &bob, "foreign", &[("SANDBOX_ID", id)]).await;
    assert_eq!(b["connect"], "SandboxNotFoundException", "{b}");
    let bob_api = serve::Api::new(&serve, &bob);
    let (status, _) = bob_api
        .json(
            reqwest::Method::POST,
            &format!("/e2b/sandboxes/{id}/pause"),
            Some(serde_json::json!({})),
        )
        .await;
    assert_eq!(status, 404);
    let (_, s) = api
        .json(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(s["state"], "running", "{s}");
}

/// set_timeout extends as well as shortens, never above the admin's cap (900 s here), and
/// the end time the SDK reads says what was applied; a paused sandbox stays paused.
#[tokio::test]
async fn e2b_sdk_set_timeout_extends_up_to_the_cap() {
    let env = Env::new("idle_timeout_secs = 900").await;
    let key = env.add_user("tim", &[]);
    let serve = env.start();
    let o = sdk(&serve, &key, "timeout", &[]).await;
    // [end - before the call, end - after it]: the timeout applied lies between them (a
    // second either side for the clocks' rounding; the timeouts differ by far more).
    let applied = |name: &str, secs: f64| {
        let v = o[name].as_array().unwrap();
        let (from_before, from_after) = (v[0].as_f64().unwrap(), v[1].as_f64().unwrap());
        assert!(
            from_before >= secs - 1.0 && from_after <= secs + 1.0,
            "{name}: {secs} s applied? {o}"
        );
    };
    applied("longer", 300.0);
    applied("shorter", 30.0);
    applied("above_cap", 900.0);
    applied("paused", 120.0);
    assert_eq!(o["paused_state"], "paused", "{o}");
    assert_eq!(o["connect_longer"], "running", "{o}");
    let id = o["sandbox_id"].as_str().unwrap();
    let api = serve::Api::new(&serve, &key);
    let (status, s) = api
        .json(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
        .await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["idle_timeout"], 200, "connect's longer timeout: {s}");
    assert_eq!(s["state"], "running", "{s}");
}
