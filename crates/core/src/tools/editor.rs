//! str_replace_editor: view, create and edit text files inside the session's sandbox, with a
//! per-file undo history that lives as long as the tool (one tool per session).
//!
//! It keeps OpenManus's contract (view / create / str_replace / insert / undo_edit, `cat -n`
//! output, a snippet of the edited region, 16,000-character clipping) without its bugs: tabs
//! are never expanded, CRLF files keep their line endings, undoing a create removes the file,
//! and every file access goes through the Sandbox trait, never the host filesystem.

mod text;
mod undo;
mod view;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::{Mutex, MutexGuard};

use super::{Tool, ToolContext, ToolError, ToolResult, arg_str};
use crate::sandbox::{ExecRequest, FileKind, FileStat, Sandbox, SandboxError};
use text::DecodeError;
use undo::{History, remember};

pub const NAME: &str = "str_replace_editor";

pub struct StrReplaceEditor {
    sandbox: Arc<dyn Sandbox>,
    history: Mutex<History>,
    max_file_bytes: u64,
    /// Where a kept session's history is saved for later processes.
    saved: Option<super::saved::SavedTools>,
    /// Whether what an earlier process saved was read (on first use, under the lock).
    restored: AtomicBool,
}

/// Why a command did not run: something the model can fix, or a sandbox failure.
enum Fail {
    Model(String),
    Sandbox(SandboxError),
}

impl From<SandboxError> for Fail {
    fn from(e: SandboxError) -> Self {
        Fail::Sandbox(e)
    }
}

type Outcome = Result<String, Fail>;

fn model<T>(message: impl Into<String>) -> Result<T, Fail> {
    Err(Fail::Model(message.into()))
}

impl StrReplaceEditor {
    pub fn new(sandbox: Arc<dyn Sandbox>, max_file_bytes: u64) -> Self {
        Self {
            sandbox,
            history: Mutex::new(HashMap::new()),
            max_file_bytes,
            saved: None,
            restored: AtomicBool::new(false),
        }
    }

    /// Keeps the history in `saved` too, starting from what an earlier process left there
    /// (read on first use).
    pub fn with_saved(mut self, saved: super::saved::SavedTools) -> Self {
        self.saved = Some(saved);
        self
    }

    /// The history, locked; a kept session's is first restored from its record, once.
    async fn history(&self) -> MutexGuard<'_, History> {
        let mut history = self.history.lock().await;
        if let Some(saved) = &self.saved
            && !self.restored.swap(true, Ordering::AcqRel)
            && let Some(record) = saved.load::<undo::Saved>(undo::RECORD).await
        {
            *history = undo::from_saved(record);
        }
        history
    }

    /// Saves the history for a later process (kept sessions only), under the history's lock
    /// so that the record follows the order of the edits.
    async fn persist(&self, history: &History) {
        if let Some(saved) = &self.saved {
            saved.save(undo::RECORD, &undo::to_saved(history)).await;
        }
    }

    /// Stats `path`; a symlink is followed to its target, which is what gets read and edited.
    async fn locate(&self, path: &str) -> Result<(String, FileStat), Fail> {
        let st = self.sandbox.stat(path).await?;
        if st.kind != FileKind::Symlink {
            return Ok((path.to_string(), st));
        }
        // Rare, so one exec (~70 ms) is fine; the path is an argv element, never shell text.
        let req = ExecRequest::new(["realpath", "-e", "--", path]).timeout(Duration::from_secs(10));
        let out = self.sandbox.exec(req).await?;
        let stdout = out.stdout_lossy();
        let target = stdout.strip_suffix('\n').unwrap_or(&stdout);
        if !out.success() || !target.starts_with('/') {
            return model(format!(
                "{path} is a symbolic link whose target does not exist"
            ));
        }
        let st = self.sandbox.stat(target).await?;
        Ok((target.to_string(), st))
    }

    fn too_large(&self, path: &str, size: u64) -> Fail {
        Fail::Model(format!(
            "{path} is {size} bytes, over the editor's cap of {} bytes; look at parts of it with \
             `grep -n` or `sed -n 'START,ENDp'` in bash, and change it with sed or python",
            self.max_file_bytes
        ))
    }

    /// Reads a regular file as text, refusing files over the cap, binary and non-UTF-8 files.
    async fn read_text(&self, path: &str, st: &FileStat) -> Result<String, Fail> {
        if st.size > self.max_file_bytes {
            return Err(self.too_large(path, st.size));
        }
        let bytes = self.sandbox.read_file(path).await?;
        if bytes.len() as u64 > self.max_file_bytes {
            return Err(self.too_large(path, bytes.len() as u64));
        }
        text::decode(bytes).map_err(|e| {
            Fail::Model(match e {
                DecodeError::Binary => format!(
                    "{path} looks like a binary file (NUL bytes or invalid UTF-8 in its first 8 KiB); the \
                     editor handles text only: inspect it with `file` or `xxd | head` in bash"
                ),
                DecodeError::NotUtf8 { offset, line } => format!(
                    "{path} is not valid UTF-8 (first bad byte at offset {offset}, line {line}); the editor \
                     handles UTF-8 text only: convert it with iconv or edit it with python in bash"
                ),
            })
        })
    }

    /// The target and text of an existing regular file about to be edited.
    async fn open_for_edit(&self, path: &str, command: &str) -> Result<(String, String), Fail> {
        let (target, st) = self.locate(path).await?;
        match st.kind {
            FileKind::File => {}
            FileKind::Dir => {
                return model(format!(
                    "{path} is a directory; {command} works on files (view lists a directory)"
                ));
            }
            _ => return model(format!("{path} is not a regular file")),
        }
        let text = self.read_text(&target, &st).await?;
        Ok((target, text))
    }

    /// Writes an edit and remembers what it replaced.
    async fn commit(
        &self,
        history: &mut History,
        target: &str,
        before: Option<Vec<u8>>,
        after: &[u8],
    ) -> Result<(), Fail> {
        if after.len() as u64 > self.max_file_bytes {
            return model(format!(
                "the edit would make {target} {} bytes, over the editor's cap of {} bytes; nothing was changed",
                after.len(),
                self.max_file_bytes
            ));
        }
        self.sandbox.write_file(target, after).await?;
        remember(history, target, before);
        self.persist(history).await;
        Ok(())
    }

    async fn create(&self, path: &str, args: &Value) -> Outcome {
        let file_text = required(args, "file_text", "create")?;
        if file_text.len() as u64 > self.max_file_bytes {
            return Err(self.too_large("file_text", file_text.len() as u64));
        }
        let mut history = self.history().await;
        match self.sandbox.stat(path).await {
            Ok(st) if st.kind == FileKind::Dir => {
                return model(format!(
                    "{path} is a directory; give the path of the new file inside it"
                ));
            }
            Ok(_) => {
                return model(format!(
                    "{path} already exists and create never overwrites a file: change it with str_replace \
                     or insert, or remove it first (rm in bash) and create it again"
                ));
            }
            Err(SandboxError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if let Some((parent, _)) = path.rsplit_once('/')
            && !parent.is_empty()
        {
            self.sandbox.mkdir(parent).await?;
        }
        self.commit(&mut history, path, None, file_text.as_bytes())
            .await?;
        Ok(format!(
            "File created successfully at: {path} ({} lines)",
            text::line_count(file_text)
        ))
    }

    async fn str_replace(&self, path: &str, args: &Value) -> Outcome {
        let old = required(args, "old_str", "str_replace")?;
        if old.is_empty() {
            return model(
                "old_str is empty; give the exact text to replace, with enough surrounding lines to make it unique",
            );
        }
        let new = arg_str(args, "new_str").unwrap_or("");
        let mut history = self.history().await;
        let (target, text) = self.open_for_edit(path, "str_replace").await?;
        let eol = text::detect_eol(&text);
        // Match in the file's own line endings first; a mixed file may still match as sent.
        let old_eol = text::to_eol(old, eol);
        let mut found = text::occurrences(&text, &old_eol);
        let (old, new) = if found.is_empty() && old_eol != old {
            found = text::occurrences(&text, old);
            (Cow::Borrowed(old), Cow::Borrowed(new))
        } else {
            (old_eol, text::to_eol(new, eol))
        };
        let at = match found.as_slice() {
            [] => {
                return model(format!(
                    "old_str was not found in {path}; it must match the file exactly, whitespace, tabs and \
                     indentation included: view the lines first and copy them"
                ));
            }
            [at] => *at,
            many => return model(ambiguous(path, &text, many)),
        };
        let mut updated = String::with_capacity(text.len() - old.len() + new.len());
        updated.push_str(&text[..at]);
        updated.push_str(&new);
        updated.push_str(&text[at + old.len()..]);
        self.commit(
            &mut history,
            &target,
            Some(text.into_bytes()),
            updated.as_bytes(),
        )
        .await?;
        let first = text::line_of(&updated, at);
        let last = text::line_of(&updated, at + new.len().saturating_sub(1));
        Ok(edited(path, &text::snippet(&updated, first, last)))
    }

    async fn insert(&self, path: &str, args: &Value) -> Outcome {
        let Some(line) = args.get("insert_line").filter(|v| !v.is_null()) else {
            return model(
                "the insert command needs the parameter insert_line (0 inserts at the top)",
            );
        };
        let new = required(args, "new_str", "insert")?;
        let mut history = self.history().await;
        let (target, text) = self.open_for_edit(path, "insert").await?;
        let n = text::line_count(&text);
        let after = match line.as_i64() {
            Some(l) if l >= 0 && l as u64 <= n as u64 => l as usize,
            _ => {
                return model(format!(
                    "insert_line {line} is out of range: {path} has {n} lines, so insert_line must be within \
                     [0, {n}] (0 inserts at the top, {n} after the last line)"
                ));
            }
        };
        let eol = text::detect_eol(&text);
        let (updated, first, last) = text::insert_lines(&text, after, new, eol);
        self.commit(
            &mut history,
            &target,
            Some(text.into_bytes()),
            updated.as_bytes(),
        )
        .await?;
        Ok(edited(path, &text::snippet(&updated, first, last)))
    }
}

fn required<'a>(args: &'a Value, key: &str, command: &str) -> Result<&'a str, Fail> {
    arg_str(args, key)
        .ok_or_else(|| Fail::Model(format!("the {command} command needs the parameter {key}")))
}

fn edited(path: &str, snippet: &str) -> String {
    format!(
        "The file {path} has been edited. Here's the result of running `cat -n` on a snippet of {path}:\n\
         {snippet}\nReview the changes and make sure they are as expected (indentation, no duplicated or \
         missing lines); edit the file again if necessary."
    )
}

fn ambiguous(path: &str, text: &str, offsets: &[usize]) -> String {
    let lines = text::lines_of(text, offsets);
    let mut listed: Vec<String> = lines.iter().take(20).map(usize::to_string).collect();
    if lines.len() > 20 {
        listed.push("…".into());
    }
    let count = if offsets.len() >= 100 {
        "at least 100".to_string()
    } else {
        offsets.len().to_string()
    };
    format!(
        "old_str occurs {count} times in {path}, at lines {}; include more surrounding lines so that it \
         matches exactly once",
        listed.join(", ")
    )
}

/// The model's path, absolute and lexically normalized (so `/a/./b` and `/a/b` share history).
fn absolute_path(raw: &str) -> Result<String, String> {
    if raw.trim().is_empty() {
        return Err("the path is empty; give an absolute path such as /workspace/main.py".into());
    }
    if raw.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    if !raw.starts_with('/') {
        return Err(format!(
            "the path {raw:?} is not absolute; use an absolute path, e.g. /workspace/{}",
            raw.trim_start_matches("./")
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in raw.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

#[async_trait]
impl Tool for StrReplaceEditor {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "View, create and edit text files in the sandbox. Paths are absolute, e.g. /workspace/app.py.\n\
         * view: a file with line numbers (cat -n), or only view_range [start, end] (1-based, end -1 = to \
         the end); a directory: its entries two levels deep, hidden ones left out.\n\
         * create: writes file_text to a new file, creating parent directories; it never overwrites.\n\
         * str_replace: replaces old_str with new_str (omit new_str to delete). old_str must occur exactly \
         once and match exactly, whitespace and indentation included: add surrounding lines to make it unique.\n\
         * insert: inserts new_str as whole lines after line insert_line (0 = at the top).\n\
         * undo_edit: reverts this session's last edit of the file (undoing a create removes the file).\n\
         Tabs and line endings are kept as they are. Long output is cut: use view_range or grep -n."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
                    "description": "The operation to run."
                },
                "path": {"type": "string", "description": "Absolute path of the file or directory, e.g. /workspace/main.py."},
                "file_text": {"type": "string", "description": "create: the content of the new file."},
                "old_str": {"type": "string", "description": "str_replace: the exact text to replace; it must occur exactly once."},
                "new_str": {"type": "string", "description": "str_replace: the replacement (omitted = delete old_str). insert: the lines to insert."},
                "insert_line": {"type": "integer", "description": "insert: new_str goes after this line (0 = at the top)."},
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "minItems": 2,
                    "maxItems": 2,
                    "description": "view: [start, end] line numbers, 1-based; end -1 means to the end of the file."
                }
            },
            "required": ["command", "path"]
        })
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let command = arg_str(&args, "command").unwrap_or_default();
        let path = match absolute_path(arg_str(&args, "path").unwrap_or_default()) {
            Ok(p) => p,
            Err(message) => return Ok(ToolResult::error(message)),
        };
        let outcome = match command {
            "view" => self.view(&path, &args, ctx).await,
            "create" => self.create(&path, &args).await,
            "str_replace" => self.str_replace(&path, &args).await,
            "insert" => self.insert(&path, &args).await,
            "undo_edit" => self.undo(&path).await,
            other => model(format!(
                "unknown command {other:?}; use one of view, create, str_replace, insert, undo_edit"
            )),
        };
        match outcome {
            Ok(text) => Ok(ToolResult::ok(text::clip(text))),
            Err(Fail::Model(message)) => Ok(ToolResult::error(message)),
            Err(Fail::Sandbox(SandboxError::NotFound { path: missing })) => {
                Ok(ToolResult::error(format!(
                    "no such file or directory: {missing}; check the path (view a directory to list it) or make \
                 the file with create"
                )))
            }
            Err(Fail::Sandbox(e)) if e.is_fatal_for_session() => Err(ToolError::Sandbox(e)),
            Err(Fail::Sandbox(e)) => Ok(ToolResult::error(e.to_string())),
        }
    }
}
