//! Bodies of transfers, kept off the heap: an upload's body is read in bounded pieces into an
//! unlinked spool file (a small one stays in memory), and a download is streamed out of one.
//!
//! Only up to `INLINE_MAX` bytes of one request are ever in memory; the rest is in a file of
//! `Transfers::spool_file`, which the transfer's permit bounds in number.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, header};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{ApiError, ErrorCode};
use crate::transfers::{TransferPermit, Transfers};

/// Bodies and files up to this size travel in memory (and through the file helper, ~1 ms);
/// bigger ones through a spool file and a streamed process (~70 ms more).
pub const INLINE_MAX: usize = 1 << 20;
/// One read of a spool file into a response.
const CHUNK: usize = 256 << 10;

/// An upload's body, read whole.
pub enum Spooled {
    Memory(Bytes),
    /// A spool file holding `len` bytes from its start.
    File {
        file: File,
        len: u64,
    },
}

impl Spooled {
    /// How many bytes the body has.
    pub fn size(&self) -> u64 {
        match self {
            Spooled::Memory(b) => b.len() as u64,
            Spooled::File { len, .. } => *len,
        }
    }
}

/// The body size the client announced (Content-Length), if any.
pub fn declared_len(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The answer to a body over `[server] upload_limit_mb`.
pub fn over_limit() -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        "the request body is over the limit ([server] body_limit_kb for JSON, upload_limit_mb for uploads)",
    )
}

fn spool_error(e: std::io::Error) -> ApiError {
    ApiError::internal(format!("cannot write the upload to its spool file: {e}"))
}

/// Reads `body` whole, refusing it past `limit` bytes: in memory up to `INLINE_MAX`, else
/// into a spool file of `transfers`.
pub async fn read_body(body: Body, limit: u64, transfers: &Transfers) -> Result<Spooled, ApiError> {
    let mut stream = body.into_data_stream();
    let mut head = BytesMut::new();
    let mut file: Option<tokio::fs::File> = None;
    let mut len: u64 = 0;
    let mut spool = None;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::invalid(format!("cannot read the request body: {e}")))?;
        len += chunk.len() as u64;
        if len > limit {
            return Err(over_limit());
        }
        if file.is_none() {
            if head.len() + chunk.len() <= INLINE_MAX {
                head.extend_from_slice(&chunk);
                continue;
            }
            let std = transfers.spool_file()?;
            let mut f = tokio::fs::File::from_std(std.try_clone().map_err(spool_error)?);
            f.write_all(&head).await.map_err(spool_error)?;
            head = BytesMut::new();
            spool = Some(std);
            file = Some(f);
        }
        if let Some(f) = file.as_mut() {
            f.write_all(&chunk).await.map_err(spool_error)?;
        }
    }
    match (file, spool) {
        (Some(mut f), Some(mut std)) => {
            f.flush().await.map_err(spool_error)?;
            drop(f);
            std.seek(SeekFrom::Start(0)).map_err(spool_error)?;
            Ok(Spooled::File { file: std, len })
        }
        _ => Ok(Spooled::Memory(head.freeze())),
    }
}

/// A response body of the first `len` bytes of `file`, read from its start in pieces. The
/// permit is held until the body ends or the client goes away; a body still being read after
/// `deadline` ends with an error, so a client that reads slowly cannot hold its place (and the
/// spool file) for ever. (One that stops reading altogether is not polled at all: the
/// connection's own timeouts end it.)
pub fn file_body(file: File, len: u64, permit: TransferPermit, deadline: Duration) -> Body {
    let mut file = file;
    let start = file.seek(SeekFrom::Start(0));
    let until = tokio::time::Instant::now() + deadline;
    let state = (tokio::fs::File::from_std(file), len, permit, start.err());
    let stream = futures::stream::unfold(Some(state), move |state| async move {
        let (mut f, left, permit, err) = state?;
        if let Some(e) = err {
            return Some((Err(e), None));
        }
        if left == 0 {
            return None;
        }
        if tokio::time::Instant::now() >= until {
            let late = std::io::Error::other("the transfer outlived its time limit");
            return Some((Err(late), None));
        }
        let mut buf = vec![0u8; (left as usize).min(CHUNK)];
        let read = tokio::time::timeout_at(until, f.read(&mut buf)).await;
        match read {
            Ok(Ok(0)) => Some((
                Err(std::io::Error::other("the spool file ended early")),
                None,
            )),
            Ok(Ok(n)) => {
                buf.truncate(n);
                let next = (f, left - n as u64, permit, None);
                Some((Ok(Bytes::from(buf)), Some(next)))
            }
            Ok(Err(e)) => Some((Err(e), None)),
            Err(_) => Some((
                Err(std::io::Error::other(
                    "the transfer outlived its time limit",
                )),
                None,
            )),
        }
    });
    Body::from_stream(stream)
}
