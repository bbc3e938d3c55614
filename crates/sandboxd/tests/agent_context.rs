//! Context that lasts, on the real engine and image with the LLM faked at the HTTP
//! boundary: a long run with bulky outputs against a small window is condensed (old outputs
//! masked into files in /workspace, the middle summarized) so every request fits and the
//! pairing holds; a provider's context-length 400 condenses the history and the run goes on.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sandboxd_core::agent::{
    Agent, AgentSettings, AgentTask, Event, EventKind, FinishReason, MemorySink,
};
use sandboxd_core::config::Config;
use sandboxd_core::llm::{LlmClient, Tokenizer};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::tools::ask_human::NoHuman;
use sandboxd_core::tools::session::session_tools;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing};
use tokio_util::sync::CancellationToken;

/// The model's window in these tests, and the reply's share of it ([llm] max_tokens).
const WINDOW: usize = 16_384;
const MAX_TOKENS: u32 = 2_048;
/// A bash command whose output is 20 KB of prose (~4,400 tokens; the observation the model
/// sees is cut to max_observe, 10,000 characters).
const BULKY: &str =
    "yes 'the quick brown fox jumps over the lazy dog, again and again' | head -c 20000";
const SUMMARY: &str = "Summary: the agent printed the fox sentence many times; nothing failed.";

fn client(llm: &FakeLlm) -> Arc<LlmClient> {
    let mut settings = FakeLlm::settings();
    settings.context_window = WINDOW;
    settings.max_tokens = MAX_TOKENS;
    Arc::new(LlmClient::new(llm.endpoint(), None, settings))
}

fn agent(llm: &FakeLlm, session: &Session, max_steps: usize) -> Agent {
    let config = Config::load_with_env(None, &[]).expect("default config");
    let mut settings = AgentSettings::from_config(&config);
    settings.max_steps = max_steps;
    let tools = session_tools(session, &config, Arc::new(NoHuman));
    Agent::new(client(llm), tools, settings).with_workspace(session.sandbox.clone())
}

async fn run(agent: &Agent, session: &Session) -> (sandboxd_core::agent::RunOutcome, Vec<Event>) {
    let sink = MemorySink::new();
    let task = AgentTask::new(
        "print the fox sentence, a lot",
        "tester",
        session.id.clone(),
    );
    let outcome = agent
        .run(task, sink.as_ref(), CancellationToken::new())
        .await;
    (outcome, sink.events())
}

/// A summary request has no tools; the agent's requests always do.
fn is_summary(body: &Value) -> bool {
    body.get("tools").is_none()
}

/// The tokens of a request as sent (its JSON, messages and tools): what the provider counts.
fn request_tokens(body: &Value) -> usize {
    let text = format!(
        "{}{}",
        body["messages"],
        body.get("tools").unwrap_or(&Value::Null)
    );
    Tokenizer::Cl100k.count(&text)
}

fn condensed(events: &[Event]) -> Vec<(u64, u64, usize, usize, Vec<String>)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ContextCondensed {
                before_tokens,
                after_tokens,
                masked_outputs,
                summarized_messages,
                files,
                ..
            } => Some((
                *before_tokens,
                *after_tokens,
                *masked_outputs,
                *summarized_messages,
                files.clone(),
            )),
            _ => None,
        })
        .collect()
}

/// The agent's steps of the 60-step run (summary requests are not steps).
static STEPS: AtomicUsize = AtomicUsize::new(0);

fn sixty_steps(body: &Value) -> Reply {
    if is_summary(body) {
        return Reply::text(SUMMARY);
    }
    if STEPS.fetch_add(1, Ordering::SeqCst) < 60 {
        Reply::tool("bash", json!({ "command": BULKY }))
    } else {
        Reply::text("done: printed it sixty times")
    }
}

#[tokio::test]
async fn a_sixty_step_run_with_bulky_outputs_fits_a_16k_window_by_condensing() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm = FakeLlm::start_with_fallback(vec![], Reply::FromRequest(sixty_steps)).await;
    let (outcome, events) = run(&agent(&llm, &s, 61), &s).await;
    assert_eq!(outcome.reason, FinishReason::FinalAnswer, "{events:#?}");
    assert_eq!(outcome.steps, 61);

    let reqs = llm.requests();
    let steps: Vec<&Value> = reqs.iter().filter(|b| !is_summary(b)).collect();
    assert_eq!(steps.len(), 61);
    for (i, body) in reqs.iter().enumerate() {
        check_tool_pairing(body).unwrap_or_else(|e| panic!("request {i}: {e}"));
        let tokens = request_tokens(body);
        assert!(
            tokens <= WINDOW,
            "request {i} is {tokens} tokens, over the {WINDOW} window"
        );
    }
    // Every step's request keeps the system prompt and the task.
    for (i, body) in steps.iter().enumerate() {
        assert_eq!(body["messages"][0]["role"], "system", "step {i}");
        assert_eq!(
            body["messages"][1]["content"], "print the fox sentence, a lot",
            "step {i}"
        );
    }

    let done = condensed(&events);
    assert!(!done.is_empty(), "no context_condensed event");
    for (before, after, ..) in &done {
        assert!(
            after < before,
            "a condensation that did not shrink: {before} → {after}"
        );
    }
    let masked: usize = done.iter().map(|d| d.2).sum();
    let summarized: usize = done.iter().map(|d| d.3).sum();
    assert!(
        masked > 0 && summarized > 0,
        "masked {masked}, summarized {summarized}"
    );
    assert!(
        reqs.iter().any(is_summary),
        "the middle was summarized by the model"
    );

    // A masked output's full text is in the file its note names, in the sandbox.
    let file = done
        .iter()
        .flat_map(|d| d.4.iter())
        .next()
        .expect("a masked output's file");
    assert!(file.starts_with("/workspace/.sandboxd-context/"), "{file}");
    let kept = String::from_utf8(s.sandbox.read_file(file).await.unwrap()).unwrap();
    assert!(
        kept.contains("the quick brown fox"),
        "{}",
        &kept[..kept.len().min(200)]
    );
    let last = steps.last().unwrap().to_string();
    assert!(
        last.contains(SUMMARY),
        "the last request carries the summary"
    );
    assert!(
        steps
            .iter()
            .any(|b| b.to_string().contains(".sandboxd-context/")),
        "the model is told where a masked output's full text is"
    );
}

#[tokio::test]
async fn a_context_length_400_condenses_once_and_the_run_goes_on() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let bulky = || Reply::tool("bash", json!({ "command": BULKY }));
    let too_long = Reply::Error {
        status: 400,
        body: json!({"error": {
            "message": "This model's maximum context length is 16385 tokens. However, your messages resulted in 17210 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
        headers: Vec::new(),
    };
    fn after(body: &Value) -> Reply {
        if is_summary(body) {
            Reply::text(SUMMARY)
        } else {
            Reply::text("finished after the condensation")
        }
    }
    let llm = FakeLlm::start_with_fallback(
        vec![bulky(), bulky(), bulky(), bulky(), too_long],
        Reply::FromRequest(after),
    )
    .await;
    // The window is large here: only the provider's error can make the run condense.
    let mut settings = FakeLlm::settings();
    settings.context_window = 1_000_000;
    let config = Config::load_with_env(None, &[]).expect("default config");
    let mut agent_settings = AgentSettings::from_config(&config);
    agent_settings.max_steps = 10;
    let tools = session_tools(&s, &config, Arc::new(NoHuman));
    let client = Arc::new(LlmClient::new(llm.endpoint(), None, settings));
    let agent = Agent::new(client, tools, agent_settings).with_workspace(s.sandbox.clone());
    let (outcome, events) = run(&agent, &s).await;
    assert_eq!(outcome.reason, FinishReason::FinalAnswer, "{events:#?}");
    assert_eq!(
        outcome.answer.as_deref(),
        Some("finished after the condensation")
    );

    let done = condensed(&events);
    assert_eq!(done.len(), 1, "one condensation: {done:?}");
    assert!(done[0].1 < done[0].0);
    assert!(done[0].2 > 0, "old outputs were masked");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, EventKind::Error { .. })),
        "the 400 did not end the run"
    );
    let reqs = llm.requests();
    for (i, body) in reqs.iter().enumerate() {
        check_tool_pairing(body).unwrap_or_else(|e| panic!("request {i}: {e}"));
    }
    // The step refused (request 4) is asked again, condensed: smaller than what was refused.
    let steps: Vec<&Value> = reqs.iter().filter(|b| !is_summary(b)).collect();
    assert_eq!(steps.len(), 6);
    assert!(request_tokens(steps[5]) < request_tokens(steps[4]));
}
