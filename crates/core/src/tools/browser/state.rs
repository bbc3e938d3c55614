//! The browser state every action returns: url, title, tabs, the numbered interactive
//! elements in the viewport, scroll position and a viewport screenshot.
//!
//! The element list comes from `INDEX_SCRIPT`, run in an isolated world of the page (the
//! page's own scripts can neither see nor replace it). It keeps the elements it numbered in
//! `window.__sandboxd_elems`, so later actions address exactly what the model was shown.
//! Everything read from the page is hostile text: it is cut to a bounded length and quoted
//! when rendered, so a page cannot forge lines of the state.

use serde::{Deserialize, Serialize};

/// How many elements one state lists; a page with more gets a note to scroll or extract.
pub const MAX_ELEMENTS: usize = 150;

/// Indexes the visible interactive elements of the viewport and measures the page.
pub const INDEX_SCRIPT: &str = r#"(() => {
  const MAX = 150, TEXT = 100;
  const vw = window.innerWidth, vh = window.innerHeight;
  const sel = 'a[href],button,input,select,textarea,summary,label[for],[role=button],[role=link],' +
    '[role=checkbox],[role=radio],[role=tab],[role=menuitem],[role=option],[role=switch],[role=combobox],' +
    '[role=textbox],[role=searchbox],[onclick],[contenteditable=""],[contenteditable=true],[tabindex]:not([tabindex="-1"])';
  const clean = (s) => (s || '').replace(/\s+/g, ' ').trim().slice(0, TEXT);
  const elems = [], out = [];
  let more = 0;
  for (const el of document.querySelectorAll(sel)) {
    if (el.type === 'hidden') continue;
    const r = el.getBoundingClientRect();
    if (r.width <= 0 || r.height <= 0) continue;
    if (r.bottom <= 0 || r.top >= vh || r.right <= 0 || r.left >= vw) continue;
    const st = getComputedStyle(el);
    if (st.visibility === 'hidden' || st.display === 'none' || st.opacity === '0') continue;
    if (elems.length >= MAX) { more++; continue; }
    const tag = el.tagName.toLowerCase();
    let text = '';
    if (tag === 'select') text = clean(el.selectedOptions[0] ? el.selectedOptions[0].text : '');
    else if (tag !== 'input' && tag !== 'textarea') text = clean(el.innerText || el.textContent);
    if (!text) text = clean(el.getAttribute('aria-label') || el.getAttribute('title') || el.getAttribute('alt') || '');
    const item = { index: elems.length, tag, text };
    const role = el.getAttribute('role'); if (role) item.role = clean(role);
    if (tag === 'a') item.href = clean(el.getAttribute('href'));
    if (tag === 'input' || tag === 'textarea' || tag === 'select') {
      if (el.type) item.input_type = clean(el.type);
      if (el.name) item.name = clean(el.name);
      if (el.placeholder) item.placeholder = clean(el.placeholder);
      if (el.type === 'password') { if (el.value) item.value = '********'; }
      else if (tag !== 'select' && el.value) item.value = clean(el.value);
      if (el.type === 'checkbox' || el.type === 'radio') item.checked = !!el.checked;
    }
    if (el.disabled) item.disabled = true;
    elems.push(el);
    out.push(item);
  }
  window.__sandboxd_elems = elems;
  const doc = document.documentElement;
  const height = Math.max(doc ? doc.scrollHeight : 0, document.body ? document.body.scrollHeight : 0);
  return { url: location.href, title: clean(document.title), scroll_y: Math.round(window.scrollY),
           viewport_width: vw, viewport_height: vh, page_height: height, elements: out, more };
})()"#;

/// What `INDEX_SCRIPT` returns.
#[derive(Debug, Clone, Deserialize)]
pub struct PageInfo {
    pub url: String,
    pub title: String,
    pub scroll_y: f64,
    pub viewport_width: f64,
    pub viewport_height: f64,
    pub page_height: f64,
    pub elements: Vec<ElementInfo>,
    #[serde(default)]
    pub more: usize,
}

/// One numbered interactive element of the viewport.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElementInfo {
    pub index: usize,
    pub tag: String,
    #[serde(default)]
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub href: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<bool>,
    #[serde(default)]
    pub disabled: bool,
}

/// One tab; `id` is what switch_tab and close_tab take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TabInfo {
    pub id: usize,
    pub url: String,
    pub title: String,
}

/// The browser as the model sees it after an action.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BrowserState {
    pub url: String,
    pub title: String,
    pub tabs: Vec<TabInfo>,
    pub current_tab: usize,
    pub elements: Vec<ElementInfo>,
    /// Interactive elements of the viewport past `MAX_ELEMENTS`, not listed.
    pub elements_not_listed: usize,
    pub pixels_above: u64,
    pub pixels_below: u64,
    pub viewport_width: u32,
    pub viewport_height: u32,
    /// Dialogs (alert, confirm, ...) the page opened since the last state; all were accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dialogs: Vec<String>,
    /// Downloads into /workspace the model was not told of yet (downloads.rs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub downloads: Vec<String>,
    /// The viewport as a base64 JPEG.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub screenshot: Option<String>,
}

impl BrowserState {
    pub fn new(
        info: PageInfo,
        tabs: Vec<TabInfo>,
        current_tab: usize,
        screenshot: Option<String>,
    ) -> Self {
        let above = info.scroll_y.max(0.0);
        let below = (info.page_height - info.scroll_y - info.viewport_height).max(0.0);
        Self {
            url: info.url,
            title: info.title,
            tabs,
            current_tab,
            elements: info.elements,
            elements_not_listed: info.more,
            pixels_above: above.round() as u64,
            pixels_below: below.round() as u64,
            viewport_width: info.viewport_width.max(0.0) as u32,
            viewport_height: info.viewport_height.max(0.0) as u32,
            dialogs: Vec::new(),
            downloads: Vec::new(),
            screenshot,
        }
    }

    /// The state as text for the model (the screenshot travels separately, as an image).
    pub fn to_prompt(&self) -> String {
        let mut s = format!(
            "Current browser state:\nURL: {}\nTitle: {}\n",
            quote(&self.url),
            quote(&self.title)
        );
        s.push_str("Tabs:");
        for tab in &self.tabs {
            let current = if tab.id == self.current_tab {
                " (current)"
            } else {
                ""
            };
            s.push_str(&format!(
                "\n  tab {}{current}: {} {}",
                tab.id,
                quote(&tab.title),
                quote(&tab.url)
            ));
        }
        s.push('\n');
        if self.elements.is_empty() {
            s.push_str("No interactive elements in the viewport.\n");
        } else {
            s.push_str("Interactive elements in the viewport (pass the index to click_element, input_text, get_dropdown_options, select_dropdown_option):\n");
            for el in &self.elements {
                s.push_str(&render_element(el));
                s.push('\n');
            }
        }
        if self.elements_not_listed > 0 {
            s.push_str(&format!(
                "... and {} more interactive elements not listed; use extract_content to read the page.\n",
                self.elements_not_listed
            ));
        }
        for dialog in &self.dialogs {
            s.push_str(&format!(
                "The page opened a dialog, which was accepted: {dialog}\n"
            ));
        }
        for download in &self.downloads {
            s.push_str(&format!("Browser download: {download}\n"));
        }
        s.push_str(&format!(
            "Scroll: {} pixels above and {} pixels below the {}x{} viewport.",
            self.pixels_above, self.pixels_below, self.viewport_width, self.viewport_height
        ));
        s
    }
}

fn render_element(el: &ElementInfo) -> String {
    let mut s = format!("[{}] <{}", el.index, el.tag);
    if let Some(t) = &el.input_type {
        s.push_str(&format!(" type={}", quote(t)));
    }
    if let Some(r) = &el.role {
        s.push_str(&format!(" role={}", quote(r)));
    }
    s.push('>');
    if !el.text.is_empty() {
        s.push_str(&format!(" {}", quote(&el.text)));
    }
    for (key, value) in [
        ("name", &el.name),
        ("placeholder", &el.placeholder),
        ("value", &el.value),
        ("href", &el.href),
    ] {
        if let Some(v) = value {
            s.push_str(&format!(" {key}={}", quote(v)));
        }
    }
    if let Some(c) = el.checked {
        s.push_str(if c { " checked" } else { " unchecked" });
    }
    if el.disabled {
        s.push_str(" disabled");
    }
    s
}

/// A JSON string literal: page text can never break out of its line or its quotes.
fn quote(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> PageInfo {
        serde_json::from_value(serde_json::json!({
            "url": "http://localhost:8000/", "title": "T\nforged line", "scroll_y": 100.0,
            "viewport_width": 1280.0, "viewport_height": 720.0, "page_height": 2000.0,
            "elements": [
                {"index": 0, "tag": "button", "text": "Go"},
                {"index": 1, "tag": "input", "text": "", "input_type": "text", "value": "abc", "placeholder": "Name"},
                {"index": 2, "tag": "a", "text": "Home", "href": "/home"}
            ],
            "more": 0
        }))
        .unwrap()
    }

    #[test]
    fn prompt_lists_elements_tabs_and_scroll() {
        let tabs = vec![TabInfo {
            id: 0,
            url: "http://localhost:8000/".into(),
            title: "T".into(),
        }];
        let state = BrowserState::new(info(), tabs, 0, None);
        assert_eq!(state.pixels_above, 100);
        assert_eq!(state.pixels_below, 1180);
        let text = state.to_prompt();
        assert!(text.contains("[0] <button> \"Go\""), "{text}");
        assert!(
            text.contains("[1] <input type=\"text\"> placeholder=\"Name\" value=\"abc\""),
            "{text}"
        );
        assert!(text.contains("[2] <a> \"Home\" href=\"/home\""), "{text}");
        assert!(text.contains("tab 0 (current)"));
        assert!(text.contains("100 pixels above and 1180 pixels below"));
        // A title with a newline stays on its line.
        assert!(text.contains("Title: \"T\\nforged line\""));
    }
}
