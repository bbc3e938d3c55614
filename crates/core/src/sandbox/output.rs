//! CappedBuffer: keeps the head and the tail of a byte stream, never more than its cap.
//!
//! A command that prints gigabytes must not grow the host process, and the model needs
//! both the start (what ran) and the end (how it ended), so the middle is what gets cut.

use std::collections::VecDeque;

#[derive(Debug)]
pub(super) struct CappedBuffer {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl CappedBuffer {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    pub(super) fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let head_cap = self.cap / 2;
        if self.head.len() < head_cap {
            let take = (head_cap - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        let tail_cap = self.cap - head_cap;
        if data.len() >= tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - tail_cap..]);
        } else {
            let overflow = (self.tail.len() + data.len()).saturating_sub(tail_cap);
            self.tail.drain(..overflow);
            self.tail.extend(data);
        }
    }

    pub(super) fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// The kept bytes, with a marker where the middle was cut.
    pub(super) fn finish(self) -> (Vec<u8>, bool) {
        let truncated = self.truncated();
        let kept = (self.head.len() + self.tail.len()) as u64;
        let mut out = self.head;
        if truncated {
            let cut = self.total - kept;
            out.extend_from_slice(format!("\n[... {cut} bytes cut by sandboxd ...]\n").as_bytes());
        }
        out.extend(self.tail);
        (out, truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_everything_under_the_cap() {
        let mut b = CappedBuffer::new(10);
        b.push(b"abc");
        b.push(b"def");
        assert_eq!(b.finish(), (b"abcdef".to_vec(), false));
    }

    #[test]
    fn cuts_the_middle() {
        let mut b = CappedBuffer::new(6);
        for chunk in [b"0123".as_slice(), b"4567", b"89"] {
            b.push(chunk);
        }
        let (out, cut) = b.finish();
        assert!(cut);
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("012\n[... 4 bytes cut"), "{s}");
        assert!(s.ends_with("789"), "{s}");
    }

    #[test]
    fn a_huge_single_push_keeps_its_end() {
        let mut b = CappedBuffer::new(4);
        b.push(&[b'x'; 1000]);
        b.push(b"yz");
        let (out, cut) = b.finish();
        assert!(cut);
        assert!(out.ends_with(b"xyz") || out.ends_with(b"yz"));
        assert_eq!(b"xx", &out[..2]);
    }
}
