//! /v1/sessions/{id}/files and /archive: list a directory, download and upload one file,
//! download and upload /workspace (or a directory in it) as a tar archive.
//!
//! Every path is hostile: it is resolved lexically against /workspace and refused if it
//! leaves it (the container is the security boundary, so a symlink inside /workspace that
//! points elsewhere in the container reaches only the container). Archives pass the
//! hostile-tar rules (`sandbox::tar_safety`) on the host before anything is unpacked, and the
//! archive sent to a client is validated the same way first.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::auth::Caller;
use super::error::{ApiBody, ApiError, ApiPath, ApiQuery, ErrorCode, ErrorResponses};
use super::sessions::{live_session, sandbox_failed};
use super::types::*;
use crate::sandbox::tar_safety::{TarLimits, validate_archive};
use crate::sandbox::{FileKind, WORKSPACE};

/// Resolves a client path to an absolute path inside /workspace, or says why not.
pub fn workspace_path(raw: &str) -> Result<String, ApiError> {
    let bad = |why: &str| {
        Err(ApiError::invalid(format!(
            "parameter `path`: {raw:?} {why}"
        )))
    };
    if raw.len() > 4096 {
        return bad("is longer than 4096 bytes");
    }
    if raw.chars().any(|c| c.is_control()) {
        return bad("contains a control character");
    }
    let rel = match raw.strip_prefix(WORKSPACE) {
        Some("") => "",
        Some(rest) if rest.starts_with('/') => rest,
        _ if raw.starts_with('/') => return bad("is outside /workspace"),
        _ => raw,
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in rel.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return bad("leaves /workspace");
                }
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        Ok(WORKSPACE.to_string())
    } else {
        Ok(format!("{WORKSPACE}/{}", parts.join("/")))
    }
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files", tag = "files",
    params(("id" = String, Path, description = "The session id"), DirQuery),
    responses((status = 200, description = "The directory's entries", body = DirListing), ErrorResponses),
    security(("bearer" = [])))]
pub async fn list_dir(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<DirQuery>,
) -> Result<Json<DirListing>, ApiError> {
    let path = workspace_path(q.path.as_deref().unwrap_or(WORKSPACE))?;
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
    params(("id" = String, Path, description = "The session id"), PathQuery),
    responses((status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>), ErrorResponses),
    security(("bearer" = [])))]
pub async fn download_file(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> Result<Response, ApiError> {
    let path = workspace_path(&q.path)?;
    let live = live_session(&st, &caller, &id).await?;
    // A large transfer may outlast a short idle timeout: the session is in use meanwhile.
    let _in_use = live.hold();
    match live.sandbox.read_file(&path).await {
        Ok(bytes) => Ok(octets(bytes, "application/octet-stream")),
        Err(e) => Err(sandbox_failed(&st, &live, e).await),
    }
}

fn octets(bytes: Vec<u8>, mime: &'static str) -> Response {
    let mut resp = (StatusCode::OK, bytes).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    resp
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files/content", tag = "files",
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The file's new bytes"),
    params(("id" = String, Path, description = "The session id"), PathQuery),
    responses((status = 200, description = "Written (parents are created)", body = Written), ErrorResponses),
    security(("bearer" = [])))]
pub async fn upload_file(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PathQuery>,
    ApiBody(body): ApiBody,
) -> Result<Json<Written>, ApiError> {
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
    if body.len() as u64 > cap {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the file is {} bytes, over this session's max_file_mb ({cap} bytes); upload a tar archive in parts",
                body.len()
            ),
        ));
    }
    match live.sandbox.write_file(&path, &body).await {
        Ok(()) => Ok(Json(Written {
            path,
            bytes: body.len() as u64,
            entries: None,
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
    let tar = match live.sandbox.download_tar(&path).await {
        Ok(t) => t,
        Err(e) => return Err(sandbox_failed(&st, &live, e).await),
    };
    // What the sandbox packed is hostile too: never hand a client what we would refuse.
    validate_archive(&tar, &tar_limits(live.limits.workspace_mb)).map_err(|e| {
        ApiError::new(
            ErrorCode::Conflict,
            format!("the sandbox's archive of {path} is unsafe and was not sent: {e}"),
        )
    })?;
    Ok(octets(tar, "application/x-tar"))
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
    ApiBody(body): ApiBody,
) -> Result<Json<Written>, ApiError> {
    let path = workspace_path(q.path.as_deref().unwrap_or(WORKSPACE))?;
    let live = live_session(&st, &caller, &id).await?;
    // A large transfer may outlast a short idle timeout: the session is in use meanwhile.
    let _in_use = live.hold();
    // Validated here to answer with the summary (and 400 before touching the sandbox);
    // upload_tar validates again on its own.
    let summary = validate_archive(&body, &tar_limits(live.limits.workspace_mb)).map_err(|e| {
        ApiError::invalid(format!("the archive was refused, nothing was written: {e}"))
    })?;
    match live.sandbox.upload_tar(&path, &body).await {
        Ok(()) => Ok(Json(Written {
            path,
            bytes: summary.total_bytes,
            entries: Some(summary.entries as u64),
        })),
        Err(e) => Err(sandbox_failed(&st, &live, e).await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_workspace() {
        for (raw, want) in [
            ("a.txt", "/workspace/a.txt"),
            ("/workspace", "/workspace"),
            ("/workspace/", "/workspace"),
            ("/workspace/d/../e", "/workspace/e"),
            ("./x//y/.", "/workspace/x/y"),
            (".", "/workspace"),
        ] {
            assert_eq!(workspace_path(raw).unwrap(), want, "{raw}");
        }
        for raw in [
            "/etc/passwd",
            "..",
            "../etc",
            "/workspace/../etc",
            "/workspacex/a",
            "a/../../b",
            "a\nb",
            "/tmp/x",
        ] {
            assert!(workspace_path(raw).is_err(), "{raw} must be refused");
        }
    }
}
