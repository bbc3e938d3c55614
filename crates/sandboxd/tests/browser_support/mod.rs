//! Helpers of the browser tests: a test site written into /workspace, the python http.server
//! inside the container, and calls of the real browser_use tool.
#![allow(dead_code)]

use std::time::Duration;

use sandboxd_core::sandbox::{Sandbox, ShellOptions};
use sandboxd_core::tools::browser::BrowserUse;
use sandboxd_core::tools::{Tool, ToolContext, ToolResult};
use serde_json::Value;

pub const SITE: &str = "/workspace/site";

pub const INDEX: &str = r#"<!doctype html><html><head><title>Home page</title></head><body style="margin:0">
<h1>Welcome home</h1>
<p id="out">not clicked</p>
<button id="btn" onclick="document.getElementById('out').textContent='clicked!'">Press me</button>
<form action="result.html" method="get"><input name="q" placeholder="Search words"><button type="submit">Send</button></form>
<select id="fruit" onchange="document.getElementById('picked').textContent='picked ' + this.value">
  <option value="a">Apple</option><option value="b">Banana</option><option value="c">Cherry</option></select>
<p id="picked">nothing picked</p>
<a href="page2.html">Go to page two</a>
<a href="page2.html" target="_blank">Page two in a new tab</a>
</body></html>"#;

pub const RESULT: &str = r#"<!doctype html><html><head><title>Result</title></head><body>
<p id="r"></p><script>document.getElementById('r').textContent = 'You searched: ' + new URLSearchParams(location.search).get('q');</script>
</body></html>"#;

pub const PAGE2: &str = r#"<!doctype html><html><head><title>Page two</title></head><body><h1>Second page</h1>
<table><tr><th>Item</th><th>Price</th></tr><tr><td>Tea</td><td>4 EUR</td></tr></table>
<script>var hidden_script_text = 1;</script><style>.x{color:red}</style></body></html>"#;

pub const LONG: &str = r#"<!doctype html><html><head><title>Long</title></head><body style="margin:0">
<div style="height:3000px">top part</div><p>the deep marker sentence</p><div style="height:3000px"></div>
<button>bottom button</button></body></html>"#;

/// A white page with a pure red 200x200 block whose top-left corner is at (100, 100).
pub const COLOR: &str = r#"<!doctype html><html><head><title>Colour</title></head><body style="margin:0;background:#fff">
<div style="position:absolute;left:100px;top:100px;width:200px;height:200px;background:#ff0000"></div></body></html>"#;

/// Writes the site and starts `python3 -m http.server` on 127.0.0.1:8000 inside the container.
pub async fn serve_site(sb: &dyn Sandbox) {
    for (name, body) in [
        ("index.html", INDEX),
        ("result.html", RESULT),
        ("page2.html", PAGE2),
        ("long.html", LONG),
        ("color.html", COLOR),
    ] {
        sb.write_file(&format!("{SITE}/{name}"), body.as_bytes())
            .await
            .unwrap();
    }
    let opts = ShellOptions {
        timeout: Duration::from_secs(20),
        ..ShellOptions::default()
    };
    let out = sb
        .shell(
            &format!(
                "cd {SITE} && (python3 -m http.server 8000 --bind 127.0.0.1 > /tmp/http.log 2>&1 &) && \
                 for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done; \
                 (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null"
            ),
            opts,
        )
        .await
        .unwrap();
    assert_eq!(
        out.exit_code,
        Some(0),
        "http.server did not come up: {}",
        out.stderr_lossy()
    );
}

pub async fn call(tool: &BrowserUse, args: Value) -> ToolResult {
    tool.execute(args, &ToolContext::default())
        .await
        .expect("browser_use failed as a tool")
}

/// Calls and insists on success; returns the text the model reads.
pub async fn ok(tool: &BrowserUse, args: Value) -> ToolResult {
    let r = call(tool, args.clone()).await;
    assert!(r.error.is_none(), "{args} failed: {}", r.render());
    r
}

/// The index of the first listed element whose line contains `needle`.
pub fn index_of(result: &ToolResult, needle: &str) -> i64 {
    result
        .output
        .lines()
        .find(|l| l.starts_with('[') && l.contains(needle))
        .and_then(|l| l[1..l.find(']')?].parse().ok())
        .unwrap_or_else(|| panic!("no element with {needle:?} in:\n{}", result.output))
}

/// The text of the element with the given id, read by the page itself through the browser.
pub async fn page_text(tool: &BrowserUse, goal_id: &str) -> String {
    let r = ok(
        tool,
        serde_json::json!({"action": "extract_content", "goal": goal_id}),
    )
    .await;
    r.output
}
