//! envd's filesystem service (`/e2b/sandbox/filesystem.Filesystem/{method}`: Stat, ListDir
//! with a depth, MakeDir, Move, Remove) and its `/files` download and (multipart) upload,
//! over the session sandbox's file operations. Paths are the container's: a relative one is
//! under /workspace (E2B's is under the user's home), and only /workspace and /tmp are
//! writable (the root is read-only). Watching a directory is not offered: the answer is
//! Connect's `unimplemented`, saying so.

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::connect::{self, ConnectError};
use super::wire::{self, ListDirRequest, MoveRequest, PathRequest};
use super::{E2bError, multipart};
use crate::AppState;
use crate::auth::Caller;
use crate::backend::Live;
use crate::error::ApiError;
use sandboxd_core::sandbox::{ExecRequest, FileKind, FileStat, SandboxError, resolve_path};

/// Entries a ListDir answers at most (a deep listing of a big tree is cut there).
const MAX_ENTRIES: usize = 10_000;

pub(super) async fn rpc(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = call(&st, &caller, &method, &headers, &body)
        .await
        .map(connect::unary);
    connect::answer(&headers, answer)
}

fn path_of(raw: &str) -> Result<String, ConnectError> {
    resolve_path(raw).map_err(|e| ConnectError::invalid(e.to_string()))
}

fn failed(e: SandboxError) -> ConnectError {
    match e {
        SandboxError::NotFound { path } => {
            ConnectError::not_found(format!("path {path} does not exist"))
        }
        e => ApiError::from(e).into(),
    }
}

async fn call(
    st: &Arc<AppState>,
    caller: &Caller,
    method: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Value, ConnectError> {
    let (live, _) = super::target(st, caller, headers).await?;
    let sb = &live.sandbox;
    match method {
        "Stat" => {
            let req: PathRequest = connect::request(headers, body)?;
            let stat = sb.stat(&path_of(&req.path)?).await.map_err(failed)?;
            Ok(json!({"entry": wire::entry_info(&stat)}))
        }
        "ListDir" => {
            let req: ListDirRequest = connect::request(headers, body)?;
            let entries = list(&live, &path_of(&req.path)?, req.depth.max(1)).await?;
            Ok(json!({"entries": entries}))
        }
        "MakeDir" => {
            let req: PathRequest = connect::request(headers, body)?;
            let path = path_of(&req.path)?;
            if sb.stat(&path).await.is_ok() {
                return Err(ConnectError::new(
                    "already_exists",
                    format!("path {path} already exists"),
                ));
            }
            sb.mkdir(&path).await.map_err(failed)?;
            let stat = sb.stat(&path).await.map_err(failed)?;
            Ok(json!({"entry": wire::entry_info(&stat)}))
        }
        "Move" => {
            let req: MoveRequest = connect::request(headers, body)?;
            let (from, to) = (path_of(&req.source)?, path_of(&req.destination)?);
            sb.stat(&from).await.map_err(failed)?;
            let out = sb
                .exec(ExecRequest::new([
                    "mv",
                    "-T",
                    "--",
                    from.as_str(),
                    to.as_str(),
                ]))
                .await
                .map_err(failed)?;
            if !out.success() {
                return Err(ConnectError::new(
                    "failed_precondition",
                    format!(
                        "could not move {from} to {to}: {}",
                        out.stderr_lossy().trim()
                    ),
                ));
            }
            let stat = sb.stat(&to).await.map_err(failed)?;
            Ok(json!({"entry": wire::entry_info(&stat)}))
        }
        "Remove" => {
            let req: PathRequest = connect::request(headers, body)?;
            let path = path_of(&req.path)?;
            sb.stat(&path).await.map_err(failed)?;
            sb.remove(&path, true).await.map_err(failed)?;
            Ok(json!({}))
        }
        "WatchDir" | "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => {
            Err(ConnectError::new(
                "unimplemented",
                "sandboxd does not watch directories; list the directory again to see changes",
            ))
        }
        other => Err(ConnectError::new(
            "unimplemented",
            format!("filesystem.Filesystem/{other} is not a method of envd's filesystem service"),
        )),
    }
}

/// The entries under `root`, `depth` levels down, breadth first, at most `MAX_ENTRIES`.
async fn list(live: &Live, root: &str, depth: u32) -> Result<Vec<Value>, ConnectError> {
    let root_stat = live.sandbox.stat(root).await.map_err(failed)?;
    if root_stat.kind != FileKind::Dir {
        return Err(ConnectError::invalid(format!(
            "path {root} is not a directory"
        )));
    }
    let mut out = Vec::new();
    let mut level = vec![root.trim_end_matches('/').to_string()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in level {
            for e in live.sandbox.list_dir(&dir).await.map_err(failed)? {
                if out.len() >= MAX_ENTRIES {
                    return Ok(out);
                }
                let path = format!("{dir}/{}", e.name);
                if e.kind == FileKind::Dir {
                    next.push(path.clone());
                }
                let stat = FileStat {
                    path,
                    kind: e.kind,
                    size: e.size,
                    mode: if e.kind == FileKind::Dir {
                        0o755
                    } else {
                        0o644
                    },
                    modified: 0,
                };
                out.push(wire::entry_info(&stat));
            }
        }
        level = next;
    }
    Ok(out)
}

#[derive(Debug, Deserialize)]
pub(super) struct FilesQuery {
    path: Option<String>,
}

/// `GET /files?path=`: a file's bytes.
pub(super) async fn download(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<FilesQuery>,
    headers: HeaderMap,
) -> Result<Response, E2bError> {
    let (live, _) = super::target(&st, &caller, &headers).await?;
    let raw = q.path.unwrap_or_default();
    let path = resolve_path(&raw).map_err(|e| E2bError::invalid(e.to_string()))?;
    let max = st.config.server.upload_limit_mb.saturating_mul(1 << 20) as usize;
    let (data, size) = live
        .sandbox
        .read_head(&path, max)
        .await
        .map_err(|e| match e {
            SandboxError::NotFound { .. } => {
                E2bError::not_found(format!("path '{path}' does not exist"))
            }
            e => ApiError::from(e).into(),
        })?;
    if size as usize > data.len() {
        return Err(E2bError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{path} is {size} bytes, over the {max}-byte limit of a download through the E2B API; use /v1's file download, which streams"
            ),
        ));
    }
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
}

/// `POST /files` (multipart, one part per file, each named by its filename or `?path=`).
pub(super) async fn upload(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<FilesQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, E2bError> {
    let (live, _) = super::target(&st, &caller, &headers).await?;
    let parts = multipart::parse(&headers, &body).map_err(E2bError::invalid)?;
    let single = parts.len() == 1;
    let mut written = Vec::new();
    for part in parts {
        let raw = match (&q.path, single) {
            (Some(p), true) => p.clone(),
            _ => part.filename.clone().ok_or_else(|| {
                E2bError::invalid("a multipart part has no filename: name each file by its path")
            })?,
        };
        let path = resolve_path(&raw).map_err(|e| E2bError::invalid(e.to_string()))?;
        live.sandbox
            .write_file(&path, &body[part.data])
            .await
            .map_err(|e| E2bError::from(ApiError::from(e)))?;
        let name = path.rsplit('/').next().unwrap_or("").to_string();
        written.push(json!({"name": name, "type": "file", "path": path}));
    }
    Ok((StatusCode::OK, axum::Json(written)).into_response())
}
