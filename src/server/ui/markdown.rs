//! The model's Markdown to HTML that cannot run script: pulldown-cmark parses it, every raw
//! HTML block or inline tag becomes escaped text (so `<script>`, `<img onerror>` and SVG are
//! shown, not parsed), a link whose scheme is not http, https or mailto points nowhere, and
//! images become links (the page loads no image the model named). Escaping of text and
//! attributes is pulldown-cmark's own writer.

use pulldown_cmark::{CowStr, Event, LinkType, Options, Parser, Tag, TagEnd};

/// Whether a link target may be followed: http(s), mailto, or a relative reference.
fn safe_url(url: &str) -> bool {
    // Browsers ignore whitespace and controls inside a scheme ("java\tscript:").
    let squeezed: String = url
        .chars()
        .filter(|c| !c.is_whitespace() && !c.is_control())
        .collect::<String>()
        .to_ascii_lowercase();
    match squeezed.find(':') {
        None => true,
        Some(colon) => {
            let before = &squeezed[..colon];
            // A colon after a '/', '?' or '#' belongs to a path, not a scheme.
            if before.contains(['/', '?', '#']) {
                return true;
            }
            matches!(before, "http" | "https" | "mailto")
        }
    }
}

fn link<'a>(dest_url: CowStr<'a>, title: CowStr<'a>, id: CowStr<'a>) -> Tag<'a> {
    let dest_url = if safe_url(&dest_url) {
        dest_url
    } else {
        CowStr::Borrowed("#unsafe-link-removed")
    };
    Tag::Link {
        link_type: LinkType::Inline,
        dest_url,
        title,
        id,
    }
}

/// Markdown as safe HTML.
pub fn to_html(md: &str) -> String {
    let opts = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    let events = Parser::new_ext(md, opts).map(|ev| match ev {
        Event::Html(h) | Event::InlineHtml(h) => Event::Text(h),
        Event::Start(Tag::Link {
            dest_url,
            title,
            id,
            ..
        }) => Event::Start(link(dest_url, title, id)),
        Event::Start(Tag::Image {
            dest_url,
            title,
            id,
            ..
        }) => Event::Start(link(dest_url, title, id)),
        Event::End(TagEnd::Image) => Event::End(TagEnd::Link),
        other => other,
    });
    let mut out = String::with_capacity(md.len() + md.len() / 4);
    pulldown_cmark::html::push_html(&mut out, events);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_renders() {
        let h = to_html("# Title\n\n**bold** and `code`\n\n- a\n- b\n");
        assert!(h.contains("<h1>Title</h1>"), "{h}");
        assert!(h.contains("<strong>bold</strong>") && h.contains("<code>code</code>"));
        assert!(h.contains("<li>a</li>"));
        let h = to_html("[ok](https://example.com/a?b=1)");
        assert!(h.contains(r#"href="https://example.com/a?b=1""#), "{h}");
    }

    #[test]
    fn hostile_markdown_stays_text() {
        for hostile in [
            "<img src=x onerror=alert(1)>",
            "<script>window.pwned=1</script>",
            "<svg><script>alert(1)</script></svg>",
            "text <iframe src=javascript:alert(1)></iframe>",
            "<details open ontoggle=alert(1)>",
            "<a href=\"javascript:alert(1)\">x</a>",
        ] {
            let h = to_html(hostile);
            assert!(
                !h.contains('<')
                    || !h.contains("<img")
                        && !h.contains("<script")
                        && !h.contains("<svg")
                        && !h.contains("<iframe")
                        && !h.contains("<details")
                        && !h.contains("<a "),
                "{hostile} -> {h}"
            );
            assert!(h.contains("&lt;"), "{hostile} -> {h}");
        }
        let h = to_html("[a](javascript:alert(1)) ![b](javascript:alert(2))");
        assert_eq!(h.matches("#unsafe-link-removed").count(), 2, "{h}");
        for url in [
            "javascript:alert(1)",
            "JaVaScRiPt:alert(1)",
            "java\tscript:alert(1)",
            "data:text/html,<script>alert(1)</script>",
            "vbscript:x",
        ] {
            let h = to_html(&format!(
                "[click](<{url}>) ![img](<{url}>) [ref]\n\n[ref]: {url}"
            ));
            let lower = h.to_ascii_lowercase();
            for bad in ["href=\"java", "href=\"data", "href=\"vbscript", "src="] {
                assert!(!lower.contains(bad), "{url} -> {h}");
            }
            assert!(!h.contains("<img"), "{url} -> {h}");
        }
        assert!(
            to_html("![p](https://x.example/p.png)")
                .contains(r#"<a href="https://x.example/p.png""#)
        );
        assert!(safe_url("/runs/a:b") && safe_url("#top") && safe_url("a/b:c"));
    }
}
