//! The conversation of one run and the context actually sent to the model.
//!
//! Trimming works on whole turns: a turn is an assistant message plus every tool message
//! (and image message) that answers it, so a tool message can never lose its assistant
//! `tool_calls` (OpenAI answers 400 to such an orphan; OpenManus trimmed by message count
//! and hit exactly that). The system prompt and the task are always kept; older turns are
//! dropped first and replaced by one note saying how many messages are gone. Trimming is
//! the last resort: condensation (condense.rs) masks old outputs and summarizes first,
//! through `mask` and `fold_middle` here, which keep the same turn boundaries.
//!
//! Token counts use the model's BPE encoding (llm/tokens.rs), counted once per message when
//! it is added; the exact counts come back in `usage` and are what the run budget is charged.

use crate::llm::tokens::{PER_IMAGE, PER_MESSAGE};
use crate::llm::{ContentPart, Message, Tokenizer, UserContent};

/// Tokens of a message as `tokenizer` counts them, with the message framing.
pub fn count(tokenizer: Tokenizer, m: &Message) -> usize {
    let body = match m {
        Message::System { content } => tokenizer.count(content),
        Message::User {
            content: UserContent::Text(t),
        } => tokenizer.count(t),
        Message::User {
            content: UserContent::Parts(parts),
        } => parts
            .iter()
            .map(|p| match p {
                ContentPart::Text { text } => tokenizer.count(text),
                ContentPart::ImageUrl { .. } => PER_IMAGE,
            })
            .sum(),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            content.as_deref().map_or(0, |c| tokenizer.count(c))
                + tool_calls
                    .iter()
                    .map(|c| {
                        tokenizer.count(&c.function.name)
                            + tokenizer.count(&c.function.arguments)
                            + tokenizer.count(&c.id)
                            + PER_MESSAGE
                    })
                    .sum::<usize>()
        }
        Message::Tool {
            tool_call_id,
            content,
        } => tokenizer.count(tool_call_id) + tokenizer.count(content),
    };
    PER_MESSAGE + body
}

/// The conversation of one run, with the estimates: `messages[0]` is the system prompt,
/// then the earlier runs' messages when the run continues a session, then this run's task
/// (`messages[task_at]`) and its turns.
#[derive(Debug, Clone)]
pub struct Memory {
    messages: Vec<Message>,
    tokens: Vec<usize>,
    task_at: usize,
    tokenizer: Tokenizer,
}

/// What `Memory::context` produced.
pub struct Context {
    pub messages: Vec<Message>,
    pub dropped: usize,
    pub estimated_tokens: usize,
}

impl Memory {
    pub fn new(system: String, task: String, tokenizer: Tokenizer) -> Self {
        Self::continuing(system, Vec::new(), task, tokenizer)
    }

    /// A run that continues `earlier` (the messages after the system prompt of the
    /// session's previous runs; see `paired_prefix`).
    pub fn continuing(
        system: String,
        earlier: Vec<Message>,
        task: String,
        tokenizer: Tokenizer,
    ) -> Self {
        let mut m = Self {
            messages: Vec::new(),
            tokens: Vec::new(),
            task_at: 0,
            tokenizer,
        };
        m.push(Message::system(system));
        for message in earlier {
            m.push(message);
        }
        m.task_at = m.messages.len();
        m.push(Message::user(task));
        m
    }

    pub fn push(&mut self, message: Message) {
        self.tokens.push(count(self.tokenizer, &message));
        self.messages.push(message);
    }

    pub fn tokenizer(&self) -> Tokenizer {
        self.tokenizer
    }

    /// Tokens of the whole conversation, every message included.
    pub fn total_tokens(&self) -> usize {
        self.tokens.iter().sum()
    }

    pub fn tokens_of(&self, index: usize) -> usize {
        self.tokens.get(index).copied().unwrap_or(0)
    }

    pub fn task_index(&self) -> usize {
        self.task_at
    }

    /// Replaces the text of the tool message at `index` (its call id stays, so the pairing
    /// holds); false when that message is not a tool message.
    pub fn mask(&mut self, index: usize, note: String) -> bool {
        let Some(Message::Tool { tool_call_id, .. }) = self.messages.get(index) else {
            return false;
        };
        let masked = Message::tool(tool_call_id.clone(), note);
        self.tokens[index] = count(self.tokenizer, &masked);
        self.messages[index] = masked;
        true
    }

    /// Where each turn starts: every assistant message, this run's task, and the first
    /// message after the system prompt; `len` closes the last one.
    pub fn turn_starts(&self) -> Vec<usize> {
        let len = self.messages.len();
        let task = self.task_at;
        let mut starts: Vec<usize> = (1..len)
            .filter(|&i| {
                i == 1 || i == task || matches!(self.messages[i], Message::Assistant { .. })
            })
            .collect();
        starts.push(len);
        starts
    }

    /// Replaces every message before `keep_from` (a turn start after the task) except the
    /// system prompt and the task with `summary`, placed right after the task; earlier
    /// runs' messages are folded in too. Returns how many messages were replaced.
    pub fn fold_middle(&mut self, keep_from: usize, summary: Message) -> usize {
        let task = self.task_at;
        if keep_from <= task + 1 || keep_from > self.messages.len() {
            return 0;
        }
        let folded = keep_from - 2;
        let task_message = self.messages[task].clone();
        let task_tokens = self.tokens[task];
        let summary_tokens = count(self.tokenizer, &summary);
        self.messages.splice(1..keep_from, [task_message, summary]);
        self.tokens
            .splice(1..keep_from, [task_tokens, summary_tokens]);
        self.task_at = 1;
        folded
    }

    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// What a later run continues: everything but the system prompt.
    pub fn conversation(&self) -> Vec<Message> {
        self.messages[1..].to_vec()
    }

    /// How many messages came from earlier runs.
    pub fn earlier_len(&self) -> usize {
        self.task_at - 1
    }

    /// The request context: the system prompt, this run's task and the newest whole turns
    /// that fit `budget` tokens (earlier runs' turns are older, so they go first), then
    /// `tail` (a nudge) if given. The newest turn is always kept, even over budget.
    pub fn context(
        &self,
        budget: usize,
        tail: Option<Message>,
        trimmed_note: &dyn Fn(usize) -> String,
    ) -> Context {
        let len = self.messages.len();
        let task = self.task_at;
        let tail_tokens = tail.as_ref().map_or(0, |t| count(self.tokenizer, t));
        let starts = self.turn_starts();
        let mut keep_from = len;
        let mut used = self.tokens[0] + self.tokens[task] + tail_tokens + 30;
        for w in starts.windows(2).rev() {
            let (start, end) = (w[0], w[1]);
            // The task's own turn is only the task, which is always kept (counted above).
            let turn: usize = if start == task {
                self.tokens[start + 1..end].iter().sum()
            } else {
                self.tokens[start..end].iter().sum()
            };
            if keep_from != len && used + turn > budget {
                break;
            }
            used += turn;
            keep_from = start;
        }
        let mut messages = Vec::with_capacity(len - keep_from + 3);
        messages.push(self.messages[0].clone());
        let dropped = if keep_from > task {
            // Even this run's older turns had to go: the task stays right after the system.
            messages.push(self.messages[task].clone());
            (task - 1) + (keep_from - task - 1)
        } else {
            keep_from - 1
        };
        if dropped > 0 {
            messages.push(Message::user(trimmed_note(dropped)));
        }
        messages.extend_from_slice(&self.messages[keep_from..]);
        messages.extend(tail);
        Context {
            messages,
            dropped,
            estimated_tokens: used,
        }
    }
}

/// The longest prefix of `messages` in which every assistant tool call is answered by a
/// tool message and every tool message answers one, without system messages: what a
/// restored conversation may safely continue (a transcript can be cut short or edited).
pub fn paired_prefix(messages: Vec<Message>) -> Vec<Message> {
    let mut kept = Vec::with_capacity(messages.len());
    let mut open: Vec<String> = Vec::new();
    let mut complete = 0;
    for message in messages {
        match &message {
            Message::System { .. } => continue,
            Message::Assistant { tool_calls, .. } => {
                if !open.is_empty() {
                    break;
                }
                open = tool_calls.iter().map(|c| c.id.clone()).collect();
            }
            Message::Tool { tool_call_id, .. } => {
                let Some(i) = open.iter().position(|id| id == tool_call_id) else {
                    break;
                };
                open.swap_remove(i);
            }
            Message::User { .. } => {
                if !open.is_empty() {
                    break;
                }
            }
        }
        kept.push(message);
        if open.is_empty() {
            complete = kept.len();
        }
    }
    kept.truncate(complete);
    kept
}

/// Cuts an observation to `max` characters, keeping the head and the tail around a marker
/// that says how much is gone (errors and results tend to sit at either end).
pub fn cut_observation(text: &str, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text.to_string();
    }
    let head_n = max * 2 / 3;
    let tail_n = max - head_n;
    let head: String = text.chars().take(head_n).collect();
    let tail: String = text.chars().skip(total - tail_n).collect();
    format!(
        "{head}\n[... {} characters cut here by sandboxd (observation limit {max}); filter the output or write it to a file ...]\n{tail}",
        total - head_n - tail_n
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{FunctionCall, ToolCall};

    fn turn(i: usize, calls: usize) -> Vec<Message> {
        let ids: Vec<String> = (0..calls).map(|c| format!("c{i}_{c}")).collect();
        let mut v = vec![Message::Assistant {
            content: Some(format!("step {i}")),
            tool_calls: ids
                .iter()
                .map(|id| ToolCall {
                    id: id.clone(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: "bash".into(),
                        arguments: "{\"command\":\"true\"}".into(),
                    },
                })
                .collect(),
        }];
        v.extend(
            ids.iter()
                .map(|id| Message::tool(id.clone(), "x".repeat(400))),
        );
        v
    }

    #[test]
    fn trimming_keeps_head_and_whole_turns() {
        let mut m = Memory::new("system".into(), "task".into(), Tokenizer::Cl100k);
        for i in 0..50 {
            for msg in turn(i, 1 + i % 3) {
                m.push(msg);
            }
        }
        let c = m.context(2000, None, &|n| format!("{n} trimmed"));
        assert!(c.dropped > 0);
        assert!(matches!(c.messages[0], Message::System { .. }));
        assert_eq!(c.messages[1], Message::user("task"));
        assert_eq!(
            c.messages[2],
            Message::user(format!("{} trimmed", c.dropped))
        );
        assert!(
            matches!(c.messages[3], Message::Assistant { .. }),
            "the kept part starts with a whole turn"
        );
        // A single giant turn is still sent.
        let c = m.context(10, None, &|n| format!("{n}"));
        assert!(matches!(c.messages[3], Message::Assistant { .. }));
    }

    #[test]
    fn a_continued_run_drops_earlier_turns_first_and_keeps_its_task() {
        let mut earlier = vec![Message::user("first task")];
        for i in 0..40 {
            earlier.extend(turn(i, 2));
        }
        let mut m = Memory::continuing(
            "system".into(),
            earlier,
            "second task".into(),
            Tokenizer::Cl100k,
        );
        assert_eq!(m.earlier_len(), 1 + 40 * 3);
        for i in 100..103 {
            for msg in turn(i, 1) {
                m.push(msg);
            }
        }
        // Room for everything: the whole conversation in order.
        let all = m.context(1_000_000, None, &|n| format!("{n} trimmed"));
        assert_eq!(all.dropped, 0);
        assert_eq!(all.messages.len(), m.messages().len());
        // A small budget: earlier turns go, this run's task and newest turns stay.
        let c = m.context(1500, None, &|n| format!("{n} trimmed"));
        assert!(c.dropped > 0);
        let task_pos = c
            .messages
            .iter()
            .position(|x| *x == Message::user("second task"))
            .expect("the current task is kept");
        assert!(matches!(
            c.messages[task_pos + 1],
            Message::Assistant { .. }
        ));
        assert!(!c.messages.contains(&Message::user("first task")));
        // A tiny budget: only the newest turn, with the task right after the system prompt.
        let c = m.context(10, None, &|n| format!("{n} trimmed"));
        assert_eq!(c.messages[1], Message::user("second task"));
        assert_eq!(
            c.messages[2],
            Message::user(format!("{} trimmed", c.dropped))
        );
        assert_eq!(c.messages.len(), 3 + 2);
        assert_eq!(c.dropped, m.messages().len() - 1 - 1 - 2);
    }

    #[test]
    fn a_restored_conversation_is_cut_before_an_unanswered_call() {
        let mut msgs = vec![Message::system("old system"), Message::user("task")];
        msgs.extend(turn(1, 2));
        let good = msgs.len() - 1;
        msgs.extend(turn(2, 2));
        msgs.pop(); // the second call of turn 2 lost its answer
        let kept = paired_prefix(msgs);
        assert_eq!(kept.len(), good, "system dropped, turn 2 cut");
        assert!(matches!(kept.last(), Some(Message::Tool { .. })));
        // A tool message answering nothing ends the prefix too.
        let stray = vec![Message::user("t"), Message::tool("nope", "x")];
        assert_eq!(paired_prefix(stray).len(), 1);
    }

    /// Masking keeps the call id; folding the middle keeps the task and whole turns, folds
    /// earlier runs' messages in too, and what is left is still a paired conversation.
    #[test]
    fn masking_and_folding_keep_the_pairing() {
        let mut earlier = vec![Message::user("first task")];
        earlier.extend(turn(0, 2));
        let mut m = Memory::continuing("system".into(), earlier, "task".into(), Tokenizer::Cl100k);
        for i in 1..6 {
            for msg in turn(i, 1 + i % 2) {
                m.push(msg);
            }
        }
        let tool_at = m
            .messages()
            .iter()
            .position(|x| matches!(x, Message::Tool { .. }))
            .unwrap();
        let before = m.total_tokens();
        assert!(m.mask(tool_at, "masked".into()));
        assert!(m.total_tokens() < before);
        assert!(!m.mask(0, "not a tool message".into()));
        let starts = m.turn_starts();
        let keep_from = starts[starts.len() - 3];
        let kept_tail = m.messages()[keep_from..].to_vec();
        let folded = m.fold_middle(keep_from, Message::user("summary"));
        assert_eq!(folded, keep_from - 2);
        assert_eq!(m.messages()[1], Message::user("task"));
        assert_eq!(m.messages()[2], Message::user("summary"));
        assert_eq!(&m.messages()[3..], &kept_tail[..]);
        assert_eq!(m.earlier_len(), 0);
        assert_eq!(
            paired_prefix(m.messages().to_vec()).len(),
            m.messages().len() - 1
        );
        let sum: usize = (0..m.messages().len()).map(|i| m.tokens_of(i)).sum();
        assert_eq!(sum, m.total_tokens());
    }

    #[test]
    fn cut_marks_the_gap() {
        let s = "a".repeat(50) + &"b".repeat(50);
        let cut = cut_observation(&s, 30);
        assert!(cut.starts_with(&"a".repeat(20)) && cut.ends_with(&"b".repeat(10)));
        assert!(cut.contains("70 characters cut"));
        assert_eq!(cut_observation("short", 30), "short");
    }
}
