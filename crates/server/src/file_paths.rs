//! The paths of the file routes: every one is hostile, checked and resolved lexically before
//! the sandbox sees it.
//!
//! Reads (a file, a directory listing) may name any absolute path in the container: the
//! helper that serves them runs as the sandbox user, so it reads exactly what sandboxed code
//! could read anyway (`/etc/os-release`, not `/etc/shadow`), and a missing file is a 404.
//! Writes stay inside /workspace, and a write whose existing ancestors include a symbolic
//! link is refused (`write_target`): the link could lead out of /workspace. That check is
//! for a clear answer, not the boundary: the write runs as the sandbox user in the
//! container, which sandboxed code could do itself.

use crate::AppState;
use crate::backend::Live;
use crate::error::ApiError;
use crate::sessions::sandbox_failed;
use sandboxd_core::sandbox::{FileKind, SandboxError, WORKSPACE};

/// The longest path accepted (Linux's PATH_MAX).
const MAX_PATH: usize = 4096;
/// The longest component accepted (Linux's NAME_MAX).
const MAX_NAME: usize = 255;

fn refuse<T>(raw: &str, why: &str) -> Result<T, ApiError> {
    Err(ApiError::invalid(format!(
        "parameter `path`: {raw:?} {why}"
    )))
}

/// The components of `raw` after `..` and `.` are resolved lexically, relative paths taken
/// from /workspace; a `..` above `floor` (the components every result must keep) is refused.
fn components<'a>(raw: &'a str, floor: &[&str], above: &str) -> Result<Vec<&'a str>, ApiError> {
    if raw.len() > MAX_PATH {
        return refuse(raw, "is longer than 4096 bytes");
    }
    if raw.chars().any(|c| c.is_control()) {
        return refuse(raw, "contains a control character (a NUL, a newline)");
    }
    let (start, rest): (Vec<&str>, &str) = match raw.strip_prefix('/') {
        Some(rest) => (Vec::new(), rest),
        None => (vec!["workspace"], raw),
    };
    let mut parts = start;
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.len() <= floor.len() || parts.pop().is_none() {
                    return refuse(raw, above);
                }
            }
            p if p.len() > MAX_NAME => return refuse(raw, "has a component over 255 bytes"),
            p => parts.push(p),
        }
    }
    if !parts.starts_with(floor) {
        return refuse(raw, "is outside /workspace (only reads may leave it)");
    }
    Ok(parts)
}

/// Resolves a client path to an absolute path inside /workspace, or says why not.
pub fn workspace_path(raw: &str) -> Result<String, ApiError> {
    let parts = components(raw, &["workspace"], "leaves /workspace")?;
    Ok(format!("/{}", parts.join("/")))
}

/// Resolves a client path to read: any absolute path in the container (relative ones are
/// taken from /workspace), or says why not.
pub fn readable_path(raw: &str) -> Result<String, ApiError> {
    let parts = components(raw, &[], "goes above /")?;
    Ok(format!("/{}", parts.join("/")))
}

/// Checks that writing `path` (from `workspace_path`) goes through no symbolic link: each
/// existing ancestor below /workspace is looked at (about 1 ms each, with the file helper),
/// up to the first that does not exist yet (the write makes the rest as directories).
pub async fn write_target(st: &AppState, live: &Live, path: &str) -> Result<(), ApiError> {
    let Some(rel) = path.strip_prefix(WORKSPACE) else {
        return Err(ApiError::invalid(format!(
            "parameter `path`: {path:?} is outside /workspace"
        )));
    };
    let mut at = WORKSPACE.to_string();
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        at.push('/');
        at.push_str(part);
        match live.sandbox.stat(&at).await {
            Ok(s) if s.kind == FileKind::Symlink => {
                return Err(ApiError::invalid(format!(
                    "parameter `path`: {path:?} goes through the symbolic link {at}, which may \
                     lead out of /workspace; write to the link's target instead"
                )));
            }
            Ok(_) => {}
            Err(SandboxError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(sandbox_failed(st, live, e).await),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_stay_inside_the_workspace() {
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
            "a\0b",
            "/tmp/x",
            "/",
        ] {
            assert!(workspace_path(raw).is_err(), "{raw} must be refused");
        }
    }

    #[test]
    fn reads_reach_the_container_but_not_above_its_root() {
        for (raw, want) in [
            ("/etc/os-release", "/etc/os-release"),
            ("a.txt", "/workspace/a.txt"),
            ("../etc/os-release", "/etc/os-release"),
            ("/", "/"),
            ("/usr//lib/./x/..", "/usr/lib"),
        ] {
            assert_eq!(readable_path(raw).unwrap(), want, "{raw}");
        }
        let long = format!("/{}", "a/".repeat(2100));
        let name = format!("/tmp/{}", "n".repeat(256));
        for (raw, says) in [
            ("/..", "goes above /"),
            ("../../../etc", "goes above /"),
            ("/etc/\0x", "control character"),
            ("/etc/x\n", "control character"),
            (long.as_str(), "longer than 4096"),
            (name.as_str(), "over 255 bytes"),
        ] {
            let err = readable_path(raw).expect_err(raw);
            assert!(format!("{err:?}").contains(says), "{raw}: {err:?}");
        }
    }
}
