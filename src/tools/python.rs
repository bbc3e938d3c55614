//! python: the session's persistent interpreter, used like a notebook cell. Variables and
//! imports persist between calls; stdout and stderr come back apart with the repr of a final
//! expression, a trimmed traceback and any matplotlib figure as an image.
//!
//! A cell past its timeout is interrupted with KeyboardInterrupt and the state is kept; an
//! interpreter that does not come back, or that dies, is replaced and the model is told
//! that its variables are gone.

mod driver;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::{Tool, ToolContext, ToolError, ToolResult, arg_str, timeout_arg};
use crate::sandbox::Sandbox;
use driver::{CellEnd, CellOutput, Driver, GRACE};

pub struct Python {
    sandbox: Arc<dyn Sandbox>,
    slot: Mutex<Slot>,
    default_timeout: Duration,
    max_timeout: Duration,
    output_cap: usize,
}

/// The interpreter of the session, and why the last one was lost (told on the next call).
#[derive(Default)]
struct Slot {
    driver: Option<Driver>,
    lost: Option<String>,
}

impl Python {
    pub fn new(
        sandbox: Arc<dyn Sandbox>,
        default_timeout: Duration,
        max_timeout: Duration,
        output_cap: usize,
    ) -> Self {
        Self {
            sandbox,
            slot: Mutex::new(Slot::default()),
            default_timeout: default_timeout.min(max_timeout),
            max_timeout,
            output_cap,
        }
    }

    /// The largest reply the driver may send: four capped text parts and one image.
    fn max_body(&self) -> usize {
        4 * (self.output_cap + 1024) + crate::tools::MAX_IMAGE_BYTES
    }

    /// Makes sure the slot holds an idle interpreter; returns notes for the model.
    async fn ready(&self, slot: &mut Slot, notes: &mut Vec<String>) -> Result<(), ToolError> {
        if let Some(d) = slot.driver.as_mut()
            && d.has_cell_in_flight()
        {
            match d.settle().await {
                Ok(true) => {}
                Ok(false) => {
                    if let Some(d) = slot.driver.take() {
                        let _ = d.kill(&*self.sandbox).await;
                    }
                    slot.lost = Some(
                        "the cell of a cancelled call did not stop, so the interpreter was killed"
                            .into(),
                    );
                }
                Err(why) => {
                    if let Some(d) = slot.driver.take() {
                        let (cause, _) = d.obituary(&*self.sandbox, why).await;
                        slot.lost = Some(format!("the previous interpreter died ({cause})"));
                    }
                }
            }
        }
        if slot.driver.is_none() {
            slot.driver = Some(Driver::start(&*self.sandbox, self.max_body()).await?);
            if let Some(why) = slot.lost.take() {
                notes.push(format!(
                    "a fresh python interpreter was started: {why}; variables and imports from earlier calls are gone"
                ));
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Tool for Python {
    fn name(&self) -> &str {
        "python"
    }

    fn description(&self) -> &str {
        "Run Python 3 code in the sandbox's persistent interpreter, like a notebook cell: variables, \
         imports and functions persist between calls (reset: true starts a fresh interpreter). The \
         repr of a final expression is shown, as in Jupyter; print() anything else. stdout and stderr \
         come back apart; long output is cut in the middle. numpy, pandas and matplotlib are \
         installed. There is no network, so pip install and downloads fail. Files live in /workspace \
         (the working directory). Every open matplotlib figure is returned as an image at the end of \
         the cell and saved under /workspace/figures/ (plt.show() is not needed). A cell that runs \
         past its timeout is interrupted with KeyboardInterrupt and the variables are kept. stdin is \
         empty, so input() fails."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The Python code to run."},
                "timeout": {"type": "integer", "description": "Seconds before the cell is interrupted (default 120)."},
                "reset": {"type": "boolean", "description": "Start a fresh interpreter first (all variables are lost)."}
            },
            "required": ["code"]
        })
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let code = arg_str(&args, "code").unwrap_or_default();
        let timeout = match timeout_arg(&args, self.default_timeout, self.max_timeout) {
            Ok(t) => t,
            Err(observation) => return Ok(observation),
        };
        let reset = args.get("reset").and_then(Value::as_bool) == Some(true);
        let mut slot = self.slot.lock().await;
        let mut notes = Vec::new();
        if reset {
            if let Some(d) = slot.driver.take() {
                if d.has_cell_in_flight() {
                    let _ = d.kill(&*self.sandbox).await;
                } else {
                    d.exit().await;
                }
            }
            slot.lost = None;
            notes.push("the python interpreter was reset: earlier variables are gone".to_string());
        }
        if code.trim().is_empty() {
            if reset {
                self.ready(&mut slot, &mut Vec::new()).await?;
                return Ok(ToolResult::ok("").with_system(notes.join("; ")));
            }
            return Ok(ToolResult::error("the code is empty"));
        }
        self.ready(&mut slot, &mut notes).await?;
        let Some(driver) = slot.driver.as_mut() else {
            return Err(ToolError::Internal(
                "the python interpreter did not start".into(),
            ));
        };
        let end = driver
            .run(code, self.output_cap, timeout, &ctx.cancel)
            .await;
        let secs = timeout.as_secs();
        let mut result = match end {
            CellEnd::Done(out) => observe(out, None),
            CellEnd::TimedOut(Some(out)) => observe(
                out,
                Some(format!(
                    "the cell timed out after {secs}s and was interrupted with KeyboardInterrupt; \
                     variables defined so far are kept"
                )),
            ),
            CellEnd::TimedOut(None) => {
                let killed = match slot.driver.take() {
                    Some(d) => d.kill(&*self.sandbox).await,
                    None => Ok(()),
                };
                slot.lost = Some(format!(
                    "the previous one was killed after a {secs}s timeout"
                ));
                let what = match killed {
                    Ok(()) => "so the python interpreter was killed".to_string(),
                    Err(e) => format!(
                        "so sandboxd tried to kill the python interpreter, but could not confirm \
                         it is gone ({e}); its processes may still run"
                    ),
                };
                ToolResult::error(format!(
                    "the cell timed out after {secs}s and did not stop within {}s of KeyboardInterrupt \
                     (stuck in native code or ignoring SIGINT), {what}; \
                     its variables are lost; the next call starts a fresh one",
                    GRACE.as_secs()
                ))
            }
            CellEnd::Cancelled => return Err(ToolError::Cancelled),
            CellEnd::Died(why) => {
                let (cause, words) = match slot.driver.take() {
                    Some(d) => d.obituary(&*self.sandbox, why).await,
                    None => (why, None),
                };
                slot.lost = Some(format!("the previous one died ({cause})"));
                let words = words
                    .map(|w| format!("\nIts last words:\n{w}"))
                    .unwrap_or_default();
                ToolResult::error(format!(
                    "the python interpreter died ({cause}); its variables are lost; the next call starts a fresh one{words}"
                ))
            }
        };
        if !notes.is_empty() {
            result = result.with_system(notes.join("; "));
        }
        Ok(result)
    }
}

/// Formats a cell's output for the model; `timed_out` explains an interrupted cell.
fn observe(out: CellOutput, timed_out: Option<String>) -> ToolResult {
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    fn push_block(text: &mut String, block: &str) {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(block);
    }
    if !out.stderr.is_empty() {
        push_block(
            &mut text,
            &format!("[stderr]\n{}", String::from_utf8_lossy(&out.stderr)),
        );
    }
    if let Some(value) = &out.value {
        push_block(&mut text, value);
    }
    if out.stdout_cut || out.stderr_cut {
        push_block(
            &mut text,
            "[output was cut in the middle; print less, or write it to a file and read parts of it]",
        );
    }
    if !out.figures.is_empty() {
        let shown = if out.image.is_some() {
            "the first is shown as an image"
        } else {
            "too large to show"
        };
        push_block(
            &mut text,
            &format!("[figures saved: {} ({shown})]", out.figures.join(", ")),
        );
    }
    let text = text.trim_end().to_string();
    let error = match (timed_out, out.error) {
        (Some(t), Some(tb)) => Some(format!("{t}\n{}", tb.trim_end())),
        (Some(t), None) => Some(t),
        (None, Some(tb)) => Some(tb.trim_end().to_string()),
        (None, None) => None,
    };
    let mut result = match error {
        Some(e) => ToolResult {
            output: text,
            error: Some(e),
            ..ToolResult::default()
        },
        None => ToolResult::ok(text),
    };
    if let Some(png) = out.image {
        result = result.with_image(base64::engine::general_purpose::STANDARD.encode(png));
    }
    result
}
