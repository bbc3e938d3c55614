//! Live rendering of agent events on the terminal: a spinner while the model thinks, each
//! tool call with a short result, the final answer and a one-line summary. With `--json`
//! every event is printed as one JSON line on stdout instead.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use sandboxd::agent::{Event, EventKind};
use tokio::sync::mpsc;

const FRAMES: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

/// Consumes events until the sender is dropped.
pub async fn render(mut rx: mpsc::UnboundedReceiver<Event>, json: bool) {
    if json {
        while let Some(ev) = rx.recv().await {
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
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else { break };
                if spinner.take().is_some() && animate {
                    eprint!("\r\x1b[2K");
                }
                if let EventKind::Thinking { step } = &ev.kind {
                    spinner = Some((0, format!("step {step}: thinking")));
                    if !animate {
                        eprintln!("· step {step}: thinking…");
                    }
                    continue;
                }
                show(&ev);
            }
            _ = tick.tick(), if spinner.is_some() && animate => {
                if let Some((frame, label)) = spinner.as_mut() {
                    *frame = (*frame + 1) % FRAMES.len();
                    eprint!("\r\x1b[2K{} {label}", FRAMES[*frame]);
                    let _ = std::io::stderr().flush();
                }
            }
        }
    }
    if spinner.is_some() && animate {
        eprint!("\r\x1b[2K");
    }
}

fn show(ev: &Event) {
    match &ev.kind {
        EventKind::RunStarted {
            session_id,
            model,
            max_steps,
            ..
        } => {
            eprintln!(
                "sandboxd: run {} · session {session_id} · model {model} · up to {max_steps} steps",
                ev.run_id
            );
        }
        EventKind::AssistantText { text, .. } => eprintln!("💭 {}", short(text, 400)),
        EventKind::ToolCall {
            name, arguments, ..
        } => eprintln!("🔧 {name} {}", short(arguments, 200)),
        EventKind::ToolResult {
            output,
            is_error,
            has_image,
            duration_ms,
            ..
        } => {
            let mark = if *is_error { "✗" } else { "✓" };
            let image = if *has_image { " [image]" } else { "" };
            let first = output.lines().take(3).collect::<Vec<_>>().join(" ⏎ ");
            eprintln!("   {mark} {}{image} ({duration_ms} ms)", short(&first, 200));
        }
        EventKind::Nudge { active: true, .. } => {
            eprintln!("↻ the model repeated itself; asked it to change strategy")
        }
        EventKind::Nudge { .. } => {}
        EventKind::ContextTrimmed { .. }
        | EventKind::TokenUsage { .. }
        | EventKind::Thinking { .. } => {}
        EventKind::Retry {
            attempt,
            max_attempts,
            delay_ms,
            reason,
        } => {
            eprintln!(
                "⟳ LLM retry {attempt}/{max_attempts} in {:.1}s: {}",
                *delay_ms as f64 / 1000.0,
                short(reason, 200)
            );
        }
        EventKind::Error { message } => eprintln!("error: {message}"),
        EventKind::RunFinished {
            reason,
            answer,
            steps,
            prompt_tokens,
            completion_tokens,
            duration_ms,
        } => {
            if let Some(a) = answer {
                println!("{a}");
            }
            eprintln!(
                "── {} · {steps} steps · {prompt_tokens} prompt + {completion_tokens} completion tokens · {:.1}s",
                reason.describe(),
                *duration_ms as f64 / 1000.0
            );
        }
    }
}

/// One line, at most `max` characters.
fn short(text: &str, max: usize) -> String {
    let line: String = text
        .chars()
        .map(|c| if c == '\n' { ' ' } else { c })
        .collect();
    if line.chars().count() <= max {
        return line;
    }
    let cut: String = line.chars().take(max).collect();
    format!("{cut}…")
}
