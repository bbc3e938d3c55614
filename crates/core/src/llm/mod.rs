//! The LLM client: async-openai (config, URLs, auth headers, Azure) with our own transport,
//! our own retry policy and lenient response types.
//!
//! Requests and responses go through async-openai's `byot` methods with our types
//! (`wire.rs`): its strict response types reject what Ollama and vLLM really send (no
//! `created`, unknown `finish_reason`, untyped tool calls). Retries follow the issue's
//! policy, not async-openai's: up to `max_retries` attempts on 429, 5xx, timeouts and
//! connection errors, exponential backoff with jitter, Retry-After honoured; 400, 401,
//! 403, 404 and context-length errors fail at once with the server's message.

mod setup;
mod stream;
pub mod tokens;
mod transport;
pub mod wire;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_openai::Client;
use async_openai::config::{AzureConfig, Config, OpenAIConfig};
use async_openai::error::OpenAIError;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use setup::{ApiType, Endpoint, guidance, resolve, resolve_vision};
pub use tokens::Tokenizer;
pub use transport::HttpFailure;
pub use wire::{Completion, ContentPart, FunctionCall, Message, ToolCall, Usage, UserContent};

use crate::config::LlmConfig;

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("{}", guidance(.missing))]
    NotConfigured { missing: Vec<String> },
    #[error("invalid setting {key}: {message}")]
    Invalid { key: String, message: String },
    #[error("the LLM server answered HTTP {status}: {message}{}", attempts_note(*.attempts))]
    Http {
        status: u16,
        message: String,
        attempts: u32,
    },
    #[error(
        "the conversation is longer than the model's context window (HTTP {status}: {message}); set [llm] context_window to the model's window"
    )]
    ContextTooLong { status: u16, message: String },
    #[error("cannot reach the LLM server at {url}: {message}{}", attempts_note(*.attempts))]
    Unreachable {
        url: String,
        message: String,
        attempts: u32,
    },
    #[error("the LLM server did not answer within {after:?}{}; raise [llm] timeout_secs for slow local models", attempts_note(*.attempts))]
    Timeout { after: Duration, attempts: u32 },
    #[error("the LLM server sent a response sandboxd cannot read: {0}")]
    BadResponse(String),
    #[error("the LLM call was cancelled")]
    Cancelled,
}

fn attempts_note(attempts: u32) -> String {
    if attempts > 1 {
        format!(" (after {attempts} attempts)")
    } else {
        String::new()
    }
}

/// A retry that is about to happen, for the event stream.
#[derive(Debug, Clone)]
pub struct RetryNotice {
    pub attempt: u32,
    pub max_attempts: u32,
    pub delay: Duration,
    pub reason: String,
}

/// Tuning of one client, from [llm] (the backoff base is not a config key: tests shorten it).
#[derive(Debug, Clone)]
pub struct LlmSettings {
    pub max_tokens: u32,
    pub temperature: f32,
    pub timeout: Duration,
    pub max_attempts: u32,
    pub multimodal: bool,
    pub reasoning_prefixes: Vec<String>,
    /// The model's context window in tokens; 0 means the default of its family.
    pub context_window: usize,
    /// Ask for streamed answers where the caller shows text live.
    pub stream: bool,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// The longest Retry-After we wait; a server asking for more gets this.
    pub retry_after_max: Duration,
}

impl LlmSettings {
    pub fn from_config(cfg: &LlmConfig) -> Self {
        Self {
            max_tokens: cfg.max_tokens,
            temperature: cfg.temperature,
            timeout: Duration::from_secs(cfg.timeout_secs.max(1)),
            max_attempts: cfg.max_retries.max(1),
            multimodal: cfg.sees_images(),
            reasoning_prefixes: cfg.reasoning_prefixes.clone(),
            context_window: cfg.context_window,
            stream: cfg.stream,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            retry_after_max: Duration::from_secs(120),
        }
    }
}

struct Target {
    client: Client<Box<dyn Config>>,
    /// For streamed requests, which async-openai's byot layer would read itself.
    http: reqwest::Client,
    endpoint: Endpoint,
}

impl Target {
    fn new(endpoint: Endpoint) -> Self {
        let config: Box<dyn Config> = match endpoint.api_type {
            ApiType::OpenAi => Box::new(
                OpenAIConfig::new()
                    .with_api_base(endpoint.base_url.clone())
                    .with_api_key(endpoint.api_key.clone()),
            ),
            ApiType::Azure => Box::new(
                AzureConfig::new()
                    .with_api_base(endpoint.base_url.clone())
                    .with_api_key(endpoint.api_key.clone())
                    .with_deployment_id(endpoint.deployment.clone())
                    .with_api_version(endpoint.api_version.clone()),
            ),
        };
        let client = Client::with_config(config).with_http_service(transport::Transport::default());
        Self {
            client,
            http: reqwest::Client::new(),
            endpoint,
        }
    }
}

pub struct LlmClient {
    main: Target,
    vision: Option<Target>,
    settings: LlmSettings,
    /// Set when the server refused a streamed request: plain requests from then on.
    no_stream: AtomicBool,
}

impl LlmClient {
    /// From [llm] and the process environment; `NotConfigured` carries the setup guide.
    pub fn from_config(cfg: &LlmConfig) -> Result<Self, LlmError> {
        let endpoint = resolve(cfg, &|k| std::env::var(k).ok())?;
        let vision = resolve_vision(cfg, &endpoint)?;
        Ok(Self::new(endpoint, vision, LlmSettings::from_config(cfg)))
    }

    pub fn new(endpoint: Endpoint, vision: Option<Endpoint>, settings: LlmSettings) -> Self {
        Self {
            main: Target::new(endpoint),
            vision: vision.map(Target::new),
            settings,
            no_stream: AtomicBool::new(false),
        }
    }

    pub fn model(&self) -> &str {
        &self.main.endpoint.model
    }

    /// Whether images may be put into the conversation at all.
    pub fn takes_images(&self) -> bool {
        self.settings.multimodal || self.vision.is_some()
    }

    pub fn settings(&self) -> &LlmSettings {
        &self.settings
    }

    /// The encoding the main model's prompts are counted with.
    pub fn tokenizer(&self) -> Tokenizer {
        Tokenizer::for_model(self.model())
    }

    /// The main model's context window: [llm] context_window, else its family's default.
    pub fn context_window(&self) -> usize {
        tokens::context_window(self.model(), self.settings.context_window)
    }

    fn is_reasoning(&self, model: &str) -> bool {
        // "openai/o3-mini" and "o3-mini" are both reasoning models.
        let bare = model
            .rsplit('/')
            .next()
            .unwrap_or(model)
            .to_ascii_lowercase();
        self.settings
            .reasoning_prefixes
            .iter()
            .any(|p| !p.is_empty() && bare.starts_with(&p.to_ascii_lowercase()))
    }

    /// One chat turn with tools (tool_choice auto), retried per the policy above.
    pub async fn chat(
        &self,
        messages: &[Message],
        tools: &[Value],
        cancel: &CancellationToken,
        on_retry: &(dyn Fn(RetryNotice) + Send + Sync),
    ) -> Result<Completion, LlmError> {
        let choice = (!tools.is_empty()).then(|| Value::from("auto"));
        self.chat_with_choice(messages, tools, choice, cancel, on_retry, None)
            .await
    }

    /// `chat`, streamed when [llm] stream is on: each piece of the answer's text goes to
    /// `on_text` as it arrives (a retried attempt may repeat pieces: the returned
    /// completion is the answer). A server that refuses streaming gets plain requests
    /// from then on.
    pub async fn chat_streaming(
        &self,
        messages: &[Message],
        tools: &[Value],
        cancel: &CancellationToken,
        on_retry: &(dyn Fn(RetryNotice) + Send + Sync),
        on_text: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<Completion, LlmError> {
        let choice = (!tools.is_empty()).then(|| Value::from("auto"));
        self.chat_with_choice(messages, tools, choice, cancel, on_retry, Some(on_text))
            .await
    }

    /// One chat turn that must call `tool` (an OpenAI function-format tool), e.g. to extract
    /// structured data; returns that call's arguments.
    pub async fn chat_forced(
        &self,
        messages: &[Message],
        tool: Value,
        cancel: &CancellationToken,
    ) -> Result<Value, LlmError> {
        let name = tool["function"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let choice = serde_json::json!({"type": "function", "function": {"name": name}});
        let completion = self
            .chat_with_choice(
                messages,
                std::slice::from_ref(&tool),
                Some(choice),
                cancel,
                &|_| {},
                None,
            )
            .await?;
        let call = completion
            .tool_calls
            .into_iter()
            .find(|c| c.function.name == name)
            .ok_or_else(|| LlmError::BadResponse(format!("the model did not call {name}")))?;
        serde_json::from_str(&call.function.arguments).map_err(|e| {
            LlmError::BadResponse(format!("the arguments of {name} are not JSON: {e}"))
        })
    }

    /// `chat_attempts`, measured for the metrics (`crate::metrics`): one request per turn,
    /// its retries included.
    async fn chat_with_choice(
        &self,
        messages: &[Message],
        tools: &[Value],
        tool_choice: Option<Value>,
        cancel: &CancellationToken,
        on_retry: &(dyn Fn(RetryNotice) + Send + Sync),
        on_text: Option<&(dyn Fn(&str) + Send + Sync)>,
    ) -> Result<Completion, LlmError> {
        let target = match &self.vision {
            Some(v) if messages.iter().any(Message::has_image) => v,
            _ => &self.main,
        };
        let started = std::time::Instant::now();
        let out = self
            .chat_attempts(
                target,
                messages,
                tools,
                tool_choice,
                cancel,
                on_retry,
                on_text,
            )
            .await;
        if let Some(m) = crate::metrics::recorder() {
            let usage = out.as_ref().map(|c| c.usage).unwrap_or_default();
            m.llm_request(crate::metrics::LlmCall {
                model: &target.endpoint.model,
                took: started.elapsed(),
                ok: out.is_ok(),
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
            });
        }
        out
    }

    /// The attempts of one request (streamed when `on_text` is given and the server allows
    /// it), with retries and their notices.
    #[allow(clippy::too_many_arguments)]
    async fn chat_attempts(
        &self,
        target: &Target,
        messages: &[Message],
        tools: &[Value],
        tool_choice: Option<Value>,
        cancel: &CancellationToken,
        on_retry: &(dyn Fn(RetryNotice) + Send + Sync),
        on_text: Option<&(dyn Fn(&str) + Send + Sync)>,
    ) -> Result<Completion, LlmError> {
        let mut request = self.request(&target.endpoint.model, messages, tools, tool_choice);
        let max = self.settings.max_attempts;
        let mut attempt = 1;
        loop {
            let streamed = on_text.filter(|_| self.streams());
            request.stream = streamed.is_some();
            request.stream_options = streamed.map(|_| serde_json::json!({"include_usage": true}));
            let call = self.attempt(target, &request, streamed, attempt);
            let outcome = tokio::select! {
                r = tokio::time::timeout(self.settings.timeout, call) => r,
                _ = cancel.cancelled() => return Err(LlmError::Cancelled),
            };
            let failure = match outcome {
                Ok(Ok(completion)) => return Ok(completion),
                Ok(Err(Failure::Fatal(e))) if streamed.is_some() && refuses_streaming(&e) => {
                    tracing::warn!(error = %e, "the LLM server refused a streamed request; asking without streaming from now on");
                    self.no_stream.store(true, Ordering::Relaxed);
                    continue;
                }
                Ok(Err(f)) => f,
                Err(_) => Failure::Retry {
                    error: LlmError::Timeout {
                        after: self.settings.timeout,
                        attempts: attempt,
                    },
                    after: None,
                },
            };
            let (error, server_wait) = match failure {
                Failure::Fatal(e) => return Err(e),
                Failure::Retry { error, after } => (error, after),
            };
            if attempt >= max {
                return Err(error);
            }
            let delay = match server_wait {
                Some(d) => d.min(self.settings.retry_after_max),
                None => backoff(
                    self.settings.backoff_base,
                    self.settings.backoff_max,
                    attempt,
                ),
            };
            on_retry(RetryNotice {
                attempt: attempt + 1,
                max_attempts: max,
                delay,
                reason: error.to_string(),
            });
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = cancel.cancelled() => return Err(LlmError::Cancelled),
            }
            attempt += 1;
        }
    }
}

impl LlmClient {
    /// The request body for `model` (a reasoning model gets max_completion_tokens and no
    /// temperature); not streamed until the attempt says so.
    fn request<'a>(
        &self,
        model: &'a str,
        messages: &'a [Message],
        tools: &'a [Value],
        tool_choice: Option<Value>,
    ) -> wire::ChatRequest<'a> {
        let reasoning = self.is_reasoning(model);
        wire::ChatRequest {
            model,
            messages,
            tools,
            tool_choice,
            max_tokens: (!reasoning).then_some(self.settings.max_tokens),
            max_completion_tokens: reasoning.then_some(self.settings.max_tokens),
            temperature: (!reasoning).then_some(self.settings.temperature),
            stream: false,
            stream_options: None,
        }
    }

    fn streams(&self) -> bool {
        self.settings.stream && !self.no_stream.load(Ordering::Relaxed)
    }

    /// One attempt, streamed when `on_text` is given.
    async fn attempt(
        &self,
        target: &Target,
        request: &wire::ChatRequest<'_>,
        on_text: Option<&(dyn Fn(&str) + Send + Sync)>,
        attempt: u32,
    ) -> Result<Completion, Failure> {
        let url = &target.endpoint.base_url;
        let Some(on_text) = on_text else {
            let chat = target.client.chat();
            let raw = chat
                .create_byot::<_, wire::RawResponse>(request)
                .await
                .map_err(|e| classify(e, url, attempt))?;
            return raw.into_completion().ok_or_else(|| {
                Failure::Fatal(LlmError::BadResponse(
                    "the response has no choices[0].message".into(),
                ))
            });
        };
        let config = target.client.config();
        let body = serde_json::to_value(request)
            .map_err(|e| Failure::Fatal(LlmError::BadResponse(e.to_string())))?;
        let streamed = stream::attempt(
            &target.http,
            &config.url("/chat/completions"),
            config.headers(),
            &config.query(),
            &body,
            on_text,
        )
        .await;
        let mut completion = streamed.map_err(|f| match f {
            stream::StreamFailure::Http(h) => {
                classify(OpenAIError::Boxed(Box::new(h)), url, attempt)
            }
            stream::StreamFailure::Bad(m) => Failure::Fatal(LlmError::BadResponse(m)),
        })?;
        if completion.usage.prompt_tokens == 0 {
            // The server sent no usage: count the prompt ourselves, so budgets and quotas
            // still see what the request cost.
            let text = serde_json::to_string(request.messages).unwrap_or_default();
            completion.usage.prompt_tokens = self.tokenizer().count(&text) as u64;
        }
        Ok(completion)
    }
}

/// Whether a failed streamed request says the server does not stream (so a plain request
/// may work): a 4xx about `stream`, or an answer that is not the stream we read.
fn refuses_streaming(e: &LlmError) -> bool {
    match e {
        LlmError::Http {
            status, message, ..
        } => (400..500).contains(status) && message.to_ascii_lowercase().contains("stream"),
        LlmError::BadResponse(_) => true,
        _ => false,
    }
}

enum Failure {
    Fatal(LlmError),
    Retry {
        error: LlmError,
        after: Option<Duration>,
    },
}

fn classify(e: OpenAIError, url: &str, attempts: u32) -> Failure {
    let failure = match e {
        OpenAIError::Boxed(b) => match b.downcast::<HttpFailure>() {
            Ok(f) => *f,
            Err(other) => return Failure::Fatal(LlmError::BadResponse(other.to_string())),
        },
        OpenAIError::JSONDeserialize(err, body) => {
            let snippet: String = body.chars().take(300).collect();
            return Failure::Fatal(LlmError::BadResponse(format!("{err}; body: {snippet}")));
        }
        other => return Failure::Fatal(LlmError::BadResponse(other.to_string())),
    };
    match failure {
        HttpFailure::Transport { message, .. } => Failure::Retry {
            error: LlmError::Unreachable {
                url: url.into(),
                message,
                attempts,
            },
            after: None,
        },
        HttpFailure::Status {
            status,
            message,
            retry_after,
        } => {
            if is_context_length(&message) {
                return Failure::Fatal(LlmError::ContextTooLong { status, message });
            }
            let quota = message.contains("insufficient_quota")
                || message.contains("exceeded your current quota");
            let error = LlmError::Http {
                status,
                message,
                attempts,
            };
            match status {
                429 if !quota => Failure::Retry {
                    error,
                    after: retry_after,
                },
                408 | 500..=599 => Failure::Retry {
                    error,
                    after: retry_after,
                },
                _ => Failure::Fatal(error),
            }
        }
    }
}

fn is_context_length(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "maximum context length",
        "context length",
        "context window",
        "too many tokens",
        "prompt is too long",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

/// base·2^(attempt-1), capped, with "equal jitter": half fixed, half random.
fn backoff(base: Duration, max: Duration, attempt: u32) -> Duration {
    let exp = base.saturating_mul(1u32 << (attempt - 1).min(16)).min(max);
    let half = exp / 2;
    half + half.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        let d1 = backoff(base, max, 1);
        assert!(d1 >= Duration::from_millis(50) && d1 <= base);
        let d4 = backoff(base, max, 4);
        assert!(d4 >= Duration::from_millis(400) && d4 <= Duration::from_millis(800));
        assert!(backoff(base, max, 30) <= max);
    }

    #[test]
    fn context_errors_are_recognized() {
        assert!(is_context_length(
            "This model's maximum context length is 8192 tokens"
        ));
        assert!(!is_context_length("invalid model"));
    }
}
