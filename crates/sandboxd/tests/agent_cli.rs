//! `sandboxd run` as a user runs it: the real binary, the real engine and image, the LLM
//! faked at the HTTP boundary. A full run that leaves a report on the host, the guidance
//! when no LLM is configured, and Ctrl-C during a long command.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::mcp_common;
use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::cli::sandboxd;
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing};

fn with_llm(cmd: &mut Command, llm: &FakeLlm) {
    cmd.env("SANDBOXD_LLM_BASE_URL", llm.base_url())
        .env("SANDBOXD_LLM_MODEL", "fake-model");
}

/// Managed containers created by process `pid` (the `sandboxd.creator` label is `pid:start`).
fn containers_of(pid: u32) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=sandboxd.managed=true",
            "--format",
            "{{.ID}} {{.Label \"sandboxd.creator\"}}",
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|c| c.starts_with(&format!("{pid}:")))
        })
        .map(String::from)
        .collect()
}

/// The tests of this file run one at a time: several start `sandboxd run` processes whose
/// fake LLMs and containers are easier to tell apart that way.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[test]
fn without_an_llm_it_explains_what_to_set_and_creates_nothing() {
    let _serial = SERIAL.blocking_lock();
    let dir = tempfile::tempdir().unwrap();
    let child = sandboxd(dir.path())
        .args(["run", "--prompt", "say hi"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for needle in [
        "no LLM is configured",
        "OPENAI_API_KEY",
        "SANDBOXD_LLM_MODEL",
        "SANDBOXD_LLM_BASE_URL",
        "Ollama",
        "vLLM",
        "AZURE_OPENAI_ENDPOINT",
        "[llm]",
    ] {
        assert!(
            stderr.contains(needle),
            "{needle:?} missing from:\n{stderr}"
        );
    }
    // Only this process's containers count: the other modules of the test binary create
    // and remove theirs meanwhile, so the engine's total says nothing about this run.
    assert!(containers_of(pid).is_empty(), "a container was created");
    assert!(
        !dir.path().join("data").exists(),
        "nothing was written either"
    );
}

/// The scripted model of the full run. Kept in one place so it is easy to switch to the
/// editor and python tools: compute a number, write the report, terminate.
fn report_script() -> Vec<Reply> {
    vec![
        Reply::tool(
            "python",
            json!({"code": "total = sum(i * i for i in range(1, 101))\ntotal"}),
        )
        .with_content("First I compute the sum of squares."),
        // The scripted model writes the number python showed it (the test checks it did).
        Reply::tool(
            "str_replace_editor",
            json!({"command": "create", "path": "/workspace/report.html",
                   "file_text": "<!doctype html>\n<html><body><h1>Report</h1><p>Sum of squares 1..100 = <b>338350</b></p></body></html>\n"}),
        ),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "The report is in /workspace/report.html"}),
        ),
    ]
}

#[tokio::test]
async fn a_full_run_leaves_the_report_on_the_host_and_removes_the_container() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(report_script()).await;
    let out_dir = dir.path().join("out");
    let mut cmd = sandboxd(dir.path());
    with_llm(&mut cmd, &llm);
    cmd.args(["run", "--json", "--no-input", "--output"])
        .arg(&out_dir)
        .args([
            "--prompt",
            "Write an HTML report of the sum of squares of 1..100",
        ]);
    let child = tokio::process::Command::from(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let out = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stderr}", out.status);

    let report = std::fs::read_to_string(out_dir.join("report.html"))
        .unwrap_or_else(|e| panic!("no report ({e}):\n{stderr}"));
    assert!(report.contains("<b>338350</b>"), "{report}");
    assert!(
        containers_of(pid).is_empty(),
        "the container was not removed"
    );

    // --json: one event per line, ending with the finish.
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "run_started");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "run_finished");
    assert_eq!(
        last["reason"],
        json!({"kind": "terminated", "status": "success"})
    );
    assert_eq!(last["steps"], 3);
    let run_id = last["run_id"].as_str().unwrap();
    assert!(
        dir.path()
            .join("data/runs")
            .join(format!("{run_id}.json"))
            .is_file(),
        "transcript saved"
    );

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    for (i, body) in reqs.iter().enumerate() {
        check_tool_pairing(body).unwrap_or_else(|e| panic!("request {i}: {e}"));
    }
    let tools: Vec<&str> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    for t in [
        "bash",
        "python",
        "str_replace_editor",
        "browser_use",
        "terminate",
        "ask_human",
    ] {
        assert!(tools.contains(&t), "{t} missing: {tools:?}");
    }
    // The number in the report is the one python computed in the sandbox.
    let python_result = reqs[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the python result")["content"]
        .to_string();
    assert!(python_result.contains("338350"), "{python_result}");
}

#[tokio::test]
async fn ctrl_c_during_a_long_command_cancels_and_removes_the_container() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(vec![Reply::tool(
        "bash",
        json!({"command": "sleep 600", "timeout": 600}),
    )])
    .await;
    let mut cmd = sandboxd(dir.path());
    with_llm(&mut cmd, &llm);
    cmd.args([
        "run",
        "--json",
        "--no-input",
        "--prompt",
        "wait a long time",
    ]);
    let child = tokio::process::Command::from(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    // Wait for the tool call to be running: the LLM was asked and the container exists.
    let deadline = Instant::now() + Duration::from_secs(60);
    while llm.requests().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(containers_of(pid).len(), 1, "the session container runs");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let started = Instant::now();
    Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the run stops after Ctrl-C")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(events.contains("\"kind\":\"cancelled\""), "{events}");
    assert!(
        containers_of(pid).is_empty(),
        "the container was not removed"
    );
    assert_eq!(llm.requests().len(), 1, "no request after the cancel");
}

#[tokio::test]
async fn run_with_mcp_servers_calls_a_third_party_tool() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mcp_json = dir.path().join("mcp.json");
    std::fs::write(
        &mcp_json,
        json!({"mcpServers": {
            "py": {"command": mcp_common::python(), "args": [mcp_common::script("server_sdk.py")], "env": {"GREETING": "hi"}, "host": true},
            "broken": {"command": "/nonexistent/server"}
        }})
        .to_string(),
    )
    .unwrap();
    let llm = FakeLlm::start(vec![
        Reply::tool("mcp_py_echo_text", json!({"text": "from the agent"})),
        Reply::text("The server echoed it."),
    ])
    .await;
    let mut cmd = sandboxd(dir.path());
    with_llm(&mut cmd, &llm);
    cmd.args(["run", "--json", "--no-input", "--mcp"])
        .arg(&mcp_json)
        .args(["--output"])
        .arg(dir.path().join("out"))
        .args(["--prompt", "Use the echo tool"]);
    let out = tokio::process::Command::from(cmd).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("MCP server broken is skipped"), "{stderr}");
    assert!(
        stderr.contains("MCP server py runs on the host"),
        "{stderr}"
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let tools = reqs[0]["tools"].to_string();
    assert!(tools.contains("mcp_py_echo_text"), "{tools}");
    // The server's instructions are in the system prompt, attributed to it.
    let system = reqs[0]["messages"][0]["content"].to_string();
    assert!(
        system.contains("py") && system.contains("pyserver echoes text"),
        "{system}"
    );
    let result = reqs[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .to_string();
    assert!(result.contains("echo: from the agent"), "{result}");
    check_tool_pairing(&reqs[1]).unwrap();
}

#[tokio::test]
async fn a_kept_session_continues_its_conversation_in_the_same_container() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "bash",
            json!({"command": "echo 41 > /workspace/x.txt; cat /workspace/x.txt"}),
        ),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "stored"}),
        ),
        Reply::tool(
            "bash",
            json!({"command": "echo $(( $(cat /workspace/x.txt) + 1 ))"}),
        ),
        Reply::tool("terminate", json!({"status": "success", "answer": "42"})),
    ])
    .await;
    let (id, _cleanup, out) =
        support::cli::keep_then_continue(dir.path(), &llm, "Store 41 in a file", "Add one to it")
            .await;
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "run_started");
    assert_eq!(events[0]["session_id"], id.as_str());
    assert!(events[0]["continued_messages"].as_u64().unwrap() > 0);

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 4);
    for (i, body) in reqs.iter().enumerate() {
        check_tool_pairing(body).unwrap_or_else(|e| panic!("request {i}: {e}"));
    }
    // The second process restored run 1 from its transcript: task, calls and results.
    let opening = reqs[2]["messages"].as_array().unwrap();
    let text = serde_json::to_string(opening).unwrap();
    assert!(text.contains("Store 41 in a file"), "{text}");
    assert!(
        opening
            .iter()
            .any(|m| m["role"] == "tool" && m["content"].to_string().contains("41")),
        "{text}"
    );
    assert_eq!(opening.last().unwrap()["content"], "Add one to it");
    // The same container: run 2 read the file run 1 wrote.
    let result = reqs[3]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .to_string();
    assert!(result.contains("42"), "{result}");
}

/// Starts a run whose only step is a long command, waits until it runs, sends `signal`
/// and checks that the run was cancelled and its container removed.
async fn signal_cancels_the_run_and_removes_the_container(signal: &str, code: i32) {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(vec![Reply::tool(
        "bash",
        json!({"command": "sleep 600", "timeout": 600}),
    )])
    .await;
    let mut cmd = sandboxd(dir.path());
    with_llm(&mut cmd, &llm);
    cmd.args([
        "run",
        "--json",
        "--no-input",
        "--prompt",
        "wait a long time",
    ]);
    let child = tokio::process::Command::from(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while llm.requests().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(containers_of(pid).len(), 1, "the session container runs");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the run stops after the signal")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"kind\":\"cancelled\""),
        "{stderr}"
    );
    assert!(
        containers_of(pid).is_empty(),
        "SIGTERM/SIGHUP left the container running"
    );
}

#[tokio::test]
async fn sigterm_and_sighup_clean_up_as_ctrl_c_does() {
    let _serial = SERIAL.lock().await;
    signal_cancels_the_run_and_removes_the_container("TERM", 143).await;
    signal_cancels_the_run_and_removes_the_container("HUP", 129).await;
}

#[tokio::test]
async fn escape_sequences_from_the_sandbox_and_the_model_never_reach_the_terminal() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "bash",
            json!({"command": "printf '\\033]0;PWNED-TITLE\\007\\033]52;c;Y2xpcA==\\007\\033[2Jvisible'"}),
        )
        .with_content("Thinking \u{1b}]0;MODEL-TITLE\u{7} aloud"),
        Reply::text("Done \u{1b}[31mred\u{1b}[0m \u{1b}]52;c;ZXZpbA==\u{7}\u{9b}2J end"),
    ])
    .await;
    let mut cmd = sandboxd(dir.path());
    with_llm(&mut cmd, &llm);
    cmd.args(["run", "--no-input", "--output"])
        .arg(dir.path().join("out"))
        .args(["--prompt", "print a title"]);
    let out = tokio::process::Command::from(cmd).output().await.unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("visible"), "the output is shown: {stderr}");
    assert!(
        stdout.contains("Done") && stdout.contains("end"),
        "{stdout}"
    );
    for (what, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}') && !text.contains('\u{9b}'),
            "a control sequence reached {what}: {text:?}"
        );
        // Sequences are dropped whole, payload included (the tool-call line shows the
        // command's own text, where the title is harmless characters).
        for payload in ["MODEL-TITLE", "ZXZpbA"] {
            assert!(
                !text.contains(payload),
                "{payload} reached {what}: {text:?}"
            );
        }
    }
    let result = stderr
        .lines()
        .find(|l| l.trim_start().starts_with('✓'))
        .unwrap_or_else(|| panic!("no result line: {stderr}"));
    assert!(result.contains("visible"), "{result:?}");
    assert!(
        !result.contains("PWNED") && !result.contains("Y2xpcA"),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_bad_mcp_file_or_a_dead_shell_leaves_no_container() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // An MCP servers file that cannot be read: the run does not start, the container goes.
    let bad = dir.path().join("mcp.json");
    std::fs::write(&bad, "{ not json").unwrap();
    let llm = FakeLlm::start(vec![]).await;
    let mut cmd = sandboxd(dir.path());
    with_llm(&mut cmd, &llm);
    cmd.args(["run", "--json", "--no-input", "--mcp"])
        .arg(&bad)
        .args(["--output"])
        .arg(dir.path().join("out1"))
        .args(["--prompt", "use the tools"]);
    let child = tokio::process::Command::from(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let out = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("mcp.json"), "{stderr}");
    assert!(
        containers_of(pid).is_empty(),
        "the container was left behind"
    );

    // A session whose shell cannot start (its container was killed under it).
    let llm = FakeLlm::start(vec![
        Reply::tool("bash", json!({"command": "echo hi"})).delayed(Duration::from_secs(4)),
    ])
    .await;
    let mut cmd = sandboxd(dir.path());
    with_llm(&mut cmd, &llm);
    cmd.args(["run", "--json", "--no-input", "--output"])
        .arg(dir.path().join("out2"))
        .args(["--prompt", "say hi"]);
    let child = tokio::process::Command::from(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while llm.requests().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let container = containers_of(pid);
    assert_eq!(container.len(), 1);
    let cid = container[0].split_whitespace().next().unwrap().to_string();
    Command::new("docker")
        .args(["kill", &cid])
        .output()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("the run ends")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("\"kind\":\"error\""), "{stdout}");
    assert!(
        containers_of(pid).is_empty(),
        "the dead container was left behind"
    );
}
