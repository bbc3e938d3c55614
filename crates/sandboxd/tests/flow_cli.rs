//! `sandboxd run --plan` as a user runs it: the real binary, engine and image, the LLM faked
//! at the HTTP boundary. The live checklist on stderr, the summary on stdout, the files.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::path::Path;
use std::process::Command;

use serde_json::json;
use support::fake_llm::{FakeLlm, Reply};

fn sandboxd(cwd: &Path, llm: &FakeLlm) -> Command {
    let mut cmd = support::cli::sandboxd(cwd);
    cmd.env("SANDBOXD_LLM_BASE_URL", llm.base_url())
        .env("SANDBOXD_LLM_MODEL", "fake-model");
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn run_plan_shows_the_checklist_and_prints_the_summary() {
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "planning",
            json!({"command": "create", "title": "Report", "steps": ["Write the data", "Write the report"]}),
        ),
        Reply::tool("bash", json!({"command": "seq 3 > /workspace/data.txt"})),
        Reply::tool("terminate", json!({"status": "success", "answer": "data.txt has 1..3"})),
        Reply::tool(
            "terminate",
            json!({"status": "failure", "answer": "cannot write the report"}),
        ),
        Reply::tool(
            "terminate",
            json!({"status": "failure", "answer": "still cannot"}),
        ),
        Reply::text("The data is in data.txt; the report is missing."),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let mut cmd = sandboxd(dir.path(), &llm);
    cmd.args([
        "run",
        "--plan",
        "--no-input",
        "--prompt",
        "Make a report",
        "--output",
    ])
    .arg(&out_dir);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a blocked step is not a success\n{stderr}"
    );
    for needle in [
        "📋 plan plan-1 · Report · 2 steps",
        "▶ step 1: Write the data",
        "✓ step 1: data.txt has 1..3",
        "▶ step 2 (attempt 2): Write the report",
        "✗ step 2: blocked after 2 attempt(s)",
        "   ✓ 1. Write the data",
        "   ✗ 2. Write the report",
        "── flow partial: step 2 is blocked",
    ] {
        assert!(stderr.contains(needle), "{needle:?} missing:\n{stderr}");
    }
    assert!(
        stdout.starts_with("Partial result: step 2 of 2 (\"Write the report\") is blocked"),
        "{stdout}"
    );
    assert!(stdout.contains("The data is in data.txt; the report is missing."));
    assert!(
        !stdout.contains("data.txt has 1..3"),
        "step answers are progress, on stderr"
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("data.txt")).unwrap(),
        "1\n2\n3\n"
    );
}

/// A kept session's plans outlive the process: the next `run --plan --session` in a new
/// process hands out the next id (never plan-1 twice in one session), and its step sees the
/// earlier plan, with the status it ended in, through `planning list`.
#[tokio::test(flavor = "multi_thread")]
async fn a_kept_sessions_plans_carry_on_in_the_next_process() {
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "planning",
            json!({"command": "create", "title": "First plan", "steps": ["Write a"]}),
        ),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "a is written"}),
        ),
        Reply::text("Done with the first."),
        Reply::tool(
            "planning",
            json!({"command": "create", "title": "Second plan", "steps": ["Look back"]}),
        ),
        Reply::tool("planning", json!({"command": "list"})),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "looked"}),
        ),
        Reply::text("Done with the second."),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: Vec<String>| {
        let mut cmd = sandboxd(dir.path(), &llm);
        cmd.args(["run", "--plan", "--no-input", "--prompt", "Plan it"])
            .args(extra);
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
    };
    let first = run(vec!["--keep".into()]).await.unwrap();
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    assert!(stderr.contains("📋 plan plan-1 · First plan"), "{stderr}");
    let id = support::cli::kept_session_id(&stderr);
    let _cleanup = support::cli::cleanup(&id);
    let asked_before = llm.requests().len();

    let second = run(vec!["--session".into(), id.clone()]).await.unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{stderr}");
    assert!(stderr.contains("📋 plan plan-2 · Second plan"), "{stderr}");
    let listed = llm.requests()[asked_before..]
        .iter()
        .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str().map(str::to_string))
        .find(|c| c.starts_with("Plans in this session"))
        .expect("the step's planning list was answered");
    assert!(
        listed.contains("plan-1") && listed.contains("First plan"),
        "{listed}"
    );
    assert!(
        listed.contains("plan-2") && listed.contains("Second plan"),
        "{listed}"
    );
}
