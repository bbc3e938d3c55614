//! The LLM client against the scripted fake server over real HTTP: the retry policy
//! (429 with Retry-After, 5xx, no retry on 400), what roughly-compatible servers send,
//! reasoning-model parameters and Azure's request shape.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::sync::Mutex;
use std::time::Duration;

use sandboxd_core::llm::{ApiType, LlmClient, LlmError, Message, RetryNotice};
use serde_json::json;
use support::fake_llm::{FakeLlm, Reply};
use tokio_util::sync::CancellationToken;

async fn ask(
    client: &LlmClient,
) -> (
    Result<sandboxd_core::llm::Completion, LlmError>,
    Vec<RetryNotice>,
) {
    let retries = Mutex::new(Vec::new());
    let on_retry = |n: RetryNotice| retries.lock().unwrap().push(n);
    let r = client
        .chat(
            &[Message::system("s"), Message::user("u")],
            &[],
            &CancellationToken::new(),
            &on_retry,
        )
        .await;
    (r, retries.into_inner().unwrap())
}

#[tokio::test]
async fn rate_limit_is_retried_after_the_servers_retry_after() {
    let llm = FakeLlm::start(vec![
        Reply::error(429, "Rate limit reached for requests").header("Retry-After", "1"),
        Reply::text("hello"),
    ])
    .await;
    let (r, retries) = ask(&llm.client()).await;
    assert_eq!(r.unwrap().content.as_deref(), Some("hello"));
    let rec = llm.recorded();
    assert_eq!(rec.len(), 2);
    let waited = rec[1].at - rec[0].at;
    assert!(
        waited >= Duration::from_secs(1),
        "Retry-After: 1 not honoured, waited {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(3),
        "waited far longer than asked: {waited:?}"
    );
    assert_eq!(retries.len(), 1);
    assert_eq!(retries[0].delay, Duration::from_secs(1));
    assert!(
        retries[0].reason.contains("Rate limit reached"),
        "{}",
        retries[0].reason
    );
}

#[tokio::test]
async fn bad_request_is_not_retried_and_names_the_server_message() {
    let llm = FakeLlm::start(vec![
        Reply::error(400, "Invalid value for 'tool_choice': banana"),
        Reply::text("never"),
    ])
    .await;
    let (r, retries) = ask(&llm.client()).await;
    let err = r.unwrap_err();
    assert!(matches!(err, LlmError::Http { status: 400, .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("Invalid value for 'tool_choice': banana"),
        "{err}"
    );
    assert_eq!(llm.requests().len(), 1, "a 400 must not be retried");
    assert!(retries.is_empty());

    // vLLM's error body has no "error" wrapper; the message must still come through.
    let llm = FakeLlm::start(vec![Reply::Error {
        status: 400,
        body: json!({"object": "error", "message": "This model's maximum context length is 4096 tokens", "type": "BadRequestError", "code": 400}),
        headers: vec![],
    }])
    .await;
    let err = ask(&llm.client()).await.0.unwrap_err();
    assert!(
        matches!(err, LlmError::ContextTooLong { status: 400, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("maximum context length is 4096"),
        "{err}"
    );

    let llm = FakeLlm::start(vec![Reply::error(401, "Incorrect API key provided")]).await;
    let err = ask(&llm.client()).await.0.unwrap_err();
    assert!(
        err.to_string().contains("401") && err.to_string().contains("Incorrect API key"),
        "{err}"
    );
    assert_eq!(llm.requests().len(), 1);
}

#[tokio::test]
async fn server_errors_are_retried_up_to_the_attempt_limit() {
    let llm = FakeLlm::start_with_fallback(vec![], Reply::error(503, "overloaded")).await;
    let mut settings = FakeLlm::settings();
    settings.max_attempts = 4;
    let client = LlmClient::new(llm.endpoint(), None, settings);
    let (r, retries) = ask(&client).await;
    let err = r.unwrap_err();
    assert!(
        err.to_string().contains("overloaded") && err.to_string().contains("after 4 attempts"),
        "{err}"
    );
    assert_eq!(llm.requests().len(), 4);
    assert_eq!(
        retries.iter().map(|r| r.attempt).collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
    // Exponential: each wait at least half of base·2^n (equal jitter).
    assert!(
        retries[2].delay >= Duration::from_millis(40),
        "{:?}",
        retries[2].delay
    );

    // A connection refused is retried too, and reported as unreachable.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut endpoint = llm.endpoint();
    endpoint.base_url = format!("http://{dead}/v1");
    let mut settings = FakeLlm::settings();
    settings.max_attempts = 2;
    let err = ask(&LlmClient::new(endpoint, None, settings))
        .await
        .0
        .unwrap_err();
    assert!(
        matches!(err, LlmError::Unreachable { attempts: 2, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn what_ollama_and_vllm_send_is_understood() {
    let llm = FakeLlm::start(vec![
        // Ollama's /v1 endpoint (0.4+): content "" with tool calls, fp_ollama.
        Reply::raw(json!({
            "id": "chatcmpl-512", "object": "chat.completion", "created": 1733000000, "model": "qwen2.5:7b",
            "system_fingerprint": "fp_ollama",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "",
                "tool_calls": [{"id": "call_ab12cd", "index": 0, "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]},
                "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 18, "total_tokens": 138}
        })),
        // vLLM: reasoning_content, stop_reason, prompt_logprobs, null details.
        Reply::raw(json!({
            "id": "chatcmpl-7c2e", "object": "chat.completion", "created": 1733000001, "model": "Qwen/Qwen2.5-7B-Instruct",
            "choices": [{"index": 0, "message": {"role": "assistant", "reasoning_content": null, "content": "Done.", "tool_calls": []},
                "logprobs": null, "finish_reason": "stop", "stop_reason": null}],
            "usage": {"prompt_tokens": 200, "total_tokens": 203, "completion_tokens": 3, "prompt_tokens_details": null},
            "prompt_logprobs": null, "kv_transfer_params": null
        })),
        // A loose server: no created, no id, an unknown finish_reason, no usage.
        Reply::raw(json!({"object": "chat.completion", "model": "m", "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "eos_token"}]})),
    ])
    .await;
    let client = llm.client();
    let c = ask(&client).await.0.unwrap();
    assert_eq!(c.tool_calls[0].id, "call_ab12cd");
    assert_eq!(c.usage.prompt_tokens, 120);
    let c = ask(&client).await.0.unwrap();
    assert_eq!(c.content.as_deref(), Some("Done."));
    assert!(c.tool_calls.is_empty());
    let c = ask(&client).await.0.unwrap();
    assert_eq!(c.content.as_deref(), Some("hi"));
    assert_eq!(c.finish_reason.as_deref(), Some("eos_token"));
}

#[tokio::test]
async fn reasoning_models_get_max_completion_tokens_and_no_temperature() {
    let llm = FakeLlm::start(vec![Reply::text("a"), Reply::text("b")]).await;
    let mut endpoint = llm.endpoint();
    endpoint.model = "o3-mini".into();
    ask(&LlmClient::new(endpoint, None, FakeLlm::settings()))
        .await
        .0
        .unwrap();
    ask(&llm.client()).await.0.unwrap();
    let reqs = llm.requests();
    assert_eq!(reqs[0]["max_completion_tokens"], 4096);
    assert!(
        reqs[0].get("temperature").is_none() && reqs[0].get("max_tokens").is_none(),
        "{}",
        reqs[0]
    );
    assert_eq!(reqs[1]["max_tokens"], 4096);
    assert!(reqs[1].get("temperature").is_some());
    assert_eq!(reqs[1]["stream"], false);
}

#[tokio::test]
async fn azure_requests_use_the_deployment_path_and_api_key_header() {
    let llm = FakeLlm::start(vec![Reply::text("az")]).await;
    let mut endpoint = llm.endpoint();
    endpoint.api_type = ApiType::Azure;
    endpoint.base_url = llm.base_url().trim_end_matches("/v1").to_string();
    endpoint.deployment = "gpt4o-prod".into();
    endpoint.api_version = "2024-10-21".into();
    let c = ask(&LlmClient::new(endpoint, None, FakeLlm::settings()))
        .await
        .0
        .unwrap();
    assert_eq!(c.content.as_deref(), Some("az"));
    let rec = llm.recorded();
    assert!(
        rec[0]
            .headers
            .iter()
            .any(|(k, v)| k == "api-key" && v == "sk-fake"),
        "{:?}",
        rec[0].headers
    );
}
