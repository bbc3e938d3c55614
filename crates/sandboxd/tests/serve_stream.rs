//! The model's text streamed through `sandboxd serve` as a real process (real engine and
//! image, the LLM faked at the HTTP boundary, streaming its answer in fragments): the SSE
//! follower gets `delta` events (no id) with the first words while the answer is still being
//! written, and a follower that resumes mid-run gets the whole message once, never pieces
//! again, with every seq exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::time::Duration;

use serde_json::{Value, json};

use serve::runs::{SERVER, events, llm_config, start_run};
use serve::{Api, Env};
use support::fake_llm::{FakeLlm, Gate, Piece, Reply};

/// One SSE block as sent: its event name, its id if it has one, its data.
#[derive(Debug, Clone)]
struct Block {
    event: String,
    id: Option<u64>,
    data: Value,
}

/// Reads blocks from a stream that stays open until `stop` says so, or the stream ends.
async fn read_until(
    resp: &mut reqwest::Response,
    buf: &mut String,
    stop: impl Fn(&Block) -> bool,
) -> Vec<Block> {
    let mut out = Vec::new();
    loop {
        while let Some(end) = buf.find("\n\n") {
            let text: String = buf.drain(..end + 2).collect();
            let mut block = Block {
                event: "message".into(),
                id: None,
                data: Value::Null,
            };
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    block.event = v.to_string();
                } else if let Some(v) = line.strip_prefix("id: ") {
                    block.id = v.parse().ok();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    block.data = serde_json::from_str(v).unwrap();
                }
            }
            if block.data.is_null() {
                continue; // a keep-alive comment
            }
            let done = stop(&block);
            out.push(block);
            if done {
                return out;
            }
        }
        match tokio::time::timeout(Duration::from_secs(120), resp.chunk()).await {
            Ok(Ok(Some(c))) => buf.push_str(&String::from_utf8_lossy(&c)),
            Ok(Ok(None)) => return out,
            Ok(Err(e)) => panic!("stream failed: {e}"),
            Err(_) => panic!("nothing within 120 s; got {out:?}"),
        }
    }
}

fn texts(blocks: &[Block]) -> Vec<String> {
    blocks
        .iter()
        .filter(|b| b.event == "assistant_text")
        .map(|b| b.data["text"].as_str().unwrap().to_string())
        .collect()
}

fn ids(blocks: &[Block]) -> Vec<u64> {
    blocks.iter().filter_map(|b| b.id).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn deltas_show_the_text_live_and_a_resumed_follower_gets_whole_messages_once() {
    let gate = Gate::default();
    let llm = FakeLlm::start(vec![
        Reply::Streamed(vec![
            Piece::text("Looking "),
            Piece::text("around "),
            Piece::Wait(gate.clone()),
            Piece::text("the workspace."),
            Piece::call(0, "bash", "{\"command\": \"echo str"),
            Piece::args(0, "eamed-ok\"}"),
        ]),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "all streamed"}),
        ),
    ])
    .await;
    let env = Env::new(&format!("{}{SERVER}", llm_config(&llm))).await;
    let alice = env.add_user("alice", &[]);
    let serve = env.start();
    let a = Api::new(&serve, &alice);
    let run = start_run(&a, json!({"task": "look around", "session": {}})).await;
    let id = run["id"].as_str().unwrap().to_string();

    // The live follower: the first words arrive as a delta while the model holds the rest.
    let mut live = events(&a, &id, "", None).await;
    let mut buf = String::new();
    let first = read_until(&mut live, &mut buf, |b| b.event == "delta").await;
    let delta = first.last().unwrap();
    assert_eq!(delta.id, None, "a delta is not one of the run's events");
    assert_eq!(delta.data["step"], 1);
    assert!(
        "Looking around ".starts_with(delta.data["text"].as_str().unwrap()),
        "{delta:?}"
    );
    assert!(
        texts(&first).is_empty(),
        "the step has not ended: {first:?}"
    );
    let seen = *ids(&first).last().unwrap();
    // Placed after the run's last event (which may not have reached this follower yet).
    assert!(delta.data["after_seq"].as_u64().unwrap() >= seen);

    // A follower that resumes from there, while the answer is still being written.
    let mut resumed = events(&a, &id, "", Some(seen)).await;
    gate.open();
    let is_end = |b: &Block| b.event == "run_state" && b.data["state"] == "succeeded";
    let rest = read_until(&mut live, &mut buf, is_end).await;
    let again = read_until(&mut resumed, &mut String::new(), is_end).await;

    let all: Vec<Block> = first.iter().chain(rest.iter()).cloned().collect();
    let live_ids = ids(&all);
    assert_eq!(
        live_ids,
        (1..=live_ids.len() as u64).collect::<Vec<_>>(),
        "each seq once, in order"
    );
    assert_eq!(texts(&all), ["Looking around the workspace."]);
    let pieces: String = all
        .iter()
        .filter(|b| b.event == "delta")
        .map(|b| b.data["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        pieces, "Looking around the workspace.",
        "the pieces add up to the text"
    );
    let call = all.iter().find(|b| b.event == "tool_call").unwrap();
    assert_eq!(
        call.data["arguments"],
        "{\"command\": \"echo streamed-ok\"}"
    );

    // The resumed follower: exactly the events after `seen`, the whole text once.
    assert_eq!(ids(&again), live_ids[seen as usize..].to_vec());
    assert_eq!(texts(&again), ["Looking around the workspace."]);
    for b in again.iter().filter(|b| b.event == "delta") {
        assert!(b.data["step"].as_u64().unwrap() >= 1 && b.id.is_none());
    }
    // A replay after the end has no deltas at all: they were never stored.
    let mut replay = events(&a, &id, "?follow=false", None).await;
    let stored = read_until(&mut replay, &mut String::new(), |_| false).await;
    assert!(stored.iter().all(|b| b.event != "delta" && b.id.is_some()));
    assert_eq!(ids(&stored), live_ids);
}
