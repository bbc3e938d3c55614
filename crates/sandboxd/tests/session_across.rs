//! A kept session's tool state across sandboxd processes, as a user gets it from the CLI: the
//! real binary, engine and image, the LLM faked at the HTTP boundary. Run 1 (`run --keep`)
//! sets a python variable and opens a page; run 2 (`run --session ID`, a new process) reads
//! the variable and finds the page still open. The editor's undo works on an edit an earlier
//! `sandboxd tool` process made.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::path::Path;

use serde_json::{Value, json};
use support::cli::{kept_session_id, sandboxd};
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing};

/// The content of the last tool message of a request.
fn last_tool_result(body: &Value) -> String {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string())
        .unwrap_or_default()
}

const PAGE: &str = "data:text/html,<title>Page of run one</title><h1>left open by run 1</h1>";

#[tokio::test]
async fn python_variables_and_the_browser_page_survive_into_a_second_process() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(vec![
        Reply::tool("python", json!({"code": "x = 41\nprint('x is set')"})),
        Reply::tool("browser_use", json!({"action": "go_to_url", "url": PAGE})),
        Reply::tool("terminate", json!({"status": "success", "answer": "set"})),
        Reply::tool("python", json!({"code": "x + 1"})),
        Reply::tool("browser_use", json!({"action": "screenshot"})),
        Reply::tool("terminate", json!({"status": "success", "answer": "42"})),
    ])
    .await;
    let (_id, _cleanup, _) = support::cli::keep_then_continue(
        dir.path(),
        &llm,
        "Set x to 41 and open the page",
        "What is x + 1, and which page is open?",
    )
    .await;

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 6, "{reqs:#?}");
    for (i, body) in reqs.iter().enumerate() {
        check_tool_pairing(body).unwrap_or_else(|e| panic!("request {i}: {e}"));
    }
    // Run 2's first request carries run 1: its task and its tool results.
    let opening = serde_json::to_string(&reqs[3]["messages"]).unwrap();
    assert!(
        opening.contains("Set x to 41 and open the page"),
        "{opening}"
    );
    assert!(opening.contains("x is set"), "{opening}");
    assert!(opening.contains("Page of run one"), "{opening}");
    // The same interpreter: x from run 1.
    let python = last_tool_result(&reqs[4]);
    assert!(python.contains("42"), "{python}");
    assert!(!python.contains("NameError"), "{python}");
    let run2 = serde_json::to_string(&reqs[5]).unwrap();
    assert!(!run2.contains("fresh python interpreter"), "{run2}");
    // The same browser: run 1's page, not a new blank tab.
    let browser = last_tool_result(&reqs[5]);
    assert!(browser.contains("Page of run one"), "{browser}");
    assert!(!run2.contains("could not be reached"), "{run2}");
    assert!(!run2.contains("was restarted"), "{run2}");
}

/// One `sandboxd tool` call in `dir`; returns (success, stdout, stderr).
fn tool(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = sandboxd(dir).arg("tool").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn undo_edit_reverts_an_edit_made_by_an_earlier_process() {
    let dir = tempfile::tempdir().unwrap();
    let create = json!({"command": "create", "path": "/workspace/notes.txt", "file_text": "first version\n"});
    let (ok, out, err) = tool(
        dir.path(),
        &["--keep", "str_replace_editor", &create.to_string()],
    );
    assert!(ok, "{out}{err}");
    let id = kept_session_id(&err);
    let _cleanup = support::cli::cleanup(&id);

    let edit = json!({"command": "str_replace", "path": "/workspace/notes.txt", "old_str": "first", "new_str": "second"});
    let (ok, out, err) = tool(
        dir.path(),
        &["--session", &id, "str_replace_editor", &edit.to_string()],
    );
    assert!(ok, "{out}{err}");

    // A third process undoes the second one's edit.
    let undo = json!({"command": "undo_edit", "path": "/workspace/notes.txt"});
    let (ok, out, err) = tool(
        dir.path(),
        &["--session", &id, "str_replace_editor", &undo.to_string()],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("undone"), "{out}");
    let cat = json!({"command": "cat /workspace/notes.txt"});
    let (ok, out, err) = tool(dir.path(), &["--session", &id, "bash", &cat.to_string()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("first version"), "{out}");

    // And a fourth undoes the first process's create: the file is gone.
    let (ok, out, err) = tool(
        dir.path(),
        &["--session", &id, "str_replace_editor", &undo.to_string()],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("removed"), "{out}");
    let (_, out, _) = tool(
        dir.path(),
        &[
            "--session",
            &id,
            "bash",
            &json!({"command": "ls /workspace"}).to_string(),
        ],
    );
    assert!(!out.contains("notes.txt"), "{out}");

    // The history is a private file of the data dir, not something in the sandbox.
    let record = dir
        .path()
        .join("data/runs/sessions")
        .join(format!("{id}.undo.json"));
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&record).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "{mode:o}");
}
