//! WsGuard: checks the websocket stream that crosses a tunnel, byte for byte, so nothing the
//! sandbox sends can make the host allocate more than a fixed bound.
//!
//! Why it exists: chromiumoxide 0.9 turns off tungstenite's frame and message size limits, so
//! a frame header that claims 2^45 bytes makes the host try to allocate that much and abort
//! (no task boundary catches an allocation failure), and a fragmented message that never ends
//! grows host memory without bound. The server side of the DevTools websocket is Chromium, a
//! process running as the sandbox user: whatever it or a process impersonating it sends is
//! hostile. The relay in `tunnel.rs` feeds every chunk, in both directions, through a guard
//! before forwarding it; the first violation cuts the connection, and the client sees a
//! closed socket instead of a huge allocation.
//!
//! The guard never buffers payload: it reads the HTTP upgrade head (bounded), then parses
//! frame headers (at most 14 bytes) and counts payload bytes, so its own memory is constant.
//!
//! Rules (RFC 6455 §5.2): a frame's payload and a message's total (all its fragments) are
//! capped; the 64-bit length's top bit must be clear; RSV bits must be clear (no extension is
//! ever negotiated, and permessage-deflate would let a small frame inflate); only the six
//! defined opcodes; control frames are final and at most 125 bytes; continuation frames only
//! inside a fragmented message and a new data frame only outside one.

/// The caps one guard enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WsLimits {
    /// Largest payload of one frame.
    pub max_frame: u64,
    /// Largest message, summed over its fragments.
    pub max_message: u64,
    /// Largest HTTP upgrade request or response head, up to and including the blank line.
    pub max_handshake: usize,
}

/// The DevTools caps. The biggest message the browser tool asks for is a viewport JPEG
/// screenshot (1280×720, ~100–400 KB as base64) or the text a script extracts from a page,
/// which the tools cut to a few hundred KB anyway; 32 MiB leaves two orders of magnitude of
/// headroom for legitimate CDP traffic, while capping what one hostile frame can cost the host
/// (tungstenite's buffer, the assembled message and chromiumoxide's parse: ~3 × 32 MiB).
pub const DEVTOOLS_LIMITS: WsLimits = WsLimits {
    max_frame: 32 << 20,
    max_message: 32 << 20,
    max_handshake: 16 << 10,
};

/// Why a stream was cut.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WsViolation(pub String);

#[derive(Debug)]
enum State {
    /// Reading the HTTP head; `matched` counts the bytes of "\r\n\r\n" seen in a row.
    Handshake { seen: usize, matched: usize },
    /// Reading a frame header into `buf`.
    Header { buf: [u8; 14], have: usize },
    /// Counting the payload bytes still to come.
    Payload { remaining: u64 },
}

/// One direction of one websocket connection.
#[derive(Debug)]
pub struct WsGuard {
    limits: WsLimits,
    /// "from the sandbox" or "to the sandbox", for the violation message.
    direction: &'static str,
    /// The server's response must be `101 Switching Protocols`; the first line is checked.
    expect_101: bool,
    status_line: Vec<u8>,
    state: State,
    /// Inside a fragmented data message (its last frame did not have FIN).
    in_message: bool,
    message_len: u64,
}

impl WsGuard {
    /// A guard for the server → client direction (checks the 101 response).
    pub fn server_to_client(limits: WsLimits) -> Self {
        Self::new(limits, "from the sandbox", true)
    }

    /// A guard for the client → server direction.
    pub fn client_to_server(limits: WsLimits) -> Self {
        Self::new(limits, "to the sandbox", false)
    }

    fn new(limits: WsLimits, direction: &'static str, expect_101: bool) -> Self {
        Self {
            limits,
            direction,
            expect_101,
            status_line: Vec::new(),
            state: State::Handshake {
                seen: 0,
                matched: 0,
            },
            in_message: false,
            message_len: 0,
        }
    }

    /// Checks the next chunk of the stream; `Err` means the connection must be cut now,
    /// before this chunk is forwarded.
    pub fn check(&mut self, mut data: &[u8]) -> Result<(), WsViolation> {
        while !data.is_empty() {
            match &mut self.state {
                State::Handshake { seen, matched } => {
                    let mut used = 0;
                    let mut done = false;
                    for &b in data {
                        used += 1;
                        *seen += 1;
                        if self.expect_101 && self.status_line.len() < 16 && !done {
                            self.status_line.push(b);
                        }
                        *matched = match (*matched, b) {
                            (0 | 2, b'\r') => *matched + 1,
                            (1 | 3, b'\n') => *matched + 1,
                            (_, b'\r') => 1,
                            _ => 0,
                        };
                        if *matched == 4 {
                            done = true;
                            break;
                        }
                    }
                    if *seen > self.limits.max_handshake {
                        return Err(self.violation(format!(
                            "an HTTP upgrade head longer than {} bytes",
                            self.limits.max_handshake
                        )));
                    }
                    if done {
                        if self.expect_101 && !self.status_line.starts_with(b"HTTP/1.1 101") {
                            return Err(self.violation(format!(
                                "a refused upgrade ({:?})",
                                String::from_utf8_lossy(&self.status_line).trim()
                            )));
                        }
                        self.state = State::Header {
                            buf: [0; 14],
                            have: 0,
                        };
                    }
                    data = &data[used..];
                }
                State::Header { buf, have } => {
                    let take = (14 - *have).min(data.len());
                    buf[*have..*have + take].copy_from_slice(&data[..take]);
                    *have += take;
                    let (buf, have) = (*buf, *have);
                    match header_len(&buf[..have]) {
                        Some(needed) if needed <= have => {
                            let payload = self.frame(&buf[..needed])?;
                            // Bytes of the chunk past this header belong to its payload.
                            let consumed = take - (have - needed);
                            data = &data[consumed..];
                            self.state = if payload == 0 {
                                State::Header {
                                    buf: [0; 14],
                                    have: 0,
                                }
                            } else {
                                State::Payload { remaining: payload }
                            };
                        }
                        _ => data = &data[take..],
                    }
                }
                State::Payload { remaining } => {
                    let n = (*remaining).min(data.len() as u64);
                    *remaining -= n;
                    data = &data[n as usize..];
                    if *remaining == 0 {
                        self.state = State::Header {
                            buf: [0; 14],
                            have: 0,
                        };
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies the rules to one complete frame header; returns its payload length.
    fn frame(&mut self, header: &[u8]) -> Result<u64, WsViolation> {
        let fin = header[0] & 0x80 != 0;
        let rsv = header[0] & 0x70;
        let opcode = header[0] & 0x0f;
        let len = payload_len(header);
        if rsv != 0 {
            return Err(self.violation(format!("a frame with reserved bits {rsv:#x} set")));
        }
        if len >> 63 != 0 {
            return Err(self.violation("a frame length with the top bit set".into()));
        }
        if len > self.limits.max_frame {
            return Err(self.violation(format!(
                "a frame of {len} bytes (the cap is {})",
                self.limits.max_frame
            )));
        }
        match opcode {
            0x8..=0xa => {
                if !fin || len > 125 {
                    return Err(self.violation(format!(
                        "a control frame that is fragmented or longer than 125 bytes ({len})"
                    )));
                }
                return Ok(len);
            }
            0x0 if !self.in_message => {
                return Err(self.violation("a continuation frame outside a message".into()));
            }
            0x0 => self.message_len = self.message_len.saturating_add(len),
            0x1 | 0x2 if self.in_message => {
                return Err(self.violation("a new message inside a fragmented one".into()));
            }
            0x1 | 0x2 => self.message_len = len,
            other => return Err(self.violation(format!("a frame with unknown opcode {other:#x}"))),
        }
        if self.message_len > self.limits.max_message {
            return Err(self.violation(format!(
                "a message of more than {} bytes",
                self.limits.max_message
            )));
        }
        self.in_message = !fin;
        Ok(len)
    }

    fn violation(&self, what: String) -> WsViolation {
        WsViolation(format!("websocket {}: {what}", self.direction))
    }
}

/// The header's full length once its first two bytes are known.
fn header_len(buf: &[u8]) -> Option<usize> {
    if buf.len() < 2 {
        return None;
    }
    let ext = match buf[1] & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if buf[1] & 0x80 != 0 { 4 } else { 0 };
    Some(2 + ext + mask)
}

fn payload_len(header: &[u8]) -> u64 {
    match header[1] & 0x7f {
        126 => u64::from(u16::from_be_bytes([header[2], header[3]])),
        127 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&header[2..10]);
            u64::from_be_bytes(b)
        }
        n => u64::from(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: WsLimits = WsLimits {
        max_frame: 1000,
        max_message: 1500,
        max_handshake: 200,
    };

    fn after_handshake() -> WsGuard {
        let mut g = WsGuard::server_to_client(LIMITS);
        g.check(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
            .unwrap();
        g
    }

    fn frame(first: u8, len: u64) -> Vec<u8> {
        let mut f = vec![first];
        if len < 126 {
            f.push(len as u8);
        } else if len <= 0xffff {
            f.push(126);
            f.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            f.push(127);
            f.extend_from_slice(&len.to_be_bytes());
        }
        f
    }

    #[test]
    fn passes_normal_traffic_in_any_chunking() {
        let mut stream = b"HTTP/1.1 101 Switching Protocols\r\n\r\n".to_vec();
        for len in [0u64, 5, 300, 1000] {
            stream.extend(frame(0x81, len));
            stream.extend(vec![b'x'; len as usize]);
        }
        stream.extend(frame(0x89, 3));
        stream.extend(b"abc");
        // Fragmented: 700 + 700 stays under the message cap.
        stream.extend(frame(0x02, 700));
        stream.extend(vec![0; 700]);
        stream.extend(frame(0x80, 700));
        stream.extend(vec![0; 700]);
        for chunk in [1, 2, 3, 7, 13, 64, stream.len()] {
            let mut g = WsGuard::server_to_client(LIMITS);
            for part in stream.chunks(chunk) {
                g.check(part).unwrap();
            }
        }
    }

    #[test]
    fn refuses_a_huge_claimed_length_at_once() {
        let mut g = after_handshake();
        let err = g.check(&frame(0x82, 1 << 45)).unwrap_err();
        assert!(err.0.contains("35184372088832 bytes"), "{err}");
        let mut g = after_handshake();
        assert!(g.check(&frame(0x82, u64::MAX)).is_err());
    }

    #[test]
    fn refuses_an_endless_fragmented_message() {
        let mut g = after_handshake();
        g.check(&frame(0x01, 900)).unwrap();
        g.check(&[0; 900]).unwrap();
        let err = g.check(&frame(0x00, 900)).unwrap_err();
        assert!(err.0.contains("message of more than 1500"), "{err}");
    }

    #[test]
    fn refuses_protocol_tricks() {
        for bad in [
            frame(0xc1, 4),   // RSV1: compressed
            frame(0x83, 4),   // unknown opcode
            frame(0x09, 4),   // fragmented ping
            frame(0x89, 126), // long ping
            frame(0x80, 4),   // continuation outside a message
        ] {
            assert!(after_handshake().check(&bad).is_err(), "{bad:?}");
        }
        let mut g = after_handshake();
        g.check(&frame(0x01, 1)).unwrap();
        g.check(b"a").unwrap();
        assert!(
            g.check(&frame(0x81, 1)).is_err(),
            "new message inside a fragmented one"
        );
    }

    #[test]
    fn refuses_bad_handshakes() {
        let mut g = WsGuard::server_to_client(LIMITS);
        assert!(g.check(&[b'A'; 300]).is_err(), "endless head");
        let mut g = WsGuard::server_to_client(LIMITS);
        assert!(g.check(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        // The client's request has no status to check.
        let mut g = WsGuard::client_to_server(LIMITS);
        g.check(b"GET /devtools/browser/x HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap();
        let mut masked = frame(0x81, 2);
        masked[1] |= 0x80;
        masked.extend([1, 2, 3, 4, b'h', b'i']);
        g.check(&masked).unwrap();
    }
}
