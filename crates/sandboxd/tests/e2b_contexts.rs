//! The code interpreter's contexts (E2B's `/contexts`) across two `sandboxd serve` replicas
//! on one Postgres, driven by the official `e2b-code-interpreter` SDK (tests/e2b/
//! contexts_check.py, one step per run against one replica): a context created through
//! replica A is listed, used with its variables and its cwd, restarted and removed through
//! replica B (its interpreter's files go with it), and the other replica sees each change;
//! the cap of 8 holds across the replicas; after a pause (hibernation) and a resume the
//! contexts are still listed and run, with their variables gone and the first execution
//! saying so, once; another user's contexts are unknown to them (404), and the contexts of
//! another user's sandbox answer as those of a sandbox that does not exist.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::e2b_sdk::python;
use crate::serve::Serve;
use crate::serve_replicas::Cluster;
use crate::support::fake_llm::FakeLlm;

/// Runs one step of contexts_check.py against `serve`, with what earlier steps printed.
async fn step(serve: &Serve, key: &str, name: &str, state: &Value) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/contexts_check.py");
    let out = tokio::process::Command::new(python())
        .arg(script)
        .arg(name)
        .env("E2B_API_URL", serve.url("/e2b"))
        .env("E2B_SANDBOX_URL", serve.url("/e2b/sandbox"))
        .env("E2B_API_KEY", key)
        .env("E2B_HTTP_VERSION", "1.1")
        .env("STATE", state.to_string())
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), out)
        .await
        .expect("contexts_check.py finishes")
        .expect("run contexts_check.py");
    assert!(
        out.status.success(),
        "contexts_check.py {name} failed:\n{}\n--- serve log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        serve.log.lock().unwrap()
    );
    serde_json::from_slice(&out.stdout).expect("contexts_check.py prints JSON")
}

fn merge(state: &mut Value, more: &Value) {
    for (k, v) in more.as_object().unwrap() {
        state[k] = v.clone();
    }
}

fn ids(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn code_contexts_are_shared_by_the_replicas_and_survive_a_pause() {
    let llm = FakeLlm::start(vec![]).await;
    let Some(c) = Cluster::start(2, &llm, "").await else {
        return;
    };
    let key = c.add_user("ada", &[]);
    let (a, b) = (c.serve(0), c.serve(1));
    let mut state = json!({});
    let a1 = step(a, &key, "a1", &state).await;
    merge(&mut state, &a1);
    let [c1, c2, c3, c4] = ["c1", "c2", "c3", "c4"].map(|k| state[k].as_str().unwrap().to_string());

    // B lists A's contexts (in order, with their cwd) and uses them with their variables.
    let b1 = step(b, &key, "b1", &state).await;
    let listed = json!([
        ["default", "/workspace"],
        [c1, "/tmp"],
        [c2, "/workspace"],
        [c3, "/workspace"],
        [c4, "/workspace"]
    ]);
    assert_eq!(b1["listed"], listed, "{b1}");
    assert_eq!(
        b1["v"],
        json!({"text": "42", "stderr": [], "error": null}),
        "{b1}"
    );
    assert_eq!(b1["getcwd"], "'/tmp'", "{b1}");
    assert_eq!(
        b1["w_after_restart"]["text"], "False",
        "restarted from B: {b1}"
    );
    assert_eq!(b1["made"].as_array().unwrap().len(), 4, "{b1}");
    let ninth = b1["ninth"].as_str().unwrap();
    assert!(ninth.contains("8 code contexts"), "{b1}");

    // The cap B filled holds on A; A uses the context B used last, its variables kept.
    let a2 = step(a, &key, "a2", &state).await;
    assert!(
        a2["ninth"].as_str().unwrap().contains("8 code contexts"),
        "{a2}"
    );
    assert_eq!(
        a2["v"],
        json!({"text": "41", "stderr": [], "error": null}),
        "{a2}"
    );

    // B removes A's context: gone for both, its interpreter's files too, its place free.
    let b2 = step(b, &key, "b2", &state).await;
    assert!(!ids(&b2["listed"]).contains(&c1), "{b2}");
    assert_eq!(ids(&b2["listed"]).len(), 8, "the default and seven: {b2}");
    let files = ids(&b2["files"]);
    assert!(files.iter().all(|f| !f.ends_with(&c1)), "{files:?}");
    assert!(
        files.iter().any(|f| f.ends_with(&c3)),
        "the others' stay: {files:?}"
    );
    assert!(
        b2["removed_run"]
            .as_str()
            .unwrap()
            .starts_with("NotFoundException"),
        "{b2}"
    );
    assert!(
        b2["remove_again"]
            .as_str()
            .unwrap()
            .starts_with("NotFoundException"),
        "{b2}"
    );
    let a3 = step(a, &key, "a3", &state).await;
    assert_eq!(a3["listed"], b2["listed"], "{a3}");
    assert!(
        a3["removed_run"]
            .as_str()
            .unwrap()
            .starts_with("NotFoundException"),
        "{a3}"
    );
    assert_eq!(a3["paused"], true, "{a3}");
    let mut before_pause = ids(&a3["listed"]);
    before_pause.push(a3["made"].as_str().unwrap().to_string());

    // Resumed through A (each replica keeps its snapshots in its own data directory), then
    // used through B: the contexts are there, their variables are not, and the first
    // execution in each says so, once.
    let a4 = step(a, &key, "a4", &state).await;
    assert_eq!(a4["state"], "running", "{a4}");
    let b3 = step(b, &key, "b3", &state).await;
    assert_eq!(ids(&b3["listed"]), before_pause, "{b3}");
    assert_eq!(b3["z"]["text"], "False", "{b3}");
    let note = ids(&b3["z"]["stderr"]).concat();
    assert!(
        note.starts_with("sandboxd: ")
            && note.contains("paused and resumed")
            && note.contains("variables"),
        "{b3}"
    );
    assert_eq!(
        b3["z_again"],
        json!({"text": "6", "stderr": [], "error": null}),
        "{b3}"
    );
    assert_eq!(b3["c4"]["text"], "'/workspace'", "{b3}");
    assert_eq!(
        b3["default"],
        json!({"text": "2", "stderr": [], "error": null}),
        "{b3}"
    );

    // Another user: A's context ids are unknown in their own sandbox; A's sandbox's contexts
    // answer as those of a sandbox that does not exist.
    let bob = c.add_user("bob", &[]);
    let f = step(b, &bob, "foreign", &state).await;
    for call in ["run", "remove", "restart"] {
        let e = f[call].as_str().unwrap();
        assert!(
            e.starts_with("NotFoundException") && e.contains("not found"),
            "{call}: {f}"
        );
    }
    assert_eq!(ids(&f["own_listed"]), ["default"], "{f}");
    for raw in ["list_victim", "remove_victim"] {
        assert_eq!(f[raw][0], f["list_missing"][0], "{raw}: {f}");
        assert!(
            f[raw][1].as_str().unwrap().contains("was not found"),
            "{raw}: {f}"
        );
    }
    assert!(!f["list_victim"][1].as_str().unwrap().contains(&c3), "{f}");
    // Bob changed nothing of Ada's.
    let b4 = step(b, &key, "listing", &state).await;
    assert!(ids(&b4["listed"]).contains(&c3), "{b4}");
}
