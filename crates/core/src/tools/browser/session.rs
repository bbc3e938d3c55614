//! Live: one running browser with its tabs, and the helpers every action uses (evaluate in an
//! isolated world, wait for a navigation to settle, capture the state).
//!
//! Tab ids are positions in `tabs`. Pages the browser opens by itself (target=_blank,
//! window.open) carry an opener and are adopted at the end of the list; a page without an
//! opener that we did not create (Chromium's initial tab) is closed.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chromiumoxide::Page;
use chromiumoxide::cdp::browser_protocol::page::{
    CaptureScreenshotFormat, CaptureScreenshotParams, EventJavascriptDialogOpening,
    HandleJavaScriptDialogParams,
};
use chromiumoxide::cdp::browser_protocol::target::{GetTargetsParams, TargetId};
use chromiumoxide::cdp::js_protocol::runtime::EvaluateParams;
use futures::StreamExt;
use serde::de::DeserializeOwned;

use super::chromium::{self, BrowserError, Running};
use super::downloads::Downloads;
use super::state::{BrowserState, INDEX_SCRIPT, PageInfo, TabInfo};
use crate::sandbox::Sandbox;

/// JPEG quality of the state screenshot: readable text at a fraction of PNG's size.
const SCREENSHOT_QUALITY: i64 = 75;
/// A navigation started by a click or a key gets this long to finish before the state is taken.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The host-side record of a kept session's browser: its endpoint and its tabs (target ids).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Saved {
    pub endpoint: chromium::Endpoint,
    pub tabs: Vec<String>,
    pub current: usize,
}

pub struct Live {
    pub running: Running,
    pub tabs: Vec<Page>,
    pub current: usize,
    /// Targets we closed: the driver may list them for a moment after, never adopt them again.
    closed: HashSet<TargetId>,
    /// Dialogs answered since the last state, for the model.
    dialogs: Arc<Mutex<Vec<String>>>,
    /// Downloads into /workspace, for the model.
    pub downloads: Downloads,
}

impl Live {
    pub async fn start(
        sandbox: Arc<dyn Sandbox>,
        n: u32,
        extra: &[String],
    ) -> Result<Live, BrowserError> {
        let started = std::time::Instant::now();
        let running = chromium::start(sandbox, n, extra).await?;
        tracing::debug!(elapsed = ?started.elapsed(), "browser: connected");
        let downloads = Downloads::watch(
            &running.browser,
            running.sandbox.clone(),
            running.dead.clone(),
        )
        .await?;
        let page = running.browser.new_page("about:blank").await?;
        tracing::debug!(elapsed = ?started.elapsed(), "browser: first tab open");
        let mut live = Live {
            running,
            tabs: vec![page],
            current: 0,
            closed: HashSet::new(),
            dialogs: Arc::new(Mutex::new(Vec::new())),
            downloads,
        };
        live.watch_dialogs(&live.tabs[0]);
        live.sync_tabs().await;
        Ok(live)
    }

    /// Takes over the Chromium an earlier process left running (see `Saved`): its pages
    /// become the tabs again, in the recorded order, the recorded one current.
    pub async fn adopt(sandbox: Arc<dyn Sandbox>, saved: &Saved) -> Result<Live, BrowserError> {
        let mut running = chromium::adopt(sandbox, &saved.endpoint).await?;
        running.browser.fetch_targets().await?;
        // The setting may have ended with the connection that made it: made again here.
        let downloads = Downloads::watch(
            &running.browser,
            running.sandbox.clone(),
            running.dead.clone(),
        )
        .await?;
        // The driver attaches to the existing pages in the background: wait until the
        // recorded ones are there (a tab closed meanwhile never comes, hence the bound).
        let mut pages = Vec::new();
        for _ in 0..40 {
            pages = running.browser.pages().await?;
            let all_there = saved
                .tabs
                .iter()
                .all(|t| pages.iter().any(|p| p.target_id().as_ref() == t.as_str()));
            if all_there && !pages.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let position = |p: &Page| {
            saved
                .tabs
                .iter()
                .position(|t| p.target_id().as_ref() == t.as_str())
                .unwrap_or(usize::MAX)
        };
        pages.sort_by_key(position);
        let mut live = Live {
            running,
            tabs: Vec::new(),
            current: 0,
            closed: HashSet::new(),
            dialogs: Arc::new(Mutex::new(Vec::new())),
            downloads,
        };
        let current = saved.tabs.get(saved.current).and_then(|id| {
            pages
                .iter()
                .position(|p| p.target_id().as_ref() == id.as_str())
        });
        for page in pages {
            live.watch_dialogs(&page);
            live.tabs.push(page);
        }
        live.current = current.unwrap_or(live.tabs.len().saturating_sub(1));
        live.ensure_tab().await?;
        Ok(live)
    }

    /// What a later process needs to adopt this browser.
    pub fn saved(&self) -> Saved {
        Saved {
            endpoint: self.running.endpoint.clone(),
            tabs: self
                .tabs
                .iter()
                .map(|p| p.target_id().as_ref().to_string())
                .collect(),
            current: self.current,
        }
    }

    pub fn page(&self) -> Result<&Page, BrowserError> {
        self.tabs
            .get(self.current)
            .ok_or_else(|| BrowserError::Cdp("no open tab".into()))
    }

    /// Brings `tabs` in line with the browser: adopts pages opened by pages, drops closed
    /// ones. Returns the id of the first adopted tab, if any.
    pub async fn sync_tabs(&mut self) -> Option<usize> {
        let Ok(pages) = self.running.browser.pages().await else {
            return None;
        };
        let live_ids: Vec<&TargetId> = pages.iter().map(|p| p.target_id()).collect();
        let current_id = self.tabs.get(self.current).map(|p| p.target_id().clone());
        self.tabs.retain(|p| live_ids.contains(&p.target_id()));
        let mut adopted = None;
        for page in pages {
            if self.tabs.iter().any(|p| p.target_id() == page.target_id())
                || self.closed.contains(page.target_id())
            {
                continue;
            }
            if page.opener_id().is_some() {
                adopted.get_or_insert(self.tabs.len());
                self.watch_dialogs(&page);
                self.tabs.push(page);
            } else {
                self.close_page(page).await;
            }
        }
        self.current = current_id
            .and_then(|id| self.tabs.iter().position(|p| *p.target_id() == id))
            .unwrap_or(self.tabs.len().saturating_sub(1));
        adopted
    }

    /// Adds a tab the model opened.
    pub fn push_tab(&mut self, page: Page) {
        self.watch_dialogs(&page);
        self.tabs.push(page);
        self.current = self.tabs.len() - 1;
    }

    /// Replaces the current tab by a fresh one on the same URL (a GET, never a form sent
    /// again; the tab's back history is lost): for a tab whose navigation the driver would
    /// wait on until its deadline.
    pub async fn renew_tab(&mut self) -> Result<(), BrowserError> {
        let old = self.page()?.clone();
        let url: String = self.eval("location.href").await.unwrap_or_default();
        let reopenable = ["http:", "https:", "file:", "data:", "about:"]
            .iter()
            .any(|s| url.starts_with(s));
        let url = if reopenable {
            url
        } else {
            "about:blank".into()
        };
        let fresh = self.running.browser.new_page(url.as_str()).await?;
        self.watch_dialogs(&fresh);
        if let Some(slot) = self.tabs.get_mut(self.current) {
            *slot = fresh;
        } else {
            self.push_tab(fresh);
        }
        self.close_page(old).await;
        Ok(())
    }

    /// alert/confirm/prompt/beforeunload block the page until answered, and with them every
    /// action: accept them at once and tell the model in the next state.
    fn watch_dialogs(&self, page: &Page) {
        let page = page.clone();
        let dialogs = self.dialogs.clone();
        let dead = self.running.dead.clone();
        tokio::spawn(async move {
            let Ok(mut events) = page.event_listener::<EventJavascriptDialogOpening>().await else {
                return;
            };
            loop {
                tokio::select! {
                    ev = events.next() => {
                        let Some(ev) = ev else { break };
                        let _ = page.execute(HandleJavaScriptDialogParams::new(true)).await;
                        if let Ok(mut d) = dialogs.lock() && d.len() < 5 {
                            let message: String = ev.message.chars().take(200).collect();
                            d.push(format!("{} {}", ev.r#type.as_ref(), serde_json::to_string(&message).unwrap_or_default()));
                        }
                    }
                    _ = dead.cancelled() => break,
                }
            }
        });
    }

    /// Closes a page and remembers it as closed.
    pub async fn close_page(&mut self, page: Page) {
        self.closed.insert(page.target_id().clone());
        let _ = page.close().await;
    }

    /// Makes sure one tab is open (the model may have closed the last one).
    pub async fn ensure_tab(&mut self) -> Result<(), BrowserError> {
        if self.tabs.is_empty() {
            let page = self.running.browser.new_page("about:blank").await?;
            self.push_tab(page);
        }
        Ok(())
    }

    /// Evaluates `expression` in the page's isolated utility world (page scripts cannot see
    /// or tamper with it) and decodes the value. A context lost to a navigation is retried once.
    pub async fn eval<T: DeserializeOwned>(&self, expression: &str) -> Result<T, BrowserError> {
        let page = self.page()?;
        let mut last = None;
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let context = page.secondary_execution_context().await.ok().flatten();
            let mut params = EvaluateParams::new(expression);
            params.context_id = context;
            params.return_by_value = Some(true);
            params.await_promise = Some(true);
            match page.evaluate_expression(params).await {
                Ok(result) => {
                    return result
                        .into_value::<T>()
                        .map_err(|e| BrowserError::Cdp(format!("unexpected script result: {e}")));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.map(BrowserError::from).unwrap_or(BrowserError::Died))
    }

    /// After an input that may navigate: give the navigation a moment to start, then wait
    /// for it to finish.
    pub async fn settle(&self) -> Result<(), BrowserError> {
        tokio::time::sleep(Duration::from_millis(120)).await;
        let page = self.page()?;
        let _ = tokio::time::timeout(SETTLE_TIMEOUT, page.wait_for_navigation()).await;
        Ok(())
    }

    /// The viewport as a base64 JPEG (CDP returns base64 already).
    pub async fn screenshot(&self) -> Result<String, BrowserError> {
        let params = CaptureScreenshotParams {
            format: Some(CaptureScreenshotFormat::Jpeg),
            quality: Some(SCREENSHOT_QUALITY),
            ..CaptureScreenshotParams::default()
        };
        let shot = self.page()?.execute(params).await?;
        Ok(AsRef::<str>::as_ref(&shot.result.data).to_string())
    }

    /// Url, title, tabs, elements, scroll and screenshot of the current tab.
    pub async fn capture(&mut self) -> Result<BrowserState, BrowserError> {
        self.sync_tabs().await;
        self.ensure_tab().await?;
        let info: PageInfo = self.eval(INDEX_SCRIPT).await?;
        let (targets, shot) = futures::join!(
            self.running.browser.execute(GetTargetsParams::default()),
            self.screenshot()
        );
        let targets = targets?.result.target_infos;
        let tabs = self
            .tabs
            .iter()
            .enumerate()
            .map(|(id, page)| {
                let info = targets.iter().find(|t| &t.target_id == page.target_id());
                TabInfo {
                    id,
                    url: info
                        .map(|t| t.url.chars().take(300).collect())
                        .unwrap_or_default(),
                    title: info
                        .map(|t| t.title.chars().take(100).collect())
                        .unwrap_or_default(),
                }
            })
            .collect();
        let mut state = BrowserState::new(info, tabs, self.current, Some(shot?));
        state.dialogs = self
            .dialogs
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default();
        state.downloads = self.downloads.unreported();
        Ok(state)
    }
}
