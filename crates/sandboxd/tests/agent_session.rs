//! Runs as library calls (`run_in_session`) on the real engine and image, the LLM faked at
//! the HTTP boundary: two runs in one session keep the python variables, the browser's tab,
//! the editor's undo history and the conversation; the events of a run are numbered, stamped
//! and carry image references; the session lease removes the container on every path.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandboxd_core::agent::transcript::{Transcript, load_image};
use sandboxd_core::agent::{
    EventKind, FinishReason, History, MemorySink, RunContext, RunRequest, SessionLease,
    run_in_session,
};
use sandboxd_core::config::Config;
use sandboxd_core::tools::ask_human::NoHuman;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing};
use tokio_util::sync::CancellationToken;

fn context(llm: &FakeLlm, transcripts: &std::path::Path) -> RunContext {
    let config = Config::load_with_env(None, &[]).expect("default config");
    let mut ctx = RunContext::new(llm.client(), config);
    ctx.transcripts = Some(transcripts.to_path_buf());
    ctx
}

/// The content of the tool message answering the call of `tool` in request `body`.
fn tool_results(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string())
        .collect()
}

fn container_exists(session_id: &str) -> bool {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=sandboxd.session={session_id}"),
        ])
        .output()
        .expect("docker ps");
    !String::from_utf8_lossy(&out.stdout).trim().is_empty()
}

#[tokio::test]
async fn two_runs_in_one_session_keep_python_the_browser_undo_and_the_conversation() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let page = "<!doctype html><title>Run one page</title><h1>from run one</h1>";
    let llm = FakeLlm::start(vec![
        // Run 1.
        Reply::tool(
            "python",
            json!({"code": "import matplotlib.pyplot as plt\nx = 41\nplt.plot([1, 2, 3])\nx"}),
        ),
        Reply::tool(
            "str_replace_editor",
            json!({"command": "create", "path": "/workspace/page.html", "file_text": page}),
        ),
        Reply::tool(
            "str_replace_editor",
            json!({"command": "str_replace", "path": "/workspace/page.html",
                   "old_str": "from run one", "new_str": "edited in run one"}),
        ),
        Reply::tool(
            "browser_use",
            json!({"action": "go_to_url", "url": "file:///workspace/page.html"}),
        ),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "set up"}),
        ),
        // Run 2.
        Reply::tools(vec![
            ("python", json!({"code": "x + 1"})),
            ("browser_use", json!({"action": "screenshot"})),
            (
                "str_replace_editor",
                json!({"command": "undo_edit", "path": "/workspace/page.html"}),
            ),
        ]),
        Reply::tool("terminate", json!({"status": "success", "answer": "42"})),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ctx = context(&llm, dir.path());

    let first_events = MemorySink::new();
    let first = run_in_session(
        &ctx,
        &s,
        RunRequest::new("Set x to 41 in python and open the page"),
        Arc::new(NoHuman),
        first_events.clone(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(first.reason.is_success(), "{:?}", first.reason);

    // Run 1's events: 1..n, time never goes back, the plot resolves to PNG bytes.
    let events = first_events.events();
    let mut last = None;
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1);
        assert_eq!(e.run_id, first.run_id);
        let at = chrono::DateTime::parse_from_rfc3339(&e.at).unwrap();
        assert!(last.is_none_or(|l| l <= at));
        last = Some(at);
    }
    let plot = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolResult {
                name,
                image: Some(image),
                ..
            } if name == "python" => Some(image.clone()),
            _ => None,
        })
        .expect("the python result refers to its plot");
    let png = first_events.image(&plot).expect("the sink resolves it");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    // The transcript (written by its sink) resolves the same reference to the same bytes.
    let transcript = Transcript::load(first.transcript.as_ref().expect("a transcript")).unwrap();
    assert_eq!(transcript.events.len(), events.len());
    assert_eq!(load_image(dir.path(), &plot).unwrap(), png.to_vec());

    let second_events = MemorySink::new();
    let second = run_in_session(
        &ctx,
        &s,
        RunRequest::new("Now add one to x"),
        Arc::new(NoHuman),
        second_events.clone(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        second.reason,
        FinishReason::Terminated {
            status: "success".into()
        }
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 7);
    for (i, body) in reqs.iter().enumerate() {
        check_tool_pairing(body).unwrap_or_else(|e| panic!("request {i}: {e}"));
    }
    // Run 2's first request: run 1's task and results, then the new task last.
    let opening = &reqs[5];
    let text = opening.to_string();
    assert!(text.contains("Set x to 41 in python and open the page"));
    let msgs = opening["messages"].as_array().unwrap();
    assert_eq!(msgs.last().unwrap()["content"], "Now add one to x");
    assert_eq!(
        tool_results(opening).len(),
        5,
        "run 1's five tool results (terminate included) are there"
    );
    assert!(matches!(
        second_events.events()[0].kind,
        EventKind::RunStarted {
            continued_messages: n,
            ..
        } if n > 0
    ));
    // The tools kept their state: python's x, the browser's tab, the editor's undo step.
    let results = tool_results(&reqs[6]);
    let run2 = &results[results.len() - 3..];
    assert!(run2[0].contains("42"), "python: {}", run2[0]);
    assert!(
        run2[1].contains("Run one page") && run2[1].contains("file:///workspace/page.html"),
        "browser: {}",
        run2[1]
    );
    assert!(!run2[2].contains("Error"), "undo: {}", run2[2]);
    let content = s
        .sandbox
        .read_file("/workspace/page.html")
        .await
        .expect("the page");
    assert!(
        String::from_utf8_lossy(&content).contains("from run one"),
        "the undo of run 1's edit worked in run 2"
    );

    // History::Fresh starts over: the model sees only the new task.
    let llm2 = FakeLlm::start(vec![Reply::text("fresh")]).await;
    let ctx2 = context(&llm2, dir.path());
    let mut fresh = RunRequest::new("A new start");
    fresh.history = History::Fresh;
    run_in_session(
        &ctx2,
        &s,
        fresh,
        Arc::new(NoHuman),
        MemorySink::new(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        llm2.requests()[0]["messages"].as_array().unwrap().len(),
        2,
        "system and task only"
    );
}

#[tokio::test]
async fn a_bad_mcp_file_fails_before_the_run_and_the_lease_removes_the_container() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let id = s.id.clone();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("mcp.json");
    std::fs::write(&bad, "{ not json").unwrap();
    let llm = FakeLlm::start(vec![]).await;
    let ctx = context(&llm, dir.path());
    let lease = SessionLease::new(m.clone(), s, false);
    let mut request = RunRequest::new("use the tools");
    request.mcp_servers = Some(bad);
    let err = run_in_session(
        &ctx,
        lease.session(),
        request,
        Arc::new(NoHuman),
        MemorySink::new(),
        CancellationToken::new(),
    )
    .await
    .expect_err("an unreadable MCP file is an error");
    assert!(err.to_string().contains("mcp.json"), "{err}");
    assert!(llm.requests().is_empty(), "the model was never asked");
    // The caller returns early, as with `?`: dropping the lease removes the container.
    drop(lease);
    let deadline = Instant::now() + Duration::from_secs(20);
    while container_exists(&id) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!container_exists(&id), "the container was left behind");
}
