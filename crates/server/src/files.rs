//! /v1/sessions/{id}/files and /archive: list a directory, download and upload one file,
//! download and upload /workspace (or a directory in it) as a tar archive.
//!
//! Every path is hostile: it is resolved lexically (`file_paths`). A file or a listing may be
//! read anywhere in the container the sandbox user can read; writes and archives stay inside
//! /workspace, a write through a symbolic link is refused, and an archive's `path` is never
//! followed through a symlink (see `copy_out::tar_to_file`). Archives pass the
//! hostile-tar rules (`sandbox::tar_safety`) on the host before anything is unpacked, and the
//! archive sent to a client is validated the same way first.
//!
//! Transfers stream: each one holds a `TransferPermit` (429 over `[server] transfers` or
//! `transfers_per_user`), a body is spooled to an unlinked file (`spool`; small ones stay in
//! memory), archives are packed into one and validated from it with bounded reads, and what
//! goes out is streamed from it. No route holds a whole file or archive in memory.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::auth::Caller;
use crate::backend::Live;
use crate::error::{ApiError, ApiPath, ApiQuery, ErrorCode, ErrorResponses};
use crate::file_paths::{readable_path, workspace_path, write_target};
use crate::sessions::{live_session, sandbox_failed};
use crate::spool::{self, INLINE_MAX, Spooled};
use crate::transfers::TransferPermit;
use crate::types::*;
use sandboxd_core::sandbox::copy_out::{ARCHIVE_SLACK, tar_to_file};
use sandboxd_core::sandbox::file_mode::set_mode;
use sandboxd_core::sandbox::tar_safety::{TarLimits, validate_archive, validate_archive_file};
use sandboxd_core::sandbox::{FileKind, WORKSPACE, transfer};

#[utoipa::path(get, path = "/v1/sessions/{id}/files", tag = "files",
    params(("id" = String, Path, description = "The session id"), ReadDirQuery),
    responses((status = 200, description = "The directory's entries", body = DirListing), ErrorResponses),
    security(("bearer" = [])))]
pub async fn list_dir(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ReadDirQuery>,
) -> Result<Json<DirListing>, ApiError> {
    let path = readable_path(q.path.as_deref().unwrap_or(WORKSPACE))?;
    let live = live_session(&st, &caller, &id).await?;
    // A large transfer may outlast a short idle timeout: the session is in use meanwhile.
    let _in_use = live.hold();
    let entries = match live.sandbox.list_dir(&path).await {
        Ok(e) => e,
        Err(e) => return Err(sandbox_failed(&st, &live, e).await),
    };
    let entries = entries
        .into_iter()
        .map(|e| DirEntryView {
            name: e.name,
            kind: match e.kind {
                FileKind::File => "file",
                FileKind::Dir => "dir",
                FileKind::Symlink => "symlink",
                FileKind::Other => "other",
            }
            .into(),
            size: e.size,
        })
        .collect();
    Ok(Json(DirListing { path, entries }))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files/content", tag = "files",
    params(("id" = String, Path, description = "The session id"), ReadPathQuery),
    responses((status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>), ErrorResponses),
    security(("bearer" = [])))]
pub async fn download_file(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ReadPathQuery>,
) -> Result<Response, ApiError> {
    let path = readable_path(&q.path)?;
    let live = live_session(&st, &caller, &id).await?;
    // A large transfer may outlast a short idle timeout: the session is in use meanwhile.
    let _in_use = live.hold();
    // The file helper answers a small file at once, in memory like any small answer; a bigger
    // one is a transfer: copied into a spool file by a process of its own, streamed from there.
    let (head, size) = match live.sandbox.read_head(&path, INLINE_MAX).await {
        Ok(h) => h,
        Err(e) => return Err(sandbox_failed(&st, &live, e).await),
    };
    if size == head.len() as u64 {
        crate::metering::bytes_out(&st, &live.id, size).await;
        return Ok(octets(Body::from(head), None, "application/octet-stream"));
    }
    drop(head);
    let permit = st.transfers.start(caller.id())?;
    let cap = live.limits.max_file_bytes();
    let file = st.transfers.spool_file()?;
    let read = transfer::read_file_into(&*live.sandbox, &path, &file, cap, timeout(&live));
    let len = match read.await {
        Ok(len) => len,
        Err(e) => return Err(sandbox_failed(&st, &live, e).await),
    };
    crate::metering::bytes_out(&st, &live.id, len).await;
    let body = spool::file_body(file, len, permit, stream_deadline(&st));
    Ok(octets(body, Some(len), "application/octet-stream"))
}

/// How long one process of a transfer may take in the sandbox.
fn timeout(live: &Live) -> Duration {
    Duration::from_secs(live.limits.max_timeout_secs.max(1))
}

/// How long a response may take to stream out: the time limit of the transfer routes.
fn stream_deadline(st: &AppState) -> Duration {
    let s = &st.config.server;
    Duration::from_secs(s.request_timeout_secs.max(1) + st.config.limits.max_timeout_secs)
}

fn octets(body: Body, len: Option<u64>, mime: &'static str) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    if let Some(len) = len {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
    resp
}

/// The upload limit, checked against the announced length before anything is read.
fn upload_limit(st: &AppState, headers: &HeaderMap) -> Result<u64, ApiError> {
    let limit = st.config.server.upload_limit_mb.saturating_mul(1 << 20);
    match spool::declared_len(headers) {
        Some(n) if n > limit => Err(spool::over_limit()),
        _ => Ok(limit),
    }
}

/// Claims a transfer and reads the body, in that order: a refused transfer reads nothing. A
/// body announced at `INLINE_MAX` or less stays in memory, like any small request, and claims
/// nothing.
async fn spool_upload(
    st: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> Result<(Option<TransferPermit>, Spooled), ApiError> {
    let permit = match spool::declared_len(headers) {
        Some(n) if n <= INLINE_MAX as u64 => None,
        _ => Some(st.transfers.start(caller.id())?),
    };
    let body = spool::read_body(body, limit, &st.transfers).await?;
    Ok((permit, body))
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files/content", tag = "files",
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The file's new bytes"),
    params(("id" = String, Path, description = "The session id"), UploadQuery),
    responses((status = 200, description = "Written (parents are created), with `mode` if one was given", body = Written), ErrorResponses),
    security(("bearer" = [])))]
pub async fn upload_file(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<UploadQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Written>, ApiError> {
    let limit = upload_limit(&st, &headers)?;
    let path = workspace_path(&q.path)?;
    if path == WORKSPACE {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "parameter `path`: /workspace is a directory; name a file inside it",
        ));
    }
    let live = live_session(&st, &caller, &id).await?;
    // A large transfer may outlast a short idle timeout: the session is in use meanwhile.
    let _in_use = live.hold();
    let cap = live.limits.max_file_bytes();
    let too_large = |size: u64| {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the file is {size} bytes, over this session's max_file_mb ({cap} bytes); upload a tar archive in parts"
            ),
        )
    };
    if let Some(n) = spool::declared_len(&headers).filter(|n| *n > cap) {
        return Err(too_large(n));
    }
    write_target(&st, &live, &path).await?;
    let (_permit, body) = spool_upload(&st, &caller, &headers, body, limit).await?;
    let bytes = body.size();
    if bytes > cap {
        return Err(too_large(bytes));
    }
    let written = match &body {
        Spooled::Memory(data) => live.sandbox.write_file(&path, data).await,
        Spooled::File { file, len } => {
            let to = timeout(&live);
            transfer::write_file_from(&*live.sandbox, &path, file, *len, cap, to).await
        }
    };
    let moded = match (written, q.mode) {
        (Ok(()), Some(mode)) => set_mode(&*live.sandbox, &path, mode, timeout(&live)).await,
        (done, _) => done,
    };
    if moded.is_ok() {
        crate::metering::bytes_in(&st, &live.id, bytes).await;
    }
    match moded {
        Ok(()) => Ok(Json(Written {
            path,
            bytes,
            entries: None,
            mode: q.mode.map(|m| m.to_string()),
        })),
        Err(e) => Err(sandbox_failed(&st, &live, e).await),
    }
}

fn tar_limits(workspace_mb: u64) -> TarLimits {
    TarLimits {
        max_total_bytes: workspace_mb.saturating_mul(1 << 20),
        ..TarLimits::default()
    }
}

#[utoipa::path(get, path = "/v1/sessions/{id}/archive", tag = "files",
    params(("id" = String, Path, description = "The session id"), DirQuery),
    responses((status = 200, description = "A tar of the directory (default /workspace)", content_type = "application/x-tar", body = Vec<u8>), ErrorResponses),
    security(("bearer" = [])))]
pub async fn download_archive(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<DirQuery>,
) -> Result<Response, ApiError> {
    let path = workspace_path(q.path.as_deref().unwrap_or(WORKSPACE))?;
    let live = live_session(&st, &caller, &id).await?;
    // A large transfer may outlast a short idle timeout: the session is in use meanwhile.
    let _in_use = live.hold();
    let permit = st.transfers.start(caller.id())?;
    let file = st.transfers.spool_file()?;
    let workspace = live.limits.workspace_mb.saturating_mul(1 << 20);
    let max = workspace.saturating_add(ARCHIVE_SLACK);
    let packed = tar_to_file(&*live.sandbox, &path, file, max, timeout(&live)).await;
    let archive = match packed {
        Ok(a) => a,
        Err(e) => return Err(sandbox_failed(&st, &live, e).await),
    };
    // What the sandbox packed is hostile too: never hand a client what we would refuse.
    let check = archive.file.try_clone().map_err(ApiError::internal)?;
    let (len, limits) = (archive.len, tar_limits(live.limits.workspace_mb));
    let checked = tokio::task::spawn_blocking(move || validate_archive_file(&check, len, &limits))
        .await
        .map_err(ApiError::internal)?;
    checked.map_err(|e| {
        ApiError::new(
            ErrorCode::Conflict,
            format!("the sandbox's archive of {path} is unsafe and was not sent: {e}"),
        )
    })?;
    crate::metering::bytes_out(&st, &live.id, len).await;
    let body = spool::file_body(archive.file, len, permit, stream_deadline(&st));
    Ok(octets(body, Some(len), "application/x-tar"))
}

#[utoipa::path(put, path = "/v1/sessions/{id}/archive", tag = "files",
    request_body(content = Vec<u8>, content_type = "application/x-tar", description = "A tar archive; absolute names, `..`, links out of the tree, devices and setuid bits are refused"),
    params(("id" = String, Path, description = "The session id"), DirQuery),
    responses((status = 200, description = "Unpacked into the directory (default /workspace)", body = Written), ErrorResponses),
    security(("bearer" = [])))]
pub async fn upload_archive(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<DirQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Written>, ApiError> {
    let limit = upload_limit(&st, &headers)?;
    let path = workspace_path(q.path.as_deref().unwrap_or(WORKSPACE))?;
    let live = live_session(&st, &caller, &id).await?;
    // A large transfer may outlast a short idle timeout: the session is in use meanwhile.
    let _in_use = live.hold();
    write_target(&st, &live, &path).await?;
    let (_permit, body) = spool_upload(&st, &caller, &headers, body, limit).await?;
    // Validated here, from the spool file in bounded reads, to answer with the summary (and
    // 400 before touching the sandbox); `upload_tar` validates a small one again on its own.
    let limits = tar_limits(live.limits.workspace_mb);
    let checked = match &body {
        Spooled::Memory(data) => validate_archive(data, &limits),
        Spooled::File { file, len } => {
            let (check, len) = (file.try_clone().map_err(ApiError::internal)?, *len);
            tokio::task::spawn_blocking(move || validate_archive_file(&check, len, &limits))
                .await
                .map_err(ApiError::internal)?
        }
    };
    let summary = checked.map_err(|e| {
        ApiError::invalid(format!("the archive was refused, nothing was written: {e}"))
    })?;
    let unpacked = match &body {
        Spooled::Memory(data) => live.sandbox.upload_tar(&path, data).await,
        Spooled::File { file, len } => {
            let to = timeout(&live);
            transfer::unpack_tar_from(&*live.sandbox, &path, file, *len, to).await
        }
    };
    if unpacked.is_ok() {
        crate::metering::bytes_in(&st, &live.id, body.size()).await;
    }
    match unpacked {
        Ok(()) => Ok(Json(Written {
            path,
            bytes: summary.total_bytes,
            entries: Some(summary.entries as u64),
            mode: None,
        })),
        Err(e) => Err(sandbox_failed(&st, &live, e).await),
    }
}
