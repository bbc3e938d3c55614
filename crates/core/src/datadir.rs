//! The process's private files in its data dir (transcripts, kept sessions' tool records):
//! the file-name rule for ids and the owner-only atomic write, shared by the agent's
//! transcripts and the tools' saved records.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

/// Ids become file names: letters, digits, '-' and '_' only.
pub fn is_plain_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Writes `path` readable by the owner only (tasks and tool output may hold secrets),
/// through a temporary file and a rename.
pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(data)?;
    drop(file);
    std::fs::rename(&tmp, path)
}
