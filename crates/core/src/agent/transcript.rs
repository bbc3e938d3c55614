//! Transcripts: every message and every event of a run, saved as one JSON file,
//! `<runs>/<run-id>.json`, by `TranscriptSink` (the loop itself writes nothing). Images are
//! stored once each, by content hash, under `<runs>/images/`; events refer to them. A small
//! pointer `<runs>/sessions/<session-id>.json` names the session's last run, which is how a
//! kept session's conversation comes back after sandboxd restarts.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::memory::paired_prefix;
use super::sink::{EventSink, Image, RunRecord};
use crate::datadir::{is_plain_id, write_private};
use crate::events::{Event, FinishReason, ImageRef};
use crate::llm::{Message, Usage};

#[derive(Debug, Serialize, Deserialize)]
pub struct Transcript {
    pub run_id: String,
    pub owner: String,
    pub session_id: String,
    pub model: String,
    pub task: String,
    pub reason: FinishReason,
    pub answer: Option<String>,
    pub steps: usize,
    pub usage: Usage,
    pub messages: Vec<Message>,
    pub events: Vec<Event>,
}

/// `<runs>/sessions/<id>.json`.
#[derive(Debug, Serialize, Deserialize)]
struct LastRun {
    run_id: String,
}

impl Transcript {
    /// Writes `<dir>/<run-id>.json` (through a temporary file, so a reader never sees half).
    pub fn save(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let path = dir.join(format!("{}.json", self.run_id));
        write_private(&path, &text)?;
        Ok(path)
    }

    pub fn load(path: &Path) -> std::io::Result<Transcript> {
        let text = std::fs::read(path)?;
        serde_json::from_slice(&text).map_err(std::io::Error::other)
    }
}

/// The bytes of an image a transcript refers to.
pub fn load_image(dir: &Path, reference: &ImageRef) -> std::io::Result<Vec<u8>> {
    let name = Image::file_name(reference)
        .ok_or_else(|| std::io::Error::other("not an image reference sandboxd makes"))?;
    std::fs::read(dir.join("images").join(name))
}

/// The conversation of `session_id`'s last run, if a transcript of it (of this owner) is
/// in `dir`: messages after the system prompt, cut before any unanswered tool call.
pub fn last_conversation(dir: &Path, session_id: &str, owner: &str) -> Option<Vec<Message>> {
    if !is_plain_id(session_id) {
        return None;
    }
    let pointer = std::fs::read(dir.join("sessions").join(format!("{session_id}.json"))).ok()?;
    let last: LastRun = serde_json::from_slice(&pointer).ok()?;
    if !is_plain_id(&last.run_id) {
        return None;
    }
    let t = Transcript::load(&dir.join(format!("{}.json", last.run_id))).ok()?;
    if t.session_id != session_id || t.owner != owner {
        return None;
    }
    Some(paired_prefix(t.messages))
}

/// Collects a run's events and writes its transcript when the run is over.
pub struct TranscriptSink {
    dir: PathBuf,
    events: Mutex<Vec<Event>>,
    saved: Mutex<Option<PathBuf>>,
}

impl TranscriptSink {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            events: Mutex::new(Vec::new()),
            saved: Mutex::new(None),
        }
    }

    /// Where the transcript went, once the run is over (None if it could not be written).
    pub fn path(&self) -> Option<PathBuf> {
        self.saved.lock().ok()?.clone()
    }

    fn save(&self, record: &RunRecord) -> std::io::Result<PathBuf> {
        let t = Transcript {
            run_id: record.run_id.clone(),
            owner: record.owner.clone(),
            session_id: record.session_id.clone(),
            model: record.model.clone(),
            task: record.task.clone(),
            reason: record.reason.clone(),
            answer: record.answer.clone(),
            steps: record.steps,
            usage: record.usage,
            messages: record.messages.clone(),
            events: self.events.lock().map(|e| e.clone()).unwrap_or_default(),
        };
        let path = t.save(&self.dir)?;
        if is_plain_id(&record.session_id) {
            let pointer = serde_json::to_vec(&LastRun {
                run_id: record.run_id.clone(),
            })
            .map_err(std::io::Error::other)?;
            let name = format!("{}.json", record.session_id);
            write_private(&self.dir.join("sessions").join(name), &pointer)?;
        }
        Ok(path)
    }
}

#[async_trait]
impl EventSink for TranscriptSink {
    async fn event(&self, event: &Event, image: Option<&Image>) {
        if let Some(img) = image
            && let Some(name) = Image::file_name(&img.reference)
        {
            let path = self.dir.join("images").join(name);
            // Content-addressed: an image already there is the same bytes.
            if !path.exists()
                && let Err(e) = write_private(&path, &img.data)
            {
                tracing::warn!(error = %e, "cannot save an image of the transcript");
            }
        }
        if let Ok(mut events) = self.events.lock() {
            events.push(event.clone());
        }
    }

    async fn finished(&self, record: &RunRecord) {
        match self.save(record) {
            Ok(path) => {
                if let Ok(mut saved) = self.saved.lock() {
                    *saved = Some(path);
                }
            }
            Err(e) => {
                tracing::warn!(run = %record.run_id, error = %e, "cannot save the transcript")
            }
        }
    }
}
