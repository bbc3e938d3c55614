//! Host files and directories into a sandbox's /workspace before a run (`sandboxd run
//! --input FILE…`): each lands as /workspace/<its base name>, the counterpart of the
//! copy-out at the end (copy_out.rs) and of the service's upload routes.
//!
//! Every input is checked before anything is written: a name that cannot be a plain file
//! name in the sandbox (control characters, not UTF-8, too long), two inputs with one name,
//! something that is neither a regular file nor a directory, or more bytes than the session's
//! workspace holds is refused with a message naming the input. Files stream in
//! (`transfer::write_file_from`); a directory goes in as a tar built by
//! `tar_safety::archive_dir`, which refuses links that leave it and special files.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::tar_safety::{TarError, TarLimits, archive_dir};
use super::{Sandbox, SandboxError, WORKSPACE, transfer};
use crate::config::Limits;

/// Most inputs one run takes (a directory counts once, whatever it holds).
pub const MAX_INPUTS: usize = 100;
/// The longest base name (bytes), as most filesystems allow.
const MAX_NAME: usize = 255;

#[derive(Debug, thiserror::Error)]
pub enum CopyInError {
    #[error("input {path}: {message}")]
    Refused { path: PathBuf, message: String },
    #[error("{count} inputs; at most {MAX_INPUTS} may be copied into one run")]
    TooMany { count: usize },
    #[error(
        "the inputs hold {total} bytes, more than the session's workspace of {limit} bytes; lower the inputs or raise --workspace"
    )]
    TooLarge { total: u64, limit: u64 },
    #[error("input {path}: {source}")]
    Archive { path: PathBuf, source: TarError },
    #[error("input {path}: {source}")]
    Sandbox { path: PathBuf, source: SandboxError },
}

/// One input, checked.
struct Input {
    path: PathBuf,
    name: String,
    dir: bool,
    bytes: u64,
}

/// Copies `inputs` into /workspace; returns the sandbox paths they got, in order.
pub async fn copy_in(
    sandbox: &dyn Sandbox,
    limits: &Limits,
    inputs: &[PathBuf],
) -> Result<Vec<String>, CopyInError> {
    if inputs.len() > MAX_INPUTS {
        return Err(CopyInError::TooMany {
            count: inputs.len(),
        });
    }
    let workspace = limits.workspace_mb.saturating_mul(1 << 20);
    let checked = check_all(inputs, workspace)?;
    let timeout = Duration::from_secs(limits.max_timeout_secs.max(1));
    let mut budget = workspace;
    let mut placed = Vec::with_capacity(checked.len());
    for input in checked {
        let target = format!("{WORKSPACE}/{}", input.name);
        let in_sandbox = |source| CopyInError::Sandbox {
            path: input.path.clone(),
            source,
        };
        if input.dir {
            let tar_limits = TarLimits {
                max_total_bytes: budget,
                ..TarLimits::default()
            };
            let archive =
                archive_dir(&input.path, &tar_limits).map_err(|source| CopyInError::Archive {
                    path: input.path.clone(),
                    source,
                })?;
            budget = budget.saturating_sub(archive.len() as u64);
            sandbox
                .upload_tar(&target, &archive)
                .await
                .map_err(in_sandbox)?;
        } else {
            let file = File::open(&input.path).map_err(|e| refused(&input.path, e.to_string()))?;
            budget = budget.saturating_sub(input.bytes);
            transfer::write_file_from(sandbox, &target, &file, input.bytes, workspace, timeout)
                .await
                .map_err(in_sandbox)?;
        }
        placed.push(target);
    }
    Ok(placed)
}

fn refused(path: &Path, message: impl Into<String>) -> CopyInError {
    CopyInError::Refused {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Every input's name, kind and size, or the first one that cannot go in.
fn check_all(inputs: &[PathBuf], workspace: u64) -> Result<Vec<Input>, CopyInError> {
    let mut checked: Vec<Input> = Vec::with_capacity(inputs.len());
    let mut total = 0u64;
    for path in inputs {
        let input = check_one(path)?;
        if checked.iter().any(|c| c.name == input.name) {
            return Err(refused(
                path,
                format!(
                    "another input is also named {:?}; each lands in /workspace by its base name",
                    input.name
                ),
            ));
        }
        total = total.saturating_add(input.bytes);
        checked.push(input);
    }
    if total > workspace {
        return Err(CopyInError::TooLarge {
            total,
            limit: workspace,
        });
    }
    Ok(checked)
}

fn check_one(path: &Path) -> Result<Input, CopyInError> {
    let name = base_name(path)?;
    // A symbolic link named on the command line is the user's choice: it is followed. Links
    // inside a directory are archive_dir's to judge.
    let meta = std::fs::metadata(path).map_err(|e| refused(path, e.to_string()))?;
    let (dir, bytes) = if meta.is_dir() {
        (true, dir_bytes(path))
    } else if meta.is_file() {
        (false, meta.len())
    } else {
        return Err(refused(
            path,
            "not a regular file or a directory (a FIFO, socket or device)",
        ));
    };
    Ok(Input {
        path: path.to_path_buf(),
        name,
        dir,
        bytes,
    })
}

/// The name the input gets in /workspace, if it can be one there.
fn base_name(path: &Path) -> Result<String, CopyInError> {
    // `a/.` and `a/..` have no base name of their own; name the directory itself.
    let normal = path
        .components()
        .next_back()
        .and_then(|c| match c {
            std::path::Component::Normal(n) => Some(n),
            _ => None,
        })
        .ok_or_else(|| {
            refused(
                path,
                "has no base name to use in /workspace (name the file or directory itself)",
            )
        })?;
    let name = normal
        .to_str()
        .ok_or_else(|| refused(path, "its name is not UTF-8"))?;
    if name.len() > MAX_NAME {
        return Err(refused(
            path,
            format!("its name is longer than {MAX_NAME} bytes"),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(refused(
            path,
            "its name holds control characters (a newline, an escape); rename it first",
        ));
    }
    Ok(name.to_string())
}

/// The regular files' bytes under `dir`, for the up-front size check (archive_dir enforces
/// the bound again while it reads, so a tree that grows in between is still stopped).
fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                todo.push(entry.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_are_refused() {
        for bad in ["a\nb.csv", "x\u{1b}[31m", ".."] {
            let e = base_name(Path::new(bad)).expect_err(bad).to_string();
            assert!(e.contains("input"), "{e}");
        }
        assert_eq!(
            base_name(Path::new("/data/sales.xlsx")).expect("plain"),
            "sales.xlsx"
        );
        assert_eq!(base_name(Path::new("dir/sub/")).expect("dir"), "sub");
    }

    #[test]
    fn duplicates_and_missing_inputs_are_refused_before_anything_is_written() {
        let tmp = tempfile::tempdir().expect("tmp");
        for d in ["a", "b"] {
            std::fs::create_dir(tmp.path().join(d)).expect("dir");
            std::fs::write(tmp.path().join(d).join("x.csv"), "1").expect("file");
        }
        let twice = [tmp.path().join("a/x.csv"), tmp.path().join("b/x.csv")];
        let e = check_all(&twice, 1 << 20).err().expect("dup").to_string();
        assert!(e.contains("also named \"x.csv\""), "{e}");
        let e = check_all(&[tmp.path().join("nope")], 1 << 20)
            .err()
            .expect("missing")
            .to_string();
        assert!(e.contains("nope"), "{e}");
        let e = check_all(&[tmp.path().join("a")], 0)
            .err()
            .expect("too large")
            .to_string();
        assert!(e.contains("more than the session's workspace"), "{e}");
    }
}
