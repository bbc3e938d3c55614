//! A cell's output as the model reads it: stdout, then stderr, the final expression's repr,
//! notes on cut output and saved figures; the traceback as the error; the figures as images,
//! in order.

use base64::Engine as _;

use super::driver::{CellOutput, SHOWN_LIMIT};
use crate::tools::ToolResult;

/// Formats a cell's output for the model; `timed_out` explains an interrupted cell.
pub(super) fn observe(out: CellOutput, timed_out: Option<String>) -> ToolResult {
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    fn push_block(text: &mut String, block: &str) {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(block);
    }
    if !out.stderr.is_empty() {
        push_block(
            &mut text,
            &format!("[stderr]\n{}", String::from_utf8_lossy(&out.stderr)),
        );
    }
    if let Some(value) = &out.value {
        push_block(&mut text, value);
    }
    if out.stdout_cut || out.stderr_cut {
        push_block(
            &mut text,
            "[output was cut in the middle; print less, or write it to a file and read parts of it]",
        );
    }
    if !out.figures.is_empty() {
        let shown = match (out.images.len(), out.figures.len()) {
            (0, _) => "too large to show".to_string(),
            (s, f) if s == f => "shown as images, in order".to_string(),
            (s, f) => format!(
                "{s} of {f} shown as images, in order: at most {SHOWN_LIMIT} and {} MiB together",
                crate::tools::MAX_IMAGE_BYTES >> 20
            ),
        };
        push_block(
            &mut text,
            &format!("[figures saved: {} ({shown})]", out.figures.join(", ")),
        );
    }
    let text = text.trim_end().to_string();
    let error = match (timed_out, out.error) {
        (Some(t), Some(tb)) => Some(format!("{t}\n{}", tb.trim_end())),
        (Some(t), None) => Some(t),
        (None, Some(tb)) => Some(tb.trim_end().to_string()),
        (None, None) => None,
    };
    let mut result = match error {
        Some(e) => ToolResult {
            output: text,
            error: Some(e),
            ..ToolResult::default()
        },
        None => ToolResult::ok(text),
    };
    for png in out.images {
        result = result.with_image(base64::engine::general_purpose::STANDARD.encode(png));
    }
    result
}
