//! The terminal sink of `sandboxd run`: a spinner while the model thinks, the model's text
//! as it is written (streamed), each tool call with a short result, the final answer and a
//! one-line summary. With `--json` every event is printed as one JSON line on stdout
//! instead (the live pieces of text are not events and are not printed there).
//!
//! Everything shown comes from the model or the sandbox and is hostile: `clean` drops every
//! escape sequence (an OSC title or clipboard write, cursor moves, colours) and control
//! character before it reaches the terminal; the only line breaks are the renderer's own.
//! Writes ignore errors: a closed terminal (SIGHUP, a broken pipe) must not stop the run.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandboxd_core::agent::{Event, EventKind, EventSink, Image, TextDelta};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

const FRAMES: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
/// Events waiting for the terminal; a full queue makes the run wait (a paused terminal).
const QUEUE: usize = 64;

/// Writes to stderr, ignoring failures.
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut err = std::io::stderr().lock();
        let _ = write!(err, $($arg)*);
        let _ = err.flush();
    }};
}

/// Prints a line on stderr, ignoring failures.
macro_rules! sayln {
    ($($arg:tt)*) => {{
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, $($arg)*);
    }};
}
pub(crate) use sayln;

/// What the rendering task is handed: an event, or a piece of the answer being written.
enum Item {
    Event(Event),
    Delta(TextDelta),
}

/// Hands events to a rendering task through a bounded queue.
pub(crate) struct TerminalSink {
    tx: Mutex<Option<mpsc::Sender<Item>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl TerminalSink {
    pub(crate) fn start(json: bool) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(QUEUE);
        Arc::new(Self {
            tx: Mutex::new(Some(tx)),
            task: Mutex::new(Some(tokio::spawn(render(rx, json)))),
        })
    }

    /// Waits until every event so far is shown; later events are dropped.
    pub(crate) async fn finish(&self) {
        self.tx.lock().ok().and_then(|mut t| t.take());
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

#[async_trait]
impl EventSink for TerminalSink {
    async fn event(&self, event: &Event, _image: Option<&Image>) {
        let tx = self.tx.lock().ok().and_then(|t| t.clone());
        if let Some(tx) = tx {
            // A renderer that is gone does not stop the run.
            let _ = tx.send(Item::Event(event.clone())).await;
        }
    }

    async fn delta(&self, delta: &TextDelta) {
        let tx = self.tx.lock().ok().and_then(|t| t.clone());
        if let Some(tx) = tx {
            let _ = tx.send(Item::Delta(delta.clone())).await;
        }
    }
}

/// Consumes events until the sender is dropped.
async fn render(mut rx: mpsc::Receiver<Item>, json: bool) {
    if json {
        while let Some(item) = rx.recv().await {
            let Item::Event(ev) = item else { continue };
            // Notices are for the person at the terminal, in --json mode too.
            if let EventKind::Notice { message } = &ev.kind {
                sayln!("sandboxd: {}", clean(message));
            }
            // serde_json escapes every control character, so the line is safe as it is.
            if let Ok(line) = serde_json::to_string(&ev) {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
        }
        return;
    }
    let animate = std::io::stderr().is_terminal();
    let mut spinner: Option<(usize, String)> = None;
    // In a planning flow each step's answer is a line of progress, not the result.
    let mut in_flow = false;
    let mut live = Live::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            item = rx.recv() => {
                let Some(item) = item else { break };
                if spinner.take().is_some() && animate {
                    say!("\r\x1b[2K");
                }
                let ev = match item {
                    Item::Delta(d) => {
                        live.piece(&d);
                        continue;
                    }
                    Item::Event(ev) => ev,
                };
                if live.shown(&ev) {
                    continue;
                }
                if let EventKind::Thinking { step } = &ev.kind {
                    spinner = Some((0, format!("step {step}: thinking")));
                    if !animate {
                        sayln!("· step {step}: thinking…");
                    }
                    continue;
                }
                in_flow |= matches!(ev.kind, EventKind::PlanCreated { .. });
                show(&ev, in_flow);
            }
            _ = tick.tick(), if spinner.is_some() && animate => {
                if let Some((frame, label)) = spinner.as_mut() {
                    *frame = (*frame + 1) % FRAMES.len();
                    say!("\r\x1b[2K{} {label}", FRAMES[*frame]);
                }
            }
        }
    }
    if spinner.is_some() && animate {
        say!("\r\x1b[2K");
    }
}

/// The text printed as it came: which run's step it was, what was printed, and whether its
/// line is open.
#[derive(Default)]
struct Live {
    streamed: Option<(String, usize)>,
    text: String,
    open_line: bool,
    /// The tail of the pieces so far that may be the start of an escape sequence not yet
    /// ended: held back until the next piece completes it, so a sequence cut between two
    /// pieces is still dropped whole, its payload included (never printed if it never ends).
    pending: String,
}

/// Most bytes held back as an unfinished sequence; past this it is dropped.
const MAX_PENDING: usize = 4096;

/// Where the unfinished escape sequence at the end of `text` starts (`text.len()` if none):
/// an ESC (or a C1 CSI/OSC/DCS) with no final byte or string terminator after it.
fn unfinished_from(text: &str) -> usize {
    let Some((at, c)) = text
        .char_indices()
        .rev()
        .find(|(_, c)| matches!(c, '\u{1b}' | '\u{9b}' | '\u{9d}' | '\u{90}'))
    else {
        return text.len();
    };
    let rest = &text[at + c.len_utf8()..];
    let ended_string =
        |r: &str| r.contains('\u{7}') || r.contains('\u{1b}') || r.contains('\u{9c}');
    let ended_csi = |r: &str| r.chars().any(|c| ('@'..='~').contains(&c));
    let done = match (c, rest.chars().next()) {
        ('\u{1b}', None) => false,
        ('\u{1b}', Some('[')) => ended_csi(&rest[1..]),
        ('\u{1b}', Some(']' | 'P' | '_' | '^' | 'X')) => ended_string(&rest[1..]),
        ('\u{1b}', Some(_)) => true,
        ('\u{9b}', _) => ended_csi(rest),
        _ => ended_string(rest),
    };
    if done { text.len() } else { at }
}

impl Live {
    fn piece(&mut self, d: &TextDelta) {
        let same = self
            .streamed
            .as_ref()
            .is_some_and(|(run, step)| *run == d.run_id && *step == d.step);
        if !same {
            self.text.clear();
            self.pending.clear();
        }
        if !self.open_line || !same {
            if self.open_line {
                sayln!();
            }
            say!("💭 ");
        }
        say!("{}", self.printable(&d.text));
        self.text.push_str(&d.text);
        self.streamed = Some((d.run_id.clone(), d.step));
        self.open_line = true;
    }

    /// What of `piece` can be printed now: whole sequences stripped, an unfinished one held.
    fn printable(&mut self, piece: &str) -> String {
        let mut text = std::mem::take(&mut self.pending);
        text.push_str(piece);
        let from = unfinished_from(&text);
        if text.len() - from <= MAX_PENDING {
            self.pending = text[from..].to_string();
        }
        live_text(&text[..from])
    }

    /// Ends the open line before any event; true for the step's text when exactly that was
    /// printed already (a retried or unstreamed answer is printed whole).
    fn shown(&mut self, ev: &Event) -> bool {
        if std::mem::take(&mut self.open_line) {
            sayln!();
        }
        if matches!(ev.kind, EventKind::Retry { .. }) {
            // The answer starts again.
            self.streamed = None;
        }
        // Text held back as an unfinished sequence was not all shown: the event prints it whole.
        let held = !std::mem::take(&mut self.pending).is_empty();
        match (&ev.kind, &self.streamed) {
            (EventKind::AssistantText { step, text }, Some((run, streamed))) if !held => {
                *run == ev.run_id && step == streamed && text.trim() == self.text.trim()
            }
            _ => false,
        }
    }
}

fn show(ev: &Event, in_flow: bool) {
    match &ev.kind {
        EventKind::RunStarted {
            session_id,
            model,
            max_steps,
            continued_messages,
            ..
        } => started(
            &ev.run_id,
            session_id,
            model,
            *max_steps,
            *continued_messages,
        ),
        EventKind::Notice { message } => sayln!("sandboxd: {}", clean(message)),
        EventKind::Egress { record } => sayln!("🌐 {}", clean(&record.to_string())),
        EventKind::AssistantText { text, .. } => sayln!("💭 {}", short(text, 400)),
        EventKind::ToolCall {
            name, arguments, ..
        } => sayln!("🔧 {} {}", short(name, 80), short(arguments, 200)),
        EventKind::ToolResult {
            output,
            is_error,
            has_image,
            duration_ms,
            ..
        } => tool_result(output, *is_error, *has_image, *duration_ms),
        EventKind::ToolImage { index, .. } => sayln!("   [image {}]", index + 1),
        EventKind::Nudge { active: true, .. } => {
            sayln!("↻ the model repeated itself; asked it to change strategy")
        }
        EventKind::Nudge { .. } => {}
        EventKind::ContextTrimmed { .. }
        | EventKind::TokenUsage { .. }
        | EventKind::Thinking { .. } => {}
        // The service's own events; the CLI asks on the terminal and shows no run states.
        EventKind::RunState { .. }
        | EventKind::QuestionAsked { .. }
        | EventKind::QuestionAnswered { .. } => {}
        EventKind::Retry { .. } | EventKind::ContextCondensed { .. } => model_note(&ev.kind),
        EventKind::Error { message } => sayln!("error: {}", short(message, 2000)),
        EventKind::PlanCreated { .. }
        | EventKind::StepStarted { .. }
        | EventKind::StepFinished { .. }
        | EventKind::Replanned { .. }
        | EventKind::FlowFinished { .. } => super::plan::show(ev),
        EventKind::RunFinished {
            reason,
            answer,
            steps,
            prompt_tokens,
            completion_tokens,
            duration_ms,
        } => {
            if let Some(a) = answer {
                print_answer(a, in_flow);
            }
            sayln!(
                "── {} · {steps} steps · {prompt_tokens} prompt + {completion_tokens} completion tokens · {:.1}s",
                clean(&reason.describe()),
                *duration_ms as f64 / 1000.0
            );
        }
    }
}

/// What happened around a request to the model: a retry, a condensed context.
fn model_note(kind: &EventKind) {
    match kind {
        EventKind::Retry {
            attempt,
            max_attempts,
            delay_ms,
            reason,
        } => sayln!(
            "⟳ LLM retry {attempt}/{max_attempts} in {:.1}s: {}",
            *delay_ms as f64 / 1000.0,
            short(reason, 200)
        ),
        EventKind::ContextCondensed {
            before_tokens,
            after_tokens,
            masked_outputs,
            summarized_messages,
            ..
        } => sayln!(
            "⇣ context condensed to fit the model: {before_tokens} → {after_tokens} tokens ({masked_outputs} old outputs masked, {summarized_messages} messages summarized)"
        ),
        _ => {}
    }
}

/// The run's first line: its ids, the model, the step limit and what it continues.
fn started(run_id: &str, session_id: &str, model: &str, max_steps: usize, continued: usize) {
    let continued = if continued > 0 {
        format!(" · continuing {continued} earlier messages")
    } else {
        String::new()
    };
    sayln!(
        "sandboxd: run {} · session {} · model {} · up to {max_steps} steps{continued}",
        clean(run_id),
        clean(session_id),
        clean(model)
    );
}

/// A tool's result: ok or failed, its first three lines, an image mark, its duration.
fn tool_result(output: &str, is_error: bool, has_image: bool, duration_ms: u64) {
    let mark = if is_error { "✗" } else { "✓" };
    let image = if has_image { " [image]" } else { "" };
    let first = output.lines().take(3).collect::<Vec<_>>().join(" ⏎ ");
    sayln!("   {mark} {}{image} ({duration_ms} ms)", short(&first, 200));
}

/// The run's answer, each line cleaned, on stdout; in a planning flow each step's answer
/// is a line of progress, not the result.
fn print_answer(answer: &str, in_flow: bool) {
    if in_flow {
        sayln!("   {}", short(answer, 300));
        return;
    }
    let mut out = std::io::stdout().lock();
    for line in answer.lines() {
        let _ = writeln!(out, "{}", clean(line));
    }
    let _ = out.flush();
}

/// A piece of streamed text, safe to print: each line cleaned, the line breaks kept and
/// indented under the 💭.
fn live_text(text: &str) -> String {
    text.split('\n')
        .map(clean)
        .collect::<Vec<_>>()
        .join("\n   ")
}

/// One line, at most `max` characters, safe to print.
pub(crate) fn short(text: &str, max: usize) -> String {
    let line = clean(text);
    if line.chars().count() <= max {
        return line;
    }
    let cut: String = line.chars().take(max).collect();
    format!("{cut}…")
}

/// `text` without escape sequences or control characters, on one line: sequences are
/// parsed (anstream) and dropped whole, so an OSC's payload goes too; what is left that is
/// still a control character (C0, DEL, C1, a lone ESC) or a bidi override becomes a space
/// or goes. Colours are not kept: they would have to be re-emitted by us, and plain text
/// reads fine.
pub(crate) fn clean(text: &str) -> String {
    let stripped: String = anstream::adapter::strip_str(text).collect();
    stripped
        .chars()
        .filter_map(|c| match c {
            '\n' | '\r' | '\t' => Some(' '),
            c if c.is_control() => None,
            // Bidi embeddings, overrides and isolates can reorder what the user reads.
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => None,
            c => Some(c),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn escape_sequences_and_controls_never_reach_the_terminal() {
        let hostile = "a\x1b]0;pwned title\x07b\x1b]52;c;ZXZpbA==\x1b\\c\x1b[31mred\x1b[0m\
                       \x1b[2J\x1bPdcs\x1b\\\u{9b}31m\u{9d}osc\x07\x08\x00\x7f\r\n\u{202e}x";
        let out = clean(hostile);
        assert!(
            !out.chars().any(|c| c.is_control()),
            "control characters left: {out:?}"
        );
        for gone in ["pwned", "ZXZpbA", "[31m", "[2J"] {
            assert!(!out.contains(gone), "{gone:?} left in {out:?}");
        }
        assert!(out.starts_with("abcred"), "{out:?}");
        assert!(!out.contains('\u{202e}'));
        assert_eq!(clean("plain text, ünïcode ✓"), "plain text, ünïcode ✓");
    }

    /// Streamed text arrives in pieces cut anywhere, also inside a sequence: the one parser
    /// across a step's pieces still drops each sequence whole.
    #[test]
    fn a_sequence_cut_between_streamed_pieces_is_dropped_whole() {
        let text = "Thinking \u{1b}]0;MODEL-TITLE\u{7} aloud \u{9b}2J end \u{1b}[31mred";
        for cut in 1..text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let mut live = super::Live::default();
            let mut out = String::new();
            for piece in [&text[..cut], &text[cut..]] {
                out.push_str(&live.printable(piece));
            }
            // (A C1 CSI's parameters stay as plain text: the C1 character itself goes, so
            // nothing is left that a terminal would act on.)
            for gone in ["MODEL-TITLE", "[31m"] {
                assert!(
                    !out.contains(gone),
                    "cut at {cut}: {gone:?} left in {out:?}"
                );
            }
            assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
            assert!(out.ends_with("end red"), "cut at {cut}: {out:?}");
        }
    }
}
