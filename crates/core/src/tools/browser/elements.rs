//! Actions on elements of the last state (click, type, dropdowns) and on the keyboard.
//!
//! Clicks and typing go through CDP input events (trusted, like a user's); the element is
//! found and prepared by a small script in the isolated world, where the state's script left
//! the numbered elements. Arguments are embedded in scripts only as JSON literals.

use chromiumoxide::cdp::browser_protocol::input::{
    DispatchKeyEventParams, DispatchKeyEventType, InsertTextParams,
};
use chromiumoxide::layout::Point;
use serde_json::Value;

use super::actions::{Outcome, json};
use super::chromium::BrowserError;
use super::session::Live;

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

pub async fn click(live: &mut Live, index: i64) -> Result<Outcome, BrowserError> {
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

pub async fn input_text(live: &mut Live, index: i64, text: &str) -> Result<Outcome, BrowserError> {
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

pub async fn dropdown_options(live: &mut Live, index: i64) -> Result<Outcome, BrowserError> {
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

pub async fn select_option(
    live: &mut Live,
    index: i64,
    text: &str,
) -> Result<Outcome, BrowserError> {
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
pub async fn send_keys(live: &mut Live, keys: &str) -> Result<Outcome, BrowserError> {
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
