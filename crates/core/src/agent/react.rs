//! One run of the ReAct loop: think (chat with tools) → act (each tool call in order) →
//! observe (tool messages cut to max_observe), until terminate, a final text answer,
//! max_steps, the input-token budget, cancellation or an error that cannot be retried.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::condense::Condenser;
use super::live;
use super::memory::{Memory, count, cut_observation};
use super::sink::{Emitter, EventSink, Image, RunRecord};
use super::{Agent, AgentTask, RunOutcome, prompts};
use crate::events::{EventKind, FinishReason};
use crate::llm::{Completion, ContentPart, LlmError, Message, ToolCall, Usage, UserContent};
use crate::tools::{ToolContext, ToolError, ToolRegistry, ToolResult, terminate};

/// How long a tool gets to clean up after a cancel before the run stops waiting for it.
const CANCEL_GRACE: Duration = Duration::from_secs(15);

pub(super) struct Run<'a> {
    agent: &'a Agent,
    run_id: String,
    request: AgentTask,
    emitter: Emitter<'a>,
    cancel: CancellationToken,
    memory: Memory,
    usage: Usage,
    tools_json: Vec<Value>,
    /// This run's own copy of the tools: a step hook may add or remove some.
    tools: ToolRegistry,
    /// The previous step's fingerprint, and whether the stuck nudge is on.
    last_step: Option<String>,
    nudge: bool,
    /// The last step that used the browser.
    browser_step: Option<usize>,
    /// Tokens of `tools_json`, counted once per tool set.
    tools_tokens: Option<usize>,
    /// A smaller request limit learnt from the provider's context-length error.
    provider_cap: Option<usize>,
}

/// What one step decided.
enum Next {
    Continue,
    Finish(FinishReason, Option<String>),
}

impl<'a> Run<'a> {
    pub(super) fn new(
        agent: &'a Agent,
        mut request: AgentTask,
        sink: &'a dyn EventSink,
        cancel: CancellationToken,
    ) -> Self {
        let mut system = prompts::system(&agent.tools.names(), agent.settings.max_steps);
        for note in &agent.system_notes {
            system.push_str("\n\n");
            system.push_str(note);
        }
        let earlier = std::mem::take(&mut request.earlier);
        let memory =
            Memory::continuing(system, earlier, request.task.clone(), agent.llm.tokenizer());
        let run_id = request.run_id.clone();
        Self {
            agent,
            emitter: Emitter::new(run_id.clone(), sink),
            run_id,
            request,
            cancel,
            memory,
            usage: Usage::default(),
            tools_json: agent.tools.to_openai(),
            tools: agent.tools.clone(),
            last_step: None,
            nudge: false,
            browser_step: None,
            tools_tokens: None,
            provider_cap: None,
        }
    }

    pub(super) async fn execute(mut self) -> RunOutcome {
        let settings = self.agent.settings.clone();
        self.emitter
            .emit(EventKind::RunStarted {
                owner: self.request.owner.clone(),
                session_id: self.request.session_id.clone(),
                task: self.request.task.clone(),
                model: self.agent.llm.model().to_string(),
                max_steps: settings.max_steps,
                continued_messages: self.memory.earlier_len(),
            })
            .await;
        for message in std::mem::take(&mut self.request.notices) {
            self.emitter.emit(EventKind::Notice { message }).await;
        }
        let mut steps = 0;
        let (reason, answer) = loop {
            if steps >= settings.max_steps {
                break (
                    FinishReason::MaxSteps {
                        max_steps: settings.max_steps,
                    },
                    None,
                );
            }
            if self.cancel.is_cancelled() {
                break (FinishReason::Cancelled, None);
            }
            steps += 1;
            match self.step(steps).await {
                Next::Continue => {}
                Next::Finish(reason, answer) => {
                    // The budget check comes before the model is asked: that step never ran.
                    if matches!(reason, FinishReason::TokenBudget { .. }) {
                        steps -= 1;
                    }
                    break (reason, answer);
                }
            }
        };
        self.finish(reason, answer, steps).await
    }

    /// One step: think (the model's reply), act (its tool calls, in order), observe (their
    /// results into the memory). A reply without tool calls is the answer, or an empty reply
    /// the model is asked to follow up on.
    async fn step(&mut self, step: usize) -> Next {
        let completion = match self.think(step).await {
            Ok(completion) => completion,
            Err(end) => return end,
        };
        if completion.tool_calls.is_empty() {
            return match completion.content {
                Some(text) => Next::Finish(FinishReason::FinalAnswer, Some(text)),
                None => {
                    self.memory.push(Message::user(prompts::empty_reply()));
                    Next::Continue
                }
            };
        }
        let (results, finished) = self.act(step, &completion.tool_calls).await;
        self.observe(&completion.tool_calls, results, &finished);
        match finished {
            Some((reason, answer)) => Next::Finish(reason, answer),
            None => Next::Continue,
        }
    }

    /// Think: the step hook, the context within the budgets (condensed first when the
    /// history does not fit), then the model's completion, recorded in the memory and the
    /// events. A context-length error from the provider condenses harder and asks once
    /// more. `Err` ends the run before any tool runs (the input-token budget, a cancel, an
    /// LLM error).
    async fn think(&mut self, step: usize) -> Result<Completion, Next> {
        self.apply_hook().await;
        let mut retried = false;
        loop {
            let context = self.prepare(step).await?;
            let llm = &self.agent.llm;
            let asked = live::chat(
                llm,
                &context.messages,
                &self.tools_json,
                &self.cancel,
                &mut self.emitter,
                step,
            );
            match asked.await {
                Ok(completion) => {
                    self.record_reply(step, &completion).await;
                    return Ok(completion);
                }
                Err(LlmError::Cancelled) => {
                    return Err(Next::Finish(FinishReason::Cancelled, None));
                }
                Err(LlmError::ContextTooLong { .. }) if !retried => {
                    retried = true;
                    // Our window was wrong for this provider: aim well under what was sent.
                    self.provider_cap = Some(context.estimated_tokens * 2 / 3);
                }
                Err(e) => {
                    let message = e.to_string();
                    self.emitter
                        .emit(EventKind::Error {
                            message: message.clone(),
                        })
                        .await;
                    return Err(Next::Finish(FinishReason::Error { message }, None));
                }
            }
        }
    }

    /// The request's context: condensed when the history is over the budget, then trimmed
    /// to it, checked against the run's input-token budget, announced by `thinking`.
    async fn prepare(&mut self, step: usize) -> Result<super::memory::Context, Next> {
        let tokenizer = self.memory.tokenizer();
        let tools_tokens = *self.tools_tokens.get_or_insert_with(|| {
            tokenizer.count(&serde_json::to_string(&self.tools_json).unwrap_or_default())
        });
        let budget = self.request_limit().saturating_sub(tools_tokens);
        let tail = self.tail(step).await;
        let tail_tokens = tail.as_ref().map_or(0, |t| count(tokenizer, t));
        let history_budget = budget.saturating_sub(tail_tokens);
        if self.agent.settings.condense && self.memory.total_tokens() > history_budget {
            self.condense(step, history_budget).await?;
        }
        let context = self.memory.context(budget, tail, &prompts::trimmed);
        if context.dropped > 0 {
            self.emitter
                .emit(EventKind::ContextTrimmed {
                    step,
                    dropped_messages: context.dropped,
                })
                .await;
        }
        let max_input_tokens = self.agent.settings.max_input_tokens;
        if max_input_tokens > 0 {
            let next = (context.estimated_tokens + tools_tokens) as u64;
            if self.usage.prompt_tokens + next > max_input_tokens {
                return Err(Next::Finish(
                    FinishReason::TokenBudget {
                        budget: max_input_tokens,
                        spent: self.usage.prompt_tokens,
                    },
                    None,
                ));
            }
        }
        self.emitter.emit(EventKind::Thinking { step }).await;
        Ok(context)
    }

    /// Tokens one request may hold: [agent] context_tokens (0: no own limit), the model's
    /// window less the reply's max_tokens, and what the provider's error taught us.
    fn request_limit(&self) -> usize {
        let llm = &self.agent.llm;
        let window = llm
            .context_window()
            .saturating_sub(llm.settings().max_tokens as usize);
        let own = match self.agent.settings.context_tokens {
            0 => window,
            n => n.min(window),
        };
        self.provider_cap.map_or(own, |cap| cap.min(own))
    }

    /// Condenses the history under `budget` and says so in a `context_condensed` event.
    async fn condense(&mut self, step: usize, budget: usize) -> Result<(), Next> {
        let condenser = Condenser {
            llm: &self.agent.llm,
            workspace: self.agent.workspace.as_ref(),
            run_id: &self.run_id,
            cancel: &self.cancel,
        };
        let done = match condenser.condense(&mut self.memory, budget).await {
            Ok(Some(done)) => done,
            Ok(None) => return Ok(()),
            Err(_) => return Err(Next::Finish(FinishReason::Cancelled, None)),
        };
        self.usage.add(done.usage);
        self.emitter
            .emit(EventKind::ContextCondensed {
                step,
                before_tokens: done.before_tokens as u64,
                after_tokens: done.after_tokens as u64,
                masked_outputs: done.masked_outputs,
                summarized_messages: done.summarized_messages,
                files: done.files,
            })
            .await;
        Ok(())
    }

    /// The step hook may change the tools and leave notes for the model.
    async fn apply_hook(&mut self) {
        if let Some(hook) = self.agent.hook.clone() {
            let notes = hook.before_step(&mut self.tools).await;
            if !notes.is_empty() {
                self.tools_json = self.tools.to_openai();
                self.tools_tokens = None;
                for note in notes {
                    self.memory
                        .push(Message::user(format!("[sandboxd] {note}")));
                }
            }
        }
    }

    /// The reply's usage and text as events, the reply itself into the memory, and the
    /// stuck check on it.
    async fn record_reply(&mut self, step: usize, completion: &Completion) {
        self.usage.add(completion.usage);
        self.emitter
            .emit(EventKind::TokenUsage {
                step,
                prompt_tokens: completion.usage.prompt_tokens,
                completion_tokens: completion.usage.completion_tokens,
                total_prompt_tokens: self.usage.prompt_tokens,
                total_completion_tokens: self.usage.completion_tokens,
            })
            .await;
        if let Some(text) = &completion.content {
            self.emitter
                .emit(EventKind::AssistantText {
                    step,
                    text: text.clone(),
                })
                .await;
        }
        self.memory.push(Message::Assistant {
            content: completion.content.clone(),
            tool_calls: completion.tool_calls.clone(),
        });
        self.track_stuck(step, &completion.content, &completion.tool_calls)
            .await;
    }

    /// Act: runs the calls in order until one ends the run (terminate, cancel, a dead
    /// sandbox); the ones after it are not run (`None`). Returns the results and why the run
    /// ends, if it does.
    async fn act(
        &mut self,
        step: usize,
        calls: &[ToolCall],
    ) -> (
        Vec<Option<ToolResult>>,
        Option<(FinishReason, Option<String>)>,
    ) {
        let mut results = Vec::with_capacity(calls.len());
        let mut finished = None;
        for call in calls {
            if finished.is_some() {
                results.push(None);
                continue;
            }
            if call.function.name == crate::tools::browser::NAME {
                self.browser_step = Some(step);
            }
            let (result, stop) = self.run_call(step, call).await;
            results.push(Some(result));
            if stop.is_some() {
                finished = stop;
            }
        }
        (results, finished)
    }

    /// Observe: each call's tool message (its result cut to max_observe, or why it did not
    /// run), then the images the calls produced in one user message, for a model that takes
    /// images.
    fn observe(
        &mut self,
        calls: &[ToolCall],
        results: Vec<Option<ToolResult>>,
        finished: &Option<(FinishReason, Option<String>)>,
    ) {
        let mut images = Vec::new();
        for (call, result) in calls.iter().zip(results) {
            let Some(result) = result else {
                // Every tool call needs its tool message, even the ones we no longer run.
                let why = match finished {
                    Some((FinishReason::Cancelled, _)) => "not run: the run was cancelled",
                    _ => "not run: the run ended before this call",
                };
                self.memory.push(Message::tool(call.id.clone(), why));
                continue;
            };
            let has_image = result.base64_image.is_some();
            let mut text = result.render();
            if has_image && !self.agent.llm.takes_images() {
                text.push('\n');
                text.push_str(&prompts::no_images());
            }
            let observation = cut_observation(&text, self.agent.settings.max_observe);
            self.memory
                .push(Message::tool(call.id.clone(), observation));
            if self.agent.llm.takes_images() {
                for img in result.images() {
                    images.push((call.function.name.clone(), img.clone()));
                }
            }
        }
        if !images.is_empty() {
            let mut parts = Vec::new();
            for (name, img) in images {
                parts.push(ContentPart::Text {
                    text: format!("Image produced by {name}:"),
                });
                parts.push(ContentPart::image_base64(&img));
            }
            self.memory.push(Message::User {
                content: UserContent::Parts(parts),
            });
        }
    }

    /// The transient message after the history: the stuck nudge, and the browser's state
    /// in the step right after the browser was used. Never stored, so it cannot pile up.
    async fn tail(&self, step: usize) -> Option<Message> {
        let nudge = self.nudge.then(prompts::nudge);
        let browser = match (&self.agent.browser, self.browser_step) {
            (Some(b), Some(used)) if used + 1 == step => b.current_state().await,
            _ => None,
        };
        let Some(state) = browser else {
            return nudge.map(Message::user);
        };
        let mut text = state.to_prompt();
        if let Some(n) = nudge {
            text = format!("{n}\n\n{text}");
        }
        match state.screenshot.filter(|_| self.agent.llm.takes_images()) {
            Some(img) => Some(Message::User {
                content: UserContent::Parts(vec![
                    ContentPart::Text { text },
                    ContentPart::image_base64(&img),
                ]),
            }),
            None => Some(Message::user(text)),
        }
    }

    /// Runs one call; the second value ends the run (terminate, cancel, a dead sandbox).
    async fn run_call(
        &mut self,
        step: usize,
        call: &ToolCall,
    ) -> (ToolResult, Option<(FinishReason, Option<String>)>) {
        let name = call.function.name.as_str();
        self.emitter
            .emit(EventKind::ToolCall {
                step,
                call_id: call.id.clone(),
                name: name.to_string(),
                arguments: call.function.arguments.clone(),
            })
            .await;
        let started = Instant::now();
        let ctx = ToolContext {
            cancel: self.cancel.child_token(),
        };
        let exec = self.tools.execute(name, &call.function.arguments, &ctx);
        // The tool sees the cancel itself (bash restarts its shell, killing the command);
        // we only stop waiting if it does not return within the grace period.
        let cancel = self.cancel.clone();
        let outcome = tokio::select! {
            r = exec => r,
            _ = async { cancel.cancelled().await; tokio::time::sleep(CANCEL_GRACE).await } => Err(ToolError::Cancelled),
        };
        let (result, stop) = self.call_result(call, outcome).await;
        let shown = cut_observation(&result.render(), self.agent.settings.max_observe);
        let image = result.base64_image.as_deref().and_then(Image::from_base64);
        self.emitter
            .emit_with(
                EventKind::ToolResult {
                    step,
                    call_id: call.id.clone(),
                    name: name.to_string(),
                    output: shown,
                    is_error: result.is_error(),
                    has_image: result.base64_image.is_some(),
                    image: image.as_ref().map(|i| i.reference.clone()),
                    data: result.data.clone(),
                    duration_ms: started.elapsed().as_millis() as u64,
                },
                image.as_ref(),
            )
            .await;
        // A python cell's further figures follow its result, in order.
        for (i, more) in result.more_images().iter().enumerate() {
            if let Some(img) = Image::from_base64(more) {
                let kind = EventKind::ToolImage {
                    step,
                    call_id: call.id.clone(),
                    name: name.to_string(),
                    index: i + 1,
                    image: img.reference.clone(),
                };
                self.emitter.emit_with(kind, Some(&img)).await;
            }
        }
        (result, stop)
    }

    /// What a call's outcome means for the run: a successful terminate ends it with its
    /// status and answer, a cancel ends it, a failure is an error event and a result for the
    /// model, and ends the run when the sandbox is gone for good.
    async fn call_result(
        &mut self,
        call: &ToolCall,
        outcome: Result<ToolResult, ToolError>,
    ) -> (ToolResult, Option<(FinishReason, Option<String>)>) {
        let name = call.function.name.as_str();
        match outcome {
            Ok(r) => {
                let stop = (name == terminate::NAME && !r.is_error()).then(|| {
                    let args: Value =
                        serde_json::from_str(&call.function.arguments).unwrap_or_default();
                    let status = args
                        .get("status")
                        .and_then(Value::as_str)
                        .unwrap_or("success")
                        .to_string();
                    let answer = args.get("answer").and_then(Value::as_str).map(String::from);
                    (FinishReason::Terminated { status }, answer)
                });
                (r, stop)
            }
            Err(ToolError::Cancelled) => (
                ToolResult::error("the tool call was cancelled"),
                Some((FinishReason::Cancelled, None)),
            ),
            Err(e) => {
                let message = format!("sandboxd failed to run {name}: {e}");
                self.emitter
                    .emit(EventKind::Error {
                        message: message.clone(),
                    })
                    .await;
                let fatal = matches!(&e, ToolError::Sandbox(s) if s.is_fatal_for_session());
                let stop = fatal.then(|| {
                    (
                        FinishReason::Error {
                            message: message.clone(),
                        },
                        None,
                    )
                });
                (ToolResult::error(message), stop)
            }
        }
    }

    /// The same step twice in a row turns the nudge on; a different step turns it off.
    async fn track_stuck(&mut self, step: usize, content: &Option<String>, calls: &[ToolCall]) {
        let mut fingerprint = content.clone().unwrap_or_default();
        for c in calls {
            fingerprint.push('\u{1f}');
            fingerprint.push_str(&c.function.name);
            fingerprint.push('\u{1f}');
            fingerprint.push_str(&c.function.arguments);
        }
        let repeated =
            !fingerprint.is_empty() && self.last_step.as_deref() == Some(fingerprint.as_str());
        if repeated != self.nudge {
            self.nudge = repeated;
            self.emitter
                .emit(EventKind::Nudge {
                    step,
                    active: repeated,
                })
                .await;
        }
        self.last_step = Some(fingerprint);
    }

    async fn finish(
        mut self,
        reason: FinishReason,
        answer: Option<String>,
        steps: usize,
    ) -> RunOutcome {
        let elapsed = self.emitter.elapsed();
        self.emitter
            .emit(EventKind::RunFinished {
                reason: reason.clone(),
                answer: answer.clone(),
                steps,
                prompt_tokens: self.usage.prompt_tokens,
                completion_tokens: self.usage.completion_tokens,
                duration_ms: elapsed.as_millis() as u64,
            })
            .await;
        let record = RunRecord {
            run_id: self.run_id.clone(),
            owner: self.request.owner.clone(),
            session_id: self.request.session_id.clone(),
            model: self.agent.llm.model().to_string(),
            task: self.request.task.clone(),
            reason: reason.clone(),
            answer: answer.clone(),
            steps,
            usage: self.usage,
            messages: self.memory.messages().to_vec(),
        };
        self.emitter.finished(&record).await;
        RunOutcome {
            run_id: self.run_id,
            reason,
            answer,
            steps,
            usage: self.usage,
            elapsed,
            conversation: self.memory.conversation(),
            transcript: None,
        }
    }
}
