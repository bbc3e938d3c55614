//! Condensation: what a run does when its history no longer fits the request budget.
//!
//! Two stages, cheapest first. (1) Mask: the bulky outputs of older tool calls are written
//! in full to /workspace/.sandboxd-context/ and replaced by a short note saying where they
//! are; the call and its tool message stay, so the pairing holds and the model can read the
//! file again. (2) Summarize: if the history is still too long, the messages between the
//! task and the newest turns are summarized by the model in one extra request (no tools)
//! and replaced by that summary, right after the task. Both change the memory for good, so
//! the next steps start from the condensed history; they aim well under the budget
//! (`TARGET_PERCENT`) so a run does not condense at every step. Trimming by whole turns
//! (memory.rs) still catches whatever is left over.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::memory::{Memory, cut_observation};
use crate::llm::{LlmClient, LlmError, Message, Usage};
use crate::sandbox::Sandbox;

/// Where masked outputs go in the sandbox.
pub const SPILL_DIR: &str = "/workspace/.sandboxd-context";
/// Condensation aims at this share of the budget.
const TARGET_PERCENT: usize = 60;
/// The newest turns are never masked: the model is working with them.
const KEEP_RECENT_TURNS: usize = 2;
/// Outputs smaller than this many tokens are not worth a note and a file.
const MASK_MIN_TOKENS: usize = 200;
/// Each message of the summarized part is cut to this many characters for the summary
/// request, and the whole request to `SUMMARY_INPUT_MAX` characters.
const SUMMARY_PER_MESSAGE: usize = 2_000;
const SUMMARY_INPUT_MAX: usize = 48_000;
/// The longest summary kept, in characters.
const SUMMARY_MAX: usize = 8_000;

const SUMMARY_PROMPT: &str = "You condense the history of an AI agent's task so the agent can continue it \
with less context. Write a concise summary of the steps below: what was tried, what worked, what failed \
and why, the files created or changed (full paths), key facts and numbers found, and what remains to do. \
Keep exact paths, commands, names and figures. Do not invent anything. Answer with the summary only.";

/// What one condensation did, for the `context_condensed` event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Condensed {
    pub before_tokens: usize,
    pub after_tokens: usize,
    pub masked_outputs: usize,
    pub summarized_messages: usize,
    /// Where the masked outputs were written.
    pub files: Vec<String>,
    /// What the summary request cost.
    pub usage: Usage,
}

/// What condensation needs besides the memory.
pub struct Condenser<'a> {
    pub llm: &'a LlmClient,
    pub workspace: Option<&'a Arc<dyn Sandbox>>,
    pub run_id: &'a str,
    pub cancel: &'a CancellationToken,
}

impl Condenser<'_> {
    /// Condenses `memory` until it is under `TARGET_PERCENT` of `budget` (or as far as it
    /// goes); `None` when nothing changed. Only a cancel is an error: a failed summary
    /// leaves the rest to trimming.
    pub async fn condense(
        &self,
        memory: &mut Memory,
        budget: usize,
    ) -> Result<Option<Condensed>, LlmError> {
        let target = budget * TARGET_PERCENT / 100;
        let before = memory.total_tokens();
        let mut done = Condensed {
            before_tokens: before,
            ..Condensed::default()
        };
        self.mask(memory, target, &mut done).await;
        if memory.total_tokens() > target {
            done.summarized_messages = self.summarize(memory, target, &mut done.usage).await?;
        }
        done.after_tokens = memory.total_tokens();
        let changed = done.masked_outputs > 0 || done.summarized_messages > 0;
        Ok(changed.then_some(done))
    }

    /// Masks tool outputs, oldest first, outside the newest turns, until under `target`.
    async fn mask(&self, memory: &mut Memory, target: usize, done: &mut Condensed) {
        let starts = memory.turn_starts();
        let recent_from = starts
            .len()
            .checked_sub(KEEP_RECENT_TURNS + 1)
            .map_or(0, |i| starts[i]);
        for index in 1..recent_from {
            if memory.total_tokens() <= target {
                break;
            }
            let tokens = memory.tokens_of(index);
            let Some(Message::Tool {
                tool_call_id,
                content,
            }) = memory.messages().get(index)
            else {
                continue;
            };
            if tokens < MASK_MIN_TOKENS || content.starts_with(MASK_MARK) {
                continue;
            }
            let path = format!(
                "{SPILL_DIR}/{}-{}.txt",
                safe(self.run_id),
                safe(tool_call_id)
            );
            let kept = match self.workspace {
                Some(sandbox) => sandbox.write_file(&path, content.as_bytes()).await.is_ok(),
                None => false,
            };
            let note = mask_note(tokens, kept.then_some(path.as_str()));
            if memory.mask(index, note) {
                done.masked_outputs += 1;
                if kept {
                    done.files.push(path);
                }
            }
        }
    }

    /// Summarizes everything between the task and the newest turns that fit half of
    /// `target`; returns how many messages the summary replaced.
    async fn summarize(
        &self,
        memory: &mut Memory,
        target: usize,
        usage: &mut Usage,
    ) -> Result<usize, LlmError> {
        let starts = memory.turn_starts();
        let task = memory.task_index();
        let mut keep_from = memory.messages().len();
        let mut kept = 0;
        for w in starts.windows(2).rev() {
            let (start, end) = (w[0], w[1]);
            if start <= task {
                break;
            }
            let turn: usize = (start..end).map(|i| memory.tokens_of(i)).sum();
            // The newest turn always stays, whatever its size.
            if keep_from != memory.messages().len() && kept + turn > target / 2 {
                break;
            }
            kept += turn;
            keep_from = start;
        }
        let middle: Vec<&Message> = memory.messages()[1..keep_from]
            .iter()
            .enumerate()
            .filter(|(i, _)| i + 1 != task)
            .map(|(_, m)| m)
            .collect();
        if middle.is_empty() {
            return Ok(0);
        }
        let request = [
            Message::system(SUMMARY_PROMPT),
            Message::user(render(&middle)),
        ];
        let summary = match self.llm.chat(&request, &[], self.cancel, &|_| {}).await {
            Ok(c) => {
                usage.add(c.usage);
                c.content.unwrap_or_default()
            }
            Err(LlmError::Cancelled) => return Err(LlmError::Cancelled),
            Err(e) => {
                tracing::warn!("the history could not be summarized: {e}");
                return Ok(0);
            }
        };
        if summary.trim().is_empty() {
            return Ok(0);
        }
        let text = format!(
            "[sandboxd] {} earlier messages were condensed into this summary to fit the context window:\n\n{}",
            middle.len(),
            cut_observation(summary.trim(), SUMMARY_MAX)
        );
        Ok(memory.fold_middle(keep_from, Message::user(text)))
    }
}

/// How a masked output starts, so it is never masked twice.
const MASK_MARK: &str = "[sandboxd: output masked";

fn mask_note(tokens: usize, path: Option<&str>) -> String {
    match path {
        Some(p) => format!(
            "{MASK_MARK} to save context ({tokens} tokens). The full output is in {p}: read the part you need (grep, head, sed -n) instead of printing it whole.]"
        ),
        None => format!(
            "{MASK_MARK} to save context ({tokens} tokens); it could not be kept. Run the command again if you need it.]"
        ),
    }
}

/// The messages as plain text for the summary request, each cut, the whole bounded.
fn render(messages: &[&Message]) -> String {
    let mut out = String::new();
    for m in messages {
        let (role, text) = match m {
            Message::System { content } => ("system", content.clone()),
            Message::User { content } => (
                "user",
                match content {
                    crate::llm::UserContent::Text(t) => t.clone(),
                    crate::llm::UserContent::Parts(_) => "(an image)".into(),
                },
            ),
            Message::Assistant {
                content,
                tool_calls,
            } => {
                let mut t = content.clone().unwrap_or_default();
                for c in tool_calls {
                    t.push_str(&format!(
                        "\ncalls {}({})",
                        c.function.name, c.function.arguments
                    ));
                }
                ("assistant", t)
            }
            Message::Tool { content, .. } => ("tool result", content.clone()),
        };
        out.push_str(&format!(
            "### {role}\n{}\n\n",
            cut_observation(&text, SUMMARY_PER_MESSAGE)
        ));
    }
    cut_observation(&out, SUMMARY_INPUT_MAX)
}

/// A name part safe in a file name: ASCII letters, digits, '-' and '_' only.
fn safe(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(80)
        .collect()
}
