//! The conversation of one run and the context actually sent to the model.
//!
//! Trimming works on whole turns: a turn is an assistant message plus every tool message
//! (and image message) that answers it, so a tool message can never lose its assistant
//! `tool_calls` (OpenAI answers 400 to such an orphan; OpenManus trimmed by message count
//! and hit exactly that). The system prompt and the task are always kept; older turns are
//! dropped first and replaced by one note saying how many messages are gone.
//!
//! Token counts are estimated as characters / 4 plus 4 per message (images: a flat 1000).
//! That is close enough for English and code to keep a request under a budget, and costs
//! nothing; the exact counts come back in `usage` and are what the run budget is charged.

use crate::llm::{ContentPart, Message, UserContent};

const PER_MESSAGE: usize = 4;
const PER_IMAGE: usize = 1000;

/// Estimated tokens of a message.
pub fn estimate(m: &Message) -> usize {
    let chars = match m {
        Message::System { content } => content.len(),
        Message::User {
            content: UserContent::Text(t),
        } => t.len(),
        Message::User {
            content: UserContent::Parts(parts),
        } => {
            return PER_MESSAGE
                + parts
                    .iter()
                    .map(|p| match p {
                        ContentPart::Text { text } => text.len() / 4,
                        ContentPart::ImageUrl { .. } => PER_IMAGE,
                    })
                    .sum::<usize>();
        }
        Message::Assistant {
            content,
            tool_calls,
        } => {
            content.as_ref().map_or(0, String::len)
                + tool_calls
                    .iter()
                    .map(|c| c.id.len() + c.function.name.len() + c.function.arguments.len() + 16)
                    .sum::<usize>()
        }
        Message::Tool {
            tool_call_id,
            content,
        } => tool_call_id.len() + content.len(),
    };
    PER_MESSAGE + chars / 4
}

pub fn estimate_text(text: &str) -> usize {
    text.len() / 4
}

/// The messages of one run, with their estimates. `messages[0]` is the system prompt and
/// `messages[1]` the task.
#[derive(Debug, Default, Clone)]
pub struct Memory {
    messages: Vec<Message>,
    tokens: Vec<usize>,
}

/// What `Memory::context` produced.
pub struct Context {
    pub messages: Vec<Message>,
    pub dropped: usize,
    pub estimated_tokens: usize,
}

impl Memory {
    pub fn new(system: String, task: String) -> Self {
        let mut m = Self::default();
        m.push(Message::system(system));
        m.push(Message::user(task));
        m
    }

    pub fn push(&mut self, message: Message) {
        self.tokens.push(estimate(&message));
        self.messages.push(message);
    }

    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The request context: head + the newest whole turns that fit `budget` tokens, then
    /// `tail` (a nudge) if given. The newest turn is always kept, even over budget.
    pub fn context(
        &self,
        budget: usize,
        tail: Option<Message>,
        trimmed_note: &dyn Fn(usize) -> String,
    ) -> Context {
        let head = self.messages.len().min(2);
        let head_tokens: usize = self.tokens[..head].iter().sum();
        let tail_tokens = tail.as_ref().map_or(0, estimate);
        // Turn boundaries: every assistant message starts a turn; anything before the first
        // assistant message after the head is a turn of its own.
        let mut starts: Vec<usize> = (head..self.messages.len())
            .filter(|&i| i == head || matches!(self.messages[i], Message::Assistant { .. }))
            .collect();
        starts.push(self.messages.len());
        let mut keep_from = self.messages.len();
        let mut used = head_tokens + tail_tokens + 30;
        for w in starts.windows(2).rev() {
            let (start, end) = (w[0], w[1]);
            let turn: usize = self.tokens[start..end].iter().sum();
            if keep_from != self.messages.len() && used + turn > budget {
                break;
            }
            used += turn;
            keep_from = start;
        }
        let dropped = keep_from - head;
        let mut messages = Vec::with_capacity(self.messages.len() - dropped + 2);
        messages.extend_from_slice(&self.messages[..head]);
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
        let mut m = Memory::new("system".into(), "task".into());
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
    fn cut_marks_the_gap() {
        let s = "a".repeat(50) + &"b".repeat(50);
        let cut = cut_observation(&s, 30);
        assert!(cut.starts_with(&"a".repeat(20)) && cut.ends_with(&"b".repeat(10)));
        assert!(cut.contains("70 characters cut"));
        assert_eq!(cut_observation("short", 30), "short");
    }
}
