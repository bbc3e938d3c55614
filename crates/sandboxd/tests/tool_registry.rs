//! The registry and the small tools: every bad call becomes an observation the model can act
//! on; registration refuses what OpenAI would refuse; bash surfaces exit codes, stderr,
//! timeouts and a hint for commands that wait for input; `sandboxd tool` runs one call.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sandboxd_core::config::Config;
use sandboxd_core::tools::ask_human::NoHuman;
use sandboxd_core::tools::registry::RegistryError;
use sandboxd_core::tools::session::session_tools;
use sandboxd_core::tools::{Tool, ToolContext, ToolError, ToolRegistry, ToolResult};
use serde_json::{Value, json};

struct Named(&'static str, String);

#[async_trait]
impl Tool for Named {
    fn name(&self) -> &str {
        self.0
    }
    fn description(&self) -> &str {
        &self.1
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"n": {"type": "integer"}, "mode": {"type": "string", "enum": ["a", "b"]}}, "required": ["n"]})
    }
    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        Ok(ToolResult::ok(format!("{} got {}", self.1, args["n"])))
    }
}

async fn exec(reg: &ToolRegistry, name: &str, raw: &str) -> ToolResult {
    reg.execute(name, raw, &ToolContext::default())
        .await
        .expect("an observation, not an error")
}

#[tokio::test]
async fn bad_calls_become_observations() {
    let mut reg = ToolRegistry::new();
    reg.register(Arc::new(Named("count", "first".into())))
        .unwrap();
    let r = exec(&reg, "count", "{not json").await;
    assert!(r.render().contains("not valid JSON"), "{r:?}");
    let r = exec(&reg, "count", "[1,2]").await;
    assert!(r.render().contains("expected an object"), "{r:?}");
    let r = exec(&reg, "nosuch", "{}").await;
    assert!(
        r.render().contains("no tool named \"nosuch\"") && r.render().contains("count"),
        "{r:?}"
    );
    let r = exec(&reg, "count", "{}").await;
    assert!(
        r.render().contains("required parameter \"n\" is missing"),
        "{r:?}"
    );
    let r = exec(&reg, "count", r#"{"n": "five"}"#).await;
    assert!(
        r.render()
            .contains("\"n\" must be of type \"integer\", got string"),
        "{r:?}"
    );
    let r = exec(&reg, "count", r#"{"n": 1, "mode": "c"}"#).await;
    assert!(r.render().contains("must be one of"), "{r:?}");
    let r = exec(&reg, "count", r#"{"n": 5}"#).await;
    assert_eq!(r.output, "first got 5");
    assert!(!r.is_error());
}

#[test]
fn registration_refuses_what_openai_refuses() {
    let mut reg = ToolRegistry::new();
    let err = reg
        .register(Arc::new(Named("long", "x".repeat(1025))))
        .unwrap_err();
    assert!(
        matches!(err, RegistryError::DescriptionTooLong { len: 1025, .. }),
        "{err}"
    );
    reg.register(Arc::new(Named("exactly", "x".repeat(1024))))
        .unwrap();
    for bad in ["has space", "dot.ted", "", "ünï"] {
        let leaked: &'static str = Box::leak(bad.to_string().into_boxed_str());
        assert!(
            matches!(
                reg.register(Arc::new(Named(leaked, "d".into()))),
                Err(RegistryError::BadName(_))
            ),
            "{bad}"
        );
    }
    let sixty_five: &'static str = Box::leak("a".repeat(65).into_boxed_str());
    assert!(
        reg.register(Arc::new(Named(sixty_five, "d".into())))
            .is_err()
    );
    // A duplicate name: the first registered wins.
    reg.register(Arc::new(Named("dup", "first".into())))
        .unwrap();
    reg.register(Arc::new(Named("dup", "second".into())))
        .unwrap();
    assert_eq!(reg.names().iter().filter(|n| *n == "dup").count(), 1);
    assert_eq!(reg.get("dup").unwrap().description(), "first");
    // Every built-in tool fits OpenAI's limits.
    let specs = reg.to_openai();
    assert!(specs.iter().all(|s| s["type"] == "function"));
}

#[tokio::test]
async fn bash_reports_exit_codes_stderr_timeouts_and_input_waits() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let config = Config::load_with_env(None, &[]).unwrap();
    let reg = session_tools(&s, &config, Arc::new(NoHuman));
    for spec in reg.specs() {
        assert!(spec.description.chars().count() <= 1024, "{}", spec.name);
    }
    let r = exec(
        &reg,
        "bash",
        r#"{"command": "echo out; echo err >&2; exit 4"}"#,
    )
    .await;
    assert_eq!(r.output, "out\n[stderr]\nerr\n[exit code 4]");
    let t = Instant::now();
    let r = exec(&reg, "bash", r#"{"command": "read x"}"#).await;
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(r.render().contains("[exit code 1]"), "{r:?}");
    assert!(
        r.system
            .as_deref()
            .unwrap_or_default()
            .contains("waits for input"),
        "{r:?}"
    );
    let t = Instant::now();
    let r = exec(&reg, "bash", r#"{"command": "python3"}"#).await;
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(
        r.system
            .as_deref()
            .unwrap_or_default()
            .contains("waits for input"),
        "{r:?}"
    );
    let t = Instant::now();
    let r = exec(&reg, "bash", r#"{"command": "sleep 30", "timeout": 1}"#).await;
    assert!(t.elapsed() < Duration::from_secs(4));
    assert!(
        r.is_error() && r.render().contains("timed out after 1s"),
        "{r:?}"
    );
    let r = exec(&reg, "bash", r#"{"command": "echo after"}"#).await;
    assert_eq!(r.output, "after");
    let r = exec(&reg, "bash", r#"{"command": "cd /tmp", "restart": true}"#).await;
    assert!(
        r.system
            .as_deref()
            .unwrap_or_default()
            .contains("restarted"),
        "{r:?}"
    );
    let r = exec(&reg, "ask_human", r#"{"inquire": "which colour?"}"#).await;
    assert!(r.render().contains("no human is available"), "{r:?}");
    let r = exec(&reg, "terminate", r#"{"status": "success"}"#).await;
    assert!(r.output.contains("completed with status: success"));
    let r = exec(&reg, "terminate", r#"{"status": "maybe"}"#).await;
    assert!(r.is_error());
}

#[test]
fn the_tool_command_runs_one_call_and_lists_the_tools() {
    let bin = env!("CARGO_BIN_EXE_sandboxd");
    let list = std::process::Command::new(bin)
        .args(["tool", "--list"])
        .output()
        .unwrap();
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    let tools: Value = serde_json::from_slice(&list.stdout).unwrap();
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "bash",
            "python",
            "str_replace_editor",
            "browser_use",
            "web_search",
            "web_fetch",
            "view_image",
            "ask_human",
            "terminate"
        ]
    );
    let out = std::process::Command::new(bin)
        .args(["tool", "python", r#"{"code": "6 * 7"}"#])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("42"));
    let out = std::process::Command::new(bin)
        .args(["tool", "bash", r#"{"command": 3}"#])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("must be of type"));
}
