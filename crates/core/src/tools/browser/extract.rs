//! extract_content: the page as Markdown, and the pluggable LLM step that pulls out what the
//! model's `goal` asks for.
//!
//! The agent implements `Extractor` with its LLM client (a forced function call, as OpenManus
//! does); without one the tool returns the Markdown itself, cut, with a note.

use async_trait::async_trait;
use serde_json::Value;

/// HTML past this size is cut before conversion: a hostile page must not stall the host.
pub const MAX_HTML: usize = 3 << 20;
/// What an extractor gets at most.
pub const MAX_MARKDOWN: usize = 60_000;
/// What the model gets when no extractor is configured.
pub const MAX_RAW_MARKDOWN: usize = 8_000;

/// Pulls out of a page (as Markdown) what `goal` asks for. The agent's implementation asks
/// its LLM with a forced function call and returns that call's arguments.
#[async_trait]
pub trait Extractor: Send + Sync {
    async fn extract(&self, goal: &str, markdown: &str) -> Result<Value, String>;
}

/// The page as Markdown without scripts, styles, noscript blocks or inline SVG.
pub fn html_to_markdown(html: &str) -> String {
    let html = cut(html, MAX_HTML);
    let converter = htmd::HtmlToMarkdown::builder()
        .skip_tags(vec![
            "script", "style", "noscript", "svg", "template", "head",
        ])
        .build();
    match converter.convert(html) {
        Ok(md) => collapse_blank_lines(&md),
        Err(_) => String::new(),
    }
}

/// The first `max` bytes of `text`, on a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn collapse_blank_lines(md: &str) -> String {
    let mut out = String::with_capacity(md.len());
    let mut blank = 0;
    for line in md.lines() {
        if line.trim().is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_scripts_and_styles() {
        let html = "<html><head><title>x</title><style>p{}</style></head><body><h1>Prices</h1>\
                    <script>var secret=1</script><noscript>enable js</noscript>\
                    <svg><text>svgtext</text></svg><p>Apples cost <b>3</b>.</p></body></html>";
        let md = html_to_markdown(html);
        assert!(md.contains("# Prices"), "{md}");
        assert!(md.contains("Apples cost **3**."), "{md}");
        for gone in ["secret", "enable js", "svgtext", "p{}"] {
            assert!(!md.contains(gone), "{gone} in {md}");
        }
    }

    #[test]
    fn cut_keeps_char_boundaries() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("abc", 10), "abc");
    }
}
