//! Where a run's events go: the `EventSink` trait, a fan-out to several sinks, a sink that
//! keeps everything in memory, and the `Emitter` the loop uses to number and stamp events.
//!
//! A sink is awaited for every event, in order, before the loop goes on. That is the
//! backpressure: a sink that persists (SQLite) or feeds a bounded queue (the terminal, an
//! SSE broadcast) slows the run instead of buffering without bound. A sink that must never
//! slow the run keeps its own bounded queue and decides itself what to do when it is full.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::events::{Event, EventKind, FinishReason, ImageRef, TextDelta};
use crate::llm::{Message, Usage};

/// The bytes behind an `ImageRef`.
#[derive(Debug, Clone)]
pub struct Image {
    pub reference: ImageRef,
    pub data: Bytes,
}

impl Image {
    /// Wraps decoded image bytes; None unless they are a PNG or a JPEG.
    pub fn from_bytes(data: Bytes) -> Option<Image> {
        let media_type = if data.starts_with(b"\x89PNG\r\n\x1a\n") {
            "image/png"
        } else if data.starts_with(&[0xff, 0xd8, 0xff]) {
            "image/jpeg"
        } else {
            return None;
        };
        let id = format!("sha256:{}", hex::encode(Sha256::digest(&data)));
        Some(Image {
            reference: ImageRef {
                id,
                media_type: media_type.into(),
                bytes: data.len() as u64,
            },
            data,
        })
    }

    /// From a tool result's base64 (what tools hand the model).
    pub fn from_base64(b64: &str) -> Option<Image> {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        Image::from_bytes(Bytes::from(data))
    }

    /// The file name a store may use: the hash and an extension, nothing from outside.
    pub fn file_name(reference: &ImageRef) -> Option<String> {
        let hex = reference.id.strip_prefix("sha256:")?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let ext = match reference.media_type.as_str() {
            "image/png" => "png",
            "image/jpeg" => "jpg",
            _ => return None,
        };
        Some(format!("{hex}.{ext}"))
    }
}

/// What a run leaves behind, handed to sinks once at its end: the record a transcript or
/// a store keeps, including the conversation a later run continues.
#[derive(Debug, Clone)]
pub struct RunRecord {
    pub run_id: String,
    pub owner: String,
    pub session_id: String,
    pub model: String,
    pub task: String,
    pub reason: FinishReason,
    pub answer: Option<String>,
    pub steps: usize,
    pub usage: Usage,
    /// The whole conversation as the model saw it, system prompt first.
    pub messages: Vec<Message>,
}

#[async_trait]
pub trait EventSink: Send + Sync {
    /// One event, in sequence order; `image` carries the bytes of `ToolResult.image`.
    async fn event(&self, event: &Event, image: Option<&Image>);
    /// The run is over (after its `run_finished` event).
    async fn finished(&self, _record: &RunRecord) {}
    /// A piece of the answer being written (coalesced by the emitter): for live views only,
    /// never a record; sinks that keep events ignore it.
    async fn delta(&self, _delta: &TextDelta) {}
}

/// Sends every event to each sink in turn.
pub struct FanOut(pub Vec<Arc<dyn EventSink>>);

#[async_trait]
impl EventSink for FanOut {
    async fn event(&self, event: &Event, image: Option<&Image>) {
        for sink in &self.0 {
            sink.event(event, image).await;
        }
    }

    async fn finished(&self, record: &RunRecord) {
        for sink in &self.0 {
            sink.finished(record).await;
        }
    }

    async fn delta(&self, delta: &TextDelta) {
        for sink in &self.0 {
            sink.delta(delta).await;
        }
    }
}

/// Drops everything (a run nobody watches).
pub struct NullSink;

#[async_trait]
impl EventSink for NullSink {
    async fn event(&self, _event: &Event, _image: Option<&Image>) {}
}

/// Keeps every event, each image once, and the final record: for tests, benchmarks and
/// callers that want the whole run after it ended. Holds one run's worth (bounded by the
/// run's steps and the observation cap).
#[derive(Default)]
pub struct MemorySink {
    inner: Mutex<MemoryInner>,
}

#[derive(Default)]
struct MemoryInner {
    events: Vec<Event>,
    deltas: Vec<TextDelta>,
    images: HashMap<String, Bytes>,
    record: Option<RunRecord>,
}

impl MemorySink {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn events(&self) -> Vec<Event> {
        self.inner
            .lock()
            .map(|i| i.events.clone())
            .unwrap_or_default()
    }

    /// The answer pieces seen while the run was live.
    pub fn deltas(&self) -> Vec<TextDelta> {
        self.inner
            .lock()
            .map(|i| i.deltas.clone())
            .unwrap_or_default()
    }

    /// The bytes behind a reference, if this sink saw them.
    pub fn image(&self, reference: &ImageRef) -> Option<Bytes> {
        self.inner.lock().ok()?.images.get(&reference.id).cloned()
    }

    pub fn record(&self) -> Option<RunRecord> {
        self.inner.lock().ok()?.record.clone()
    }
}

#[async_trait]
impl EventSink for MemorySink {
    async fn event(&self, event: &Event, image: Option<&Image>) {
        if let Ok(mut inner) = self.inner.lock() {
            if let Some(img) = image {
                inner
                    .images
                    .entry(img.reference.id.clone())
                    .or_insert_with(|| img.data.clone());
            }
            inner.events.push(event.clone());
        }
    }

    async fn finished(&self, record: &RunRecord) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.record = Some(record.clone());
        }
    }

    async fn delta(&self, delta: &TextDelta) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.deltas.push(delta.clone());
        }
    }
}

/// Numbers and stamps the events of one run and hands them to its sink. Used from the
/// run's own task only, so `&mut self` keeps the numbering strictly sequential.
pub struct Emitter<'s> {
    run_id: String,
    started: Instant,
    seq: u64,
    sink: &'s dyn EventSink,
}

impl<'s> Emitter<'s> {
    pub fn new(run_id: String, sink: &'s dyn EventSink) -> Self {
        Self {
            run_id,
            started: Instant::now(),
            seq: 0,
            sink,
        }
    }

    pub async fn emit(&mut self, kind: EventKind) {
        self.emit_with(kind, None).await;
    }

    pub async fn emit_with(&mut self, kind: EventKind, image: Option<&Image>) {
        self.seq += 1;
        let event = Event {
            run_id: self.run_id.clone(),
            seq: self.seq,
            at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            elapsed_ms: self.started.elapsed().as_millis() as u64,
            kind,
        };
        self.sink.event(&event, image).await;
    }

    pub async fn finished(&self, record: &RunRecord) {
        self.sink.finished(record).await;
    }

    /// A piece of the answer of `step`, placed after the last event.
    pub async fn delta(&self, step: usize, text: String) {
        let delta = TextDelta {
            run_id: self.run_id.clone(),
            step,
            after_seq: self.seq,
            text,
        };
        self.sink.delta(&delta).await;
    }

    pub fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_are_numbered_from_one_and_images_kept_once() {
        let sink = MemorySink::new();
        let mut emitter = Emitter::new("r".into(), sink.as_ref());
        let png = Image::from_bytes(Bytes::from_static(b"\x89PNG\r\n\x1a\nrest")).unwrap();
        for _ in 0..3 {
            emitter
                .emit_with(
                    EventKind::Error {
                        message: "x".into(),
                    },
                    Some(&png),
                )
                .await;
        }
        let events = sink.events();
        assert_eq!(
            events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert!(chrono::DateTime::parse_from_rfc3339(&events[0].at).is_ok());
        assert_eq!(
            sink.image(&png.reference).as_deref(),
            Some(&b"\x89PNG\r\n\x1a\nrest"[..])
        );
        assert!(Image::from_bytes(Bytes::from_static(b"GIF89a")).is_none());
        assert!(Image::file_name(&png.reference).unwrap().ends_with(".png"));
        let mut bad = png.reference.clone();
        bad.id = "sha256:../../etc".into();
        assert!(Image::file_name(&bad).is_none());
    }
}
