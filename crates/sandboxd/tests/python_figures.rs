//! Every figure of a python cell reaches the user and, when the model sees images, the model:
//! in order, at most 8 a cell (all are saved), against the real engine and image. The tool's
//! result carries them, the run's events reference each (`tool_result` the first,
//! `tool_image` the rest), and the request after the cell holds them in the same order.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use sandboxd_core::agent::{Agent, AgentSettings, AgentTask, EventKind, FinishReason, MemorySink};
use sandboxd_core::config::Config;
use sandboxd_core::llm::LlmClient;
use sandboxd_core::sandbox::Sandbox;
use sandboxd_core::tools::python::Python;
use sandboxd_core::tools::{ToolContext, ToolRegistry, ToolResult};
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing};
use tokio_util::sync::CancellationToken;

/// `n` figures, each a bar of a different height (so no two PNGs are alike).
fn figures(n: usize) -> String {
    format!(
        "import matplotlib.pyplot as plt\nfor i in range({n}):\n    plt.figure(figsize=(2, 2))\n    plt.bar([0], [i + 1])\n    plt.title(f'figure {{i}}')\nNone"
    )
}

fn python_registry(sandbox: Arc<dyn Sandbox>) -> ToolRegistry {
    let tool = Python::new(
        sandbox,
        Duration::from_secs(120),
        Duration::from_secs(600),
        256 * 1024,
    );
    let mut registry = ToolRegistry::new();
    registry.register(Arc::new(tool)).unwrap();
    registry
}

async fn saved(sandbox: &dyn Sandbox, n: usize) -> String {
    let png = sandbox
        .read_file(&format!("/workspace/figures/figure-{n}.png"))
        .await
        .unwrap();
    base64::engine::general_purpose::STANDARD.encode(png)
}

#[tokio::test]
async fn every_figure_of_a_cell_comes_back_in_order_up_to_eight() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let registry = python_registry(s.sandbox.clone());
    let run = |code: String| {
        let registry = registry.clone();
        async move {
            let args = json!({"code": code}).to_string();
            registry
                .execute("python", &args, &ToolContext::default())
                .await
                .unwrap()
        }
    };
    let r: ToolResult = run(figures(3)).await;
    assert!(!r.is_error(), "{}", r.render());
    let images: Vec<&String> = r.images().collect();
    assert_eq!(images.len(), 3, "{}", r.render());
    for (i, img) in images.iter().enumerate() {
        assert_eq!(**img, saved(s.sandbox.as_ref(), i + 1).await, "figure {i}");
    }
    assert!(
        r.output.contains("shown as images, in order"),
        "{}",
        r.output
    );

    // Ten figures: all saved, the first eight shown, and the model is told.
    let r = run(figures(10)).await;
    let images: Vec<&String> = r.images().collect();
    assert_eq!(images.len(), 8, "{}", r.render());
    for (i, img) in images.iter().enumerate() {
        assert_eq!(**img, saved(s.sandbox.as_ref(), i + 4).await, "figure {i}");
    }
    assert!(
        r.output.contains("figure-13.png") && r.output.contains("8 of 10 shown as images"),
        "{}",
        r.output
    );
}

/// The images of the user message that follows the last tool message of a request.
fn images_after_tools(body: &Value) -> Vec<String> {
    let messages = body["messages"].as_array().unwrap();
    let last_tool = messages.iter().rposition(|m| m["role"] == "tool").unwrap();
    messages[last_tool + 1..]
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter_map(|p| p["image_url"]["url"].as_str())
        .map(|u| u.trim_start_matches("data:image/png;base64,").to_string())
        .collect()
}

#[tokio::test]
async fn a_multimodal_model_and_the_events_get_every_figure_in_order() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    for multimodal in [true, false] {
        let llm = FakeLlm::start(vec![
            Reply::tool("python", json!({"code": figures(3)})),
            Reply::text("seen"),
        ])
        .await;
        let mut st = FakeLlm::settings();
        st.multimodal = multimodal;
        let client = Arc::new(LlmClient::new(llm.endpoint(), None, st));
        let settings = AgentSettings::from_config(&Config::default());
        let agent = Agent::new(client, python_registry(s.sandbox.clone()), settings);
        let sink = MemorySink::new();
        let outcome = agent
            .run(
                AgentTask::new("draw three", "t", s.id.clone()),
                sink.as_ref(),
                CancellationToken::new(),
            )
            .await;
        assert_eq!(outcome.reason, FinishReason::FinalAnswer, "{outcome:?}");

        // The user's view: the result's image, then two tool_image events, in order, each
        // resolvable to the bytes of its saved figure.
        let events = sink.events();
        let mut refs = Vec::new();
        for e in &events {
            match &e.kind {
                EventKind::ToolResult { image, .. } => refs.push(image.clone().unwrap()),
                EventKind::ToolImage { index, image, .. } => {
                    assert_eq!(*index, refs.len());
                    refs.push(image.clone());
                }
                _ => {}
            }
        }
        assert_eq!(refs.len(), 3);
        let offset = if multimodal { 0 } else { 3 };
        let mut want = Vec::new();
        for (i, r) in refs.iter().enumerate() {
            let expected = saved(s.sandbox.as_ref(), offset + i + 1).await;
            let got = base64::engine::general_purpose::STANDARD.encode(sink.image(r).unwrap());
            assert_eq!(got, expected, "event image {i}");
            want.push(expected);
        }

        let reqs = llm.requests();
        check_tool_pairing(&reqs[1]).unwrap();
        let sent = images_after_tools(&reqs[1]);
        if multimodal {
            assert_eq!(sent, want, "the model gets every figure, in order");
        } else {
            assert!(sent.is_empty());
            assert!(reqs[1].to_string().contains("does not take images"));
        }
    }
}
