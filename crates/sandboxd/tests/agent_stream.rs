//! Token streaming, with the LLM faked at the HTTP boundary and the real engine and image:
//! text and a tool call that arrive in fragments are assembled into the same step, the text
//! reaches the sinks (and the CLI's terminal) while the answer is still being written, and
//! a server that refuses streaming gets plain requests from then on.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use sandboxd_core::agent::{Agent, AgentSettings, AgentTask, EventKind, FinishReason, MemorySink};
use sandboxd_core::config::Config;
use sandboxd_core::tools::ask_human::NoHuman;
use sandboxd_core::tools::session::session_tools;
use serde_json::json;
use support::cli::sandboxd;
use support::fake_llm::{FakeLlm, Gate, Piece, Reply, check_tool_pairing};
use tokio_util::sync::CancellationToken;

/// A reply that writes "Let me list " at once, holds until `gate` opens, then finishes its
/// text and a bash call whose arguments come in three fragments.
fn held_reply(gate: &Gate) -> Reply {
    Reply::Streamed(vec![
        Piece::text("Let me "),
        Piece::text("list "),
        Piece::Wait(gate.clone()),
        Piece::text("the files."),
        Piece::call(0, "bash", "{\"comm"),
        Piece::args(0, "and\": \"echo fr"),
        Piece::args(0, "agments-ok\"}"),
    ])
}

/// Polls `probe` until it is true; fails after a minute (a hang, not a timing).
async fn eventually(what: &str, probe: impl Fn() -> bool) {
    for _ in 0..3000 {
        if probe() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test]
async fn text_and_a_tool_call_in_fragments_make_one_step_and_the_text_comes_first() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![held_reply(&gate), Reply::text("All listed.")]).await;
    let config = Config::load_with_env(None, &[]).expect("default config");
    let tools = session_tools(&s, &config, Arc::new(NoHuman));
    let agent = Agent::new(llm.client(), tools, AgentSettings::from_config(&config));
    let sink = MemorySink::new();
    let run = {
        let sink = sink.clone();
        let task = AgentTask::new("list the files", "tester", s.id.clone());
        async move {
            agent
                .run(task, sink.as_ref(), CancellationToken::new())
                .await
        }
    };
    let run = tokio::spawn(run);

    // The first words are with the sinks while the model's answer is still held open.
    eventually("the first text delta", || {
        sink.deltas()
            .iter()
            .map(|d| d.text.as_str())
            .collect::<String>()
            == "Let me list "
    })
    .await;
    let events = sink.events();
    assert!(
        !events.iter().any(|e| matches!(
            e.kind,
            EventKind::AssistantText { .. } | EventKind::ToolCall { .. }
        )),
        "the step has not ended: {events:#?}"
    );
    let delta = &sink.deltas()[0];
    assert_eq!(delta.step, 1);
    assert_eq!(
        delta.after_seq,
        events.last().unwrap().seq,
        "placed after the last event"
    );
    gate.open();

    let outcome = run.await.unwrap();
    assert_eq!(outcome.reason, FinishReason::FinalAnswer);
    assert_eq!(outcome.answer.as_deref(), Some("All listed."));
    let events = sink.events();
    let text: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::AssistantText { step: 1, text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        text,
        ["Let me list the files."],
        "the whole text is the step's event"
    );
    let (args, output) = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolCall { arguments, .. } => Some(arguments.clone()),
            _ => None,
        })
        .zip(events.iter().find_map(|e| match &e.kind {
            EventKind::ToolResult { output, .. } => Some(output.clone()),
            _ => None,
        }))
        .expect("the call ran");
    assert_eq!(args, r#"{"command": "echo fragments-ok"}"#);
    assert!(output.contains("fragments-ok"), "{output}");
    let streamed: String = sink
        .deltas()
        .iter()
        .filter(|d| d.step == 1)
        .map(|d| d.text.as_str())
        .collect();
    assert_eq!(streamed, "Let me list the files.");
    let reqs = llm.requests();
    assert_eq!(reqs[0]["stream"], true);
    assert_eq!(reqs[0]["stream_options"]["include_usage"], true);
    for body in &reqs {
        check_tool_pairing(body).unwrap();
    }
}

#[tokio::test]
async fn a_server_that_refuses_streaming_gets_plain_requests_and_the_run_goes_on() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm = FakeLlm::start(vec![
        Reply::error(400, "stream is not supported by this deployment"),
        Reply::tool("bash", json!({"command": "echo plain"})),
        Reply::text("done plainly"),
    ])
    .await;
    let config = Config::load_with_env(None, &[]).expect("default config");
    let tools = session_tools(&s, &config, Arc::new(NoHuman));
    let agent = Agent::new(llm.client(), tools, AgentSettings::from_config(&config));
    let sink = MemorySink::new();
    let task = AgentTask::new("say it plainly", "tester", s.id.clone());
    let outcome = agent
        .run(task, sink.as_ref(), CancellationToken::new())
        .await;
    assert_eq!(
        outcome.answer.as_deref(),
        Some("done plainly"),
        "{:#?}",
        sink.events()
    );
    let streams: Vec<bool> = llm.requests().iter().map(|r| r["stream"] == true).collect();
    assert_eq!(streams, [true, false, false]);
    assert!(sink.deltas().is_empty(), "no stream, no pieces");
}

/// `sandboxd run` prints the model's words as they arrive: the first ones are on stderr
/// while the fake model still holds the rest of its answer.
#[test]
fn the_cli_prints_the_text_before_the_step_ends() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let gate = Gate::default();
    let llm = rt.block_on(FakeLlm::start(vec![
        held_reply(&gate),
        Reply::text("All listed."),
    ]));
    let dir = tempfile::tempdir().unwrap();
    let mut child = sandboxd(dir.path())
        .args(["run", "--prompt", "list the files"])
        .env("SANDBOXD_LLM_BASE_URL", llm.base_url())
        .env("SANDBOXD_LLM_MODEL", "fake-model")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    // Byte by byte: the streamed text is on an open line (no newline until the step ends).
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&seen).contains("💭 Let me list ") {
        let n = stderr.read(&mut byte).unwrap();
        assert!(
            n > 0,
            "stderr ended first: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.push(byte[0]);
    }
    assert!(
        !String::from_utf8_lossy(&seen).contains("🔧"),
        "no tool ran yet"
    );
    gate.open();
    let mut rest = String::new();
    for line in stderr.by_ref().lines() {
        rest.push_str(&line.unwrap());
        rest.push('\n');
    }
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{rest}");
    let all = format!("{}{rest}", String::from_utf8_lossy(&seen));
    assert!(all.contains("💭 Let me list the files.\n"), "{all}");
    assert_eq!(
        all.matches("Let me list").count(),
        1,
        "the text is shown once: {all}"
    );
    assert!(all.contains("fragments-ok"), "{all}");
    assert!(stdout.contains("All listed."), "{stdout}");
    drop(rt);
}
