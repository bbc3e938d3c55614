//! The frames between the host and the in-container egress helper
//! (images/sandbox/helpers/sandboxd_egress.py, whose docstring is the protocol's reference).
//!
//! `u32 BE connection id | u8 type | u32 BE payload length | payload`. The helper runs as the
//! sandbox user, so what it sends is parsed as hostile: a frame type, payload size or CREDIT
//! length out of bounds is an error that tears the whole channel down, never a guess.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub(crate) const HELLO: u8 = 1;
pub(crate) const OPEN: u8 = 2;
pub(crate) const DATA: u8 = 3;
pub(crate) const EOF: u8 = 4;
pub(crate) const CLOSE: u8 = 5;
pub(crate) const CREDIT: u8 = 6;
pub(crate) const REFUSED: u8 = 7;

/// What the helper says first, once it listens.
pub(crate) const HELLO_PAYLOAD: &[u8] = b"sandboxd-egress/1";
/// The largest payload either side sends in one frame.
pub(crate) const MAX_PAYLOAD: usize = 64 * 1024;
/// Unacknowledged DATA bytes one side may have in flight per connection and direction.
pub(crate) const WINDOW: usize = 256 * 1024;
const HEADER: usize = 9;

/// One frame, as read from the helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) id: u32,
    pub(crate) kind: u8,
    pub(crate) payload: Bytes,
}

/// One frame, ready to write.
pub(crate) fn encode(id: u32, kind: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER + payload.len());
    out.put_u32(id);
    out.put_u8(kind);
    out.put_u32(payload.len() as u32);
    out.put_slice(payload);
    out.freeze()
}

/// An empty DATA frame to read a payload into in place (up to `MAX_PAYLOAD` bytes after its
/// header's room), so the bytes from a destination are copied once on their way to the
/// helper's stdin; `seal` writes the header.
pub(crate) fn data_buf() -> BytesMut {
    let mut b = BytesMut::with_capacity(HEADER + MAX_PAYLOAD);
    b.put_bytes(0, HEADER);
    b
}

/// The payload bytes of a `data_buf`.
pub(crate) fn payload_len(buf: &BytesMut) -> usize {
    buf.len().saturating_sub(HEADER)
}

/// Keeps the first `n` payload bytes of a `data_buf`.
pub(crate) fn truncate_payload(buf: &mut BytesMut, n: usize) {
    buf.truncate(HEADER + n);
}

/// A `data_buf` as the DATA frame of connection `id`.
pub(crate) fn seal(id: u32, mut buf: BytesMut) -> Bytes {
    let len = payload_len(&buf) as u32;
    buf[..4].copy_from_slice(&id.to_be_bytes());
    buf[4] = DATA;
    buf[5..HEADER].copy_from_slice(&len.to_be_bytes());
    buf.freeze()
}

/// A CREDIT frame giving back `n` bytes.
pub(crate) fn credit(id: u32, n: u32) -> Bytes {
    encode(id, CREDIT, &n.to_be_bytes())
}

/// Cuts the helper's stdout into frames; holds at most one frame's worth of bytes beyond
/// what it was given (the caller stops reading while a frame is pending).
#[derive(Default)]
pub(crate) struct Decoder {
    buf: BytesMut,
}

impl Decoder {
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, None when more bytes are needed, or why the bytes are not
    /// a frame of this protocol.
    pub(crate) fn next(&mut self) -> Result<Option<Frame>, String> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let id = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        let kind = self.buf[4];
        let len = u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]]) as usize;
        if !(HELLO..=REFUSED).contains(&kind) {
            return Err(format!("unknown frame type {kind}"));
        }
        let max = match kind {
            DATA => MAX_PAYLOAD,
            HELLO => HELLO_PAYLOAD.len(),
            CREDIT => 4,
            _ => 0,
        };
        if len > max {
            return Err(format!(
                "a frame of type {kind} with {len} payload bytes (at most {max})"
            ));
        }
        if kind == CREDIT && len != 4 {
            return Err("a CREDIT frame without its 4-byte count".into());
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        self.buf.advance(HEADER);
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Frame { id, kind, payload }))
    }
}

/// The count of a CREDIT frame (checked to be 4 bytes by the decoder).
pub(crate) fn credit_of(payload: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&payload[..4]);
    u32::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_in_pieces() {
        let mut d = Decoder::default();
        let mut wire = encode(7, DATA, b"hello").to_vec();
        wire.extend_from_slice(&credit(7, 300));
        for b in &wire[..12] {
            d.push(&[*b]);
            assert_eq!(d.next().unwrap(), None);
        }
        d.push(&wire[12..]);
        assert_eq!(d.next().unwrap().unwrap().payload.as_ref(), b"hello");
        let c = d.next().unwrap().unwrap();
        assert_eq!((c.id, c.kind, credit_of(&c.payload)), (7, CREDIT, 300));
        assert!(d.buf.is_empty());
    }

    #[test]
    fn a_sealed_buffer_is_a_data_frame() {
        let mut b = data_buf();
        b.extend_from_slice(b"hello world");
        truncate_payload(&mut b, 5);
        assert_eq!(seal(9, b), encode(9, DATA, b"hello"));
    }

    #[test]
    fn hostile_frames_are_errors() {
        for wire in [
            encode(1, 99, b"").to_vec(),
            encode(1, OPEN, b"x").to_vec(),
            encode(1, CREDIT, b"12").to_vec(),
            // A DATA length over the limit is refused before its payload arrives.
            [
                &1u32.to_be_bytes()[..],
                &[DATA],
                &(1u32 << 30).to_be_bytes(),
            ]
            .concat(),
        ] {
            let mut d = Decoder::default();
            d.push(&wire);
            assert!(d.next().is_err(), "{wire:?}");
        }
    }
}
