//! The transcript of a run — every message and every event — saved as one JSON file,
//! `<data_dir>/runs/<run-id>.json`, so a run can be read back after the terminal is gone.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::events::{Event, FinishReason};
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

impl Transcript {
    /// Writes `<dir>/<run-id>.json` (through a temporary file, so a reader never sees half).
    pub fn save(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{}.json", self.run_id));
        let tmp = dir.join(format!(".{}.json.tmp", self.run_id));
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        // Tasks and tool output may hold secrets: readable by the owner only.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&text)?;
        drop(file);
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    pub fn load(path: &Path) -> std::io::Result<Transcript> {
        let text = std::fs::read(path)?;
        serde_json::from_slice(&text).map_err(std::io::Error::other)
    }
}
