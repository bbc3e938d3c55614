//! read_file, write_file and list_dir: whole-file access to the session's sandbox through
//! the in-container file helper (~1 ms a call). Paths are resolved inside the container
//! (relative ones against /workspace); nothing here touches the host filesystem.
//!
//! The MCP server offers these three (server_tools in session.rs); the agent has bash, python
//! and the editor for files instead, and sees an image file through view_image
//! (view_image.rs), which shares `image_result` with read_file.

use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine as _;
use serde_json::{Value, json};

use super::{MAX_IMAGE_BYTES, Tool, ToolContext, ToolError, ToolResult, arg_str};
use crate::sandbox::{FileKind, Sandbox};

/// Bytes of text returned by one read before the rest is cut.
const DEFAULT_READ_CAP: usize = 256 * 1024;

/// Images a read returns as image content, by their magic bytes.
fn image_mime(data: &[u8]) -> Option<&'static str> {
    if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if data.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if data.starts_with(b"GIF8") {
        Some("image/gif")
    } else if data.len() > 12 && &data[..4] == b"RIFF" && &data[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// An image file's bytes (the head `data` of a file of `size` bytes) as a result carrying the
/// image, or why it is too large; None when the bytes are not an image.
pub(super) fn image_result(path: &str, data: &[u8], size: u64) -> Option<ToolResult> {
    image_mime(data)?;
    if size > data.len() as u64 || data.len() > MAX_IMAGE_BYTES {
        return Some(ToolResult::error(format!(
            "{path} is an image of {size} bytes, over the {MAX_IMAGE_BYTES}-byte cap for images; \
             make a smaller copy (e.g. with PIL: im.thumbnail((1600, 1600)); im.save(...)) and read that"
        )));
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(data);
    Some(ToolResult::ok(format!("{path}: an image of {size} bytes")).with_image(b64))
}

pub struct ReadFile {
    sandbox: Arc<dyn Sandbox>,
    cap: usize,
}

impl ReadFile {
    pub fn new(sandbox: Arc<dyn Sandbox>, cap: usize) -> Self {
        Self {
            sandbox,
            cap: if cap == 0 { DEFAULT_READ_CAP } else { cap },
        }
    }
}

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &str {
        "read_file"
    }

    fn description(&self) -> &str {
        "Read a file from the sandbox. Relative paths are under /workspace. Text comes back as \
         text (long files are cut; read parts with bash: sed -n, head, tail); PNG, JPEG, GIF and \
         WebP files come back as images; other binary files are reported by size."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path inside the sandbox, e.g. /workspace/notes.txt or notes.txt."}
            },
            "required": ["path"]
        })
    }

    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let path = arg_str(&args, "path").unwrap_or_default();
        // Only as much as an answer can use comes to the host: a 100 MB file costs the host
        // the shared image cap at most, not 100 MB per call.
        let want = self.cap.max(MAX_IMAGE_BYTES) + 1;
        let (data, size) = self.sandbox.read_head(path, want).await?;
        let whole = size <= data.len() as u64;
        if let Some(result) = image_result(path, &data, size) {
            return Ok(result);
        }
        // A read cut inside a multi-byte character is still text.
        let text = match std::str::from_utf8(&data) {
            Ok(text) => Some(text),
            Err(e) if !whole && data.len() - e.valid_up_to() < 4 && e.error_len().is_none() => {
                std::str::from_utf8(&data[..e.valid_up_to()]).ok()
            }
            Err(_) => None,
        };
        match text {
            Some(text) if whole && text.len() <= self.cap => Ok(ToolResult::ok(text)),
            Some(text) => {
                let mut end = self.cap.min(text.len());
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                Ok(ToolResult::ok(&text[..end]).with_system(format!(
                    "the file is {size} bytes; only the first {end} are shown: read the rest with bash (sed -n, tail)"
                )))
            }
            None => Ok(ToolResult::ok(format!(
                "{path} is a binary file of {size} bytes; inspect it with bash (file, xxd | head)"
            ))),
        }
    }
}

pub struct WriteFile {
    sandbox: Arc<dyn Sandbox>,
}

impl WriteFile {
    pub fn new(sandbox: Arc<dyn Sandbox>) -> Self {
        Self { sandbox }
    }
}

#[async_trait]
impl Tool for WriteFile {
    fn name(&self) -> &str {
        "write_file"
    }

    fn description(&self) -> &str {
        "Write a text file in the sandbox, replacing it if it exists and creating missing parent \
         directories. Relative paths are under /workspace. The write is atomic: readers never see \
         half a file."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path inside the sandbox."},
                "content": {"type": "string", "description": "The whole new content of the file."}
            },
            "required": ["path", "content"]
        })
    }

    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let path = arg_str(&args, "path").unwrap_or_default();
        let content = arg_str(&args, "content").unwrap_or_default();
        self.sandbox.write_file(path, content.as_bytes()).await?;
        Ok(ToolResult::ok(format!(
            "wrote {} bytes to {path}",
            content.len()
        )))
    }
}

pub struct ListDir {
    sandbox: Arc<dyn Sandbox>,
}

impl ListDir {
    pub fn new(sandbox: Arc<dyn Sandbox>) -> Self {
        Self { sandbox }
    }
}

/// Entries shown by one listing; bigger directories are cut.
const MAX_ENTRIES: usize = 1000;

#[async_trait]
impl Tool for ListDir {
    fn name(&self) -> &str {
        "list_dir"
    }

    fn description(&self) -> &str {
        "List a directory in the sandbox (default /workspace): one entry per line with its kind \
         and size; directories end with /."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Directory inside the sandbox (default /workspace)."}
            }
        })
    }

    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let path = arg_str(&args, "path")
            .filter(|p| !p.is_empty())
            .unwrap_or(crate::sandbox::WORKSPACE);
        let entries = self.sandbox.list_dir(path).await?;
        if entries.is_empty() {
            return Ok(ToolResult::ok(format!("{path} is empty")));
        }
        let mut out = String::new();
        for e in entries.iter().take(MAX_ENTRIES) {
            // Names come from the sandbox: escape control characters so a crafted name
            // cannot forge lines of the listing.
            let name = e.name.escape_debug().to_string();
            let line = match e.kind {
                FileKind::Dir => format!("{name}/\n"),
                FileKind::Symlink => format!("{name} -> (symlink)\n"),
                FileKind::File => format!("{name}\t{} bytes\n", e.size),
                FileKind::Other => format!("{name}\t(special)\n"),
            };
            out.push_str(&line);
        }
        let mut result = ToolResult::ok(out.trim_end().to_string());
        if entries.len() > MAX_ENTRIES {
            result = result.with_system(format!(
                "at least {} entries (listings are cut to fit the file helper's frame); only the first {MAX_ENTRIES} are shown (use bash: ls | grep)",
                entries.len()
            ));
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::image_mime;

    #[test]
    fn image_magic() {
        assert_eq!(image_mime(b"\x89PNG\r\n\x1a\nrest"), Some("image/png"));
        assert_eq!(image_mime(&[0xff, 0xd8, 0xff, 0xe0]), Some("image/jpeg"));
        assert_eq!(image_mime(b"hello"), None);
    }
}
