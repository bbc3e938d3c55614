//! browser_use against the real engine and real Chromium inside the sandbox: pages served by
//! python's http.server inside the container and opened as file://.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::browser_support;
use crate::support;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use browser_support::*;
use sandboxd_core::tools::browser::{BrowserUse, Extractor};
use serde_json::{Value, json};

/// A trait-level fake of the LLM step (the fake LLM server lives with the agent): it records
/// what it was given and answers from the Markdown.
#[derive(Default)]
struct FakeExtractor {
    seen: Mutex<Vec<(String, String)>>,
}

#[async_trait]
impl Extractor for FakeExtractor {
    async fn extract(&self, goal: &str, markdown: &str) -> Result<Value, String> {
        self.seen
            .lock()
            .unwrap()
            .push((goal.to_string(), markdown.to_string()));
        let price = markdown
            .lines()
            .find(|l| l.contains("Tea"))
            .and_then(|l| l.split('|').map(str::trim).find(|c| c.ends_with("EUR")))
            .ok_or("no price on the page")?;
        Ok(json!({"tea_price": price}))
    }
}

#[tokio::test]
async fn click_type_submit_select_back_and_tabs_over_http() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    serve_site(s.sandbox.as_ref()).await;
    let tool = BrowserUse::new(s.sandbox.clone());
    assert!(
        tool.current_state().await.is_none(),
        "no state before the first action"
    );

    // Navigate and read the state.
    let r = ok(
        &tool,
        json!({"action": "go_to_url", "url": "http://localhost:8000/index.html"}),
    )
    .await;
    assert!(
        r.output
            .contains("URL: \"http://localhost:8000/index.html\""),
        "{}",
        r.output
    );
    assert!(r.output.contains("Title: \"Home page\""));
    assert!(r.output.contains("<button> \"Press me\""));
    assert!(r.output.contains("placeholder=\"Search words\""));
    assert!(r.output.contains("href=\"page2.html\""));
    assert!(r.base64_image.is_some());

    // Click a button that changes text.
    assert!(page_text(&tool, "out").await.contains("not clicked"));
    let r = ok(
        &tool,
        json!({"action": "click_element", "index": index_of(&r, "Press me")}),
    )
    .await;
    assert!(r.output.starts_with("Clicked element"), "{}", r.output);
    assert!(page_text(&tool, "out").await.contains("clicked!"));

    // A wrong index names the valid range; a missing parameter is named.
    let bad = call(&tool, json!({"action": "click_element", "index": 99})).await;
    let err = bad.error.clone().unwrap();
    assert!(
        err.contains("element 99 does not exist: valid indexes are 0-5"),
        "{err}"
    );
    let missing = call(&tool, json!({"action": "input_text", "index": 1})).await;
    assert!(missing.error.unwrap().contains("'text'"));

    // Select a dropdown option.
    let select = index_of(&r, "<select");
    let opts = ok(
        &tool,
        json!({"action": "get_dropdown_options", "index": select}),
    )
    .await;
    assert!(
        opts.output.contains("1: \"Banana\" value=\"b\""),
        "{}",
        opts.output
    );
    let r = ok(
        &tool,
        json!({"action": "select_dropdown_option", "index": select, "text": "Cherry"}),
    )
    .await;
    assert!(
        r.output.contains("<select type=\"select-one\"> \"Cherry\""),
        "{}",
        r.output
    );
    assert!(page_text(&tool, "picked").await.contains("picked c"));
    let none = call(
        &tool,
        json!({"action": "select_dropdown_option", "index": select, "text": "Durian"}),
    )
    .await;
    assert!(none.error.unwrap().contains("no option \"Durian\""));

    // Type into an input and submit the form with Enter.
    let input = index_of(&r, "Search words");
    let r = ok(
        &tool,
        json!({"action": "input_text", "index": input, "text": "blue whales"}),
    )
    .await;
    assert!(r.output.contains("value=\"blue whales\""), "{}", r.output);
    let r = ok(&tool, json!({"action": "send_keys", "keys": "Enter"})).await;
    assert!(
        r.output.contains("result.html?q=blue+whales"),
        "{}",
        r.output
    );
    assert!(
        page_text(&tool, "r")
            .await
            .contains("You searched: blue whales")
    );

    // go_back returns to the form.
    let r = ok(&tool, json!({"action": "go_back"})).await;
    assert!(r.output.contains("Title: \"Home page\""), "{}", r.output);

    // A link with target=_blank opens a tab that becomes current.
    let r = ok(
        &tool,
        json!({"action": "click_element", "index": index_of(&r, "new tab")}),
    )
    .await;
    assert!(r.output.contains("opened tab 1"), "{}", r.output);
    assert!(
        r.output.contains("tab 1 (current): \"Page two\""),
        "{}",
        r.output
    );
    // open, switch and close tabs.
    let r = ok(
        &tool,
        json!({"action": "open_tab", "url": "http://127.0.0.1:8000/long.html"}),
    )
    .await;
    assert!(
        r.output.contains("tab 2 (current): \"Long\""),
        "{}",
        r.output
    );
    let r = ok(&tool, json!({"action": "switch_tab", "tab_id": 0})).await;
    assert!(
        r.output.contains("tab 0 (current): \"Home page\""),
        "{}",
        r.output
    );
    assert!(
        r.output
            .contains("URL: \"http://localhost:8000/index.html\"")
    );
    let r = ok(&tool, json!({"action": "close_tab", "tab_id": 1})).await;
    assert!(!r.output.contains("\"Page two\" \"http"), "{}", r.output);
    assert!(r.output.contains("tab 1: \"Long\""), "{}", r.output);
    let bad = call(&tool, json!({"action": "switch_tab", "tab_id": 5})).await;
    assert!(
        bad.error
            .unwrap()
            .contains("there is no tab 5: the open tabs are 0-1")
    );

    // The agent's hook sees the same browser.
    let state = tool
        .current_state()
        .await
        .expect("a state once the browser runs");
    assert_eq!(state.current_tab, 0);
    assert_eq!(state.tabs.len(), 2);
    assert!(state.to_prompt().contains("Home page"));
    assert!(state.screenshot.is_some());
    tool.shutdown().await;
}

#[tokio::test]
async fn scroll_extract_and_screenshot_over_file_urls() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    serve_site(s.sandbox.as_ref()).await;
    let extractor = Arc::new(FakeExtractor::default());
    let tool = BrowserUse::new(s.sandbox.clone()).with_extractor(extractor.clone());

    // Scrolling moves the pixels above and below.
    let r = ok(
        &tool,
        json!({"action": "go_to_url", "url": format!("file://{SITE}/long.html")}),
    )
    .await;
    assert!(r.output.contains("0 pixels above"), "{}", r.output);
    let r = ok(&tool, json!({"action": "scroll_down"})).await;
    assert!(
        r.output.contains("Scrolled down by 720 pixels"),
        "{}",
        r.output
    );
    assert!(r.output.contains("720 pixels above"), "{}", r.output);
    let r = ok(&tool, json!({"action": "scroll_up", "scroll_amount": 200})).await;
    assert!(r.output.contains("520 pixels above"), "{}", r.output);
    let r = ok(
        &tool,
        json!({"action": "scroll_to_text", "text": "DEEP marker"}),
    )
    .await;
    let above: u64 = r
        .output
        .split(" pixels above")
        .next()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((2500..3100).contains(&above), "{}", r.output);
    let missing = call(
        &tool,
        json!({"action": "scroll_to_text", "text": "not on this page"}),
    )
    .await;
    assert!(missing.error.unwrap().contains("is not on the page"));
    let r = ok(
        &tool,
        json!({"action": "scroll_down", "scroll_amount": 100000}),
    )
    .await;
    assert!(
        r.output.contains("<button> \"bottom button\""),
        "{}",
        r.output
    );
    assert!(r.output.contains(" 0 pixels below"), "{}", r.output);

    // extract_content hands the page as Markdown, without scripts and styles, to the extractor.
    ok(
        &tool,
        json!({"action": "go_to_url", "url": format!("file://{SITE}/page2.html")}),
    )
    .await;
    let r = ok(
        &tool,
        json!({"action": "extract_content", "goal": "the price of tea"}),
    )
    .await;
    assert!(
        r.output.contains("\"tea_price\": \"4 EUR\""),
        "{}",
        r.output
    );
    let seen = extractor.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "the price of tea");
    assert!(seen[0].1.contains("# Second page"), "{}", seen[0].1);
    assert!(!seen[0].1.contains("hidden_script_text") && !seen[0].1.contains("color:red"));

    // The screenshot is a JPEG of the viewport with the red block where the page put it.
    let r = ok(
        &tool,
        json!({"action": "go_to_url", "url": format!("file://{SITE}/color.html")}),
    )
    .await;
    let r2 = ok(&tool, json!({"action": "screenshot"})).await;
    for shot in [r.base64_image.unwrap(), r2.base64_image.unwrap()] {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(shot)
            .unwrap();
        let mut decoder = jpeg_decoder::Decoder::new(&bytes[..]);
        let pixels = decoder.decode().expect("a valid JPEG");
        let info = decoder.info().unwrap();
        assert_eq!((info.width, info.height), (1280, 720));
        assert_eq!(info.pixel_format, jpeg_decoder::PixelFormat::RGB24);
        let at = |x: usize, y: usize| {
            let i = (y * info.width as usize + x) * 3;
            (pixels[i], pixels[i + 1], pixels[i + 2])
        };
        let red = |(r, g, b): (u8, u8, u8)| r > 220 && g < 40 && b < 40;
        let white = |(r, g, b): (u8, u8, u8)| r > 235 && g > 235 && b > 235;
        for (x, y) in [(110, 110), (200, 200), (290, 290)] {
            assert!(red(at(x, y)), "({x},{y}) is {:?}", at(x, y));
        }
        for (x, y) in [(90, 90), (310, 200), (200, 310), (1000, 600)] {
            assert!(white(at(x, y)), "({x},{y}) is {:?}", at(x, y));
        }
    }
    tool.shutdown().await;
}

#[tokio::test]
async fn without_an_extractor_the_markdown_comes_back() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    s.sandbox
        .write_file(&format!("{SITE}/page2.html"), PAGE2.as_bytes())
        .await
        .unwrap();
    let tool = BrowserUse::new(s.sandbox.clone());
    ok(
        &tool,
        json!({"action": "go_to_url", "url": format!("file://{SITE}/page2.html")}),
    )
    .await;
    let r = ok(
        &tool,
        json!({"action": "extract_content", "goal": "prices"}),
    )
    .await;
    assert!(
        r.output.contains("No extraction model is configured"),
        "{}",
        r.output
    );
    assert!(
        r.output
            .lines()
            .any(|l| l.contains("| Tea") && l.contains("| 4 EUR")),
        "{}",
        r.output
    );
    assert!(!r.output.contains("hidden_script_text"));
    // data: and about: URLs load too.
    let r = ok(&tool, json!({"action": "go_to_url", "url": "data:text/html,<title>inline</title><button>x</button>"})).await;
    assert!(r.output.contains("Title: \"inline\""), "{}", r.output);
    // A dialog would block the page and every later action: it is accepted and reported.
    let page = "data:text/html,<title>before</title><button onclick=\"alert('hi there'); document.title = 'after'\">alert me</button>";
    let r = ok(&tool, json!({"action": "go_to_url", "url": page})).await;
    let r = ok(
        &tool,
        json!({"action": "click_element", "index": index_of(&r, "alert me")}),
    )
    .await;
    assert!(
        r.output
            .contains("dialog, which was accepted: alert \"hi there\""),
        "{}",
        r.output
    );
    assert!(r.output.contains("Title: \"after\""), "{}", r.output);
    let r = ok(&tool, json!({"action": "screenshot"})).await;
    assert!(!r.output.contains("dialog"), "{}", r.output);
    tool.shutdown().await;
}
