//! The multiplexed channel to the in-container egress helper: one spawned process, many
//! connections.
//!
//! Three parts: the writer task owns the helper's stdin and writes frames in batches; the
//! demux task reads the helper's stdout, checks every frame (known type, known connection,
//! within the credit it was given, at most `max_open` connections) and hands each
//! connection's bytes to its `ConnIo`; the proxy serves each `ConnIo` in a task of its own.
//! The demux never waits on anything but the helper, so a slow connection cannot stall the
//! others, and every queue is bounded by the credit windows (see frame.rs): a connection's
//! inbound queue holds at most `WINDOW` bytes because the helper may not send more before the
//! host gives credit back, which it does only after the bytes left for the destination.
//! Anything out of protocol ends the channel: every connection sees its queue close.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::frame::{self, Decoder, Frame};
use crate::sandbox::{OutputChunk, SandboxError};

/// How much of the helper's stderr is kept.
const STDERR_TAIL: usize = 2048;

/// What the demux hands a connection.
#[derive(Debug)]
pub(crate) enum Inbound {
    Data(Bytes),
    /// The client will send no more (it shut down its writing side).
    Eof,
}

/// One connection's end of the channel.
pub(crate) struct ConnIo {
    /// Bytes from the client; closed when the client aborted or the channel ended.
    pub(crate) rx: mpsc::UnboundedReceiver<Inbound>,
    pub(crate) ctl: ConnCtl,
    table: Arc<Table>,
}

/// The sending half of a connection (apart from `rx`, so both can be borrowed at once).
pub(crate) struct ConnCtl {
    pub(crate) id: u32,
    /// Bytes the host may still send towards the client (the helper's credit).
    down_credit: Arc<Semaphore>,
    up_credit: Arc<AtomicUsize>,
    out: mpsc::UnboundedSender<Bytes>,
}

impl ConnCtl {
    /// Sends bytes to the client, waiting for credit; false once the channel is gone.
    pub(crate) async fn send(&self, mut data: &[u8]) -> bool {
        while !data.is_empty() {
            let n = data.len().min(frame::MAX_PAYLOAD);
            match self.down_credit.acquire_many(n as u32).await {
                Ok(permit) => permit.forget(),
                Err(_) => return false,
            }
            if self
                .out
                .send(frame::encode(self.id, frame::DATA, &data[..n]))
                .is_err()
            {
                return false;
            }
            data = &data[n..];
        }
        true
    }

    /// Sends a `frame::data_buf` (at most one frame's payload) to the client, waiting for
    /// credit; false once the channel is gone.
    pub(crate) async fn send_data(&self, buf: BytesMut) -> bool {
        let n = frame::payload_len(&buf);
        match self.down_credit.acquire_many(n as u32).await {
            Ok(permit) => permit.forget(),
            Err(_) => return false,
        }
        self.out.send(frame::seal(self.id, buf)).is_ok()
    }

    /// Tells the client no more bytes come (the destination closed its side).
    pub(crate) fn send_eof(&self) {
        let _ = self.out.send(frame::encode(self.id, frame::EOF, b""));
    }

    /// Gives the helper back `n` bytes of credit: they left for the destination.
    pub(crate) fn grant(&self, n: usize) {
        if n == 0 {
            return;
        }
        // Raised before the frame goes out, so the helper's next DATA always finds it.
        self.up_credit.fetch_add(n, Ordering::AcqRel);
        let _ = self.out.send(frame::credit(self.id, n as u32));
    }
}

impl Drop for ConnIo {
    /// Every connection ends with the host's CLOSE, however its task ended.
    fn drop(&mut self) {
        self.table.remove(self.ctl.id);
        let _ = self
            .ctl
            .out
            .send(frame::encode(self.ctl.id, frame::CLOSE, b""));
    }
}

struct Entry {
    tx: mpsc::UnboundedSender<Inbound>,
    up_credit: Arc<AtomicUsize>,
    down_credit: Arc<Semaphore>,
}

/// The live connections, shared by the demux and the `ConnIo`s (which remove themselves).
#[derive(Default)]
struct Table {
    live: Mutex<HashMap<u32, Entry>>,
}

impl Table {
    fn remove(&self, id: u32) {
        if let Ok(mut live) = self.live.lock() {
            live.remove(&id);
        }
    }

    /// Ends every connection: queues close, credit waits fail.
    fn clear(&self) {
        if let Ok(mut live) = self.live.lock() {
            for (_, e) in live.drain() {
                e.down_credit.close();
            }
        }
    }
}

/// What the demux produces for the proxy.
pub(crate) enum Event {
    Open(ConnIo),
    /// The helper refused a connection itself (it was at its `--max`).
    Refused,
}

/// Reads frames from the helper until it ends or breaks the protocol. Returns why it ended.
pub(crate) struct Demux {
    pub(crate) output: BoxStream<'static, Result<OutputChunk, SandboxError>>,
    pub(crate) decoder: Decoder,
    pub(crate) out: mpsc::UnboundedSender<Bytes>,
    pub(crate) max_open: usize,
    /// The end of the helper's stderr (its last words when it fails to start).
    pub(crate) stderr: Vec<u8>,
    table: Arc<Table>,
    /// The highest id opened so far: a frame for a lower, closed id is in flight and dropped;
    /// one for a higher id that was never opened is a protocol error.
    highest: u32,
}

impl Demux {
    pub(crate) fn new(
        output: BoxStream<'static, Result<OutputChunk, SandboxError>>,
        out: mpsc::UnboundedSender<Bytes>,
        max_open: usize,
    ) -> Demux {
        Demux {
            output,
            decoder: Decoder::default(),
            out,
            max_open,
            stderr: Vec::new(),
            table: Arc::new(Table::default()),
            highest: 0,
        }
    }

    /// The next frame from the helper; Err with the reason when the channel is over.
    pub(crate) async fn next_frame(&mut self) -> Result<Frame, String> {
        loop {
            if let Some(f) = self.decoder.next()? {
                return Ok(f);
            }
            match self.output.next().await {
                Some(Ok(OutputChunk::Stdout(b))) => self.decoder.push(&b),
                Some(Ok(OutputChunk::Stderr(b))) => {
                    // Only the tail is kept: the sandbox can fill a stderr pipe at will.
                    self.stderr.extend_from_slice(&b);
                    let excess = self.stderr.len().saturating_sub(STDERR_TAIL);
                    self.stderr.drain(..excess);
                }
                Some(Err(e)) => return Err(format!("the helper's stream failed: {e}")),
                None => return Err("the helper exited".into()),
            }
        }
    }

    /// Serves frames until the channel ends or `stop`, sending new connections to `events`;
    /// then ends every connection.
    pub(crate) async fn run(
        &mut self,
        events: mpsc::UnboundedSender<Event>,
        stop: &CancellationToken,
    ) -> String {
        let why = loop {
            let next = tokio::select! {
                _ = stop.cancelled() => break "stopped".to_string(),
                f = self.next_frame() => f,
            };
            let f = match next {
                Ok(f) => f,
                Err(why) => break why,
            };
            if let Err(why) = self.handle(f, &events) {
                break format!("the helper broke the protocol: {why}");
            }
        };
        self.table.clear();
        why
    }

    fn handle(&mut self, f: Frame, events: &mpsc::UnboundedSender<Event>) -> Result<(), String> {
        match f.kind {
            frame::OPEN => {
                if f.id <= self.highest {
                    return Err(format!("connection id {} reused", f.id));
                }
                self.highest = f.id;
                let io = self.open(f.id)?;
                let _ = events.send(Event::Open(io));
                Ok(())
            }
            frame::REFUSED if f.id == 0 => {
                let _ = events.send(Event::Refused);
                Ok(())
            }
            frame::DATA | frame::EOF | frame::CLOSE | frame::CREDIT => self.for_conn(f),
            kind => Err(format!("a frame of type {kind} for connection {}", f.id)),
        }
    }

    fn open(&mut self, id: u32) -> Result<ConnIo, String> {
        let mut live = self
            .table
            .live
            .lock()
            .map_err(|_| "the table is poisoned")?;
        if live.len() >= self.max_open {
            return Err(format!("more than {} connections open", self.max_open));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let up_credit = Arc::new(AtomicUsize::new(frame::WINDOW));
        let down_credit = Arc::new(Semaphore::new(frame::WINDOW));
        live.insert(
            id,
            Entry {
                tx,
                up_credit: up_credit.clone(),
                down_credit: down_credit.clone(),
            },
        );
        Ok(ConnIo {
            rx,
            ctl: ConnCtl {
                id,
                down_credit,
                up_credit,
                out: self.out.clone(),
            },
            table: self.table.clone(),
        })
    }

    fn for_conn(&mut self, f: Frame) -> Result<(), String> {
        let mut live = self
            .table
            .live
            .lock()
            .map_err(|_| "the table is poisoned")?;
        let Some(entry) = live.get(&f.id) else {
            if f.id == 0 || f.id > self.highest {
                return Err(format!("a frame for connection {}, never opened", f.id));
            }
            return Ok(()); // closed here already; the frame was in flight
        };
        match f.kind {
            frame::DATA => {
                let n = f.payload.len();
                let within =
                    entry
                        .up_credit
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(n));
                if within.is_err() {
                    return Err(format!("connection {} sent past its credit", f.id));
                }
                let _ = entry.tx.send(Inbound::Data(f.payload));
            }
            frame::EOF => {
                let _ = entry.tx.send(Inbound::Eof);
            }
            frame::CLOSE => {
                // Dropping the sender closes the connection's queue: it ends as aborted.
                if let Some(e) = live.remove(&f.id) {
                    e.down_credit.close();
                }
            }
            _ => {
                let n = frame::credit_of(&f.payload) as usize;
                if entry.down_credit.available_permits().saturating_add(n) > frame::WINDOW {
                    return Err(format!("connection {} gave credit it was never owed", f.id));
                }
                entry.down_credit.add_permits(n);
            }
        }
        Ok(())
    }
}

/// Frames at least this long are written as they are, not copied into a batch.
const DIRECT: usize = 16 * 1024;
/// The most bytes of small frames gathered into one write.
const BATCH: usize = 256 * 1024;

/// Writes queued frames to the helper's stdin until the queue closes or `stop` is cancelled;
/// then closes stdin, which makes the helper exit. Small frames (credit, control, short data)
/// are gathered into one write; a large DATA frame goes out without another copy.
pub(crate) async fn write_frames(
    mut stdin: std::pin::Pin<Box<dyn AsyncWrite + Send>>,
    mut rx: mpsc::UnboundedReceiver<Bytes>,
    stop: CancellationToken,
) {
    let mut batch = BytesMut::new();
    'run: loop {
        let first = tokio::select! {
            _ = stop.cancelled() => break,
            f = rx.recv() => f,
        };
        let mut next = first;
        if next.is_none() {
            break;
        }
        while let Some(f) = next.take() {
            if f.len() >= DIRECT {
                let flushed = put(&mut stdin, &batch, &stop).await;
                batch.clear();
                if flushed.is_err() || put(&mut stdin, &f, &stop).await.is_err() {
                    break 'run;
                }
            } else {
                batch.extend_from_slice(&f);
            }
            if batch.len() < BATCH {
                next = rx.try_recv().ok();
            }
        }
        let flushed = put(&mut stdin, &batch, &stop).await;
        batch.clear();
        if flushed.is_err() {
            break;
        }
    }
    stop.cancel();
    let _ = stdin.shutdown().await;
}

/// One write of `bytes` (none when empty), given up when `stop` is cancelled.
async fn put(
    stdin: &mut std::pin::Pin<Box<dyn AsyncWrite + Send>>,
    bytes: &[u8],
    stop: &CancellationToken,
) -> Result<(), ()> {
    if bytes.is_empty() {
        return Ok(());
    }
    tokio::select! {
        _ = stop.cancelled() => Err(()),
        r = async { stdin.write_all(bytes).await?; stdin.flush().await } => r.map_err(|_| ()),
    }
}
