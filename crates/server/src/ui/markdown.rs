//! The model's Markdown to HTML that cannot run script: pulldown-cmark parses it, every raw
//! HTML block or inline tag becomes escaped text (so `<script>`, `<img onerror>` and SVG are
//! shown, not parsed), a link whose scheme is not http, https or mailto points nowhere, and
//! images become links (the page loads no image the model named). Escaping of text and
//! attributes is pulldown-cmark's own writer. A table column's alignment becomes a class
//! (`al-left`, `al-center`, `al-right`, styled in app.css): the writer's inline
//! `style="text-align: …"` is blocked by the page's CSP (no 'unsafe-inline').

use pulldown_cmark::{Alignment, CowStr, Event, LinkType, Options, Parser, Tag, TagEnd};

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

/// The table being written: its columns' alignments and where the next cell goes.
#[derive(Default)]
struct Table {
    columns: Vec<Alignment>,
    in_head: bool,
    cell: usize,
}

impl Table {
    /// Takes over the table events that carry alignment; the writer gets the table without
    /// alignments (so it writes no `style`) and our opening tag of each cell.
    fn map<'a>(&mut self, ev: Event<'a>) -> Event<'a> {
        match ev {
            Event::Start(Tag::Table(columns)) => {
                *self = Table {
                    columns,
                    ..Table::default()
                };
                Event::Start(Tag::Table(Vec::new()))
            }
            Event::Start(Tag::TableHead) => {
                self.in_head = true;
                self.cell = 0;
                ev
            }
            Event::End(TagEnd::TableHead) => {
                self.in_head = false;
                ev
            }
            Event::Start(Tag::TableRow) => {
                self.cell = 0;
                ev
            }
            Event::Start(Tag::TableCell) => {
                let tag = if self.in_head { "th" } else { "td" };
                let class = match self.columns.get(self.cell) {
                    Some(Alignment::Left) => " class=\"al-left\"",
                    Some(Alignment::Center) => " class=\"al-center\"",
                    Some(Alignment::Right) => " class=\"al-right\"",
                    Some(Alignment::None) | None => "",
                };
                self.cell += 1;
                Event::InlineHtml(CowStr::from(format!("<{tag}{class}>")))
            }
            other => other,
        }
    }
}

/// Markdown as safe HTML.
pub fn to_html(md: &str) -> String {
    let opts = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    let mut table = Table::default();
    let events = Parser::new_ext(md, opts).map(|ev| match ev {
        // The model's HTML is text; our own cell tags are made after this, in `table.map`.
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
        other => table.map(other),
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

    #[test]
    fn aligned_table_columns_get_classes_not_inline_styles() {
        let h = to_html(
            "| plain | left | centre | right |\n|---|:---|:---:|---:|\n| a | b | c | 1.5 |\n| <b>x</b> | | | 22 |\n",
        );
        assert!(!h.contains("style"), "the CSP blocks inline styles: {h}");
        assert!(h.contains("<th>plain</th>"), "{h}");
        assert!(h.contains(r#"<th class="al-left">left</th>"#), "{h}");
        assert!(h.contains(r#"<th class="al-center">centre</th>"#), "{h}");
        assert!(h.contains(r#"<th class="al-right">right</th>"#), "{h}");
        assert!(h.contains(r#"<td class="al-right">1.5</td>"#), "{h}");
        assert!(h.contains(r#"<td class="al-right">22</td>"#), "{h}");
        assert!(
            h.contains("<td>&lt;b&gt;x&lt;/b&gt;</td>"),
            "raw HTML stays text: {h}"
        );
        // A second table starts from its own columns.
        let h = to_html("| a | b |\n|--:|---|\n| 1 | 2 |\n\n| c |\n|:-:|\n| 3 |\n");
        assert!(
            h.contains(r#"<td class="al-right">1</td><td>2</td>"#),
            "{h}"
        );
        assert!(h.contains(r#"<td class="al-center">3</td>"#), "{h}");
    }
}
