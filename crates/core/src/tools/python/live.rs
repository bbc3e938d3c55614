//! The live output of a cell: the chunks the driver sends while the cell runs (E2B's
//! `run_code` streams them to its `on_stdout`/`on_stderr`), bounded per stream.

use bytes::Bytes;

/// Which stream a live chunk of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Where a live cell's output goes as it is printed: at most `output_cap` bytes of each
/// stream in all (the driver's own cap, checked again here: the frames are hostile input).
/// What was not sent live comes in the cell's `CellOutput` at the end.
pub struct LiveOutput {
    tx: tokio::sync::mpsc::UnboundedSender<(Stream, Bytes)>,
    pub(super) left: [usize; 2],
}

impl LiveOutput {
    /// A sink and the receiver of its chunks; the receiver ends when the cell has ended.
    pub fn channel() -> (Self, tokio::sync::mpsc::UnboundedReceiver<(Stream, Bytes)>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Self { tx, left: [0, 0] }, rx)
    }

    pub(super) fn push(&mut self, stream: Stream, mut data: Bytes) {
        let left = &mut self.left[stream as usize];
        data.truncate(*left);
        *left -= data.len();
        if !data.is_empty() {
            // A receiver that is gone (the caller left) drops the output.
            let _ = self.tx.send((stream, data));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stream_is_capped_on_its_own() {
        let (mut live, mut rx) = LiveOutput::channel();
        live.left = [4, 2];
        live.push(Stream::Stdout, Bytes::from_static(b"abc"));
        live.push(Stream::Stdout, Bytes::from_static(b"def"));
        live.push(Stream::Stdout, Bytes::from_static(b"ghi"));
        live.push(Stream::Stderr, Bytes::from_static(b"xyz"));
        drop(live);
        let mut got = Vec::new();
        while let Ok(c) = rx.try_recv() {
            got.push(c);
        }
        assert_eq!(
            got,
            vec![
                (Stream::Stdout, Bytes::from_static(b"abc")),
                (Stream::Stdout, Bytes::from_static(b"d")),
                (Stream::Stderr, Bytes::from_static(b"xy")),
            ]
        );
    }
}
