//! The browser_use actions: parsing the model's arguments and carrying each action out on
//! the live browser.
//!
//! Elements are addressed by the index of the last state (see state.rs); clicks and typing go
//! through CDP input events (trusted, like a user's), everything else through small scripts
//! in the isolated world. Arguments are embedded in scripts only as JSON literals.

use std::time::Duration;

use chromiumoxide::cdp::browser_protocol::input::{
    DispatchKeyEventParams, DispatchKeyEventType, InsertTextParams,
};
use chromiumoxide::cdp::browser_protocol::page::{
    GetNavigationHistoryParams, NavigateToHistoryEntryParams,
};
use chromiumoxide::layout::Point;
use serde_json::Value;

use super::chromium::BrowserError;
use super::extract::{self, Extractor};
use super::session::Live;

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

/// Only what lives inside the sandbox can load: the container has no network.
pub fn check_url(url: &str) -> Result<(), String> {
    let no_network = || {
        format!(
            "cannot open {url:?}: the sandbox has no network. Only file://, data:, about: and http(s) on \
             localhost / 127.0.0.1 / [::1] (servers started inside the sandbox) can be opened."
        )
    };
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a valid URL ({e}); give a full URL such as http://localhost:8000/ or file:///workspace/index.html"))?;
    match parsed.scheme() {
        "file" | "about" | "data" => Ok(()),
        "http" | "https" => {
            let host = parsed.host_str().unwrap_or_default();
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let local = host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if local { Ok(()) } else { Err(no_network()) }
        }
        _ => Err(no_network()),
    }
}

/// Carries the action out on the current tab.
pub async fn run(
    action: &Action,
    live: &mut Live,
    extractor: Option<&dyn Extractor>,
) -> Result<Outcome, BrowserError> {
    match action {
        Action::GoToUrl { url } => {
            if let Err(e) = check_url(url) {
                return Ok(Err(e));
            }
            live.page()?.goto(url.as_str()).await?;
            Ok(Ok(format!("Navigated to {url}")))
        }
        Action::ClickElement { index } => click(live, *index).await,
        Action::InputText { index, text } => input_text(live, *index, text).await,
        Action::Scroll { down, amount } => {
            let sign = if *down { 1 } else { -1 };
            let amount = amount
                .map(|a| a.to_string())
                .unwrap_or_else(|| "window.innerHeight".into());
            let js = format!(
                "(() => {{ const a = {sign} * ({amount}); const before = window.scrollY; \
                 window.scrollBy({{top: a, behavior: 'instant'}}); return Math.round(window.scrollY - before); }})()"
            );
            let moved: f64 = live.eval(&js).await?;
            let dir = if *down { "down" } else { "up" };
            Ok(Ok(format!("Scrolled {dir} by {} pixels", moved.abs())))
        }
        Action::ScrollToText { text } => {
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
        Action::SendKeys { keys } => send_keys(live, keys).await,
        Action::GetDropdownOptions { index } => dropdown_options(live, *index).await,
        Action::SelectDropdownOption { index, text } => select_option(live, *index, text).await,
        Action::GoBack => {
            let page = live.page()?;
            let history = page
                .execute(GetNavigationHistoryParams::default())
                .await?
                .result;
            let current = usize::try_from(history.current_index).unwrap_or(0);
            if current == 0 {
                return Ok(Err("there is no previous page in this tab's history".into()));
            }
            let entry = history.entries[current - 1].id;
            page.execute(NavigateToHistoryEntryParams::new(entry))
                .await?;
            live.settle().await?;
            Ok(Ok("Went back to the previous page".into()))
        }
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
            if let Err(e) = check_url(url) {
                return Ok(Err(e));
            }
            let page = live.running.browser.new_page(url.as_str()).await?;
            live.push_tab(page);
            Ok(Ok(format!("Opened tab {} with {url}", live.current)))
        }
        Action::CloseTab { tab_id } => {
            let Some(id) = tab_index(live, *tab_id) else {
                return Ok(Err(bad_tab(live, *tab_id)));
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
        Action::Screenshot => Ok(Ok("Took a screenshot of the viewport".into())),
    }
}

fn json(text: &str) -> String {
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

/// Runs `body` with `el` bound to element `index` of the last state. Err is for the model.
async fn on_element(
    live: &Live,
    index: i64,
    body: &str,
) -> Result<Result<Value, String>, BrowserError> {
    let js = format!(
        "(() => {{ const els = window.__sandboxd_elems; if (!els) return {{stale: true}}; \
         const i = {index}; if (i < 0 || i >= els.length) return {{count: els.length}}; \
         const el = els[i]; if (!el.isConnected) return {{stale: true}}; {body} }})()"
    );
    let v: Value = live.eval(&js).await?;
    if v.get("stale").is_some() {
        return Ok(Err(
            "the page changed since the last state (it navigated or was rebuilt); \
                       choose the index again from the state below"
                .into(),
        ));
    }
    if let Some(count) = v.get("count").and_then(Value::as_u64) {
        return Ok(Err(if count == 0 {
            format!(
                "element {index} does not exist: there are no interactive elements in the viewport (scroll or navigate first)"
            )
        } else {
            format!(
                "element {index} does not exist: valid indexes are 0-{} (from the last state)",
                count - 1
            )
        }));
    }
    Ok(Ok(v))
}

async fn click(live: &mut Live, index: i64) -> Result<Outcome, BrowserError> {
    let body = "const tag = el.tagName.toLowerCase(); if (tag === 'select') return {select: true}; \
                el.scrollIntoView({block: 'center', inline: 'center', behavior: 'instant'}); \
                const r = el.getBoundingClientRect(); \
                return {x: r.left + r.width / 2, y: r.top + r.height / 2, tag};";
    let v = match on_element(live, index, body).await? {
        Ok(v) => v,
        Err(e) => return Ok(Err(e)),
    };
    if v.get("select").is_some() {
        return Ok(Err(format!(
            "element {index} is a dropdown (<select>): use get_dropdown_options and select_dropdown_option"
        )));
    }
    let (Some(x), Some(y)) = (v["x"].as_f64(), v["y"].as_f64()) else {
        return Err(BrowserError::Cdp(format!("unexpected click target: {v}")));
    };
    live.page()?.click(Point { x, y }).await?;
    live.settle().await?;
    let tag = v["tag"].as_str().unwrap_or("element");
    let mut msg = format!("Clicked element {index} (<{tag}>)");
    if let Some(tab) = live.sync_tabs().await {
        live.current = tab;
        msg.push_str(&format!("; it opened tab {tab}, which is now current"));
    }
    Ok(Ok(msg))
}

async fn input_text(live: &mut Live, index: i64, text: &str) -> Result<Outcome, BrowserError> {
    let body = "const tag = el.tagName.toLowerCase(); \
        const noText = ['checkbox','radio','submit','button','file','image','reset','range','color']; \
        if (!(tag === 'input' || tag === 'textarea' || el.isContentEditable)) return {not_input: '<' + tag + '>'}; \
        if (tag === 'input' && noText.includes(el.type)) return {not_input: '<input type=' + el.type + '>'}; \
        if (el.disabled || el.readOnly) return {not_input: 'disabled or read-only'}; \
        el.scrollIntoView({block: 'center', behavior: 'instant'}); el.focus(); \
        if (tag === 'input' || tag === 'textarea') { el.value = ''; if (el.select) { try { el.select(); } catch (e) {} } } \
        else { const s = window.getSelection(); const r = document.createRange(); r.selectNodeContents(el); \
               s.removeAllRanges(); s.addRange(r); } \
        return {ok: true};";
    let v = match on_element(live, index, body).await? {
        Ok(v) => v,
        Err(e) => return Ok(Err(e)),
    };
    if let Some(what) = v.get("not_input").and_then(Value::as_str) {
        return Ok(Err(format!(
            "element {index} ({what}) does not take text; use click_element for it"
        )));
    }
    live.page()?.execute(InsertTextParams::new(text)).await?;
    Ok(Ok(format!("Typed {} into element {index}", json(text))))
}

async fn dropdown_options(live: &mut Live, index: i64) -> Result<Outcome, BrowserError> {
    let body = "if (el.tagName !== 'SELECT') return {not_select: el.tagName.toLowerCase()}; \
        return {options: Array.from(el.options).slice(0, 200).map((o, i) => \
          ({index: i, text: o.text.trim().slice(0, 100), value: o.value.slice(0, 100), selected: o.selected}))};";
    let v = match on_element(live, index, body).await? {
        Ok(v) => v,
        Err(e) => return Ok(Err(e)),
    };
    if let Some(tag) = v.get("not_select").and_then(Value::as_str) {
        return Ok(Err(format!(
            "element {index} is a <{tag}>, not a dropdown (<select>)"
        )));
    }
    let mut out = format!(
        "Options of dropdown {index} (select one by its text with select_dropdown_option):"
    );
    for o in v["options"].as_array().into_iter().flatten() {
        let selected = if o["selected"] == true {
            " (selected)"
        } else {
            ""
        };
        out.push_str(&format!(
            "\n{}: {} value={}{selected}",
            o["index"],
            json(o["text"].as_str().unwrap_or_default()),
            json(o["value"].as_str().unwrap_or_default())
        ));
    }
    Ok(Ok(out))
}

async fn select_option(live: &mut Live, index: i64, text: &str) -> Result<Outcome, BrowserError> {
    let body = format!(
        "if (el.tagName !== 'SELECT') return {{not_select: el.tagName.toLowerCase()}}; \
         const want = {}; const opts = Array.from(el.options); \
         const o = opts.find(o => o.text.trim() === want.trim()) || opts.find(o => o.value === want) || \
                   opts.find(o => o.text.trim().toLowerCase() === want.trim().toLowerCase()); \
         if (!o) return {{missing: opts.slice(0, 50).map(o => o.text.trim().slice(0, 60))}}; \
         el.focus(); el.selectedIndex = o.index; \
         el.dispatchEvent(new Event('input', {{bubbles: true}})); el.dispatchEvent(new Event('change', {{bubbles: true}})); \
         return {{selected: o.text.trim().slice(0, 100), value: o.value.slice(0, 100)}};",
        json(text)
    );
    let v = match on_element(live, index, &body).await? {
        Ok(v) => v,
        Err(e) => return Ok(Err(e)),
    };
    if let Some(tag) = v.get("not_select").and_then(Value::as_str) {
        return Ok(Err(format!(
            "element {index} is a <{tag}>, not a dropdown (<select>)"
        )));
    }
    if let Some(missing) = v.get("missing") {
        return Ok(Err(format!(
            "dropdown {index} has no option {}; its options are {missing}",
            json(text)
        )));
    }
    live.settle().await?;
    Ok(Ok(format!(
        "Selected option {} (value {}) in dropdown {index}",
        json(v["selected"].as_str().unwrap_or_default()),
        json(v["value"].as_str().unwrap_or_default())
    )))
}

/// Presses a key or a combination such as "Enter", "Tab", "Control+a", "Shift+ArrowDown".
async fn send_keys(live: &mut Live, keys: &str) -> Result<Outcome, BrowserError> {
    let parts: Vec<&str> = if keys == "+" {
        vec!["+"]
    } else {
        keys.split('+').collect()
    };
    let (key, modifiers) = parts
        .split_last()
        .map(|(k, m)| (*k, m.to_vec()))
        .unwrap_or((keys, Vec::new()));
    let mut bits = 0i64;
    let mut modifier_defs = Vec::new();
    for m in &modifiers {
        let (bit, name) = match m.to_ascii_lowercase().as_str() {
            "alt" => (1, "Alt"),
            "control" | "ctrl" => (2, "Control"),
            "meta" | "command" | "cmd" => (4, "Meta"),
            "shift" => (8, "Shift"),
            _ => {
                return Ok(Err(format!(
                    "unknown modifier {m:?} in {keys:?}: use Control, Shift, Alt or Meta"
                )));
            }
        };
        bits |= bit;
        modifier_defs.extend(chromiumoxide::keys::get_key_definition(name));
    }
    let Some(def) = chromiumoxide::keys::get_key_definition(key) else {
        return Ok(Err(format!(
            "unknown key {key:?}: use key names such as Enter, Tab, Escape, Backspace, ArrowDown, PageDown, a, \
             or combinations such as Control+a; to type text use input_text"
        )));
    };
    let page = live.page()?;
    let key_event = |kind: DispatchKeyEventType,
                     d: &chromiumoxide::keys::KeyDefinition,
                     text: Option<&str>,
                     modifiers: i64| {
        let mut p = DispatchKeyEventParams::new(kind);
        p.key = Some(d.key.to_string());
        p.code = Some(d.code.to_string());
        p.windows_virtual_key_code = Some(d.key_code);
        p.native_virtual_key_code = Some(d.key_code);
        p.modifiers = Some(modifiers);
        p.text = text.map(String::from);
        p
    };
    for d in &modifier_defs {
        page.execute(key_event(DispatchKeyEventType::RawKeyDown, d, None, bits))
            .await?;
    }
    // Text is produced only without Control/Alt/Meta; editing shortcuts need their command.
    let text = if bits & 7 == 0 {
        def.text
            .or((def.key.chars().count() == 1).then_some(def.key))
    } else {
        None
    };
    let mut down = key_event(
        if text.is_some() {
            DispatchKeyEventType::KeyDown
        } else {
            DispatchKeyEventType::RawKeyDown
        },
        def,
        text,
        bits,
    );
    if bits & 2 != 0 {
        let command = match def.key.to_ascii_lowercase().as_str() {
            "a" => Some("selectAll"),
            "c" => Some("copy"),
            "x" => Some("cut"),
            "v" => Some("paste"),
            "z" => Some("undo"),
            _ => None,
        };
        down.commands = command.map(|c| vec![c.to_string()]);
    }
    page.execute(down).await?;
    page.execute(key_event(DispatchKeyEventType::KeyUp, def, None, bits))
        .await?;
    for d in modifier_defs.iter().rev() {
        page.execute(key_event(DispatchKeyEventType::KeyUp, d, None, 0))
            .await?;
    }
    live.settle().await?;
    if let Some(tab) = live.sync_tabs().await {
        live.current = tab;
    }
    Ok(Ok(format!("Sent keys {}", json(keys))))
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
    fn only_sandbox_local_urls_pass() {
        for ok in [
            "http://localhost:8000/",
            "https://LOCALHOST/x",
            "http://127.0.0.1:9/",
            "http://127.1.2.3/",
            "http://[::1]:8000/",
            "file:///workspace/a.html",
            "about:blank",
            "data:text/html,<h1>x</h1>",
        ] {
            assert_eq!(check_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "https://example.com/",
            "http://localhost.evil.com/",
            "http://10.0.0.1/",
            "ftp://localhost/",
            "chrome://settings",
            "javascript:alert(1)",
            "http://0.0.0.0:8000/",
        ] {
            assert!(check_url(bad).unwrap_err().contains("no network"), "{bad}");
        }
        assert!(
            check_url("not a url")
                .unwrap_err()
                .contains("not a valid URL")
        );
    }

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
        assert!(
            Action::parse(&json!({"action": "web_search"}))
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
