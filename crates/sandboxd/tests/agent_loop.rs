//! The ReAct loop on the real engine and image, with the LLM faked at the HTTP boundary:
//! how runs end, bad calls as observations, the stuck nudge, trimming that never orphans a
//! tool message, clean state between runs, images, cancellation and transcripts.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandboxd_core::agent::transcript::{Transcript, TranscriptSink};
use sandboxd_core::agent::{
    Agent, AgentSettings, AgentTask, Event, EventKind, EventSink, FanOut, FinishReason, Image,
    MemorySink, NullSink, RunOutcome,
};
use sandboxd_core::config::Config;
use sandboxd_core::llm::LlmClient;
use sandboxd_core::sandbox::ExecRequest;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::tools::ask_human::NoHuman;
use sandboxd_core::tools::session::session_tools;
use sandboxd_core::tools::{Tool, ToolContext, ToolError, ToolRegistry, ToolResult};
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing, last_of_role};
use tokio_util::sync::CancellationToken;

fn settings(max_steps: usize) -> AgentSettings {
    let mut config = Config::load_with_env(None, &[]).expect("default config");
    config.agent.max_steps = max_steps;
    AgentSettings::from_config(&config)
}

fn tools(session: &Session) -> ToolRegistry {
    let config = Config::load_with_env(None, &[]).expect("default config");
    session_tools(session, &config, Arc::new(NoHuman))
}

async fn run(agent: &Agent, session: &Session, task: &str) -> (RunOutcome, Vec<Event>) {
    let sink = MemorySink::new();
    let outcome = agent
        .run(
            AgentTask::new(task, "tester", session.id.clone()),
            sink.as_ref(),
            CancellationToken::new(),
        )
        .await;
    (outcome, sink.events())
}

/// Sequence numbers 1..n without a gap or repeat, timestamps that never go back.
fn assert_well_ordered(events: &[Event]) {
    let mut last_at = None;
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "{events:#?}");
        let at = chrono::DateTime::parse_from_rfc3339(&e.at).expect("an RFC 3339 timestamp");
        assert!(
            last_at.is_none_or(|l| l <= at),
            "time went back at {}",
            e.seq
        );
        last_at = Some(at);
    }
}

fn assert_all_paired(llm: &FakeLlm) {
    for (i, body) in llm.requests().iter().enumerate() {
        if let Err(e) = check_tool_pairing(body) {
            panic!("request {i}: {e}\n{body:#}");
        }
    }
}

#[tokio::test]
async fn a_final_text_answer_ends_the_run_before_max_steps() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "bash",
            json!({"command": "echo 6*7 | bc 2>/dev/null || echo 42"}),
        ),
        Reply::text("The answer is 42."),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::new(llm.client(), tools(&s), settings(20));
    let memory = MemorySink::new();
    let transcript = Arc::new(TranscriptSink::new(dir.path().to_path_buf()));
    let sink = FanOut(vec![memory.clone(), transcript.clone()]);
    let outcome = agent
        .run(
            AgentTask::new("What is 6*7?", "tester", s.id.clone()),
            &sink,
            CancellationToken::new(),
        )
        .await;
    let events = memory.events();
    assert_eq!(outcome.reason, FinishReason::FinalAnswer);
    assert_eq!(outcome.answer.as_deref(), Some("The answer is 42."));
    assert_eq!(outcome.steps, 2);
    assert_eq!(llm.requests().len(), 2, "no request after the final answer");
    // Events: started, then the finish with its reason; tool result carries the output.
    assert!(matches!(
        events.first().map(|e| &e.kind),
        Some(EventKind::RunStarted { .. })
    ));
    assert!(matches!(
        events.last().map(|e| &e.kind),
        Some(EventKind::RunFinished {
            reason: FinishReason::FinalAnswer,
            ..
        })
    ));
    assert!(
        events.iter().any(
            |e| matches!(&e.kind, EventKind::ToolResult { output, .. } if output.contains("42"))
        )
    );
    // Every event is plain JSON and the seq numbers have no gap.
    assert_well_ordered(&events);
    for e in &events {
        let back: Event = serde_json::from_value(serde_json::to_value(e).unwrap()).unwrap();
        assert_eq!(&back, e);
    }
    // The transcript holds the messages and the same events.
    let path = &transcript.path().expect("a transcript");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let t = Transcript::load(path).unwrap();
    assert_eq!(t.run_id, outcome.run_id);
    assert_eq!(
        (t.owner.as_str(), t.session_id.as_str()),
        ("tester", s.id.as_str())
    );
    assert_eq!(t.events.len(), events.len());
    assert_eq!(
        t.messages.len(),
        5,
        "system, task, assistant+call, tool, final assistant"
    );
    // The system prompt describes the sandbox honestly.
    let sys = llm.requests()[0]["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        sys.contains("NO network") && sys.contains("/workspace") && sys.contains("terminate"),
        "{sys}"
    );
}

#[tokio::test]
async fn bad_calls_and_timeouts_become_observations_and_the_run_goes_on() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm = FakeLlm::start(vec![
        Reply::tool_raw("bash", "{\"command\": \"echo hi"),
        Reply::tool("no_such_tool", json!({"x": 1})),
        Reply::tool("bash", json!({"command": "sleep 30", "timeout": 1})),
        Reply::tool("bash", json!({"command": "echo still-alive"})),
        Reply::tool("terminate", json!({"status": "success", "answer": "ok"})),
    ])
    .await;
    let agent = Agent::new(llm.client(), tools(&s), settings(20));
    let (outcome, _) = run(&agent, &s, "try things").await;
    assert_eq!(
        outcome.reason,
        FinishReason::Terminated {
            status: "success".into()
        }
    );
    assert_eq!(outcome.answer.as_deref(), Some("ok"));
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 5);
    let obs = |i: usize| last_of_role(&reqs[i], "tool").unwrap();
    assert!(obs(1).contains("not valid JSON"), "{}", obs(1));
    assert!(
        obs(2).contains("no tool named \"no_such_tool\"") && obs(2).contains("bash"),
        "{}",
        obs(2)
    );
    assert!(obs(3).contains("timed out after 1s"), "{}", obs(3));
    assert!(obs(4).contains("still-alive"), "{}", obs(4));
    assert_all_paired(&llm);
}

#[tokio::test]
async fn max_steps_ends_the_run_with_that_reason() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm =
        FakeLlm::start_with_fallback(vec![], Reply::tool("bash", json!({"command": "date +%N"})))
            .await;
    let agent = Agent::new(llm.client(), tools(&s), settings(3));
    let (outcome, _) = run(&agent, &s, "loop forever").await;
    assert_eq!(outcome.reason, FinishReason::MaxSteps { max_steps: 3 });
    assert_eq!(outcome.steps, 3);
    assert_eq!(llm.requests().len(), 3);
}

#[tokio::test]
async fn the_stuck_nudge_appears_once_and_goes_away() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let same =
        || Reply::tool("bash", json!({"command": "ls /nonexistent"})).with_content("Let me look.");
    let llm = FakeLlm::start(vec![
        same(),
        same(),
        same(),
        Reply::tool("bash", json!({"command": "ls /"})).with_content("Something else."),
        Reply::text("done"),
    ])
    .await;
    let agent = Agent::new(llm.client(), tools(&s), settings(20));
    let (outcome, events) = run(&agent, &s, "find a file").await;
    assert_eq!(outcome.reason, FinishReason::FinalAnswer);
    let reqs = llm.requests();
    let nudges = |i: usize| {
        reqs[i]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| {
                m["role"] == "user"
                    && m["content"].as_str().is_some_and(|c| {
                        c.contains("Change your\nstrategy") || c.contains("Change your strategy")
                    })
            })
            .count()
    };
    assert_eq!(nudges(0), 0);
    assert_eq!(nudges(1), 0, "one step is not a repetition");
    assert_eq!(nudges(2), 1, "the nudge appears after the same step twice");
    assert_eq!(
        nudges(3),
        1,
        "still stuck: still exactly one nudge, never accumulated"
    );
    assert_eq!(nudges(4), 0, "a different step removes the nudge");
    let toggles: Vec<bool> = events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Nudge { active, .. } => Some(active),
            _ => None,
        })
        .collect();
    assert_eq!(toggles, vec![true, false]);
    assert_all_paired(&llm);
}

#[tokio::test]
async fn a_long_run_trimmed_to_a_small_budget_never_orphans_a_tool_message() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    // Steps with one, two or three calls, each printing ~600 characters.
    let step = |n: usize| {
        let cmd = json!({"command": "head -c 450 /dev/zero | tr '\\0' x; echo"});
        Reply::tools((0..n).map(|_| ("bash", cmd.clone())).collect())
    };
    let script: Vec<Reply> = (0..150).map(|i| step(1 + i % 3)).collect();
    let llm = FakeLlm::start(script).await;
    let mut st = settings(150);
    st.context_tokens = 3000;
    // Trimming alone, the last resort (condensation has its own tests).
    st.condense = false;
    let agent = Agent::new(llm.client(), tools(&s), st);
    let (outcome, events) = run(&agent, &s, "make output").await;
    assert_eq!(outcome.reason, FinishReason::MaxSteps { max_steps: 150 });
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 150);
    assert_all_paired(&llm);
    for (i, r) in reqs.iter().enumerate() {
        let msgs = r["messages"].as_array().unwrap();
        assert_eq!(msgs[0]["role"], "system", "request {i}");
        assert_eq!(
            msgs[1]["content"], "make output",
            "request {i}: the task is always kept"
        );
        // ~4 chars per token; the budget is 3000 tokens plus one over-budget turn at most.
        let chars = serde_json::to_string(msgs).unwrap().len();
        assert!(chars < 4 * 3000 + 4000, "request {i} is {chars} characters");
    }
    let last = reqs.last().unwrap()["messages"].as_array().unwrap();
    assert!(
        last[2]["content"]
            .as_str()
            .unwrap()
            .contains("earlier messages of this run were left out")
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e.kind, EventKind::ContextTrimmed { .. }))
    );
}

#[tokio::test]
async fn a_second_run_starts_from_clean_state_and_the_budget_ends_runs() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm =
        FakeLlm::start_with_fallback(vec![], Reply::tool("bash", json!({"command": "echo step"})))
            .await;
    let agent = Agent::new(llm.client(), tools(&s), settings(2));
    let (first, _) = run(&agent, &s, "first task").await;
    let (second, _) = run(&agent, &s, "second task").await;
    assert_ne!(first.run_id, second.run_id);
    assert_eq!((first.steps, second.steps), (2, 2));
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 4);
    let msgs = reqs[2]["messages"].as_array().unwrap();
    assert_eq!(
        msgs.len(),
        2,
        "the second run's first request holds only its own system prompt and task"
    );
    assert_eq!(msgs[1]["content"], "second task");
    assert!(!reqs[3].to_string().contains("first task"));
    assert_eq!(
        second.usage.prompt_tokens,
        (reqs[2].to_string().len() / 4 + reqs[3].to_string().len() / 4) as u64,
        "usage summed per run only"
    );

    // A budget of input tokens ends the run with that reason.
    let mut st = settings(50);
    // Above the first request (the research tools and their prompt included), far below 50 steps.
    st.max_input_tokens = 5000;
    let agent = Agent::new(llm.client(), tools(&s), st);
    let (outcome, _) = run(&agent, &s, "spend").await;
    assert!(
        matches!(
            outcome.reason,
            FinishReason::TokenBudget { budget: 5000, .. }
        ),
        "{:?}",
        outcome.reason
    );
    assert!(outcome.steps >= 1 && outcome.steps < 50, "{outcome:?}");
}

/// A host-side test tool that returns a tiny PNG (no sandbox, no host files).
struct Picture;

#[async_trait]
impl Tool for Picture {
    fn name(&self) -> &str {
        "picture"
    }
    fn description(&self) -> &str {
        "returns an image"
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}})
    }
    async fn execute(&self, _args: Value, _ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        Ok(ToolResult::ok("drew it").with_image("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==".into()))
    }
}

#[tokio::test]
async fn images_reach_only_a_multimodal_model() {
    for multimodal in [false, true] {
        let llm =
            FakeLlm::start(vec![Reply::tool("picture", json!({})), Reply::text("seen")]).await;
        let mut st = FakeLlm::settings();
        st.multimodal = multimodal;
        let client = Arc::new(LlmClient::new(llm.endpoint(), None, st));
        let mut reg = ToolRegistry::new();
        reg.register(Arc::new(Picture)).unwrap();
        let agent = Agent::new(client, reg, settings(5));
        let sink = MemorySink::new();
        let outcome = agent
            .run(
                AgentTask::new("draw", "t", "none"),
                sink.as_ref(),
                CancellationToken::new(),
            )
            .await;
        assert_eq!(outcome.reason, FinishReason::FinalAnswer);
        let second = llm.requests()[1].to_string();
        assert_eq!(
            second.contains("data:image/png;base64,iVBOR"),
            multimodal,
            "{second}"
        );
        assert_eq!(second.contains("does not take images"), !multimodal);
        let events = sink.events();
        assert_well_ordered(&events);
        let image = events
            .iter()
            .find_map(|e| match &e.kind {
                EventKind::ToolResult {
                    has_image: true,
                    image: Some(image),
                    ..
                } => Some(image.clone()),
                _ => None,
            })
            .expect("the tool result event carries an image reference");
        assert_eq!(image.media_type, "image/png");
        let bytes = sink.image(&image).expect("the reference resolves");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
        assert_eq!(bytes.len() as u64, image.bytes);
        assert!(
            !serde_json::to_string(&events).unwrap().contains("iVBOR"),
            "the events carry the reference, not the bytes"
        );
        assert_all_paired(&llm);
    }
}

#[tokio::test]
async fn a_vision_override_gets_the_requests_that_carry_images() {
    let main = FakeLlm::start(vec![Reply::tool("picture", json!({}))]).await;
    let vision = FakeLlm::start(vec![Reply::text("I see a pixel")]).await;
    let mut vision_endpoint = vision.endpoint();
    vision_endpoint.model = "fake-vision".into();
    let client = Arc::new(LlmClient::new(
        main.endpoint(),
        Some(vision_endpoint),
        FakeLlm::settings(),
    ));
    let mut reg = ToolRegistry::new();
    reg.register(Arc::new(Picture)).unwrap();
    let agent = Agent::new(client, reg, settings(5));
    let outcome = agent
        .run(
            AgentTask::new("draw", "t", "none"),
            &NullSink,
            CancellationToken::new(),
        )
        .await;
    assert_eq!(outcome.answer.as_deref(), Some("I see a pixel"));
    assert_eq!(
        main.requests().len(),
        1,
        "the text-only request went to the main model"
    );
    let v = vision.requests();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["model"], "fake-vision");
    assert!(v[0].to_string().contains("data:image/png;base64,"));
}

#[tokio::test]
async fn cancelling_during_a_long_tool_call_kills_the_command_and_the_container_goes() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm = FakeLlm::start(vec![Reply::tool(
        "bash",
        json!({"command": "sleep 977", "timeout": 600}),
    )])
    .await;
    let agent = Agent::new(llm.client(), tools(&s), settings(20));
    let cancel = CancellationToken::new();
    let sink = CancelOnToolCall(cancel.clone());
    let started = std::time::Instant::now();
    let outcome = agent
        .run(AgentTask::new("wait", "t", s.id.clone()), &sink, cancel)
        .await;
    assert_eq!(outcome.reason, FinishReason::Cancelled);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "cancel took {:?}",
        started.elapsed()
    );
    // The container is still there, but the command is not.
    let ps = s
        .sandbox
        .exec(ExecRequest::new(["ps", "-eo", "args"]))
        .await
        .unwrap();
    assert!(
        !ps.stdout_lossy().contains("sleep 977"),
        "{}",
        ps.stdout_lossy()
    );
    m.remove(&s.owner, &s.id).await.unwrap();
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=sandboxd.session={}", s.id),
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "the container is gone"
    );
}

/// Cancels the run 800 ms after its first tool call starts.
struct CancelOnToolCall(CancellationToken);

#[async_trait]
impl EventSink for CancelOnToolCall {
    async fn event(&self, event: &Event, _image: Option<&Image>) {
        if matches!(event.kind, EventKind::ToolCall { .. }) {
            let cancel = self.0.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(800)).await;
                cancel.cancel();
            });
        }
    }
}
