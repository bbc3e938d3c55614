//! browser_use: a headless Chromium inside the session's container, driven from the host over
//! CDP through a one-connection tunnel (see chromium.rs and sandbox/tunnel.rs).
//!
//! Chromium starts on the first action and is restarted, with a note, when it crashed or was
//! killed. In a kept session it outlives this process: its endpoint and tabs are saved on
//! the host after every action (`tools::saved`), and the first action of a later process
//! adopts that Chromium with its tabs instead of starting one. Every action returns the browser state (url, title, tabs, numbered elements,
//! scroll position) and a viewport screenshot. The agent reads the same state between steps
//! through `BrowserUse::current_state` / `BrowserState::to_prompt`.

pub mod actions;
pub mod chromium;
pub mod downloads;
pub mod elements;
pub mod extract;
pub mod net;
pub mod search;
pub mod session;
pub mod state;
mod stderr_log;
mod tool;
#[cfg(test)]
mod watch_tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use self::actions::{Action, Outcome};
use self::chromium::BrowserError;
use self::session::Live;
use super::{ToolContext, ToolError};
use crate::research::Research;
use crate::sandbox::watch::while_alive;
use crate::sandbox::{Sandbox, SandboxError};

/// The tool's name, which the agent watches for to show the browser state.
pub const NAME: &str = "browser_use";

pub use self::extract::Extractor;
pub use self::net::{ChromiumArgs, Egress};
pub use self::state::{BrowserState, ElementInfo, TabInfo};
pub use self::tool::WithoutSearch;

/// One action may take this long (plus its own `wait`); chromiumoxide's own limit is 30 s.
const ACTION_TIMEOUT: Duration = Duration::from_secs(25);
/// Reading the state after an action.
const CAPTURE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a sandbox that answered "running" right after Chromium's end gets to show that it
/// is in fact stopping (as the exec calls' own check allows, exec_sandbox.rs).
const DYING_SETTLE: Duration = Duration::from_millis(250);

/// The record kind in `tools::saved`.
const RECORD: &str = "browser";

pub struct BrowserUse {
    sandbox: Arc<dyn Sandbox>,
    /// A kept session's record; the browser an earlier process left there is adopted at
    /// the first start (`restored` says whether the record was read).
    saved: Option<super::saved::SavedTools>,
    restored: AtomicBool,
    live: tokio::sync::Mutex<Option<Live>>,
    /// The egress arguments the live browser was started with (`ChromiumArgs::adds_to`).
    started_with: std::sync::Mutex<Vec<String>>,
    starts: AtomicU32,
    /// The LLM step of extract_content; set per run, since the browser outlives runs.
    extractor: std::sync::Mutex<Option<Arc<dyn Extractor>>>,
    last: std::sync::Mutex<Option<BrowserState>>,
    /// The session's egress (None: off, nothing but the sandbox's own pages), read at every
    /// go_to_url, open_tab and web_search (net.rs).
    egress: Option<Egress>,
    /// The host-side search engines of the web_search action (search.rs).
    research: Option<Arc<Research>>,
    /// What the model reads: built per session, it says what the browser can open.
    description: String,
}

impl BrowserUse {
    pub fn new(sandbox: Arc<dyn Sandbox>) -> Self {
        Self {
            sandbox,
            saved: None,
            restored: AtomicBool::new(false),
            live: tokio::sync::Mutex::new(None),
            started_with: std::sync::Mutex::new(Vec::new()),
            starts: AtomicU32::new(0),
            extractor: std::sync::Mutex::new(None),
            last: std::sync::Mutex::new(None),
            egress: None,
            research: None,
            description: tool::describe(None, true),
        }
    }

    /// The live web: go_to_url, open_tab and web_search open the hosts the session's egress
    /// policy allows (Chromium reaches them through the session's proxy).
    pub fn with_egress(mut self, egress: Egress) -> Self {
        self.description = tool::describe(Some(&egress.at_start), true);
        self.egress = Some(egress);
        self
    }

    /// The engines the web_search action asks (without them it says there are none).
    pub fn with_research(mut self, research: Arc<Research>) -> Self {
        self.research = Some(research);
        self
    }

    /// Saves the browser's endpoint and tabs in `saved` after every action, so it outlives
    /// this process, and adopts the one an earlier process saved there (at the first start).
    pub fn with_saved(mut self, saved: super::saved::SavedTools) -> Self {
        self.saved = Some(saved);
        self
    }

    async fn save(&self, live: &Live) {
        if let Some(saved) = &self.saved {
            saved.save(RECORD, &live.saved()).await;
        }
    }

    /// The browser an earlier process saved in a kept session's record: read at the first
    /// start only (under the browser's lock); later starts number theirs after it.
    async fn adoptable(&self) -> Option<session::Saved> {
        let saved = self.saved.as_ref()?;
        if self.restored.swap(true, Ordering::AcqRel) {
            return None;
        }
        let record = saved.load::<session::Saved>(RECORD).await?;
        self.starts
            .store(record.endpoint.n.saturating_add(1), Ordering::Relaxed);
        Some(record)
    }

    /// The LLM step of extract_content; without one the page's Markdown is returned.
    pub fn with_extractor(self, extractor: Arc<dyn Extractor>) -> Self {
        self.set_extractor(Some(extractor));
        self
    }

    /// Replaces the extractor (a session's browser serves runs that may use other LLMs).
    pub fn set_extractor(&self, extractor: Option<Arc<dyn Extractor>>) {
        if let Ok(mut e) = self.extractor.lock() {
            *e = extractor;
        }
    }

    /// The state of the current tab, read now (None if the browser was never started or is
    /// gone). For the agent: add `to_prompt()` and the screenshot to the next-step prompt.
    pub async fn current_state(&self) -> Option<BrowserState> {
        let mut guard = self.live.lock().await;
        let live = guard.as_mut().filter(|l| !l.running.is_dead())?;
        let read = async {
            tokio::time::timeout(CAPTURE_TIMEOUT, live.capture())
                .await
                .unwrap_or(Err(BrowserError::Timeout(CAPTURE_TIMEOUT)))
        };
        match while_alive(&*self.sandbox, read).await {
            Ok(state) => {
                self.remember(&state);
                Some(state)
            }
            Err(BrowserError::Sandbox(SandboxError::SandboxGone { .. })) => {
                // Nothing of a dead sandbox's browser answers again, nor can it be shut down.
                guard.take();
                self.last_state()
            }
            Err(_) => self.last_state(),
        }
    }

    /// The state returned by the last action, without asking the browser.
    pub fn last_state(&self) -> Option<BrowserState> {
        self.last.lock().ok().and_then(|l| l.clone())
    }

    /// Stops Chromium and its tunnel. The next action starts a fresh browser.
    pub async fn shutdown(&self) {
        if let Some(live) = self.live.lock().await.take() {
            live.running.shutdown().await;
        }
        if let Some(saved) = &self.saved {
            saved.clear(RECORD).await;
        }
    }

    fn remember(&self, state: &BrowserState) {
        if let Ok(mut last) = self.last.lock() {
            *last = Some(state.clone());
        }
    }

    /// Whether the live browser was started without an argument the session's egress wants
    /// now (the pin that came with its first credential).
    fn lacks_a_pin(&self) -> bool {
        let Some(e) = &self.egress else { return false };
        let started = self
            .started_with
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        e.chromium_args.adds_to(&started)
    }

    /// Adopts the browser an earlier process left, else starts one.
    async fn start(&self, notes: &mut Vec<String>) -> Result<Live, BrowserError> {
        if let Some(record) = self.adoptable().await {
            match Live::adopt(self.sandbox.clone(), &record).await {
                Ok(live) => return Ok(live),
                Err(e) => {
                    tracing::debug!(error = %e, "browser: the saved one could not be adopted");
                    let _ = self
                        .sandbox
                        .kill_tagged(&format!(
                            "sandboxd-browser-{}-{}",
                            self.sandbox.session_id(),
                            record.endpoint.n
                        ))
                        .await;
                    notes.push(format!(
                        "the browser an earlier sandboxd process left in this session could not be reached ({e}), so a fresh one was started: its tabs are gone"
                    ));
                }
            }
        }
        let n = self.starts.fetch_add(1, Ordering::Relaxed);
        let extra = self
            .egress
            .as_ref()
            .map(|e| e.chromium_args.now())
            .unwrap_or_default();
        if let Ok(mut s) = self.started_with.lock() {
            s.clone_from(&extra);
        }
        match Live::start(self.sandbox.clone(), n, &extra).await {
            // Chromium also fails to start when its sandbox stopped under the start (killed
            // from outside): say that, as the backend knows it, not that Chromium failed.
            Err(e) if !matches!(e, BrowserError::Sandbox(_)) => {
                match self.outlived_by_sandbox().await {
                    Err(gone) => Err(gone.into()),
                    Ok(()) => Err(e),
                }
            }
            started => started,
        }
    }

    /// Runs the action under the sandbox's watch (sandbox/watch.rs): when the whole sandbox
    /// dies under it (gVisor's out-of-memory kill, after which Chromium's connection only goes
    /// silent), the action ends within about two seconds with the sandbox-gone error and the
    /// backend's reason instead of waiting for its own timeout.
    async fn perform(
        &self,
        action: &Action,
        ctx: &ToolContext,
    ) -> Result<(Outcome, Option<BrowserState>, Vec<String>), ToolError> {
        let mut guard = self.live.lock().await;
        let r = while_alive(&*self.sandbox, self.perform_in(&mut guard, action, ctx)).await;
        if let Err(ToolError::Sandbox(SandboxError::SandboxGone { .. })) = &r {
            // Dropped without a shutdown: there is nothing left to kill it in.
            guard.take();
        }
        r
    }

    /// Runs the action, restarting a dead browser first; returns the outcome, the state and notes.
    async fn perform_in(
        &self,
        guard: &mut Option<Live>,
        action: &Action,
        ctx: &ToolContext,
    ) -> Result<(Outcome, Option<BrowserState>, Vec<String>), ToolError> {
        let mut notes = Vec::new();
        if let Some(live) = guard.take_if(|l| l.running.is_dead()) {
            self.retire(live, &mut notes).await?;
        }
        if let Some(live) = guard.take_if(|_| self.lacks_a_pin()) {
            live.running.shutdown().await;
            notes.push("the browser was restarted to trust the hosts this session now has a credential for: its tabs are gone".into());
        }
        let mut retried = false;
        loop {
            if guard.is_none() {
                *guard = Some(self.start(&mut notes).await.map_err(fatal_or_observation)?);
            }
            let Some(live) = guard.as_mut() else {
                return Err(ToolError::Internal("the browser vanished".into()));
            };
            let dead = live.running.dead.clone();
            let limit = ACTION_TIMEOUT
                + Duration::from_secs(if let Action::Wait { seconds } = action {
                    *seconds
                } else {
                    0
                });
            let extractor = self.extractor.lock().ok().and_then(|e| e.clone());
            let extractor = extractor.as_deref();
            let result = tokio::select! {
                r = tokio::time::timeout(limit, actions::run(action, live, extractor)) => r.unwrap_or(Err(BrowserError::Timeout(limit))),
                _ = dead.cancelled() => Err(BrowserError::Died),
                _ = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
            };
            let outcome = match result {
                Ok(outcome) => outcome,
                Err(BrowserError::Died) | Err(BrowserError::Cdp(_))
                    if live.running.is_dead() || dead_soon(&dead).await =>
                {
                    if let Some(live) = guard.take() {
                        self.retire(live, &mut notes).await?;
                    }
                    if retried || action.uses_index() {
                        *guard = Some(self.start(&mut notes).await.map_err(fatal_or_observation)?);
                        let state = self.capture(guard, &mut notes).await?;
                        return Ok((Err("the action was not carried out because Chromium stopped; look at the fresh state and try again".into()), state, notes));
                    }
                    retried = true;
                    continue;
                }
                Err(BrowserError::Sandbox(e)) => return Err(ToolError::Sandbox(e)),
                Err(e) => Err(e.to_string()),
            };
            let state = self.capture(guard, &mut notes).await?;
            if let Some(live) = guard.as_ref() {
                self.save(live).await;
            }
            return Ok((outcome, state, notes));
        }
    }

    /// Reads the state. A browser that died under the read (the action finished just before
    /// Chromium's end was noticed) is restarted once and the fresh state is read, so the model
    /// sees where it stands; one that is alive but cannot answer is stopped for the next action.
    /// A browser that died with its sandbox is the sandbox-gone error.
    async fn capture(
        &self,
        guard: &mut Option<Live>,
        notes: &mut Vec<String>,
    ) -> Result<Option<BrowserState>, SandboxError> {
        let mut restarted = false;
        loop {
            let Some(live) = guard.as_mut() else {
                return Ok(None);
            };
            let dead = live.running.dead.clone();
            let result = tokio::select! {
                r = tokio::time::timeout(CAPTURE_TIMEOUT, live.capture()) => r.unwrap_or(Err(BrowserError::Timeout(CAPTURE_TIMEOUT))),
                _ = dead.cancelled() => Err(BrowserError::Died),
            };
            let e = match result {
                Ok(state) => {
                    self.remember(&state);
                    return Ok(Some(state));
                }
                Err(e) => e,
            };
            let died = matches!(e, BrowserError::Died | BrowserError::Cdp(_))
                && (live.running.is_dead() || dead_soon(&dead).await);
            let Some(live) = guard.take() else {
                return Ok(None);
            };
            if died && !restarted {
                restarted = true;
                self.retire(live, notes).await?;
                match self.start(notes).await {
                    Ok(fresh) => *guard = Some(fresh),
                    Err(BrowserError::Sandbox(gone @ SandboxError::SandboxGone { .. })) => {
                        return Err(gone);
                    }
                    Err(e) => {
                        notes.push(format!("Chromium stopped and could not be started again ({e}); the next action tries again"));
                        return Ok(None);
                    }
                }
                continue;
            }
            if died {
                self.outlived_by_sandbox().await?;
            }
            let why = match live.running.cut_reason() {
                Some(cut) => format!("sandboxd cut the connection to Chromium: {cut}"),
                None => e.to_string(),
            };
            live.running.shutdown().await;
            notes.push(format!("the browser state could not be read ({why}); Chromium was stopped and the next action starts it again"));
            return Ok(None);
        }
    }

    /// Ends a browser found dead: the sandbox-gone error when its sandbox went with it;
    /// otherwise the restart note and its shutdown, for the next start to replace it.
    async fn retire(&self, live: Live, notes: &mut Vec<String>) -> Result<(), SandboxError> {
        self.outlived_by_sandbox().await?;
        notes.push(live.running.restart_note());
        live.running.shutdown().await;
        Ok(())
    }

    /// Chromium's connection also ends when its whole sandbox stopped (killed from outside, or
    /// gVisor's out-of-memory kill): that is the session's end, not the browser's, and the
    /// answer is the sandbox-gone error with the backend's reason. Only the backend's definite
    /// answer counts; the engine may report a dying sandbox as running for a moment after its
    /// processes' streams ended, so a running answer is looked at once more.
    async fn outlived_by_sandbox(&self) -> Result<(), SandboxError> {
        self.sandbox.check_alive().await?;
        tokio::time::sleep(DYING_SETTLE).await;
        self.sandbox.check_alive().await
    }
}

/// A CDP error right as Chromium dies comes before the process's end is noticed: wait briefly.
async fn dead_soon(dead: &tokio_util::sync::CancellationToken) -> bool {
    tokio::time::timeout(Duration::from_millis(500), dead.cancelled())
        .await
        .is_ok()
}

fn fatal_or_observation(e: BrowserError) -> ToolError {
    match e {
        BrowserError::Sandbox(e) => ToolError::Sandbox(e),
        other => ToolError::Internal(other.to_string()),
    }
}

impl Drop for BrowserUse {
    fn drop(&mut self) {
        let Some(live) = self.live.get_mut().take() else {
            return;
        };
        // A kept session's browser is left running for the next process (its record says
        // where); the session's removal takes it along otherwise.
        if self.saved.is_some() {
            return;
        }
        // Killing the processes inside the container needs the runtime; without one, the
        // session's container going away takes them along.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(live.running.shutdown());
        }
    }
}
