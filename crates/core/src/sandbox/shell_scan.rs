//! The persistent shell's output side: `Scanner` finds a call's sentinel in a hostile byte
//! stream and passes everything before it on, to a `Kept`: a capped buffer (the answer of a
//! plain `shell` call) or a `StreamCap` (pieces for a streamed call, with the same caps).
//!
//! Both keep the head and the tail of a stream and cut its middle. A streamed call sends the
//! head live; the tail can only be known at the end, so it is held and sent then, after a
//! `Cut` saying how many bytes were dropped. Nothing here holds more than the cap plus a few
//! dozen bytes, whatever the stream contains.

use std::collections::VecDeque;

use bytes::Bytes;

use super::output::CappedBuffer;
use super::{MAX_PIECE, ShellPiece, StdStream};

/// Where the output before the sentinel goes.
pub(super) enum Kept {
    Buffer(CappedBuffer),
    Stream(StreamCap),
}

impl Kept {
    fn push(&mut self, data: &[u8]) {
        match self {
            Kept::Buffer(b) => b.push(data),
            Kept::Stream(s) => s.push(data),
        }
    }

    /// The pieces waiting to be sent (none for a buffer).
    pub(super) fn outbox(&mut self) -> Option<&mut VecDeque<ShellPiece>> {
        match self {
            Kept::Buffer(_) => None,
            Kept::Stream(s) => Some(&mut s.outbox),
        }
    }
}

/// The head-and-tail cap of a streamed call for one stream: the first half of the cap
/// becomes pieces at once, the rest runs through a ring of the other half.
pub(super) struct StreamCap {
    stream: StdStream,
    head_left: usize,
    tail: VecDeque<u8>,
    tail_cap: usize,
    sent_head: u64,
    total: u64,
    holding: bool,
    outbox: VecDeque<ShellPiece>,
}

impl StreamCap {
    pub(super) fn new(stream: StdStream, cap: usize) -> Self {
        let head = cap / 2;
        Self {
            stream,
            head_left: head,
            tail: VecDeque::new(),
            tail_cap: cap - head,
            sent_head: 0,
            total: 0,
            holding: false,
            outbox: VecDeque::new(),
        }
    }

    fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.head_left > 0 {
            let take = self.head_left.min(data.len());
            for piece in data[..take].chunks(MAX_PIECE) {
                self.outbox.push_back(ShellPiece::Output(
                    self.stream,
                    Bytes::copy_from_slice(piece),
                ));
            }
            self.head_left -= take;
            self.sent_head += take as u64;
            data = &data[take..];
        }
        if data.is_empty() {
            return;
        }
        if !self.holding {
            self.holding = true;
            self.outbox.push_back(ShellPiece::Holding(self.stream));
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_cap..]);
        } else {
            let overflow = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
            self.tail.drain(..overflow);
            self.tail.extend(data);
        }
    }

    /// The pieces still to send, in order: what the outbox holds, then the cut (if any) and
    /// the kept tail; and whether the middle was cut.
    pub(super) fn finish(mut self) -> (VecDeque<ShellPiece>, bool) {
        let kept = self.sent_head + self.tail.len() as u64;
        let cut = self.total > kept;
        if cut {
            self.outbox.push_back(ShellPiece::Cut {
                stream: self.stream,
                bytes: self.total - kept,
            });
        }
        let tail: Vec<u8> = self.tail.into_iter().collect();
        for piece in tail.chunks(MAX_PIECE) {
            self.outbox.push_back(ShellPiece::Output(
                self.stream,
                Bytes::copy_from_slice(piece),
            ));
        }
        (self.outbox, cut)
    }
}

/// Finds the sentinel in a stream while passing everything before it to a `Kept`.
pub(super) struct Scanner {
    marker: Vec<u8>,
    pending: Vec<u8>,
    pub(super) kept: Kept,
    pub(super) code: Option<i32>,
    pub(super) done: bool,
}

impl Scanner {
    pub(super) fn new(marker: String, kept: Kept) -> Self {
        Self {
            marker: marker.into_bytes(),
            pending: Vec::new(),
            kept,
            code: None,
            done: false,
        }
    }

    /// Linear in the bytes seen and never holds more than the cap plus a few dozen bytes:
    /// the stream is hostile, and a forged marker must not make the host buffer or rescan.
    /// Without a marker in sight only a suffix that could begin one is held back, so a
    /// streamed call's output is not delayed by the sentinel's length.
    pub(super) fn push(&mut self, data: &[u8]) {
        if self.done {
            return;
        }
        self.pending.extend_from_slice(data);
        // Stdout's marker is followed by `<code>__\n` (at most 11 digits and a sign).
        const CODE_ROOM: usize = 16;
        let with_code = self.marker.ends_with(b"_");
        loop {
            let Some(at) = find(&self.pending, &self.marker) else {
                let commit = self.pending.len() - self.marker_prefix_suffix();
                if commit > 0 {
                    self.kept.push(&self.pending[..commit]);
                    self.pending.drain(..commit);
                }
                return;
            };
            self.kept.push(&self.pending[..at]);
            self.pending.drain(..at);
            if !with_code {
                self.pending.clear();
                self.done = true;
                return;
            }
            let rest = &self.pending[self.marker.len()..];
            match find(&rest[..rest.len().min(CODE_ROOM)], b"__\n") {
                Some(end) => {
                    self.code = std::str::from_utf8(&rest[..end])
                        .ok()
                        .and_then(|s| s.parse().ok());
                    self.pending.clear();
                    self.done = true;
                    return;
                }
                // Not enough bytes yet to tell: wait, holding only the marker and a few bytes.
                None if rest.len() < CODE_ROOM => return,
                // Marker-like bytes without a code after them are output, not a sentinel.
                None => {
                    self.kept.push(&self.pending[..1]);
                    self.pending.drain(..1);
                }
            }
        }
    }

    /// The length of the longest suffix of `pending` that is a proper prefix of the marker
    /// (such a suffix may be the sentinel's start, so it must wait for more bytes).
    fn marker_prefix_suffix(&self) -> usize {
        let max = self.pending.len().min(self.marker.len() - 1);
        (1..=max)
            .rev()
            .find(|&n| self.pending[self.pending.len() - n..] == self.marker[..n])
            .unwrap_or(0)
    }

    /// Everything seen but the sentinel, passed on; the `Kept` is handed back.
    pub(super) fn finish(mut self) -> Kept {
        if !self.done {
            let pending = std::mem::take(&mut self.pending);
            self.kept.push(&pending);
        }
        self.kept
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffered(marker: &str, cap: usize) -> Scanner {
        Scanner::new(marker.into(), Kept::Buffer(CappedBuffer::new(cap)))
    }

    fn bytes_of(kept: Kept) -> (Vec<u8>, bool) {
        match kept {
            Kept::Buffer(b) => b.finish(),
            Kept::Stream(_) => panic!("a buffer was expected"),
        }
    }

    #[test]
    fn a_forged_marker_without_a_code_is_output_and_nothing_piles_up() {
        let mut s = buffered("\n__SBXO_abc_", 1024);
        s.push(b"\n__SBXO_abc_");
        for _ in 0..1000 {
            s.push(&[b'z'; 1000]);
            assert!(s.pending.len() <= 64, "pending grew to {}", s.pending.len());
        }
        assert_eq!(s.code, None);
        s.push(b"\n__SBXO_abc_7__\n");
        assert_eq!(s.code, Some(7));
        let (out, cut) = bytes_of(s.finish());
        assert!(cut && out.starts_with(b"\n__SBXO_abc_zzz"));
    }

    #[test]
    fn scanner_finds_a_split_sentinel_and_keeps_exact_output() {
        let mut s = buffered("\n__SBXO_abc_", 1024);
        s.push(b"hello");
        s.push(b"\n__SB");
        s.push(b"XO_abc_4");
        assert_eq!(s.code, None);
        s.push(b"2__\n");
        assert_eq!(s.code, Some(42));
        assert_eq!(bytes_of(s.finish()).0, b"hello");
    }

    #[test]
    fn only_a_possible_marker_start_is_held_back() {
        let mut s = buffered("\n__SBXO_abc_", 1024);
        s.push(b"line one\nline two\n__S");
        // Everything up to the last newline is passed on at once; "\n__S" may be the marker.
        assert_eq!(s.pending, b"\n__S");
        s.push(b"ix");
        assert!(s.pending.is_empty(), "{:?}", s.pending);
        s.push(b"\n");
        assert_eq!(s.pending, b"\n");
    }

    #[test]
    fn a_stream_sends_the_head_live_then_the_cut_and_the_tail() {
        let mut s = Scanner::new(
            "\n__SBXO_abc_".into(),
            Kept::Stream(StreamCap::new(StdStream::Stdout, 8)),
        );
        s.push(b"01");
        let live: Vec<_> = s.kept.outbox().unwrap().drain(..).collect();
        assert_eq!(
            live,
            vec![ShellPiece::Output(
                StdStream::Stdout,
                Bytes::from_static(b"01")
            )]
        );
        s.push(b"23456789abcdef");
        s.push(b"\n__SBXO_abc_0__\n");
        let Kept::Stream(cap) = s.finish() else {
            panic!("a stream was expected")
        };
        let (rest, cut) = cap.finish();
        assert!(cut);
        let rest: Vec<_> = rest.into_iter().collect();
        assert_eq!(
            rest,
            vec![
                ShellPiece::Output(StdStream::Stdout, Bytes::from_static(b"23")),
                ShellPiece::Holding(StdStream::Stdout),
                ShellPiece::Cut {
                    stream: StdStream::Stdout,
                    bytes: 8
                },
                ShellPiece::Output(StdStream::Stdout, Bytes::from_static(b"cdef")),
            ]
        );
    }

    #[test]
    fn a_stream_under_its_cap_is_sent_whole_and_in_bounded_pieces() {
        let mut cap = StreamCap::new(StdStream::Stderr, 4 * MAX_PIECE);
        cap.push(&vec![b'x'; MAX_PIECE * 2 + 5]);
        cap.push(&vec![b'y'; MAX_PIECE]);
        let (pieces, cut) = cap.finish();
        assert!(!cut);
        let mut total = 0;
        for p in &pieces {
            match p {
                ShellPiece::Output(StdStream::Stderr, b) => {
                    assert!(b.len() <= MAX_PIECE);
                    total += b.len();
                }
                ShellPiece::Holding(StdStream::Stderr) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(total, MAX_PIECE * 3 + 5);
    }
}
