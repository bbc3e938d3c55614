//! A fetched page as readable Markdown with absolute links, and the file around it.
//!
//! Readability first (dom_smoothie: a close port of Mozilla's readability.js whose tests run
//! Mozilla's own test pages, and whose Markdown mode already makes links absolute against
//! the document URL); when it finds no article or too little text, the whole `<body>` goes
//! through htmd with page furniture skipped, after dom_query has made every link absolute.

use url::Url;

/// Elements worth no words: scripts, styles, navigation, forms and embedded media.
const SKIP: &[&str] = &[
    "head", "script", "style", "noscript", "nav", "footer", "header", "svg", "form", "iframe",
    "template", "button", "select", "canvas", "object", "embed",
];

/// Elements readability may parse; past this a hostile page goes straight to the fallback.
const MAX_ELEMENTS: usize = 200_000;

/// Less readable text than this and the whole-body conversion is used instead.
const MIN_ARTICLE_CHARS: usize = 200;

/// Deeper element nesting than this (estimated from the tags) is not walked by the
/// recursive converters at all: the page becomes plain text instead.
const MAX_NESTING: usize = 2000;

/// The conversion thread's stack: room for MAX_NESTING levels of recursion in readability
/// and htmd (reserved, not committed, until used).
const CONVERT_STACK: usize = 512 << 20;

/// Converts on a thread of its own, off the async runtime (a 1 MiB page is CPU work) and
/// with a stack sized for hostile nesting.
pub async fn html_to_markdown_off_thread(html: String, base: Url) -> Page {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let fallback = base.clone();
    let spawned = std::thread::Builder::new()
        .name("sandboxd-html".into())
        .stack_size(CONVERT_STACK)
        .spawn(move || {
            let _ = tx.send(html_to_markdown(&html, &base));
        });
    match spawned {
        Ok(_) => rx.await.unwrap_or_else(|_| Page {
            title: None,
            markdown: String::new(),
            method: "failed",
        }),
        Err(e) => {
            tracing::warn!(error = %e, url = %fallback, "cannot start the HTML conversion thread");
            Page {
                title: None,
                markdown: String::new(),
                method: "failed",
            }
        }
    }
}

/// An upper bound of the element nesting: opening tags minus closing ones, void elements
/// and self-closing tags not counted. Implicitly closed tags (`<p>` without `</p>`) make it
/// overestimate, never underestimate, which only errs towards the plain-text path.
fn nesting_estimate(html: &str) -> usize {
    const VOID: &[&str] = &[
        "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr", "p", "li", "option", "td", "tr", "th",
    ];
    let bytes = html.as_bytes();
    // Open elements per tag name: a closing tag only counts against an element of its own
    // name that is open, as html5ever ignores stray end tags.
    let mut open: std::collections::HashMap<String, usize> = Default::default();
    let (mut depth, mut max) = (0usize, 0usize);
    let mut i = 0;
    while let Some(off) = memchr_lt(&bytes[i..]) {
        let at = i + off + 1;
        i = at;
        let closing = bytes.get(at) == Some(&b'/');
        let start = if closing { at + 1 } else { at };
        let end = bytes[start..]
            .iter()
            .position(|b| !b.is_ascii_alphanumeric())
            .map_or(bytes.len(), |p| start + p);
        if end == start {
            continue;
        }
        let name = html[start..end].to_ascii_lowercase();
        if VOID.contains(&name.as_str()) {
            continue;
        }
        if closing {
            if let Some(n) = open.get_mut(&name).filter(|n| **n > 0) {
                *n -= 1;
                depth = depth.saturating_sub(1);
            }
            continue;
        }
        let self_closing = bytes[end..]
            .iter()
            .position(|b| *b == b'>')
            .is_some_and(|p| p > 0 && bytes[end + p - 1] == b'/');
        if !self_closing {
            *open.entry(name).or_default() += 1;
            depth += 1;
            max = max.max(depth);
        }
    }
    max
}

fn memchr_lt(b: &[u8]) -> Option<usize> {
    b.iter().position(|c| *c == b'<')
}

/// Tags stripped without building a tree: the path for pages nested too deep to walk.
fn plain_text(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let mut in_tag = false;
    for c in html.chars() {
        match (in_tag, c) {
            (false, '<') => in_tag = true,
            (true, '>') => {
                in_tag = false;
                out.push(' ');
            }
            (false, c) => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub title: Option<String>,
    pub markdown: String,
    /// "readability" or "whole-body".
    pub method: &'static str,
}

/// Converts `html` (already decoded) fetched from `base`. Call it on a thread with a large
/// stack (`html_to_markdown_off_thread`) for hostile input.
pub fn html_to_markdown(html: &str, base: &Url) -> Page {
    if nesting_estimate(html) > MAX_NESTING {
        return Page {
            title: None,
            markdown: plain_text(html),
            method: "plain text (the page nests too deep to convert)",
        };
    }
    let cfg = dom_smoothie::Config {
        text_mode: dom_smoothie::TextMode::Markdown,
        max_elements_to_parse: MAX_ELEMENTS,
        ..Default::default()
    };
    let article = dom_smoothie::Readability::new(html, Some(base.as_str()), Some(cfg))
        .and_then(|mut r| r.parse());
    match article {
        Ok(a) if a.text_content.trim().chars().count() >= MIN_ARTICLE_CHARS => Page {
            title: clean_title(&a.title),
            markdown: tidy(&a.text_content),
            method: "readability",
        },
        other => {
            if let Err(e) = &other {
                tracing::debug!(error = %e, url = %base, "readability found no article");
            }
            whole_body(html, base)
        }
    }
}

/// The fallback: the whole body, links made absolute first (htmd keeps them as written).
pub fn whole_body(html: &str, base: &Url) -> Page {
    let doc = dom_query::Document::from(html);
    let title = clean_title(&doc.select("title").text());
    for (sel, attr) in [("a[href]", "href"), ("img[src]", "src")] {
        for node in doc.select(sel).nodes() {
            let Some(v) = node.attr(attr) else { continue };
            match absolute(base, &v) {
                Some(abs) => node.set_attr(attr, &abs),
                None => node.remove_attr(attr),
            }
        }
    }
    let body = doc.select("body");
    let inner = if body.exists() {
        body.html().to_string()
    } else {
        doc.html().to_string()
    };
    let converter = htmd::HtmlToMarkdown::builder()
        .skip_tags(SKIP.to_vec())
        .build();
    let markdown = converter
        .convert(&inner)
        .unwrap_or_else(|_| doc.text().to_string());
    Page {
        title,
        markdown: tidy(&markdown),
        method: "whole-body",
    }
}

/// A link resolved against the page; `javascript:`, `data:` and the like are dropped.
fn absolute(base: &Url, href: &str) -> Option<String> {
    let u = base.join(href.trim()).ok()?;
    matches!(u.scheme(), "http" | "https" | "mailto").then(|| u.to_string())
}

fn clean_title(t: &str) -> Option<String> {
    let t: String = t.split_whitespace().collect::<Vec<_>>().join(" ");
    (!t.is_empty()).then(|| t.chars().take(300).collect())
}

/// Collapses runs of blank lines and trailing spaces.
fn tidy(md: &str) -> String {
    let mut out = String::with_capacity(md.len());
    let mut blank = 0;
    for line in md.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim().to_string()
}

/// The body as text: the header's charset, else a `<meta charset>` in the first KiB of
/// HTML, else UTF-8; undecodable bytes become U+FFFD rather than an error.
pub fn decode_text(body: &[u8], charset: Option<&str>, content_type: &str) -> String {
    let label = charset.map(str::to_string).or_else(|| {
        (content_type.contains("html"))
            .then(|| meta_charset(&body[..body.len().min(1024)]))
            .flatten()
    });
    let encoding = label
        .and_then(|l| encoding_rs::Encoding::for_label(l.as_bytes()))
        .unwrap_or(encoding_rs::UTF_8);
    let (text, _, _) = encoding.decode(body);
    text.into_owned()
}

fn meta_charset(head: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    let at = text.find("charset=")? + "charset=".len();
    let rest = text[at..].trim_start_matches(['"', '\'']);
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| rest[..end].to_string())
}

/// Cuts `text` to `max` characters, saying so.
pub fn cap_chars(text: String, max: usize) -> (String, bool) {
    match text.char_indices().nth(max) {
        None => (text, false),
        Some((at, _)) => {
            let mut t = text[..at].to_string();
            t.push_str(
                "\n\n[… cut by sandboxd: the page is longer than [research] max_markdown_chars]\n",
            );
            (t, true)
        }
    }
}

/// A YAML front-matter block; every value is a JSON string, which is valid YAML and
/// cannot break out of its line whatever a page puts in its title.
pub fn front_matter(fields: &[(&str, String)]) -> String {
    let mut out = String::from("---\n");
    for (k, v) in fields {
        let quoted = serde_json::to_string(v).unwrap_or_else(|_| "\"\"".into());
        out.push_str(&format!("{k}: {quoted}\n"));
    }
    out.push_str("---\n\n");
    out
}

/// A file name stem from a URL: host and path, lower-case ASCII letters, digits and
/// dashes only, at most 80 characters ("example-com-blog-post").
pub fn slug(url: &Url) -> String {
    let raw = format!("{}{}", url.host_str().unwrap_or("page"), url.path());
    let mut s = String::new();
    for c in raw.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') {
            s.push('-');
        }
    }
    let s = s.trim_matches('-');
    let mut s: String = s.chars().take(80).collect();
    while s.ends_with('-') {
        s.pop();
    }
    if s.is_empty() { "page".into() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARTICLE: &str = r#"<html><head><title>Kyoto temples</title></head><body>
        <nav><a href="/">Home</a> <a href="/about">About</a></nav>
        <article><h1>Kyoto temples</h1>
        <p>Kinkaku-ji, the Golden Pavilion, is a Zen temple in northern Kyoto. Its top two floors
        are covered in gold leaf. See <a href="/kinkakuji">the temple page</a> for opening hours.</p>
        <p>Ginkaku-ji, the Silver Pavilion, was modelled on it and stands at the foot of the
        eastern mountains; the moss garden and the sand cone are its best-known features.</p>
        <p>Both are UNESCO World Heritage sites, part of the Historic Monuments of Ancient Kyoto,
        and both can be visited on the same day by bus.</p></article>
        <footer>© 2026 <a href="https://other.example/">Other</a></footer></body></html>"#;

    #[test]
    fn readability_keeps_the_article_with_absolute_links() {
        let base = Url::parse("https://example.com/guide/kyoto").unwrap();
        let page = html_to_markdown(ARTICLE, &base);
        assert_eq!(page.method, "readability", "{page:?}");
        assert_eq!(page.title.as_deref(), Some("Kyoto temples"));
        assert!(
            page.markdown.contains("Golden Pavilion"),
            "{}",
            page.markdown
        );
        assert!(
            page.markdown.contains("(https://example.com/kinkakuji)"),
            "{}",
            page.markdown
        );
        assert!(
            !page.markdown.contains("About"),
            "navigation dropped: {}",
            page.markdown
        );
    }

    #[test]
    fn a_short_page_falls_back_to_the_whole_body() {
        let base = Url::parse("http://h.example/a/b.html").unwrap();
        let html = r#"<html><head><title> Tiny </title><script>evil()</script></head>
            <body><p>Short <a href="c.html">link</a> <a href="javascript:alert(1)">js</a></p></body></html>"#;
        let page = html_to_markdown(html, &base);
        assert_eq!(page.method, "whole-body");
        assert_eq!(page.title.as_deref(), Some("Tiny"));
        assert!(
            page.markdown.contains("[link](http://h.example/a/c.html)"),
            "{}",
            page.markdown
        );
        assert!(!page.markdown.contains("javascript:") && !page.markdown.contains("evil"));
    }

    #[test]
    fn hostile_nesting_becomes_plain_text_and_deep_but_sane_nesting_converts() {
        let base = Url::parse("http://h.example/").unwrap();
        let deep = format!(
            "{}words{}",
            "<div>".repeat(200_000),
            "</div>".repeat(200_000)
        );
        let page = html_to_markdown(&deep, &base);
        assert!(page.method.starts_with("plain text"), "{}", page.method);
        assert_eq!(page.markdown, "words");
        // Nested below the limit: converted on the big-stack thread without overflowing.
        let sane = format!(
            "<html><body>{}<b>deep</b>{}</body></html>",
            "<div>".repeat(1900),
            "</div>".repeat(1900)
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let page = rt.block_on(html_to_markdown_off_thread(sane, base));
        assert!(page.markdown.contains("**deep**"), "{page:?}");
        // Implicitly closed paragraphs do not count as nesting; stray end tags do not hide it.
        assert!(nesting_estimate(&"<p>x".repeat(10_000)) < 5);
        assert!(nesting_estimate(&"<div></span></p>".repeat(10_000)) >= 10_000);
        // The big stack holds far more real nesting than the limit lets through.
        let real = format!(
            "<html><body>{}<b>deep</b></body></html>",
            "<div><table></div>".repeat(12_000)
        );
        let page = std::thread::Builder::new()
            .stack_size(CONVERT_STACK)
            .spawn(move || {
                let base = Url::parse("http://h.example/").unwrap();
                (
                    whole_body(&real, &base),
                    html_to_markdown(&real, &base).method,
                )
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(page.1.starts_with("plain text"), "{}", page.1);
    }

    #[test]
    fn charset_comes_from_the_header_or_the_meta_tag() {
        let latin1 = b"<html><head><meta charset=\"iso-8859-1\"></head><body>caf\xe9</body></html>";
        assert!(decode_text(latin1, None, "text/html").contains("café"));
        assert!(decode_text(b"caf\xe9", Some("windows-1252"), "text/plain").contains("café"));
        assert!(decode_text("café".as_bytes(), None, "text/plain").contains("café"));
    }

    #[test]
    fn front_matter_cannot_be_broken_by_a_title() {
        let fm = front_matter(&[("title", "x\"\n---\nevil: 1".into())]);
        assert_eq!(fm.lines().filter(|l| *l == "---").count(), 2, "{fm}");
        assert!(fm.contains(r#"title: "x\"\n---\nevil: 1""#), "{fm}");
    }

    #[test]
    fn slugs_are_safe_file_names() {
        let u = Url::parse("https://Example.com/../Blog/Ünïcode post?x=1").unwrap();
        let s = slug(&u);
        assert!(
            s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{s}"
        );
        assert!(s.starts_with("example-com-blog"), "{s}");
        let long = Url::parse(&format!("https://a.example/{}", "x".repeat(500))).unwrap();
        assert!(slug(&long).len() <= 80);
    }

    #[test]
    fn cap_cuts_on_a_char_boundary_and_says_so() {
        let (t, cut) = cap_chars("ééééé".into(), 2);
        assert!(cut && t.starts_with("éé") && t.contains("max_markdown_chars"));
        assert_eq!(cap_chars("abc".into(), 5), ("abc".into(), false));
    }
}
