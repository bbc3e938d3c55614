//! FramedProcess: request/response frames over a spawned in-sandbox helper's stdin/stdout.
//!
//! Used by the file helper and the python driver. A frame is
//! `b"SBX1" | u32 BE header length | JSON header | u32 BE body length | body`, so output a
//! user program prints can never be read as protocol, and binary bodies need no escaping.
//! The helper's stdout pipe is writable by any process of the sandbox user
//! (/proc/PID/fd/1), so frames are parsed as hostile input: bounded, checked, never trusted
//! to be well formed.

use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use super::output::CappedBuffer;
use super::{AttachedProcess, OutputChunk, SandboxError};

const MAGIC: &[u8; 4] = b"SBX1";
const MAX_HEADER: usize = 1 << 20;

pub struct FramedProcess {
    name: String,
    process: AttachedProcess,
    buf: BytesMut,
    stderr: CappedBuffer,
    max_body: usize,
    broken: bool,
}

impl FramedProcess {
    pub fn new(name: impl Into<String>, process: AttachedProcess, max_body: usize) -> Self {
        Self {
            name: name.into(),
            process,
            buf: BytesMut::new(),
            stderr: CappedBuffer::new(8 * 1024),
            max_body,
            broken: false,
        }
    }

    /// False once the helper exited or desynchronized; such a process must be replaced.
    pub fn is_usable(&self) -> bool {
        !self.broken
    }

    pub async fn send(&mut self, header: &Value, body: &[u8]) -> Result<(), SandboxError> {
        let header = serde_json::to_vec(header).map_err(|e| self.protocol(e.to_string()))?;
        let mut frame = Vec::with_capacity(12 + header.len() + body.len());
        frame.extend_from_slice(MAGIC);
        frame.extend_from_slice(&(header.len() as u32).to_be_bytes());
        frame.extend_from_slice(&header);
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(body);
        let res = async {
            self.process.stdin.write_all(&frame).await?;
            self.process.stdin.flush().await
        }
        .await;
        res.map_err(|e| {
            self.broken = true;
            self.protocol(format!("cannot write to the helper: {e}"))
        })
    }

    /// Reads the next frame. Cancel-safe: bytes read so far stay buffered.
    pub async fn recv(&mut self) -> Result<(Value, Bytes), SandboxError> {
        loop {
            if let Some(frame) = self.try_parse()? {
                return Ok(frame);
            }
            match self.process.output.next().await {
                Some(Ok(OutputChunk::Stdout(b))) => self.buf.extend_from_slice(&b),
                Some(Ok(OutputChunk::Stderr(b))) => self.stderr.push(&b),
                Some(Err(e)) => {
                    self.broken = true;
                    return Err(e);
                }
                None => {
                    self.broken = true;
                    let stderr = std::mem::replace(&mut self.stderr, CappedBuffer::new(0));
                    let (tail, _) = stderr.finish();
                    let tail = String::from_utf8_lossy(&tail);
                    return Err(self.protocol(format!(
                        "the helper exited; its last words: {}",
                        if tail.trim().is_empty() {
                            "(none)"
                        } else {
                            tail.trim()
                        }
                    )));
                }
            }
        }
    }

    /// The helper's exit code once it has exited (None while it runs or when unknown).
    pub async fn exit_code(self) -> Option<i64> {
        (self.process.exit_code)().await
    }

    pub async fn call(
        &mut self,
        header: &Value,
        body: &[u8],
    ) -> Result<(Value, Bytes), SandboxError> {
        self.send(header, body).await?;
        self.recv().await
    }

    fn try_parse(&mut self) -> Result<Option<(Value, Bytes)>, SandboxError> {
        if self.buf.len() < 8 {
            return Ok(None);
        }
        if &self.buf[..4] != MAGIC {
            self.broken = true;
            let start = String::from_utf8_lossy(&self.buf[..self.buf.len().min(40)]).into_owned();
            return Err(self.protocol(format!(
                "unexpected bytes on the protocol channel: {start:?}"
            )));
        }
        let hlen =
            u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]) as usize;
        if hlen > MAX_HEADER {
            self.broken = true;
            return Err(self.protocol(format!("header of {hlen} bytes is over the limit")));
        }
        if self.buf.len() < 8 + hlen + 4 {
            return Ok(None);
        }
        let b = 8 + hlen;
        let blen = u32::from_be_bytes([
            self.buf[b],
            self.buf[b + 1],
            self.buf[b + 2],
            self.buf[b + 3],
        ]) as usize;
        if blen > self.max_body {
            self.broken = true;
            return Err(self.protocol(format!(
                "body of {blen} bytes is over the limit of {}",
                self.max_body
            )));
        }
        if self.buf.len() < b + 4 + blen {
            self.buf.reserve(b + 4 + blen - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(8);
        let header = self.buf.split_to(hlen);
        self.buf.advance(4);
        let body = self.buf.split_to(blen).freeze();
        let header: Value = serde_json::from_slice(&header).map_err(|e| {
            self.broken = true;
            self.protocol(format!("header is not JSON: {e}"))
        })?;
        Ok(Some((header, body)))
    }

    fn protocol(&self, message: String) -> SandboxError {
        SandboxError::Protocol {
            helper: self.name.clone(),
            message,
        }
    }
}
