//! The editor's pure text operations: decoding, line endings, `cat -n` numbering, occurrence
//! search, whole-line insertion, edit snippets and output clipping.
//!
//! Everything here works on the file's text exactly as stored: tabs are never expanded and
//! line breaks are never rewritten, so an edit changes only the bytes it was asked to change.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Lines of context shown around an edit.
pub(super) const SNIPPET_LINES: usize = 4;
/// Observations longer than this are cut (characters, not bytes).
pub(super) const MAX_OUTPUT_CHARS: usize = 16_000;
/// How much of a file is sniffed for NUL bytes and broken UTF-8 to call it binary.
pub(super) const BINARY_SNIFF_BYTES: usize = 8 * 1024;
/// The most occurrence positions collected when old_str is ambiguous.
const MAX_OCCURRENCES: usize = 100;

/// Why a file's bytes are not editable text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum DecodeError {
    /// A NUL byte or invalid UTF-8 near the start: almost certainly not a text file.
    Binary,
    /// Text at the start, but invalid UTF-8 further in.
    NotUtf8 { offset: usize, line: usize },
}

/// Turns a file's bytes into text, refusing binary and non-UTF-8 files.
pub(super) fn decode(bytes: Vec<u8>) -> Result<String, DecodeError> {
    let head = &bytes[..bytes.len().min(BINARY_SNIFF_BYTES)];
    if head.contains(&0) {
        return Err(DecodeError::Binary);
    }
    // A multi-byte character cut by the sniff window is not a sign of binary data.
    if let Err(e) = std::str::from_utf8(head)
        && e.error_len().is_some()
    {
        return Err(DecodeError::Binary);
    }
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let valid = std::str::from_utf8(&e.as_bytes()[..offset]).unwrap_or_default();
        let line = count_newlines(valid, offset) + 1;
        DecodeError::NotUtf8 { offset, line }
    })
}

/// The line break a file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Eol {
    Lf,
    Crlf,
}

impl Eol {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Eol::Lf => "\n",
            Eol::Crlf => "\r\n",
        }
    }
}

/// The file's dominant line break: CRLF when at least half of its line breaks are CRLF.
pub(super) fn detect_eol(text: &str) -> Eol {
    let lf = count_newlines(text, text.len());
    let crlf = text.matches("\r\n").count();
    if crlf > 0 && crlf * 2 >= lf {
        Eol::Crlf
    } else {
        Eol::Lf
    }
}

/// Rewrites the line breaks of text from the model into `eol`, so that an LF-typing model can
/// match and extend a CRLF file (and the reverse) without changing the file's line endings.
pub(super) fn to_eol(s: &str, eol: Eol) -> Cow<'_, str> {
    match eol {
        Eol::Lf if s.contains("\r\n") => Cow::Owned(s.replace("\r\n", "\n")),
        Eol::Lf => Cow::Borrowed(s),
        Eol::Crlf => {
            let bare_lf = s
                .bytes()
                .enumerate()
                .any(|(i, b)| b == b'\n' && (i == 0 || s.as_bytes()[i - 1] != b'\r'));
            if bare_lf {
                Cow::Owned(s.replace("\r\n", "\n").replace('\n', "\r\n"))
            } else {
                Cow::Borrowed(s)
            }
        }
    }
}

/// Line breaks in `text[..end]`; `end` may fall inside a character (a '\n' never does).
/// `str::matches` with a char runs on std's memchr, which matters for megabyte files.
fn count_newlines(text: &str, end: usize) -> usize {
    let mut end = end.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].matches('\n').count()
}

/// The number of lines: every line break ends one, and trailing text without one is one more.
pub(super) fn line_count(text: &str) -> usize {
    let breaks = count_newlines(text, text.len());
    if text.is_empty() || text.ends_with('\n') {
        breaks
    } else {
        breaks + 1
    }
}

/// The 1-based line holding byte `offset` (any byte offset; it need not be a char boundary).
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    count_newlines(text, offset) + 1
}

/// The byte offset where 1-based line `n` starts; `text.len()` for lines past the end.
pub(super) fn line_start(text: &str, n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    text.match_indices('\n')
        .nth(n - 2)
        .map_or(text.len(), |(i, _)| i + 1)
}

/// Lines `first..=last` (1-based, inclusive) of `text`, line breaks included.
pub(super) fn lines(text: &str, first: usize, last: usize) -> &str {
    let start = line_start(text, first);
    let end = line_start(text, last.saturating_add(1)).max(start);
    &text[start..end]
}

/// `cat -n` style: each line's number right-aligned in 6 columns, a tab, the line without
/// its line break. Tabs inside lines are shown as they are.
pub(super) fn numbered(text: &str, first_line: usize) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8 + 16);
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let line = line.strip_suffix('\r').unwrap_or(line);
        let _ = writeln!(out, "{:>6}\t{}", first_line + i, line);
    }
    if out.ends_with('\n') {
        out.pop();
    }
    out
}

/// Byte offsets where `needle` starts in `hay`, overlapping matches included (an overlap is as
/// ambiguous as two separate matches). Stops after `MAX_OCCURRENCES`.
pub(super) fn occurrences(hay: &str, needle: &str) -> Vec<usize> {
    let Some(first) = needle.chars().next() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = hay[from..].find(needle) {
        let at = from + i;
        found.push(at);
        if found.len() >= MAX_OCCURRENCES {
            break;
        }
        // `at` starts `first` in hay, so this is a char boundary.
        from = at + first.len_utf8();
    }
    found
}

/// The distinct line numbers of some byte offsets, in order.
pub(super) fn lines_of(text: &str, offsets: &[usize]) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    let (mut line, mut pos) = (1, 0);
    for &off in offsets {
        line += count_newlines(&text[pos..], off - pos);
        pos = off;
        if out.last() != Some(&line) {
            out.push(line);
        }
    }
    out
}

/// Inserts `new` as whole lines after line `after` (0 = at the top), with the file's line
/// break. A trailing line break in `new` ends its last line rather than adding an empty one.
/// Returns the new text and the 1-based range of the inserted lines.
pub(super) fn insert_lines(
    text: &str,
    after: usize,
    new: &str,
    eol: Eol,
) -> (String, usize, usize) {
    let new = to_eol(new, eol);
    let body = new.strip_suffix(eol.as_str()).unwrap_or(&new);
    let inserted = line_count(body).max(1);
    let mut out = String::with_capacity(text.len() + body.len() + 2);
    if after >= line_count(text) && !text.is_empty() && !text.ends_with('\n') {
        // The last line has no line break; keep it that way after the inserted lines.
        out.push_str(text);
        out.push_str(eol.as_str());
        out.push_str(body);
    } else {
        let at = line_start(text, after + 1);
        out.push_str(&text[..at]);
        out.push_str(body);
        out.push_str(eol.as_str());
        out.push_str(&text[at..]);
    }
    (out, after + 1, after + inserted)
}

/// The lines `first..=last` of `text` with `SNIPPET_LINES` of context, numbered.
pub(super) fn snippet(text: &str, first: usize, last: usize) -> String {
    let n = line_count(text).max(1);
    let start = first.saturating_sub(SNIPPET_LINES).max(1);
    let end = last.saturating_add(SNIPPET_LINES).min(n).max(start);
    numbered(lines(text, start, end), start)
}

/// Cuts an observation at `MAX_OUTPUT_CHARS`, on a line boundary when one is near, and says how
/// to see the rest.
pub(super) fn clip(text: String) -> String {
    let Some((cut, _)) = text.char_indices().nth(MAX_OUTPUT_CHARS) else {
        return text;
    };
    let mut kept = &text[..cut];
    if let Some(nl) = kept.rfind('\n')
        && nl > cut / 2
    {
        kept = &kept[..nl];
    }
    format!(
        "{kept}\n[output cut at {MAX_OUTPUT_CHARS} characters: view a part with view_range [start, end], \
         or find line numbers first with `grep -n PATTERN FILE` in bash]"
    )
}

/// A name from the sandbox made safe to show on one line (a newline in a file name must not
/// forge a listing entry).
pub(super) fn shown(name: &str) -> Cow<'_, str> {
    if name.chars().any(char::is_control) {
        Cow::Owned(name.escape_debug().to_string())
    } else {
        Cow::Borrowed(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_offsets() {
        let t = "a\nbb\r\nc";
        assert_eq!(line_count(t), 3);
        assert_eq!(line_count("a\n"), 1);
        assert_eq!(line_count(""), 0);
        assert_eq!(line_start(t, 2), 2);
        assert_eq!(line_start(t, 3), 6);
        assert_eq!(line_start(t, 4), t.len());
        assert_eq!(lines(t, 2, 3), "bb\r\nc");
        assert_eq!(numbered(t, 1), "     1\ta\n     2\tbb\n     3\tc");
        assert_eq!(lines_of(t, &[0, 1, 3, 6]), vec![1, 2, 3]);
    }

    #[test]
    fn eol_translation() {
        assert_eq!(detect_eol("a\r\nb\r\n"), Eol::Crlf);
        assert_eq!(detect_eol("a\nb\n"), Eol::Lf);
        assert_eq!(to_eol("x\ny\r\nz", Eol::Crlf), "x\r\ny\r\nz");
        assert_eq!(to_eol("x\r\ny", Eol::Lf), "x\ny");
    }

    #[test]
    fn insertion_keeps_the_missing_final_newline() {
        assert_eq!(insert_lines("a\nb", 2, "c", Eol::Lf).0, "a\nb\nc");
        assert_eq!(insert_lines("a\nb\n", 2, "c\n", Eol::Lf).0, "a\nb\nc\n");
        assert_eq!(
            insert_lines("a\r\nb\r\n", 1, "x\ny", Eol::Crlf),
            ("a\r\nx\r\ny\r\nb\r\n".into(), 2, 3)
        );
        assert_eq!(insert_lines("", 0, "x", Eol::Lf).0, "x\n");
    }

    #[test]
    fn overlapping_occurrences_and_binary() {
        assert_eq!(occurrences("aaa", "aa"), vec![0, 1]);
        assert_eq!(occurrences("é-é", "é"), vec![0, 3]);
        assert_eq!(decode(b"a\0b".to_vec()), Err(DecodeError::Binary));
        let mut late = vec![b'x'; BINARY_SNIFF_BYTES + 10];
        late.push(0xff);
        assert!(matches!(
            decode(late),
            Err(DecodeError::NotUtf8 { line: 1, .. })
        ));
        assert!(clip("y\n".repeat(MAX_OUTPUT_CHARS)).ends_with("in bash]"));
    }
}
