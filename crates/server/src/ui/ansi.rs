//! Terminal output (bash, python) to HTML for the run view: SGR colours and bold / dim /
//! italic / underline become `<span class="…">`, every other escape sequence (cursor moves,
//! OSC titles and hyperlinks, DCS, APC, …) is dropped whole, and all text is HTML-escaped.
//!
//! Why our own small performer over `anstyle-parse` rather than the `ansi-to-html` crate:
//! anstyle-parse (already in the tree through clap) is a complete DEC/ANSI state machine, so
//! a sequence we do not understand is still consumed to its end and never leaks as text; and
//! we emit classes, not `style="…"` attributes, which the page's CSP (no 'unsafe-inline')
//! would refuse. 256-colour and true-colour codes are mapped to the nearest of the 16
//! palette colours for the same reason.

use anstyle_parse::{Params, Parser, Perform};

use super::html::escape_into;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Style {
    fg: Option<u8>,
    bg: Option<u8>,
    bold: bool,
    dim: bool,
    italic: bool,
    underline: bool,
}

impl Style {
    fn classes(&self) -> String {
        let mut c = Vec::new();
        if let Some(f) = self.fg {
            c.push(format!("a-f{f}"));
        }
        if let Some(b) = self.bg {
            c.push(format!("a-b{b}"));
        }
        for (on, name) in [
            (self.bold, "a-bold"),
            (self.dim, "a-dim"),
            (self.italic, "a-it"),
            (self.underline, "a-ul"),
        ] {
            if on {
                c.push(name.to_string());
            }
        }
        c.join(" ")
    }
}

/// The 16-colour palette index nearest to an RGB colour (xterm's default values).
fn nearest16(r: u8, g: u8, b: u8) -> u8 {
    const PALETTE: [(u8, u8, u8); 16] = [
        (0, 0, 0),
        (205, 0, 0),
        (0, 205, 0),
        (205, 205, 0),
        (0, 0, 238),
        (205, 0, 205),
        (0, 205, 205),
        (229, 229, 229),
        (127, 127, 127),
        (255, 0, 0),
        (0, 255, 0),
        (255, 255, 0),
        (92, 92, 255),
        (255, 0, 255),
        (0, 255, 255),
        (255, 255, 255),
    ];
    let d = |&(pr, pg, pb): &(u8, u8, u8)| {
        let dr = i32::from(pr) - i32::from(r);
        let dg = i32::from(pg) - i32::from(g);
        let db = i32::from(pb) - i32::from(b);
        dr * dr + dg * dg + db * db
    };
    (0..16u8)
        .min_by_key(|&i| d(&PALETTE[i as usize]))
        .unwrap_or(7)
}

/// An xterm 256-colour index as one of the 16.
fn from256(n: u16) -> u8 {
    match n {
        0..=15 => n as u8,
        16..=231 => {
            let n = n - 16;
            let level = |v: u16| if v == 0 { 0 } else { (55 + v * 40) as u8 };
            nearest16(level(n / 36), level((n / 6) % 6), level(n % 6))
        }
        _ => {
            let v = (8 + (n.min(255) - 232) * 10) as u8;
            nearest16(v, v, v)
        }
    }
}

struct Html {
    out: String,
    style: Style,
    /// The style of the open `<span>`, if one is open.
    open: Option<Style>,
    pending_cr: bool,
}

impl Html {
    fn text(&mut self, s: &str) {
        if self.pending_cr {
            // A lone carriage return (progress bars): start a new line rather than glue.
            self.pending_cr = false;
            self.text("\n");
        }
        if self.open != Some(self.style) {
            if self.open.is_some() {
                self.out.push_str("</span>");
                self.open = None;
            }
            if self.style != Style::default() {
                self.out.push_str("<span class=\"");
                self.out.push_str(&self.style.classes());
                self.out.push_str("\">");
                self.open = Some(self.style);
            }
        }
        escape_into(&mut self.out, s);
    }

    fn sgr(&mut self, params: &Params) {
        let flat: Vec<u16> = params.iter().flat_map(|p| p.iter().copied()).collect();
        if flat.is_empty() {
            self.style = Style::default();
            return;
        }
        let mut i = 0;
        while i < flat.len() {
            let s = &mut self.style;
            match flat[i] {
                0 => *s = Style::default(),
                1 => s.bold = true,
                2 => s.dim = true,
                3 => s.italic = true,
                4 => s.underline = true,
                22 => (s.bold, s.dim) = (false, false),
                23 => s.italic = false,
                24 => s.underline = false,
                n @ 30..=37 => s.fg = Some((n - 30) as u8),
                39 => s.fg = None,
                n @ 40..=47 => s.bg = Some((n - 40) as u8),
                49 => s.bg = None,
                n @ 90..=97 => s.fg = Some((n - 90 + 8) as u8),
                n @ 100..=107 => s.bg = Some((n - 100 + 8) as u8),
                n @ (38 | 48) => {
                    let colour = match flat.get(i + 1) {
                        Some(5) => {
                            let c = flat.get(i + 2).map(|&v| from256(v));
                            i += 2;
                            c
                        }
                        Some(2) => {
                            let ch = |k: usize| flat.get(i + k).map_or(0, |&v| v.min(255) as u8);
                            let c = Some(nearest16(ch(2), ch(3), ch(4)));
                            i += 4;
                            c
                        }
                        _ => None,
                    };
                    if n == 38 {
                        s.fg = colour.or(s.fg);
                    } else {
                        s.bg = colour.or(s.bg);
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl Perform for Html {
    fn print(&mut self, c: char) {
        let mut buf = [0u8; 4];
        self.text(c.encode_utf8(&mut buf));
    }

    fn execute(&mut self, byte: u8) {
        match byte {
            b'\n' => {
                self.pending_cr = false;
                self.text("\n");
            }
            b'\t' => self.text("\t"),
            b'\r' => self.pending_cr = true,
            // Bell, backspace and the other C0/C1 controls draw nothing here.
            _ => {}
        }
    }

    fn csi_dispatch(&mut self, params: &Params, intermediates: &[u8], ignore: bool, action: u8) {
        if action == b'm' && intermediates.is_empty() && !ignore {
            self.sgr(params);
        }
    }
}

/// Terminal text as safe HTML (for inside a `<pre>`).
pub fn to_html(text: &str) -> String {
    let mut html = Html {
        out: String::with_capacity(text.len() + 16),
        style: Style::default(),
        open: None,
        pending_cr: false,
    };
    let mut parser = Parser::<anstyle_parse::DefaultCharAccumulator>::new();
    for b in text.bytes() {
        parser.advance(&mut html, b);
    }
    if html.open.is_some() {
        html.out.push_str("</span>");
    }
    html.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_become_classes_and_text_is_escaped() {
        assert_eq!(
            to_html("\x1b[31mred\x1b[0m <b>&"),
            "<span class=\"a-f1\">red</span> &lt;b&gt;&amp;"
        );
        assert_eq!(
            to_html("\x1b[1;92mok\x1b[22m!"),
            "<span class=\"a-f10 a-bold\">ok</span><span class=\"a-f10\">!</span>"
        );
        assert_eq!(to_html("\x1b[38;5;196mx"), "<span class=\"a-f9\">x</span>");
        assert_eq!(
            to_html("\x1b[38;2;0;0;250mx"),
            "<span class=\"a-f4\">x</span>"
        );
        assert_eq!(
            to_html("\x1b[44mx\x1b[49my"),
            "<span class=\"a-b4\">x</span>y"
        );
    }

    #[test]
    fn every_other_sequence_is_dropped_whole() {
        // OSC title, OSC 8 hyperlink with a javascript: URL, cursor moves, DCS, APC, bell.
        let hostile = "a\x1b]0;title\x07b\x1b]8;;javascript:alert(1)\x1b\\link\x1b]8;;\x1b\\c\x1b[2J\x1b[10;5Hd\x1bP1$qm\x1b\\e\x1b_apc\x1b\\f\x07g";
        assert_eq!(to_html(hostile), "ablinkcdefg");
        assert_eq!(to_html("x\x1b[?25ly\x1b[5Az"), "xyz");
    }

    #[test]
    fn lines_and_carriage_returns() {
        assert_eq!(to_html("a\r\nb\n"), "a\nb\n");
        assert_eq!(to_html("10%\r20%"), "10%\n20%");
        assert_eq!(
            to_html("<script>alert(1)</script>"),
            "&lt;script&gt;alert(1)&lt;/script&gt;"
        );
    }
}
