//! The model sees what the tools see, when it can: with a model of a vision family (no
//! `multimodal` set) the request after `view_image` carries the image and so does the one
//! after a browser action (its screenshot); with a text-only family none carries an image and
//! view_image says why. The real binary, engine and image; the LLM faked at HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::process::Stdio;

use serde_json::{Value, json};
use support::cli::sandboxd;
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing, last_of_role};

const DRAW: &str = "import matplotlib.pyplot as plt\n\
    plt.plot([0, 1, 2], [2, 0, 1], linewidth=4)\n\
    plt.savefig('/workspace/line.png')\nplt.close('all')\n\
    open('/workspace/page.html', 'w').write('<html><head><title>Vision page</title></head><body><h1>Hello</h1></body></html>')";

/// Any image in a request (plots and view_image send PNG, screenshots JPEG).
const IMAGE: &str = "data:image/";

fn script() -> Vec<Reply> {
    vec![
        Reply::tool("python", json!({"code": DRAW})),
        Reply::tool("view_image", json!({"path": "line.png"})),
        Reply::tool(
            "browser_use",
            json!({"action": "go_to_url", "url": "file:///workspace/page.html"}),
        ),
        Reply::tool("terminate", json!({"status": "success", "answer": "seen"})),
    ]
}

/// The requests of a run of `script()` with the model named `model`.
fn run_with_model(model: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let llm = rt.block_on(FakeLlm::start(script()));
    let out = sandboxd(dir.path())
        .env("SANDBOXD_LLM_BASE_URL", llm.base_url())
        .env("SANDBOXD_LLM_MODEL", model)
        .args(["run", "--no-input", "--output"])
        .arg(dir.path().join("out"))
        .args(["--prompt", "Draw a line and look at it"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{model}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 4, "{model}");
    for body in &reqs {
        check_tool_pairing(body).unwrap();
    }
    reqs
}

fn last_tool_output(body: &Value) -> String {
    last_of_role(body, "tool").unwrap()
}

#[test]
fn a_vision_model_sees_view_image_and_browser_screenshots() {
    let reqs = run_with_model("gpt-4o");
    // The plot was saved and closed, so nothing reached the model before view_image.
    assert!(!reqs[1].to_string().contains(IMAGE));
    let after_view = reqs[2]["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(after_view["role"], "user");
    assert!(after_view.to_string().contains(IMAGE), "{after_view}");
    assert!(last_tool_output(&reqs[2]).contains("line.png: an image of"));
    // After the browser action, the state message carries the page's screenshot.
    let after_browser = reqs[3]["messages"].as_array().unwrap().last().unwrap();
    let text = after_browser.to_string();
    assert!(
        text.contains("Vision page") && text.contains(IMAGE),
        "{text}"
    );
}

#[test]
fn a_text_only_model_gets_no_image_and_is_told_why() {
    let reqs = run_with_model("deepseek-chat");
    for (i, body) in reqs.iter().enumerate() {
        assert!(
            !body.to_string().contains(IMAGE),
            "request {i} has an image"
        );
    }
    let said = last_tool_output(&reqs[2]);
    assert!(
        said.contains("deepseek-chat") && said.contains("does not take images"),
        "{said}"
    );
    let after_browser = reqs[3]["messages"].as_array().unwrap().last().unwrap();
    assert!(after_browser.to_string().contains("Vision page"));
}
