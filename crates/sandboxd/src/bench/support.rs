//! What the in-process benchmarks (agent, flow) share besides the percentile: a local
//! OpenAI-compatible responder on loopback that answers at once, and the LLM client that
//! talks to it, so that what is measured is sandboxd's own overhead around the model.

use std::sync::Arc;

use serde_json::{Value, json};

use sandboxd_core::llm::{ApiType, Endpoint, LlmClient, LlmSettings};

/// The responder's server task; dropping it stops the server.
pub struct Responder(tokio::task::JoinHandle<()>);

impl Drop for Responder {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Serves `app` (which answers `POST /v1/chat/completions`) on a loopback port and returns
/// a client for it with the default LLM settings, and the guard that keeps it serving.
pub async fn local_responder(app: axum::Router) -> std::io::Result<(Arc<LlmClient>, Responder)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let endpoint = Endpoint {
        api_type: ApiType::OpenAi,
        base_url: format!("http://{addr}/v1"),
        api_key: "bench".into(),
        model: "bench".into(),
        deployment: String::new(),
        api_version: String::new(),
    };
    let settings = LlmSettings::from_config(&Default::default());
    Ok((
        Arc::new(LlmClient::new(endpoint, None, settings)),
        Responder(server),
    ))
}

/// A chat completion whose one tool call is `name(arguments)`, numbered `i`.
pub fn tool_call_completion(i: impl std::fmt::Display, name: &str, arguments: &str) -> Value {
    json!({
        "id": format!("bench-{i}"), "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": format!("call_{i}"), "type": "function",
                "function": {"name": name, "arguments": arguments}}]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    })
}

/// Refills the pool of `m` until `size` warm sandboxes are ready; a few failed rounds are an
/// error, not a hang.
pub async fn fill_pool(
    m: &sandboxd_core::sandbox::SessionManager,
    size: usize,
) -> anyhow::Result<()> {
    for _ in 0..5 {
        if m.pool_ready() >= size {
            return Ok(());
        }
        m.refill_pool().await;
    }
    anyhow::ensure!(
        m.pool_ready() >= size,
        "the pool could not fill to {size} (the warnings above say why)"
    );
    Ok(())
}
