//! The planning flow on the real engine and image, with the LLM faked at the HTTP boundary:
//! steps as separate runs in one container, outcomes that decide a step's status, the
//! planner's fallback, the step prompt and the scoped planning tool, cancellation and the
//! deadline, and executors chosen by a step's tag.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sandboxd_core::agent::{Event, EventKind, EventSink, Image, RunContext};
use sandboxd_core::config::Config;
use sandboxd_core::flow::{
    AgentStepRunner, FlowConfig, FlowOutcome, FlowRequest, FlowStatus, PlanningFlow,
};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::tools::ask_human::NoHuman;
use sandboxd_core::tools::planning::{PlanBook, StepStatus};
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing, last_of_role};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn config() -> Config {
    Config::load_with_env(None, &[]).expect("default config")
}

/// Forwards every event to a channel, so a test can watch the flow live.
struct ChannelSink(mpsc::UnboundedSender<Event>);

#[async_trait]
impl EventSink for ChannelSink {
    async fn event(&self, event: &Event, _image: Option<&Image>) {
        let _ = self.0.send(event.clone());
    }
}

/// A flow on `session` whose steps are real runs of the session (`run_in_session`).
fn flow(llm: &FakeLlm, session: &Arc<Session>, max_steps: usize, fc: FlowConfig) -> PlanningFlow {
    let mut config = config();
    config.agent.max_steps = max_steps;
    config.flow = fc.clone();
    let ctx = RunContext {
        llm: llm.client(),
        config,
        transcripts: None,
    };
    let runner = AgentStepRunner::new(ctx, session.clone(), Arc::new(NoHuman));
    PlanningFlow::new(llm.client(), Arc::new(runner), fc)
}

async fn run(flow: &PlanningFlow, session: &Session, task: &str) -> (FlowOutcome, Vec<Event>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    let outcome = flow
        .run(
            FlowRequest::new(task, "tester", session.id.clone()),
            Arc::new(ChannelSink(tx)),
            CancellationToken::new(),
        )
        .await;
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    (outcome, events)
}

fn plan_reply(steps: &[&str]) -> Reply {
    Reply::tool(
        "planning",
        json!({"command": "create", "title": "The plan", "steps": steps}),
    )
}

fn done(answer: &str) -> Reply {
    Reply::tool("terminate", json!({"status": "success", "answer": answer}))
}

fn tool_names(body: &Value) -> Vec<String> {
    let mut names: Vec<String> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(String::from))
        .collect();
    names.sort();
    names
}

fn assert_all_paired(llm: &FakeLlm) {
    for (i, body) in llm.requests().iter().enumerate() {
        if let Err(e) = check_tool_pairing(body) {
            panic!("request {i}: {e}\n{body:#}");
        }
    }
}

fn step_events(events: &[Event]) -> Vec<(String, usize, String)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::StepStarted { index, .. } => Some(("started".into(), *index, String::new())),
            EventKind::StepFinished { index, status, .. } => {
                Some(("finished".into(), *index, status.clone()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_three_step_plan_runs_each_step_as_its_own_run_in_one_container() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm = FakeLlm::start(vec![
        plan_reply(&[
            "Write notes.txt and set x in python",
            "Read notes.txt back",
            "Report x + 1",
        ]),
        Reply::tools(vec![
            (
                "bash",
                json!({"command": "echo hello-from-step-1 > /workspace/notes.txt"}),
            ),
            ("python", json!({"code": "x = 41"})),
        ]),
        done("wrote notes.txt and set x = 41"),
        Reply::tool("bash", json!({"command": "cat /workspace/notes.txt"})),
        done("notes.txt says hello-from-step-1"),
        Reply::tool("python", json!({"code": "x + 1"})),
        done("x + 1 is 42"),
        Reply::text("Summary: notes.txt was written and read; x + 1 = 42."),
    ])
    .await;
    let f = flow(&llm, &s, 5, FlowConfig::default());
    let (outcome, events) = run(&f, &s, "Show that state carries across steps").await;

    assert_eq!(outcome.status, FlowStatus::Completed, "{}", outcome.summary);
    assert!(
        outcome
            .plan
            .steps
            .iter()
            .all(|st| st.status == StepStatus::Completed)
    );
    assert_eq!(
        outcome.plan.steps[1].notes,
        "notes.txt says hello-from-step-1"
    );
    assert_eq!(
        outcome.summary,
        "Summary: notes.txt was written and read; x + 1 = 42."
    );
    // Three separate agent runs, all in this session.
    let runs: Vec<&Event> = events
        .iter()
        .filter(
            |e| matches!(&e.kind, EventKind::RunStarted { session_id, .. } if *session_id == s.id),
        )
        .collect();
    assert_eq!(runs.len(), 3);
    let mut ids: Vec<&str> = runs.iter().map(|e| e.run_id.as_str()).collect();
    ids.dedup();
    assert_eq!(ids.len(), 3, "each step has its own run id");
    assert_eq!(outcome.attempts.len(), 3);
    // Step 2 read step 1's file; step 3 used step 1's python variable.
    let req = llm.requests();
    assert_eq!(req.len(), 8, "planner, 2 per step, summary");
    assert!(
        last_of_role(&req[4], "tool")
            .unwrap()
            .contains("hello-from-step-1")
    );
    assert!(last_of_role(&req[6], "tool").unwrap().contains("42"));
    // A step's run starts with its own prompt, not the previous step's conversation.
    assert_eq!(
        req[3]["messages"].as_array().unwrap().len(),
        2,
        "system + step prompt"
    );
    // The summary request has every step's notes and the files.
    let summary_req = last_of_role(&req[7], "user").unwrap();
    for note in [
        "wrote notes.txt and set x = 41",
        "notes.txt says hello-from-step-1",
        "x + 1 is 42",
    ] {
        assert!(
            summary_req.contains(note),
            "{note} missing in {summary_req}"
        );
    }
    assert!(summary_req.contains("- notes.txt"), "{summary_req}");
    assert_eq!(outcome.files, vec!["notes.txt".to_string()]);
    // The live checklist's events, in order.
    assert!(
        matches!(events.iter().find(|e| matches!(e.kind, EventKind::PlanCreated { .. })).map(|e| &e.kind),
        Some(EventKind::PlanCreated { fallback: None, plan }) if plan.steps.len() == 3)
    );
    let st = step_events(&events);
    let expected: Vec<(String, usize, String)> = (0..3)
        .flat_map(|i| {
            [
                ("started".to_string(), i, String::new()),
                ("finished".to_string(), i, "completed".to_string()),
            ]
        })
        .collect();
    assert_eq!(st, expected);
    assert!(matches!(
        events.last().map(|e| &e.kind),
        Some(EventKind::FlowFinished {
            status: FlowStatus::Completed,
            ..
        })
    ));
    assert_all_paired(&llm);
}

#[tokio::test]
async fn a_step_at_max_steps_is_retried_once_then_blocked_and_the_result_says_so() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let busy = || Reply::tool("bash", json!({"command": "true"}));
    let llm = FakeLlm::start(vec![
        plan_reply(&["Do A", "Do B"]),
        busy(),
        busy(),
        busy(),
        busy(),
        Reply::text("A could not be done."),
    ])
    .await;
    let f = flow(&llm, &s, 2, FlowConfig::default());
    let (outcome, events) = run(&f, &s, "A then B").await;

    assert_eq!(
        outcome.status,
        FlowStatus::Blocked {
            step: 0,
            reason: "reached max_steps (2)".into()
        }
    );
    assert_eq!(outcome.plan.steps[0].status, StepStatus::Blocked);
    assert!(
        outcome.plan.steps[0]
            .notes
            .contains("blocked after 2 attempt(s)")
    );
    assert_eq!(
        outcome.plan.steps[1].status,
        StepStatus::NotStarted,
        "B never ran"
    );
    assert_eq!(outcome.attempts.len(), 2);
    assert!(
        outcome
            .summary
            .starts_with("Partial result: step 1 of 2 (\"Do A\") is blocked"),
        "{}",
        outcome.summary
    );
    let req = llm.requests();
    assert_eq!(req.len(), 6);
    let retry_prompt = last_of_role(&req[3], "user").unwrap();
    assert!(retry_prompt.contains("attempt 2 of step 1") && retry_prompt.contains("max_steps"));
    let st = step_events(&events);
    assert_eq!(st[1], ("finished".into(), 0, "in_progress".into()));
    assert_eq!(st[3], ("finished".into(), 0, "blocked".into()));
    assert_eq!(st.len(), 4);
    assert_all_paired(&llm);
}

#[tokio::test]
async fn with_replanning_on_a_blocked_step_is_replaced_and_the_flow_goes_on() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let fail = || {
        Reply::tool(
            "terminate",
            json!({"status": "failure", "answer": "no tool for A"}),
        )
    };
    let llm = FakeLlm::start(vec![
        plan_reply(&["Do A", "Do B"]),
        fail(),
        fail(),
        Reply::tool(
            "planning",
            json!({"command": "update", "steps": ["Do A another way", "Do B"]}),
        ),
        done("A done another way"),
        done("B done"),
        Reply::text("Both done."),
    ])
    .await;
    let fc = FlowConfig {
        max_replans: 1,
        ..FlowConfig::default()
    };
    let f = flow(&llm, &s, 3, fc);
    let (outcome, events) = run(&f, &s, "A then B").await;
    assert_eq!(outcome.status, FlowStatus::Completed, "{}", outcome.summary);
    assert_eq!(outcome.replans, 1);
    assert_eq!(outcome.plan.steps[0].text, "Do A another way");
    let replanned = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::Replanned { reason, plan } => Some((reason.clone(), plan.clone())),
            _ => None,
        })
        .expect("a replanned event");
    assert!(
        replanned.0.contains("step 1 was blocked"),
        "{}",
        replanned.0
    );
    let req = llm.requests();
    assert_eq!(
        tool_names(&req[3]),
        vec!["planning"],
        "re-planning offers only the planning tool"
    );
    assert!(
        last_of_role(&req[3], "user")
            .unwrap()
            .contains("\"update\"")
    );
}

#[tokio::test]
async fn a_planner_that_answers_badly_twice_gets_the_default_plan_and_the_events_say_so() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm = FakeLlm::start(vec![
        Reply::text("First I will think about it."),
        Reply::tool(
            "planning",
            json!({"command": "create", "title": "Empty", "steps": []}),
        ),
        done("did the whole task"),
        Reply::text("Done in one step."),
    ])
    .await;
    let f = flow(&llm, &s, 3, FlowConfig::default());
    let (outcome, events) = run(&f, &s, "Count to three").await;
    assert_eq!(outcome.status, FlowStatus::Completed);
    let fallback = outcome
        .planner_fallback
        .clone()
        .expect("the fallback is reported");
    assert!(fallback.contains("default one-step plan"), "{fallback}");
    assert!(
        fallback.contains("steps must be a non-empty list"),
        "{fallback}"
    );
    assert_eq!(outcome.plan.steps.len(), 1);
    let created = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::PlanCreated { fallback, .. } => Some(fallback.clone()),
            _ => None,
        })
        .expect("plan_created");
    assert_eq!(created, Some(fallback));
    let req = llm.requests();
    // The planner is offered the planning tool only, and told what was wrong the first time.
    assert_eq!(tool_names(&req[0]), vec!["planning"]);
    assert!(
        last_of_role(&req[1], "user")
            .unwrap()
            .contains("not a valid plan")
    );
    assert_all_paired(&llm);
}

#[tokio::test]
async fn step_two_is_told_to_do_step_two_only_and_an_invented_plan_id_is_an_error() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm = FakeLlm::start(vec![
        plan_reply(&["Make the data", "Check the data"]),
        done("made data.csv"),
        Reply::tool(
            "planning",
            json!({"command": "mark_step", "plan_id": "plan-4242", "step_index": 1, "step_status": "completed"}),
        ),
        done("checked"),
        Reply::text("ok"),
    ])
    .await;
    let f = flow(&llm, &s, 5, FlowConfig::default());
    let (outcome, _events) = run(&f, &s, "Make and check data").await;
    assert_eq!(outcome.status, FlowStatus::Completed, "{}", outcome.summary);
    let req = llm.requests();
    let prompt = last_of_role(&req[2], "user").unwrap();
    assert!(prompt.contains("Do step 2 only."), "{prompt}");
    assert!(
        prompt.contains("step 2 of 2: \"Check the data\""),
        "{prompt}"
    );
    assert!(
        prompt.contains("1. [✓] Make the data\n   Notes: made data.csv"),
        "{prompt}"
    );
    assert!(prompt.contains("2. [→] Check the data"), "{prompt}");
    assert!(prompt.contains("Progress: 1/2 steps completed"), "{prompt}");
    assert!(tool_names(&req[2]).contains(&"planning".to_string()));
    let observation = last_of_role(&req[3], "tool").unwrap();
    assert!(
        observation.contains("Error") && observation.contains("no plan with id \"plan-4242\""),
        "{observation}"
    );
}

#[tokio::test]
async fn cancelling_step_two_ends_the_flow_at_once_and_the_deadline_gives_a_partial_result() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let long = || Reply::tool("bash", json!({"command": "sleep 120", "timeout": 300}));
    let llm = FakeLlm::start(vec![
        plan_reply(&["Quick step", "Slow step"]),
        done("quick done"),
        long(),
        // The second flow, in the same session.
        plan_reply(&["Quick again", "Slow again"]),
        done("quick again done"),
        long(),
    ])
    .await;
    let f = flow(&llm, &s, 5, FlowConfig::default());

    let cancel = CancellationToken::new();
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    let trigger = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let mut in_step_two = false;
            let mut at = None;
            while let Some(e) = rx.recv().await {
                match e.kind {
                    EventKind::StepStarted { index: 1, .. } => in_step_two = true,
                    EventKind::ToolCall { .. } if in_step_two && at.is_none() => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        at = Some(Instant::now());
                        cancel.cancel();
                    }
                    _ => {}
                }
            }
            at
        })
    };
    let outcome = f
        .run(
            FlowRequest::new("quick then slow", "tester", s.id.clone()),
            Arc::new(ChannelSink(tx)),
            cancel,
        )
        .await;
    let ended = Instant::now();
    let cancelled_at = trigger
        .await
        .unwrap()
        .expect("the cancel was sent in step 2");
    assert_eq!(outcome.status, FlowStatus::Cancelled);
    assert!(
        ended - cancelled_at < Duration::from_secs(2),
        "the flow took {:?} to stop",
        ended - cancelled_at
    );
    assert_eq!(outcome.plan.steps[0].status, StepStatus::Completed);
    assert_eq!(outcome.plan.steps[1].status, StepStatus::InProgress);
    assert!(
        outcome
            .summary
            .starts_with("Partial result: the flow was cancelled during step 2"),
        "{}",
        outcome.summary
    );
    assert_eq!(llm.requests().len(), 3, "no summary call after a cancel");

    // The deadline: the same slow step, a flow of at most 3 seconds.
    let fc = FlowConfig {
        timeout_secs: 3,
        ..FlowConfig::default()
    };
    let f = flow(&llm, &s, 5, fc);
    let started = Instant::now();
    let (outcome, events) = run(&f, &s, "quick then slow, again").await;
    assert_eq!(outcome.status, FlowStatus::TimedOut);
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(outcome.plan.id, "plan-2", "plans are kept per session");
    assert_eq!(outcome.plan.steps[0].notes, "quick again done");
    assert!(
        outcome
            .summary
            .starts_with("Partial result: the flow's deadline passed during step 2"),
        "{}",
        outcome.summary
    );
    assert!(outcome.summary.contains("quick again done"));
    assert!(matches!(
        events.last().map(|e| &e.kind),
        Some(EventKind::FlowFinished {
            status: FlowStatus::TimedOut,
            ..
        })
    ));
    assert_eq!(
        PlanBook::of(&s, 10).list().await.0.len(),
        2,
        "the session holds both plans"
    );
}

#[tokio::test]
async fn a_python_tagged_step_runs_with_the_python_executors_tools() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm = FakeLlm::start(vec![
        plan_reply(&["[python] Compute 6*7", "Write the answer down"]),
        Reply::tool("python", json!({"code": "6*7"})),
        done("6*7 = 42"),
        done("wrote it"),
        Reply::text("42"),
    ])
    .await;
    let f = flow(&llm, &s, 5, FlowConfig::default());
    let (outcome, events) = run(&f, &s, "What is 6*7?").await;
    assert_eq!(outcome.status, FlowStatus::Completed, "{}", outcome.summary);
    let req = llm.requests();
    assert_eq!(
        tool_names(&req[1]),
        vec!["planning", "python", "str_replace_editor", "terminate"]
    );
    let system = req[1]["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(system.contains("data-analysis executor"), "{system}");
    // The untagged step gets the default agent with every tool.
    let all = tool_names(&req[3]);
    assert!(
        all.contains(&"bash".to_string()) && all.contains(&"browser_use".to_string()),
        "{all:?}"
    );
    assert!(
        !req[3]["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("data-analysis executor")
    );
    let executors: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::StepStarted { executor, .. } => Some(executor.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(executors, vec!["python", "default"]);
    assert!(last_of_role(&req[2], "tool").unwrap().contains("42"));
}

#[tokio::test]
async fn the_token_budget_covers_the_planner_and_a_spent_budget_ends_the_flow() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let llm = FakeLlm::start(vec![plan_reply(&["Do A"])]).await;
    let fc = FlowConfig {
        max_input_tokens: 1,
        ..FlowConfig::default()
    };
    let f = flow(&llm, &s, 5, fc);
    let (outcome, events) = run(&f, &s, "A").await;
    assert!(
        matches!(outcome.status, FlowStatus::BudgetSpent { budget: 1, spent } if spent > 1),
        "{:?}",
        outcome.status
    );
    assert_eq!(
        llm.requests().len(),
        1,
        "no step and no summary once the budget is spent"
    );
    assert!(outcome.attempts.is_empty());
    assert!(
        outcome
            .summary
            .starts_with("Partial result: the flow's input-token budget is spent"),
        "{}",
        outcome.summary
    );
    assert!(outcome.summary.contains("· 1. Do A"), "{}", outcome.summary);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, EventKind::StepStarted { .. }))
    );
}
