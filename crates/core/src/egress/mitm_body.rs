//! The bounded byte work of the credential relay: reading a head or a line with a hard
//! limit, streaming a body by its framing (Content-Length, chunked, until close) through a
//! fixed-size buffer, and masking the secret in what goes back to the sandbox.
//!
//! Nothing here holds a whole body: a body moves at most one buffer (`BUF`) plus the
//! scrubber's carry (the secret's length less one) at a time. `refuse` is the relay's one
//! answer of its own: a status and our reason, never anything the request carried.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::mitm::{MitmCounters, MitmError};

/// The largest request or response head (request line or status line and headers).
pub(crate) const MAX_HEAD: usize = 32 * 1024;
/// The largest chunk-size or trailer line.
const MAX_LINE: usize = 4 * 1024;
/// Trailer lines read (and dropped) after the last chunk.
const MAX_TRAILERS: usize = 64;
/// Empty lines tolerated before a request line (RFC 9112 §2.2 allows some).
const MAX_LEADING_EMPTY: usize = 4;

/// How a body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// Why a head could not be read.
#[derive(Debug)]
pub(crate) enum HeadError {
    TooLarge,
    Truncated,
    Io(std::io::Error),
}

impl From<std::io::Error> for HeadError {
    fn from(e: std::io::Error) -> Self {
        HeadError::Io(e)
    }
}

/// One line (with its `\n`) of at most `max` bytes, appended to `out`; the bytes read.
async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    out: &mut Vec<u8>,
    max: usize,
) -> Result<usize, HeadError> {
    let before = out.len();
    let n = (&mut *r).take(max as u64).read_until(b'\n', out).await?;
    if n > 0 && !out[before..].ends_with(b"\n") {
        return Err(if n >= max {
            HeadError::TooLarge
        } else {
            HeadError::Truncated
        });
    }
    Ok(n)
}

fn is_empty_line(line: &[u8]) -> bool {
    line == b"\r\n" || line == b"\n"
}

/// A head up to and including its empty line, at most `MAX_HEAD` bytes; None at a clean end
/// of stream before any byte.
pub(crate) async fn read_head<R: AsyncBufRead + Unpin>(
    r: &mut R,
) -> Result<Option<Vec<u8>>, HeadError> {
    let mut head = Vec::new();
    let mut leading = 0;
    loop {
        let room = MAX_HEAD.saturating_sub(head.len());
        if room == 0 {
            return Err(HeadError::TooLarge);
        }
        let before = head.len();
        let n = read_line(r, &mut head, room).await?;
        if n == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(HeadError::Truncated)
            };
        }
        if is_empty_line(&head[before..]) {
            if before > 0 {
                return Ok(Some(head));
            }
            leading += 1;
            if leading > MAX_LEADING_EMPTY {
                return Err(HeadError::Truncated);
            }
            head.clear();
        }
    }
}

/// Masks the secret, with a carry so an occurrence split across reads is masked too. The
/// mask has the secret's length, so Content-Length and chunk sizes stay true.
pub(crate) struct Scrubber<'a> {
    needle: &'a [u8],
    pending: Vec<u8>,
}

impl<'a> Scrubber<'a> {
    /// `needle` empty: a pass-through (the request direction).
    pub(crate) fn new(needle: &'a [u8]) -> Scrubber<'a> {
        Scrubber {
            needle,
            pending: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.needle.is_empty() {
            out.extend_from_slice(input);
            return;
        }
        self.pending.extend_from_slice(input);
        mask(&mut self.pending, self.needle);
        let keep = (self.needle.len() - 1).min(self.pending.len());
        let emit = self.pending.len() - keep;
        out.extend_from_slice(&self.pending[..emit]);
        self.pending.drain(..emit);
    }

    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.pending);
    }
}

/// Replaces every occurrence of `needle` in `buf` with as many `*`.
pub(crate) fn mask(buf: &mut [u8], needle: &[u8]) {
    if needle.is_empty() {
        return;
    }
    let mut at = 0;
    while let Some(i) = memchr::memmem::find(&buf[at..], needle) {
        let start = at + i;
        buf[start..start + needle.len()].fill(b'*');
        at = start + needle.len();
    }
}

/// Writes and flushes `bytes` (TLS streams hold writes until flushed), counting them.
pub(crate) async fn send<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    up: bool,
    counters: &MitmCounters,
) -> Result<(), MitmError> {
    if bytes.is_empty() {
        return Ok(());
    }
    w.write_all(bytes).await?;
    w.flush().await?;
    counters.add(up, bytes.len())
}

/// Sends `data` as one chunk of a chunked body (nothing if empty: an empty chunk ends it).
async fn send_chunk<W: AsyncWrite + Unpin>(
    w: &mut W,
    data: &[u8],
    up: bool,
    counters: &MitmCounters,
) -> Result<(), MitmError> {
    if data.is_empty() {
        return Ok(());
    }
    let mut framed = format!("{:X}\r\n", data.len()).into_bytes();
    framed.extend_from_slice(data);
    framed.extend_from_slice(b"\r\n");
    send(w, &framed, up, counters).await
}

fn body_err(e: HeadError) -> MitmError {
    match e {
        HeadError::TooLarge => MitmError::Io("a chunk line or trailer is too long".into()),
        HeadError::Truncated => MitmError::Io("the body ended early".into()),
        HeadError::Io(e) => e.into(),
    }
}

/// Moves up to `left` bytes (all, for `None`) from `r` through the scrubber to `w`; with
/// `chunked`, each batch is written as a chunk. Returns the bytes read.
async fn pump<R, W>(
    r: &mut R,
    w: &mut W,
    left: Option<u64>,
    chunked: bool,
    scrub: &mut Scrubber<'_>,
    up: bool,
    counters: &MitmCounters,
) -> Result<(), MitmError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut left = left;
    let mut out = Vec::new();
    while left != Some(0) {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            if left.is_none() {
                return Ok(());
            }
            return Err(MitmError::Io("the body ended early".into()));
        }
        let take = match left {
            Some(n) => buf.len().min(usize::try_from(n).unwrap_or(usize::MAX)),
            None => buf.len(),
        };
        out.clear();
        scrub.push(&buf[..take], &mut out);
        r.consume(take);
        left = left.map(|n| n - take as u64);
        if chunked {
            send_chunk(w, &out, up, counters).await?;
        } else {
            send(w, &out, up, counters).await?;
        }
    }
    Ok(())
}

/// The size of a chunk from its line (`1a2b;ext\r\n`).
fn chunk_size(line: &[u8]) -> Result<u64, MitmError> {
    let text = std::str::from_utf8(line).unwrap_or("");
    let digits = text.split(';').next().unwrap_or("").trim();
    if digits.is_empty() || digits.len() > 15 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(MitmError::Io("a malformed chunk size line".into()));
    }
    u64::from_str_radix(digits, 16).map_err(|_| MitmError::Io("a malformed chunk size".into()))
}

/// Streams one body from `r` to `w` by `framing`, masking `needle` (empty: none). A chunked
/// body is re-chunked (trailers are dropped); the others keep their length.
pub(crate) async fn copy_body<R, W>(
    r: &mut R,
    w: &mut W,
    framing: Framing,
    needle: &[u8],
    up: bool,
    counters: &MitmCounters,
) -> Result<(), MitmError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut scrub = Scrubber::new(needle);
    let mut tail = Vec::new();
    match framing {
        Framing::None => return Ok(()),
        Framing::Length(n) => pump(r, w, Some(n), false, &mut scrub, up, counters).await?,
        Framing::UntilClose => pump(r, w, None, false, &mut scrub, up, counters).await?,
        Framing::Chunked => {
            loop {
                let mut line = Vec::new();
                if read_line(r, &mut line, MAX_LINE).await.map_err(body_err)? == 0 {
                    return Err(MitmError::Io("the body ended early".into()));
                }
                let size = chunk_size(&line)?;
                if size == 0 {
                    break;
                }
                pump(r, w, Some(size), true, &mut scrub, up, counters).await?;
                line.clear();
                read_line(r, &mut line, MAX_LINE).await.map_err(body_err)?;
                if !is_empty_line(&line) {
                    return Err(MitmError::Io("a chunk is longer than its size".into()));
                }
            }
            for _ in 0..=MAX_TRAILERS {
                let mut line = Vec::new();
                read_line(r, &mut line, MAX_LINE).await.map_err(body_err)?;
                if line.is_empty() || is_empty_line(&line) {
                    scrub.finish(&mut tail);
                    send_chunk(w, &tail, up, counters).await?;
                    return send(w, b"0\r\n\r\n", up, counters).await;
                }
            }
            return Err(MitmError::Io("too many trailer lines".into()));
        }
    }
    scrub.finish(&mut tail);
    send(w, &tail, up, counters).await
}

fn status_text(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        405 => "Method Not Allowed",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

/// Answers the sandbox with `status` and `reason` (our words only) and closes; best effort.
pub(crate) async fn refuse<W: AsyncWrite + Unpin>(
    w: &mut W,
    status: u16,
    reason: &str,
    counters: &MitmCounters,
) {
    let body = format!("sandboxd egress proxy: {reason}\n");
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\nX-Sandboxd-Egress: refused\r\n\r\n",
        status_text(status),
        body.len()
    );
    let _ = send(w, format!("{head}{body}").as_bytes(), false, counters).await;
    let _ = w.shutdown().await;
}
