//! python: the session's persistent interpreter, used like a notebook cell. Variables and
//! imports persist between calls; stdout and stderr come back apart with the repr of a final
//! expression, a trimmed traceback and the cell's matplotlib figures as images, in order.
//!
//! The interpreter is a daemon of the container (see driver.rs), so its variables outlive
//! this process: a later process running the same kept session reaches the same one.
//!
//! A cell past its timeout is interrupted with KeyboardInterrupt and the state is kept; an
//! interpreter that does not come back, or that dies, is replaced and the model is told
//! that its variables are gone. A lost connection (the in-sandbox relay died) keeps the
//! interpreter: the next call reconnects.

mod driver;
mod live;
mod observe;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::{Tool, ToolContext, ToolError, ToolResult, arg_str, timeout_arg};
use crate::sandbox::Sandbox;
use crate::sandbox::watch::while_alive;
pub use driver::CellOutput;
use driver::{CellEnd, Driver, GRACE, Loss};
pub use live::{LiveOutput, Stream};
use observe::observe;

pub struct Python {
    sandbox: Arc<dyn Sandbox>,
    slot: Mutex<Slot>,
    default_timeout: Duration,
    max_timeout: Duration,
    output_cap: usize,
    /// A code context's own interpreter (its id and working directory), not the session's.
    context: Option<(String, String)>,
}

/// The connection to the session's interpreter, and why the last one was lost (told on the
/// next call).
#[derive(Default)]
struct Slot {
    driver: Option<Driver>,
    lost: Option<String>,
    /// The connection (not the interpreter) was lost: the next one should find its variables.
    reconnecting: bool,
    /// The generation of the sandbox's proxy environment this interpreter's `os.environ`
    /// has (None: not known, e.g. a daemon an earlier process started).
    proxy_env: Option<u64>,
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
            context: None,
        }
    }

    /// A separate interpreter in the same sandbox, with the same limits: the code context
    /// `id` ([a-z0-9]{1,32}), started in `cwd`. Not started until first used.
    pub fn in_context(&self, id: &str, cwd: &str) -> Self {
        Self {
            sandbox: self.sandbox.clone(),
            slot: Mutex::new(Slot::default()),
            default_timeout: self.default_timeout,
            max_timeout: self.max_timeout,
            output_cap: self.output_cap,
            context: Some((id.to_string(), cwd.to_string())),
        }
    }

    /// The largest reply the driver may send: four capped text parts and the figures (capped
    /// together like one image).
    fn max_body(&self) -> usize {
        4 * (self.output_cap + 1024) + crate::tools::MAX_IMAGE_BYTES
    }

    /// Makes sure the slot holds an idle interpreter; returns notes for the model.
    async fn ready(&self, slot: &mut Slot, notes: &mut Vec<String>) -> Result<(), ToolError> {
        self.settle(slot).await;
        // Twice at most: a cell an earlier process left running that will not stop gets its
        // interpreter killed, and the second connection starts a fresh one.
        for _ in 0..2 {
            if slot.driver.is_some() {
                return Ok(());
            }
            let env_before = self.sandbox.proxy_env_state().map(|s| s.generation);
            let context = self.context.as_ref().map(|(i, c)| (i.as_str(), c.as_str()));
            let driver = Driver::start(&*self.sandbox, self.max_body(), context).await?;
            if let Some(why) = slot.lost.take() {
                notes.push(format!(
                    "a fresh python interpreter was started: {why}; variables and imports from earlier calls are gone"
                ));
            } else if std::mem::take(&mut slot.reconnecting) && driver.cells_before == 0 {
                notes.push(
                    "the python interpreter was gone when sandboxd reconnected, so a fresh one was started; variables and imports from earlier calls are gone"
                        .to_string(),
                );
            }
            // A fresh interpreter was started with the proxy variables of then; one an
            // earlier process started has whatever it had.
            slot.proxy_env = env_before.filter(|_| driver.cells_before == 0);
            slot.driver = Some(driver);
            // A cell an earlier connection left running (its process ended mid-call).
            self.settle(slot).await;
        }
        match slot.driver {
            Some(_) => Ok(()),
            None => Err(ToolError::Internal(
                "the python interpreter is still busy with a cell that will not stop".into(),
            )),
        }
    }

    /// Ends the interpreter for a reset: killed when a cell is in flight, else asked to exit.
    async fn reset(&self, slot: &mut Slot) {
        if let Some(d) = slot.driver.take() {
            if d.has_cell_in_flight() {
                let _ = d.kill(&*self.sandbox).await;
            } else {
                d.exit().await;
            }
        }
        slot.lost = None;
    }

    /// A cell that did not stop after its timeout's KeyboardInterrupt: the interpreter is
    /// killed, and the result says whether that is confirmed.
    async fn stuck(&self, slot: &mut Slot, secs: u64) -> ToolResult {
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

    /// The interpreter died during the cell: why, in its last words if it left some, or the
    /// connection alone was lost and the next call reconnects. An error when the whole
    /// sandbox is gone.
    async fn died(&self, slot: &mut Slot, why: String) -> Result<ToolResult, ToolError> {
        let driver = slot.driver.take();
        // Under gVisor an out-of-memory kill takes the whole sandbox with the cell:
        // that is the session's end, not the interpreter's, and says why. Only the
        // backend's definite answer counts (a failed query is not a stop).
        self.sandbox.check_alive().await?;
        let loss = match driver {
            Some(d) => d.obituary(&*self.sandbox, why).await,
            None => Loss::Died(why, None),
        };
        Ok(match loss {
            Loss::Died(cause, words) => {
                slot.lost = Some(format!("the previous one died ({cause})"));
                let words = words
                    .map(|w| format!("\nIts last words:\n{w}"))
                    .unwrap_or_default();
                ToolResult::error(format!(
                    "the python interpreter died ({cause}); its variables are lost; the next call starts a fresh one{words}"
                ))
            }
            Loss::Connection(why) => {
                slot.reconnecting = true;
                ToolResult::error(format!(
                    "the connection to the python interpreter was lost during the call: {why}; \
                     the cell's output is lost (it may still be running); the interpreter and its \
                     variables are kept, and the next call reconnects"
                ))
            }
        })
    }

    /// Brings the interpreter's `os.environ` to the sandbox's proxy environment when it
    /// changed (the session's egress turned on or off), with a cell of its own before the
    /// caller's. A failure is left for the caller's cell to meet; the next call tries again.
    async fn sync_proxy_env(&self, slot: &mut Slot) {
        let Some(want) = self.sandbox.proxy_env_state() else {
            return;
        };
        if slot.proxy_env == Some(want.generation) {
            return;
        }
        let Some(driver) = slot.driver.as_mut() else {
            return;
        };
        let cell = crate::sandbox::proxy_env::python_cell(want);
        let quiet = tokio_util::sync::CancellationToken::new();
        match driver
            .run(&cell, 4096, Duration::from_secs(10), &quiet, None)
            .await
        {
            CellEnd::Done(out) if out.error.is_none() => slot.proxy_env = Some(want.generation),
            CellEnd::Done(out) => {
                tracing::warn!(error = ?out.error, "could not update the python interpreter's proxy variables")
            }
            CellEnd::TimedOut(_) | CellEnd::Died(_) | CellEnd::Cancelled => {
                tracing::warn!("the python interpreter did not take its proxy variables")
            }
        }
    }

    /// Brings back a cell left in flight (a cancelled call's, or an earlier process's); one
    /// that will not stop costs the interpreter.
    async fn settle(&self, slot: &mut Slot) {
        let Some(d) = slot.driver.as_mut().filter(|d| d.has_cell_in_flight()) else {
            return;
        };
        match d.settle().await {
            Ok(true) => {}
            Ok(false) => {
                if let Some(d) = slot.driver.take() {
                    let _ = d.kill(&*self.sandbox).await;
                }
                slot.lost = Some(
                    "the cell of a cancelled or abandoned call did not stop, so the interpreter was killed"
                        .into(),
                );
            }
            Err(why) => {
                if let Some(d) = slot.driver.take() {
                    match d.obituary(&*self.sandbox, why).await {
                        Loss::Died(cause, _) => {
                            slot.lost = Some(format!("the previous interpreter died ({cause})"))
                        }
                        Loss::Connection(_) => slot.reconnecting = true,
                    }
                }
            }
        }
    }
}

/// How one cell ended, in parts, for callers that show them apart (the E2B code
/// interpreter) rather than as the model's text.
pub enum Cell {
    /// It ran; Some(seconds) when it ran past its timeout and was interrupted.
    Ran(CellOutput, Option<u64>),
    /// The interpreter was lost or stuck: what the model would be told.
    Failed(ToolResult),
}

impl Python {
    /// Runs one cell (the same interpreter and rules as the tool); `timeout` is capped at
    /// the tool's maximum. With `live`, the output goes there as it is printed, and the
    /// returned output holds only what was not sent (past the cap). Returns the cell and
    /// notes (e.g. a fresh interpreter started).
    pub async fn run_cell(
        &self,
        code: &str,
        timeout: Duration,
        cancel: &tokio_util::sync::CancellationToken,
        live: Option<LiveOutput>,
    ) -> Result<(Cell, Vec<String>), ToolError> {
        let mut slot = self.slot.lock().await;
        let mut notes = Vec::new();
        let timeout = timeout.min(self.max_timeout);
        let cell = self
            .run_locked(&mut slot, code, timeout, cancel, &mut notes, live)
            .await?;
        Ok((cell, notes))
    }

    /// Connects to the interpreter, starting one if none runs (a new code context's, so a
    /// working directory it cannot start in is the caller's error at once).
    pub async fn start(&self) -> Result<(), ToolError> {
        let mut slot = self.slot.lock().await;
        self.ready(&mut slot, &mut Vec::new()).await
    }

    /// Starts a fresh interpreter (every variable is lost). The one running is reached
    /// first, so this works from any process: one another process started (a code context
    /// created on another replica) is ended too, not left beside the new one.
    pub async fn restart(&self) -> Result<(), ToolError> {
        let mut slot = self.slot.lock().await;
        self.ready(&mut slot, &mut Vec::new()).await?;
        self.reset(&mut slot).await;
        self.ready(&mut slot, &mut Vec::new()).await
    }

    /// Ends the interpreter and every process it started (a removed code context), from
    /// any process; a code context's files (its socket, status, last words and lock) go too.
    pub async fn shut_down(&self) -> Result<(), ToolError> {
        let mut slot = self.slot.lock().await;
        let killed = match self.ready(&mut slot, &mut Vec::new()).await {
            Ok(()) => match slot.driver.take() {
                Some(d) => d.kill(&*self.sandbox).await.map_err(ToolError::Internal),
                None => Ok(()),
            },
            Err(e) => Err(e),
        };
        // The files go even when the interpreter could not be reached (whatever still runs
        // ends with the session).
        let removed = match &self.context {
            Some((id, _)) => driver::remove_context_files(&*self.sandbox, id)
                .await
                .map_err(ToolError::Internal),
            None => Ok(()),
        };
        killed.and(removed)
    }

    async fn run_locked(
        &self,
        slot: &mut Slot,
        code: &str,
        timeout: Duration,
        cancel: &tokio_util::sync::CancellationToken,
        notes: &mut Vec<String>,
        live: Option<LiveOutput>,
    ) -> Result<Cell, ToolError> {
        self.ready(slot, notes).await?;
        self.sync_proxy_env(slot).await;
        let Some(driver) = slot.driver.as_mut() else {
            return Err(ToolError::Internal(
                "the python interpreter did not start".into(),
            ));
        };
        let run = driver.run(code, self.output_cap, timeout, cancel, live);
        let end = match while_alive(&*self.sandbox, async { Ok(run.await) }).await {
            Ok(end) => end,
            Err(gone) => {
                slot.driver = None;
                return Err(ToolError::Sandbox(gone));
            }
        };
        let secs = timeout.as_secs();
        Ok(match end {
            CellEnd::Done(out) => Cell::Ran(out, None),
            CellEnd::TimedOut(Some(out)) => Cell::Ran(out, Some(secs)),
            CellEnd::TimedOut(None) => Cell::Failed(self.stuck(slot, secs).await),
            CellEnd::Cancelled => return Err(ToolError::Cancelled),
            CellEnd::Died(why) => Cell::Failed(self.died(slot, why).await?),
        })
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
         come back apart; long output is cut in the middle. numpy, pandas (with Excel), scipy, \
         statsmodels, scikit-learn, matplotlib, seaborn and plotly are installed. There is no \
         network, so pip install and downloads fail. Files live in /workspace (the working \
         directory). The open matplotlib figures are returned as images at the end of the cell (up \
         to 8, in order) and saved under /workspace/figures/ (plt.show() is not needed). A cell that \
         runs past its timeout is interrupted with KeyboardInterrupt and the variables are kept. \
         stdin is empty, so input() fails."
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
            self.reset(&mut slot).await;
            notes.push("the python interpreter was reset: earlier variables are gone".to_string());
        }
        if code.trim().is_empty() {
            if reset {
                self.ready(&mut slot, &mut Vec::new()).await?;
                return Ok(ToolResult::ok("").with_system(notes.join("; ")));
            }
            return Ok(ToolResult::error("the code is empty"));
        }
        let secs = timeout.as_secs();
        let mut result = match self
            .run_locked(&mut slot, code, timeout, &ctx.cancel, &mut notes, None)
            .await?
        {
            Cell::Ran(out, None) => observe(out, None),
            Cell::Ran(out, Some(_)) => observe(
                out,
                Some(format!(
                    "the cell timed out after {secs}s and was interrupted with KeyboardInterrupt; \
                     variables defined so far are kept"
                )),
            ),
            Cell::Failed(result) => result,
        };
        if !notes.is_empty() {
            result = result.with_system(notes.join("; "));
        }
        Ok(result)
    }
}
