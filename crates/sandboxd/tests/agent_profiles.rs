//! Agent profiles as users choose them: `sandboxd run --agent NAME` and `POST /v1/runs
//! {"agent": NAME}` with the real binary, engine and image, the LLM faked at the HTTP
//! boundary. The fake's request log shows exactly each profile's tools and prompt (the four
//! built-in ones and one from `[[agents]]`); an unknown name is a clear error listing the
//! known ones, before any container is made.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;
use crate::support;

use std::path::Path;
use std::process::Stdio;

use reqwest::Method;
use serde_json::{Value, json};
use serve::runs::{SERVER, ended_run, llm_config, start_run};
use serve::{Api, Env};
use support::cli::sandboxd;
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing};

/// What each profile must show the model: its exact tools, a phrase of its prompt (None for
/// the general agent, whose prompt is the base one alone) and its step limit.
const PROFILES: &[(&str, &[&str], Option<&str>, usize)] = &[
    (
        "general",
        &[
            "bash",
            "python",
            "str_replace_editor",
            "browser_use",
            "web_search",
            "web_fetch",
            "view_image",
            "ask_human",
            "terminate",
        ],
        None,
        20,
    ),
    (
        "coding",
        &["bash", "python", "str_replace_editor", "terminate"],
        Some("You are working as a software engineer"),
        30,
    ),
    (
        "browser",
        &["browser_use", "web_search", "web_fetch", "terminate"],
        Some("You are a browsing agent"),
        25,
    ),
    (
        "data",
        &["python", "str_replace_editor", "view_image", "terminate"],
        Some("You are a data analyst"),
        25,
    ),
    (
        "mine",
        &["bash", "terminate"],
        Some("MINE-PROMPT-MARKER"),
        3,
    ),
];

/// Phrases only one profile's prompt has.
const MARKERS: &[&str] = &[
    "You are working as a software engineer",
    "You are a browsing agent",
    "You are a data analyst",
    "MINE-PROMPT-MARKER",
];

/// A config with one user-defined profile whose prompt file is in `dir`.
pub(crate) fn profile_config(dir: &Path) -> String {
    let prompt = dir.join("mine.md");
    std::fs::write(&prompt, "MINE-PROMPT-MARKER: only bash here.\n").unwrap();
    format!(
        "[[agents]]\nname = \"mine\"\ndescription = \"bash only\"\ntools = [\"bash\"]\nprompt_file = {:?}\nmax_steps = 3\n",
        prompt.display().to_string()
    )
}

fn tool_names(request: &Value) -> Vec<String> {
    let mut names: Vec<String> = request["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

fn system_prompt(request: &Value) -> String {
    request["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The first request of a run shows exactly the profile's tools, its prompt and no other's.
pub(crate) fn assert_shows(request: &Value, name: &str) {
    let (_, tools, marker, steps) = PROFILES.iter().find(|p| p.0 == name).unwrap();
    let mut want: Vec<String> = tools.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(tool_names(request), want, "tools of {name}");
    let system = system_prompt(request);
    assert!(
        system.contains(&format!("at most {steps} steps")),
        "{name}: {system}"
    );
    for m in MARKERS {
        assert_eq!(
            system.contains(m),
            marker == &Some(*m),
            "{name}: prompt phrase {m:?} in:\n{system}"
        );
    }
    check_tool_pairing(request).unwrap();
}

fn done() -> Reply {
    Reply::tool("terminate", json!({"status": "success", "answer": "done"}))
}

#[tokio::test(flavor = "multi_thread")]
async fn each_profile_shows_the_model_its_tools_and_prompt_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sandboxd.toml");
    std::fs::write(&config, profile_config(dir.path())).unwrap();
    let llm = FakeLlm::start_with_fallback(vec![], done()).await;
    let run = |args: &[&str]| {
        let mut cmd = sandboxd(dir.path());
        cmd.env("SANDBOXD_LLM_BASE_URL", llm.base_url())
            .env("SANDBOXD_LLM_MODEL", "fake-model")
            .arg("--config")
            .arg(&config)
            .args(args)
            .stdin(Stdio::null());
        cmd.output().unwrap()
    };

    let listed = run(&["agents"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{text}");
    for (name, ..) in PROFILES {
        assert!(text.contains(*name), "{name} not listed:\n{text}");
    }
    assert!(text.contains("mine (config): bash only"), "{text}");

    for (i, (name, ..)) in PROFILES.iter().enumerate() {
        let out_dir = dir.path().join(format!("out-{name}"));
        let out = run(&[
            "run",
            "--no-input",
            "--agent",
            name,
            "--output",
            out_dir.to_str().unwrap(),
            "--prompt",
            "say done",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        let reqs = llm.requests();
        assert_eq!(reqs.len(), i + 1, "one request per run");
        assert_shows(&reqs[i], name);
    }

    // An unknown profile: a clear error naming the known ones, before any sandbox exists.
    let out = run(&["run", "--agent", "nope", "--prompt", "x"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("no agent profile named \"nope\"")
            && stderr.contains("general, coding, browser, data, mine"),
        "{stderr}"
    );
    assert_eq!(llm.requests().len(), PROFILES.len(), "no request for it");
}

#[tokio::test(flavor = "multi_thread")]
async fn each_profile_shows_the_model_its_tools_and_prompt_from_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start_with_fallback(vec![], done()).await;
    let env = Env::new(&format!(
        "{}{SERVER}{}",
        llm_config(&llm),
        profile_config(dir.path())
    ))
    .await;
    let key = env.add_user("ada", &[]);
    let serve = env.start();
    let api = Api::new(&serve, &key);

    let (s, list) = api.json(Method::GET, "/v1/agents", None).await;
    assert_eq!(s, 200, "{list}");
    let names: Vec<&str> = list["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["general", "coding", "browser", "data", "mine"]);
    assert_eq!(list["agents"][4]["user_defined"], true);
    assert_eq!(list["agents"][4]["max_steps"], 3);

    // One session for all the runs (a user's sessions are bounded): each run's request is
    // rebuilt with its own profile's system prompt and tools.
    let mut session = None;
    for (i, (name, ..)) in PROFILES.iter().enumerate() {
        let mut body = match &session {
            None => json!({"task": "say done", "session": {}}),
            Some(id) => json!({"task": "say done", "session_id": id}),
        };
        // The general agent is also what a run without `agent` gets.
        if *name != "general" {
            body["agent"] = json!(name);
        }
        let run = start_run(&api, body).await;
        session.get_or_insert_with(|| run["session_id"].as_str().unwrap().to_string());
        let ended = ended_run(&api, run["id"].as_str().unwrap()).await;
        assert_eq!(ended["state"], "succeeded", "{name}: {ended}");
        // The run's row keeps its profile: every replica shows it (and a follow-up reuses it).
        assert_eq!(run["agent"], *name, "{run}");
        assert_eq!(ended["agent"], *name, "{ended}");
        let reqs = llm.requests();
        assert_eq!(reqs.len(), i + 1, "one request per run");
        assert_shows(&reqs[i], name);
    }

    let (s, e) = api
        .json(
            Method::POST,
            "/v1/runs",
            Some(json!({"task": "x", "agent": "nope"})),
        )
        .await;
    assert_eq!(s, 404, "{e}");
    let message = e.to_string();
    assert!(
        message.contains("field `agent`")
            && message.contains("general, coding, browser, data, mine"),
        "{message}"
    );
    let (s, e) = api
        .json(
            Method::POST,
            "/v1/runs",
            Some(json!({"task": "x", "agent": "data", "mode": "plan"})),
        )
        .await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(llm.requests().len(), PROFILES.len(), "no run started");
}
