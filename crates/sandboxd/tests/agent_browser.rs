//! The agent and the browser together: the browser state joins the prompt only in the step
//! after the browser was used, and extract_content goes to the LLM as a forced function call.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Arc;

use sandboxd_core::agent::extract::LlmExtractor;
use sandboxd_core::agent::{Agent, AgentSettings, AgentTask, FinishReason, NullSink};
use sandboxd_core::config::Config;
use sandboxd_core::tools::ask_human::NoHuman;
use sandboxd_core::tools::session::agent_tools;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing};
use tokio_util::sync::CancellationToken;

const PAGE: &str = "<html><head><title>Price list</title></head><body><h1>Prices</h1>\
    <p>The blue widget costs 17 euros.</p><button id=b>Buy</button></body></html>";

fn last_message_text(body: &Value) -> String {
    body["messages"].as_array().unwrap().last().unwrap()["content"].to_string()
}

#[tokio::test]
async fn browser_state_follows_browser_steps_and_extraction_is_forced() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    s.sandbox
        .write_file("/workspace/prices.html", PAGE.as_bytes())
        .await
        .unwrap();
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "browser_use",
            json!({"action": "go_to_url", "url": "file:///workspace/prices.html"}),
        ),
        Reply::tool(
            "browser_use",
            json!({"action": "extract_content", "goal": "the price of the blue widget"}),
        ),
        // The extraction request itself, answered with the forced call.
        Reply::tool(
            "extract_content",
            json!({"extracted_content": {"text": "17 euros", "metadata": {"item": "blue widget"}}}),
        ),
        Reply::tool("bash", json!({"command": "true"})),
        Reply::text("The blue widget costs 17 euros."),
    ])
    .await;
    let config = Config::load_with_env(None, &[]).unwrap();
    let client = llm.client();
    let tools = agent_tools(
        s.sandbox.clone(),
        &s.limits,
        &config,
        Arc::new(NoHuman),
        Some(Arc::new(LlmExtractor::new(client.clone()))),
    );
    let agent = Agent::new(client, tools.registry, AgentSettings::from_config(&config))
        .with_browser(tools.browser.clone());
    let outcome = agent
        .run(
            AgentTask::new("What does the blue widget cost?", "tester", s.id.clone()),
            &NullSink,
            CancellationToken::new(),
        )
        .await;
    tools.browser.shutdown().await;
    assert_eq!(outcome.reason, FinishReason::FinalAnswer, "{outcome:?}");

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 5);
    for (i, body) in reqs.iter().enumerate() {
        check_tool_pairing(body).unwrap_or_else(|e| panic!("request {i}: {e}"));
    }
    // Step 2's prompt ends with the browser state after the navigation.
    let after_nav = last_message_text(&reqs[1]);
    assert!(
        after_nav.contains("Current browser state") && after_nav.contains("Price list"),
        "{after_nav}"
    );
    // The extraction request forces the extract_content function and carries the page text.
    assert_eq!(
        reqs[2]["tool_choice"]["function"]["name"],
        "extract_content"
    );
    assert!(reqs[2].to_string().contains("blue widget costs 17 euros"));
    // The observation of extract_content is what the forced call returned.
    let observation = reqs[3]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .to_string();
    assert!(observation.contains("17 euros"), "{observation}");
    // After a step without the browser, the state is gone from the prompt again.
    let after_bash = last_message_text(&reqs[4]);
    assert!(
        !after_bash.contains("Current browser state"),
        "{after_bash}"
    );
}
