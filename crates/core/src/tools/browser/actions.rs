//! The browser_use actions: parsing the model's arguments and carrying each action out on
//! the live browser.
//!
//! Element and keyboard actions live in elements.rs; scripts run in the isolated world and
//! get arguments only as JSON literals.

use std::time::Duration;

use chromiumoxide::cdp::browser_protocol::page::{
    GetNavigationHistoryParams, NavigateToHistoryEntryParams,
};
use serde_json::Value;

use chromiumoxide::error::CdpError;

use super::chromium::BrowserError;
use super::elements::{click, dropdown_options, input_text, select_option, send_keys};
use super::extract::{self, Extractor};
use super::session::Live;
use super::{downloads, net};

/// `wait` sleeps at most this long: longer waits belong in bash (sleep) or in a loop of steps.
pub const MAX_WAIT_SECS: u64 = 10;

pub const ACTIONS: &[&str] = &[
    "go_to_url",
    "click_element",
    "input_text",
    "scroll_down",
    "scroll_up",
    "scroll_to_text",
    "send_keys",
    "get_dropdown_options",
    "select_dropdown_option",
    "go_back",
    "refresh",
    "wait",
    "extract_content",
    "switch_tab",
    "open_tab",
    "close_tab",
    "screenshot",
    "web_search",
];

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    GoToUrl { url: String },
    ClickElement { index: i64 },
    InputText { index: i64, text: String },
    Scroll { down: bool, amount: Option<i64> },
    ScrollToText { text: String },
    SendKeys { keys: String },
    GetDropdownOptions { index: i64 },
    SelectDropdownOption { index: i64, text: String },
    GoBack,
    Refresh,
    Wait { seconds: u64 },
    ExtractContent { goal: String },
    SwitchTab { tab_id: i64 },
    OpenTab { url: String },
    CloseTab { tab_id: i64 },
    Screenshot,
    WebSearch { query: String },
}

/// What an action did, for the model. `Err` is a mistake the model can fix.
pub type Outcome = Result<String, String>;

impl Action {
    /// Reads the action and its parameters; a missing one is named in the error.
    pub fn parse(args: &Value) -> Result<Action, String> {
        let action = args
            .get("action")
            .and_then(Value::as_str)
            .ok_or("missing parameter 'action'")?;
        let s = |key: &str| -> Result<String, String> {
            match args.get(key).and_then(Value::as_str) {
                Some(v) if !v.is_empty() => Ok(v.to_string()),
                _ => Err(format!("action {action} needs the parameter '{key}'")),
            }
        };
        let i = |key: &str| -> Result<i64, String> {
            args.get(key)
                .and_then(Value::as_i64)
                .ok_or_else(|| format!("action {action} needs the integer parameter '{key}'"))
        };
        Ok(match action {
            "go_to_url" => Action::GoToUrl { url: s("url")? },
            "click_element" => Action::ClickElement { index: i("index")? },
            "input_text" => Action::InputText {
                index: i("index")?,
                text: args
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or("action input_text needs the parameter 'text'")?
                    .to_string(),
            },
            "scroll_down" | "scroll_up" => Action::Scroll {
                down: action == "scroll_down",
                amount: args.get("scroll_amount").and_then(Value::as_i64),
            },
            "scroll_to_text" => Action::ScrollToText { text: s("text")? },
            "send_keys" => Action::SendKeys { keys: s("keys")? },
            "get_dropdown_options" => Action::GetDropdownOptions { index: i("index")? },
            "select_dropdown_option" => Action::SelectDropdownOption {
                index: i("index")?,
                text: s("text")?,
            },
            "go_back" => Action::GoBack,
            "refresh" => Action::Refresh,
            "wait" => Action::Wait {
                seconds: args
                    .get("seconds")
                    .and_then(Value::as_u64)
                    .unwrap_or(3)
                    .min(MAX_WAIT_SECS),
            },
            "extract_content" => Action::ExtractContent { goal: s("goal")? },
            "switch_tab" => Action::SwitchTab {
                tab_id: i("tab_id")?,
            },
            "open_tab" => Action::OpenTab { url: s("url")? },
            "close_tab" => Action::CloseTab {
                tab_id: i("tab_id")?,
            },
            "screenshot" => Action::Screenshot,
            "web_search" => Action::WebSearch { query: s("query")? },
            other => {
                return Err(format!(
                    "unknown action {other:?}; the actions are: {}",
                    ACTIONS.join(", ")
                ));
            }
        })
    }

    /// Actions that mean something only on the page the model last saw.
    pub fn uses_index(&self) -> bool {
        matches!(
            self,
            Action::ClickElement { .. }
                | Action::InputText { .. }
                | Action::GetDropdownOptions { .. }
                | Action::SelectDropdownOption { .. }
                | Action::SwitchTab { .. }
                | Action::CloseTab { .. }
        )
    }
}

/// Carries the action out on the current tab.
pub async fn run(
    action: &Action,
    live: &mut Live,
    extractor: Option<&dyn Extractor>,
) -> Result<Outcome, BrowserError> {
    match action {
        Action::GoToUrl { url } => go_to_url(live, url).await,
        Action::ClickElement { index } => click(live, *index).await,
        Action::InputText { index, text } => input_text(live, *index, text).await,
        Action::Scroll { down, amount } => scroll(live, *down, *amount).await,
        Action::ScrollToText { text } => scroll_to_text(live, text).await,
        Action::SendKeys { keys } => send_keys(live, keys).await,
        Action::GetDropdownOptions { index } => dropdown_options(live, *index).await,
        Action::SelectDropdownOption { index, text } => select_option(live, *index, text).await,
        Action::GoBack => go_back(live).await,
        Action::Refresh => {
            live.page()?.reload().await?;
            Ok(Ok("Reloaded the page".into()))
        }
        Action::Wait { seconds } => {
            tokio::time::sleep(Duration::from_secs(*seconds)).await;
            Ok(Ok(format!("Waited {seconds} seconds")))
        }
        Action::ExtractContent { goal } => extract_content(live, goal, extractor).await,
        Action::SwitchTab { tab_id } => {
            let Some(id) = tab_index(live, *tab_id) else {
                return Ok(Err(bad_tab(live, *tab_id)));
            };
            live.current = id;
            live.page()?.activate().await?;
            Ok(Ok(format!("Switched to tab {id}")))
        }
        Action::OpenTab { url } => {
            let page = live.running.browser.new_page(url.as_str()).await?;
            live.push_tab(page);
            Ok(Ok(format!("Opened tab {} with {url}", live.current)))
        }
        Action::CloseTab { tab_id } => close_tab(live, *tab_id).await,
        Action::Screenshot => Ok(Ok("Took a screenshot of the viewport".into())),
        // The tool searches on the host and hands over a go_to_url (search.rs).
        Action::WebSearch { .. } => Ok(Err("web_search is carried out by the tool".into())),
    }
}

/// Navigates the current tab. A load that fails in Chromium (`net::ERR_…`: the egress proxy
/// refused or is not running, the name does not resolve) is an answer for the model, not a
/// browser error. A navigation that turns into a download never finishes loading (the page
/// stays where it was): the download is waited for instead, and named.
async fn go_to_url(live: &mut Live, url: &str) -> Result<Outcome, BrowserError> {
    let page = live.page()?.clone();
    let mark = live.downloads.mark();
    let loaded = tokio::select! {
        r = page.goto(url) => Some(r.map(|_| ())),
        _ = live.downloads.began_after(mark) => None,
    };
    match loaded {
        Some(Ok(())) => Ok(Ok(format!("Navigated to {url}"))),
        Some(Err(CdpError::ChromeMessage(e))) => Ok(Err(net::load_failure(url, &e))),
        Some(Err(e)) => Err(e.into()),
        None => {
            let done = live
                .downloads
                .finished_after(mark, downloads::DOWNLOAD_WAIT)
                .await;
            // The driver waits on the navigation the download cut short until its own
            // deadline (30 s) and holds the tab's next one behind it: a fresh tab on the
            // same page takes its place.
            live.renew_tab().await?;
            Ok(Ok(format!(
                "{url} is a download, not a page: {}. The tab shows the page it showed before (reloaded; its back history is gone).",
                done.join("; ")
            )))
        }
    }
}

/// Scrolls by `amount` pixels (a screen when None), and says how far the page really moved.
async fn scroll(live: &mut Live, down: bool, amount: Option<i64>) -> Result<Outcome, BrowserError> {
    let sign = if down { 1 } else { -1 };
    let amount = amount
        .map(|a| a.to_string())
        .unwrap_or_else(|| "window.innerHeight".into());
    let js = format!(
        "(() => {{ const a = {sign} * ({amount}); const before = window.scrollY; \
         window.scrollBy({{top: a, behavior: 'instant'}}); return Math.round(window.scrollY - before); }})()"
    );
    let moved: f64 = live.eval(&js).await?;
    let dir = if down { "down" } else { "up" };
    Ok(Ok(format!("Scrolled {dir} by {} pixels", moved.abs())))
}

/// Scrolls the first visible element whose text contains `text` (any case) into view.
async fn scroll_to_text(live: &mut Live, text: &str) -> Result<Outcome, BrowserError> {
    let js = format!(
        "(() => {{ const needle = {}.toLowerCase(); \
         const w = document.createTreeWalker(document.body || document.documentElement, NodeFilter.SHOW_TEXT); \
         let n; while ((n = w.nextNode())) {{ if (!n.textContent.toLowerCase().includes(needle)) continue; \
         const el = n.parentElement; if (!el) continue; const r = el.getBoundingClientRect(); \
         if (r.width === 0 && r.height === 0) continue; \
         el.scrollIntoView({{block: 'center', behavior: 'instant'}}); return true; }} return false; }})()",
        json(text)
    );
    let found: bool = live.eval(&js).await?;
    Ok(if found {
        Ok(format!("Scrolled to the text {}", json(text)))
    } else {
        Err(format!("the text {} is not on the page", json(text)))
    })
}

async fn go_back(live: &mut Live) -> Result<Outcome, BrowserError> {
    let page = live.page()?;
    let history = page
        .execute(GetNavigationHistoryParams::default())
        .await?
        .result;
    // The index and the list come from Chromium, which runs the page's code: check
    // both instead of trusting that one fits the other.
    let previous = usize::try_from(history.current_index)
        .ok()
        .and_then(|current| current.checked_sub(1))
        .and_then(|i| history.entries.get(i));
    let Some(entry) = previous.map(|e| e.id) else {
        return Ok(Err("there is no previous page in this tab's history".into()));
    };
    page.execute(NavigateToHistoryEntryParams::new(entry))
        .await?;
    live.settle().await?;
    Ok(Ok("Went back to the previous page".into()))
}

/// Closes a tab; the tab before it (or the first) becomes current, and a new one opens when
/// it was the last.
async fn close_tab(live: &mut Live, tab_id: i64) -> Result<Outcome, BrowserError> {
    let Some(id) = tab_index(live, tab_id) else {
        return Ok(Err(bad_tab(live, tab_id)));
    };
    let page = live.tabs.remove(id);
    live.close_page(page).await;
    if live.current >= id && live.current > 0 {
        live.current -= 1;
    }
    live.ensure_tab().await?;
    Ok(Ok(format!(
        "Closed tab {id}; tab {} is current",
        live.current
    )))
}

pub(super) fn json(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

fn tab_index(live: &Live, tab_id: i64) -> Option<usize> {
    usize::try_from(tab_id)
        .ok()
        .filter(|id| *id < live.tabs.len())
}

fn bad_tab(live: &Live, tab_id: i64) -> String {
    format!(
        "there is no tab {tab_id}: the open tabs are 0-{}",
        live.tabs.len().saturating_sub(1)
    )
}

async fn extract_content(
    live: &mut Live,
    goal: &str,
    extractor: Option<&dyn Extractor>,
) -> Result<Outcome, BrowserError> {
    let html = live.page()?.content().await?;
    let markdown = tokio::task::spawn_blocking(move || extract::html_to_markdown(&html))
        .await
        .map_err(|e| BrowserError::Cdp(format!("the Markdown conversion failed: {e}")))?;
    let Some(extractor) = extractor else {
        let cut = extract::cut(&markdown, extract::MAX_RAW_MARKDOWN);
        let note = if cut.len() < markdown.len() {
            format!("\n[cut: {} of {} bytes shown]", cut.len(), markdown.len())
        } else {
            String::new()
        };
        return Ok(Ok(format!(
            "No extraction model is configured, so here is the page as Markdown; find what the goal {} asks in it:\n{cut}{note}",
            json(goal)
        )));
    };
    let input = extract::cut(&markdown, extract::MAX_MARKDOWN);
    match extractor.extract(goal, input).await {
        Ok(value) => Ok(Ok(format!(
            "Extracted from the page for the goal {}:\n{}",
            json(goal),
            serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string())
        ))),
        Err(e) => Ok(Err(format!("the extraction failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn missing_parameters_are_named() {
        assert_eq!(
            Action::parse(&json!({"action": "click_element"})).unwrap_err(),
            "action click_element needs the integer parameter 'index'"
        );
        assert!(
            Action::parse(&json!({"action": "go_to_url"}))
                .unwrap_err()
                .contains("'url'")
        );
        assert!(
            Action::parse(&json!({"action": "input_text", "index": 1}))
                .unwrap_err()
                .contains("'text'")
        );
        assert!(
            Action::parse(&json!({"action": "select_dropdown_option", "index": 1}))
                .unwrap_err()
                .contains("'text'")
        );
        assert!(
            Action::parse(&json!({"action": "extract_content"}))
                .unwrap_err()
                .contains("'goal'")
        );
        assert_eq!(
            Action::parse(&json!({"action": "web_search"})).unwrap_err(),
            "action web_search needs the parameter 'query'"
        );
        assert!(
            Action::parse(&json!({"action": "search_the_web"}))
                .unwrap_err()
                .contains("unknown action")
        );
        assert_eq!(
            Action::parse(&json!({"action": "wait", "seconds": 99})),
            Ok(Action::Wait {
                seconds: MAX_WAIT_SECS
            })
        );
        assert_eq!(
            Action::parse(&json!({"action": "wait"})),
            Ok(Action::Wait { seconds: 3 })
        );
    }
}
