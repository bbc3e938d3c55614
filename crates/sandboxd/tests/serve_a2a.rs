//! A2A on `sandboxd serve`, proven with the official Python `a2a-sdk` (tests/a2a/client_sdk.py)
//! against a real serve process, the real engine and image, and a scripted fake LLM: the
//! card, SendMessage to a completed task with its answer and a file, a continued context,
//! streaming in order, input-required answered by the next message, SubscribeToTask after a
//! disconnect, the 0.3 names, CancelTask, another user's task not found, a missing or wrong
//! key refused. The script runs its steps in order, the order of the LLM's replies here.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use serve::Env;
use serve::runs::{SERVER, llm_config};
use support::fake_llm::{FakeLlm, Reply};

/// The interpreter of the venv with the official `a2a-sdk`: SANDBOXD_TEST_A2A_PYTHON, else
/// .venv-a2a in the repo (made by .ci/run).
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("SANDBOXD_TEST_A2A_PYTHON") {
        return PathBuf::from(p);
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv-a2a/bin/python");
    assert!(
        repo.exists(),
        "the Python A2A SDK is missing: python3 -m venv .venv-a2a && .venv-a2a/bin/pip install 'a2a-sdk[http-server]==1.3.0'"
    );
    repo
}

pub fn script() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/a2a/client_sdk.py")
        .display()
        .to_string()
}

fn done(answer: &str) -> Reply {
    Reply::tool("terminate", json!({"status": "success", "answer": answer}))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_official_a2a_sdk_drives_runs_through_every_method() {
    let llm = FakeLlm::start(vec![
        // SendMessage: a file and an answer; then the same context again.
        Reply::tool(
            "bash",
            json!({"command": "echo hello-a2a > /workspace/report.txt"}),
        ),
        done("ANSWER-ONE"),
        done("ANSWER-AGAIN"),
        // SendStreamingMessage.
        done("ANSWER-TWO").with_content("STREAM-THINKING"),
        // input-required, answered by the next message.
        Reply::tool("ask_human", json!({"inquire": "Which color?"})),
        done("ANSWER-BLUE"),
        // SubscribeToTask after the client left: the run goes on for a while.
        Reply::tool("bash", json!({"command": "true"})).with_content("STEP-ONE"),
        done("ANSWER-RESUB").delayed(Duration::from_secs(3)),
        // 0.3.
        done("ANSWER-OLD"),
        // CancelTask: the model never answers in time.
        done("TOO-LATE").delayed(Duration::from_secs(120)),
    ])
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let alice = env.add_user("alice", &[]);
    let bob = env.add_user("bob", &[]);
    let serve = env.start();
    let out = tokio::process::Command::new(python())
        .arg(script())
        .arg(serve.url(""))
        .arg(&alice)
        .arg(&bob)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), out)
        .await
        .expect("the SDK script hung")
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("A2A-SDK-OK"),
        "the SDK script failed:\n{stdout}\n{stderr}"
    );
    // The answer the second message gave reached the model as the question's answer.
    let asked = llm
        .requests()
        .iter()
        .map(|r| r.to_string())
        .find(|r| r.contains("Which color?") && r.contains("blue"));
    assert!(asked.is_some(), "the model never saw the answer `blue`");
}
