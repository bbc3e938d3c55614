//! A remote A2A agent as a tool of a run (`[[remote_agents]]`), against an agent built with the
//! official `a2a-sdk`'s server (tests/a2a/remote_agent.py, served by uvicorn), with the real
//! binary, engine and image and the LLM faked at the HTTP boundary: the card's description
//! becomes the tool's, a conversation continues its context, a question is answered by the
//! next call, a slow task is polled to its end, a wrong token is refused, a user not listed
//! gets no tool, the token never reaches the model or the run's files, and without a
//! `[research]` rule that allows loopback the agent is skipped with a notice (a run event the
//! CLI prints) saying why.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve_a2a::python;
use crate::support;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{Value, json};
use support::cli::sandboxd;
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing, last_of_role};
use tokio::io::{AsyncBufReadExt, BufReader};

const TOKEN: &str = "remote-agent-token-5f1e";

/// The agent on a free loopback port: the child (killed on drop) and the port.
async fn start_agent() -> (tokio::process::Child, u16) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/a2a/remote_agent.py");
    let mut child = tokio::process::Command::new(python())
        .arg(script)
        .arg(TOKEN)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(60), lines.next_line())
        .await
        .expect("the agent did not start within 60 s (is uvicorn in .venv-a2a?)")
        .unwrap()
        .expect("the agent exited before it listened");
    let port = first.strip_prefix("PORT ").unwrap().parse().unwrap();
    (child, port)
}

fn agents_config(port: u16, allow_loopback: bool) -> String {
    // The agent's port is always allowed, so what refuses it without `allow` is the loopback rule.
    let allow = if allow_loopback {
        "\"127.0.0.1/32\""
    } else {
        ""
    };
    let research = format!("[research]\nallow = [{allow}]\nports = [{port}]\n\n");
    format!(
        "{research}[[remote_agents]]\nname = \"weather\"\nurl = \"http://127.0.0.1:{port}\"\nbearer_env = \"WEATHER_TOKEN\"\n\n\
         [[remote_agents]]\nname = \"impostor\"\nurl = \"http://127.0.0.1:{port}/\"\nbearer_env = \"IMPOSTOR_TOKEN\"\n\n\
         [[remote_agents]]\nname = \"private\"\nurl = \"http://127.0.0.1:{port}\"\nusers = [\"someone-else\"]\n"
    )
}

/// Runs `sandboxd run` with `config`; returns its stderr and stdout.
fn run(dir: &Path, llm: &FakeLlm, config: &str) -> (String, String) {
    let path = dir.join("sandboxd.toml");
    std::fs::write(&path, config).unwrap();
    let out = sandboxd(dir)
        .env("SANDBOXD_LLM_BASE_URL", llm.base_url())
        .env("SANDBOXD_LLM_MODEL", "fake-model")
        .env("WEATHER_TOKEN", TOKEN)
        .env("IMPOSTOR_TOKEN", "not-the-token")
        .arg("--config")
        .arg(&path)
        .args(["run", "--no-input", "--output"])
        .arg(dir.join("out"))
        .args(["--prompt", "ask the weather agent"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (stderr, String::from_utf8_lossy(&out.stdout).into_owned())
}

fn tool(name: &str, message: &str) -> Reply {
    Reply::tool(name, json!({"message": message}))
}

fn tools_of(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// The context id the agent echoed in `text` ("… [context ID]").
fn context_in(text: &str) -> String {
    let start = text.find("[context ").expect(text) + "[context ".len();
    text[start..].split(']').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_talks_to_a_remote_a2a_agent_built_with_the_official_sdk() {
    let (_agent, port) = start_agent().await;
    let llm = FakeLlm::start(vec![
        tool("a2a_weather", "hello"),
        tool("a2a_weather", "hello again"),
        tool("a2a_weather", "ask weather"),
        tool("a2a_weather", "Paris"),
        tool("a2a_weather", "slow job"),
        tool("a2a_impostor", "hello"),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (stderr, stdout) = run(dir.path(), &llm, &agents_config(port, true));
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 7, "{stderr}");
    for r in &reqs {
        check_tool_pairing(r).unwrap();
    }

    // The allowed agents are tools; the one for another user is not.
    let tools = tools_of(&reqs[0]);
    assert!(tools.contains(&"a2a_weather".to_string()), "{tools:?}");
    assert!(tools.contains(&"a2a_impostor".to_string()), "{tools:?}");
    assert!(!tools.iter().any(|t| t == "a2a_private"), "{tools:?}");
    let weather = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "a2a_weather")
        .unwrap();
    let description = weather["function"]["description"].as_str().unwrap();
    assert!(
        description.contains("Answers questions about the weather"),
        "{description}"
    );

    let seen = |i: usize| last_of_role(&reqs[i], "tool").unwrap();
    let first = seen(1);
    assert!(first.starts_with("echo: hello [context "), "{first}");
    let again = seen(2);
    assert!(again.starts_with("echo: hello again"), "{again}");
    assert_eq!(context_in(&first), context_in(&again), "one conversation");
    let question = seen(3);
    assert!(question.contains("asks: Which city?"), "{question}");
    assert_eq!(seen(4), "weather in Paris: sunny");
    assert_eq!(seen(5), "slow echo: slow job", "polled to its end");
    let refused = seen(6);
    assert!(
        refused.contains("refused sandboxd's credentials") && refused.contains("401"),
        "{refused}"
    );

    // The token went only to the agent: not to the model, the output or the transcript.
    for r in &reqs {
        assert!(!r.to_string().contains(TOKEN));
    }
    assert!(!stderr.contains(TOKEN) && !stdout.contains(TOKEN));
    for entry in walk(dir.path()) {
        if entry.file_name().is_some_and(|n| n != "sandboxd.toml") {
            let bytes = std::fs::read(&entry).unwrap();
            assert!(
                !String::from_utf8_lossy(&bytes).contains(TOKEN),
                "{} holds the token",
                entry.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_research_rule_for_loopback_the_agent_is_skipped_saying_why() {
    let (_agent, port) = start_agent().await;
    let llm = FakeLlm::start(vec![Reply::tool(
        "terminate",
        json!({"status": "success", "answer": "done"}),
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (stderr, _) = run(dir.path(), &llm, &agents_config(port, false));
    let reqs = llm.requests();
    let tools = tools_of(&reqs[0]);
    assert!(!tools.iter().any(|t| t.starts_with("a2a_")), "{tools:?}");
    // The run's notice (an event the CLI prints) says which agent and which rule.
    let notice = stderr
        .lines()
        .find(|l| l.contains("remote A2A agent weather is skipped"))
        .unwrap_or_else(|| panic!("no notice:\n{stderr}"));
    assert!(notice.contains("loopback"), "{notice}");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
