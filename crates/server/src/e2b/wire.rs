//! envd's request messages in proto3's JSON mapping (field names in lowerCamelCase, bytes in
//! base64, enums by name or number, 64-bit integers as numbers or strings), and the pieces
//! of its answers that several services share. Unknown fields are ignored, as protobuf's
//! JSON parsers do, so a newer SDK that adds one still works.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::connect::ConnectError;
use sandboxd_core::sandbox::{FileKind, FileStat};

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct ProcessConfig {
    pub(super) cmd: String,
    pub(super) args: Vec<String>,
    pub(super) envs: BTreeMap<String, String>,
    pub(super) cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct StartRequest {
    pub(super) process: ProcessConfig,
    pub(super) pty: Option<Value>,
    pub(super) tag: Option<String>,
    pub(super) stdin: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct Selector {
    pub(super) pid: Option<u32>,
    pub(super) tag: Option<String>,
}

/// Connect, CloseStdin: a selector alone.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct Selected {
    pub(super) process: Selector,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct ProcessInput {
    pub(super) stdin: Option<String>,
    pub(super) pty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct SendInputRequest {
    pub(super) process: Selector,
    pub(super) input: ProcessInput,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct SendSignalRequest {
    pub(super) process: Selector,
    pub(super) signal: Value,
}

/// Stat, MakeDir, Remove.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct PathRequest {
    pub(super) path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct ListDirRequest {
    pub(super) path: String,
    pub(super) depth: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct MoveRequest {
    pub(super) source: String,
    pub(super) destination: String,
}

/// A `bytes` field's value.
pub(super) fn decode_bytes(field: &str, b64: &str) -> Result<Vec<u8>, ConnectError> {
    let engine = &base64::engine::general_purpose::STANDARD;
    let url = &base64::engine::general_purpose::URL_SAFE;
    engine
        .decode(b64)
        .or_else(|_| url.decode(b64))
        .map_err(|e| ConnectError::invalid(format!("field `{field}` is not base64: {e}")))
}

pub(super) fn encode_bytes(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// `process.Signal` by name or number: Some(true) for SIGKILL, Some(false) for SIGTERM.
pub(super) fn signal_is_kill(v: &Value) -> Option<bool> {
    match v {
        Value::String(s) if s == "SIGNAL_SIGKILL" => Some(true),
        Value::String(s) if s == "SIGNAL_SIGTERM" => Some(false),
        Value::Number(n) if n.as_u64() == Some(9) => Some(true),
        Value::Number(n) if n.as_u64() == Some(15) => Some(false),
        _ => None,
    }
}

/// `filesystem.EntryInfo` of a stat.
pub(super) fn entry_info(stat: &FileStat) -> Value {
    let name = stat
        .path
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("/");
    let kind = match stat.kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let modified = chrono::DateTime::from_timestamp(stat.modified, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    json!({
        "name": name,
        "type": kind,
        "path": stat.path,
        "size": stat.size.to_string(),
        "mode": stat.mode & 0o7777,
        "permissions": permissions(stat.kind, stat.mode),
        "owner": "",
        "group": "",
        "modifiedTime": modified,
        "isSymlink": stat.kind == FileKind::Symlink,
    })
}

/// `ls -l`'s first column.
fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}
