//! bash: the session's persistent shell. cwd and exported variables persist between calls;
//! stdout and stderr come back apart with the exit code; long output is cut in the middle.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use regex::Regex;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolResult, arg_str, timeout_arg};
use crate::sandbox::{Sandbox, ShellOptions, ShellOutput};

pub struct Bash {
    sandbox: Arc<dyn Sandbox>,
    default_timeout: Duration,
    max_timeout: Duration,
    output_cap: usize,
}

impl Bash {
    pub fn new(
        sandbox: Arc<dyn Sandbox>,
        default_timeout: Duration,
        max_timeout: Duration,
        output_cap: usize,
    ) -> Self {
        Self {
            sandbox,
            default_timeout: default_timeout.min(max_timeout),
            max_timeout,
            output_cap,
        }
    }
}

#[async_trait]
impl Tool for Bash {
    fn name(&self) -> &str {
        "bash"
    }

    fn description(&self) -> &str {
        "Run a bash command in the sandbox (Debian, no network, files in /workspace). \
         The shell persists between calls: cd and export carry over. stdin is empty, so \
         interactive programs get EOF: pass input with pipes or heredocs and use non-interactive \
         flags. Start long-running servers in the background with output redirected \
         (cmd > log 2>&1 &). Returns stdout, stderr and the exit code; long output is cut \
         in the middle, so filter it (grep, head, tail)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The bash command to run."},
                "timeout": {"type": "integer", "description": "Seconds before the command is killed (default 120)."},
                "restart": {"type": "boolean", "description": "Restart the shell first (resets cwd and variables)."}
            },
            "required": ["command"]
        })
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let command = arg_str(&args, "command").unwrap_or_default();
        let mut system = None;
        if args.get("restart").and_then(Value::as_bool) == Some(true) {
            self.sandbox.restart_shell().await?;
            system = Some("the shell was restarted".to_string());
            if command.trim().is_empty() {
                return Ok(ToolResult::ok("").with_system("the shell was restarted"));
            }
        }
        if command.trim().is_empty() {
            return Ok(ToolResult::error("the command is empty"));
        }
        let timeout = match timeout_arg(&args, self.default_timeout, self.max_timeout) {
            Ok(t) => t,
            Err(observation) => return Ok(observation),
        };
        let opts = ShellOptions {
            timeout,
            output_cap: self.output_cap,
        };
        let out = tokio::select! {
            out = self.sandbox.shell(command, opts) => out?,
            _ = ctx.cancel.cancelled() => {
                // Dropping the call mid-command leaves the shell unsynchronized: replace it.
                let _ = self.sandbox.restart_shell().await;
                return Err(ToolError::Cancelled);
            }
        };
        let mut result = observe(&out, timeout);
        let notes: Vec<String> = system
            .into_iter()
            .chain(out.note.clone())
            .chain(input_hint(command, &out))
            .collect();
        if !notes.is_empty() {
            result = result.with_system(notes.join("; "));
        }
        Ok(result)
    }
}

/// Formats the shell output for the model.
pub fn observe(out: &ShellOutput, timeout: Duration) -> ToolResult {
    let stdout = out.stdout_lossy();
    let stderr = out.stderr_lossy();
    let mut text = stdout.clone();
    if !stderr.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("[stderr]\n");
        text.push_str(&stderr);
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    if out.stdout_truncated || out.stderr_truncated {
        text.push_str(
            "[output was cut in the middle; filter it with grep/head/tail or write it to a file]\n",
        );
    }
    if out.timed_out {
        text.push_str(&format!(
            "[timed out after {}s: the command was killed]",
            timeout.as_secs()
        ));
        return ToolResult::error(text.trim_end().to_string());
    }
    match out.exit_code {
        Some(0) => ToolResult::ok(text.trim_end().to_string()),
        Some(code) => {
            text.push_str(&format!("[exit code {code}]"));
            ToolResult::ok(text)
        }
        None => ToolResult::error(format!("{text}[the command did not finish]")),
    }
}

/// A hint when a command that wanted input failed or printed nothing.
fn input_hint(command: &str, out: &ShellOutput) -> Option<String> {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(r"(?m)(^|[;&|]\s*)(read\b|(python3?|node|bash|sh|irb|psql|mysql|sqlite3|vi|vim|nano|less|more|top|htop|ssh|ftp)\s*($|[;&|]))")
            .unwrap_or_else(|_| unreachable!("constant regex"))
    });
    let quiet_or_failed =
        out.exit_code != Some(0) || (out.stdout.is_empty() && out.stderr.is_empty());
    (quiet_or_failed && re.is_match(command)).then(|| {
        "this command waits for input, but commands here get no stdin (EOF at once): pipe the input in \
         (echo answer | cmd, cmd <<'EOF' ... EOF), run a script file instead of an interactive interpreter, \
         or use non-interactive flags"
            .to_string()
    })
}
