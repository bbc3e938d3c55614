//! Parsing of the file helper's (images/sandbox/helpers/sandboxd_fs.py) replies into domain types.

use serde_json::Value;

use super::{FileKind, FileStat};

pub fn parse_kind(v: &Value) -> FileKind {
    match v.as_str() {
        Some("file") => FileKind::File,
        Some("dir") => FileKind::Dir,
        Some("symlink") => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

/// A stat reply, or None when the helper reported an error.
pub fn parse_stat(path: &str, resp: &Value) -> Option<FileStat> {
    if resp["ok"] != true {
        return None;
    }
    Some(FileStat {
        path: path.to_string(),
        kind: parse_kind(&resp["kind"]),
        size: resp["size"].as_u64()?,
        mode: resp["mode"].as_u64()? as u32,
        modified: resp["modified"].as_i64()?,
    })
}
