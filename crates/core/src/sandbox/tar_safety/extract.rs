//! Writes a validated archive into a destination directory without following or overwriting:
//! all-or-nothing from memory (`extract_archive`), or entry by entry from a file, skipping and
//! listing what the rules refuse (`extract_lenient`).

use std::ffi::OsStr;
use std::fs;
use std::io::{self, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::validate::{plan, plan_from};
use super::{
    Action, ArchiveSummary, DIR_MODE, EXEC_MODE, FILE_MODE, FileSource, Planned, Source, TarError,
    TarLimits, io_err,
};

/// Walks `components` under `dest` without following anything. Returns `Ok(false)` once a
/// component is missing (so nothing below it can exist yet); refuses symlinks and non-directory
/// parents. With `create`, missing parents are created instead.
fn walk_dest(
    dest: &Path,
    components: &[Vec<u8>],
    final_is_dir: bool,
    create: bool,
) -> Result<bool, TarError> {
    let mut current = dest.to_path_buf();
    for (i, component) in components.iter().enumerate() {
        current.push(OsStr::from_bytes(component));
        let is_last = i + 1 == components.len();
        let path = current.display().to_string();
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(TarError::DestSymlink { path });
            }
            Ok(meta) if meta.is_dir() && (!is_last || final_is_dir) => {}
            Ok(_) => return Err(TarError::DestExists { path }),
            Err(e) if e.kind() == io::ErrorKind::NotFound && create && !is_last => {
                let builder = fs::DirBuilder::new().mode(DIR_MODE).create(&current);
                builder.map_err(io_err(&current))?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_err(&current)(e)),
        }
    }
    Ok(true)
}

fn write_one(dest: &Path, source: &dyn Source, item: &Planned) -> Result<(), TarError> {
    let is_dir = matches!(item.action, Action::Dir);
    if walk_dest(dest, &item.components, is_dir, true)? {
        return Ok(()); // only a directory may already exist; walk_dest refused anything else
    }
    let mut path = dest.to_path_buf();
    path.extend(item.components.iter().map(|c| OsStr::from_bytes(c)));
    match &item.action {
        Action::Dir => {
            let created = fs::DirBuilder::new().mode(DIR_MODE).create(&path);
            created.map_err(io_err(&path))
        }
        Action::Symlink { target } => {
            let created = std::os::unix::fs::symlink(OsStr::from_bytes(target), &path);
            created.map_err(io_err(&path))
        }
        Action::File {
            start,
            end,
            executable,
        } => {
            let mode = if *executable { EXEC_MODE } else { FILE_MODE };
            // create_new is O_CREAT|O_EXCL: it fails on any existing name, even a dangling
            // symlink, so a link planted since the dry run is never followed.
            let mut options = fs::OpenOptions::new();
            options.write(true).create_new(true).mode(mode);
            let mut file = options.open(&path).map_err(io_err(&path))?;
            source
                .copy_range(*start, *end, &mut file)
                .map_err(io_err(&path))?;
            // The umask may have removed bits; set the exact masked mode on the open handle.
            file.set_permissions(fs::Permissions::from_mode(mode))
                .map_err(io_err(&path))
        }
    }
}

/// Validates `bytes`, then writes it into the existing directory `dest`.
pub fn extract_archive(
    bytes: &[u8],
    dest: &Path,
    limits: &TarLimits,
) -> Result<ArchiveSummary, TarError> {
    let (planned, summary) = plan(bytes, limits)?;
    if !fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) {
        let path = dest.display().to_string();
        return Err(TarError::NotADirectory { path });
    }
    // A dry run first, so a conflict with what already is in `dest` also writes nothing.
    for item in &planned {
        let is_dir = matches!(item.action, Action::Dir);
        walk_dest(dest, &item.components, is_dir, false)?;
    }
    for item in &planned {
        write_one(dest, &bytes, item)?;
    }
    Ok(summary)
}

/// One entry the lenient extraction did not write, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// What `extract_lenient` wrote and what it skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LenientSummary {
    /// Entries written (files, directories, symlinks), the root excluded.
    pub written: usize,
    /// Bytes of file data written.
    pub bytes: u64,
    pub skipped: Vec<Skipped>,
}

/// The archive in `file` (`len` bytes), written into the existing directory `dest` entry by
/// entry: each entry the rules refuse, or that conflicts with what is in `dest`, is skipped
/// and listed; the rest is written. A damaged archive or a broken bound writes nothing.
pub fn extract_lenient(
    file: fs::File,
    len: u64,
    dest: &Path,
    limits: &TarLimits,
) -> Result<LenientSummary, TarError> {
    let reader = file.try_clone().map_err(io_err(dest))?;
    let source = FileSource { file, len };
    super::screen::screen_extensions(&source)?;
    let plan = plan_from(BufReader::new(reader), &source, limits, true)?;
    if !fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) {
        let path = dest.display().to_string();
        return Err(TarError::NotADirectory { path });
    }
    let mut summary = LenientSummary {
        skipped: plan.skipped.iter().map(skipped).collect(),
        ..LenientSummary::default()
    };
    for item in &plan.planned {
        let is_dir = matches!(item.action, Action::Dir);
        let written = walk_dest(dest, &item.components, is_dir, false)
            .and_then(|_| write_one(dest, &source, item));
        match written {
            Ok(()) => {
                summary.written += 1;
                if let Action::File { start, end, .. } = item.action {
                    summary.bytes += end - start;
                }
            }
            Err(e) => {
                // What was refused may be half-created (a file cut by ENOSPC): remove it so
                // nothing refused is left behind. Never through a symlink: remove_file on a
                // link removes the link itself.
                let mut path = dest.to_path_buf();
                path.extend(item.components.iter().map(|c| OsStr::from_bytes(c)));
                if matches!(item.action, Action::File { .. })
                    && !matches!(
                        e,
                        TarError::DestExists { .. } | TarError::DestSymlink { .. }
                    )
                {
                    let _ = fs::remove_file(&path);
                }
                let mut s = skipped(&e);
                s.path = String::from_utf8_lossy(&super::join(&item.components)).into_owned();
                summary.skipped.push(s);
            }
        }
    }
    Ok(summary)
}

/// A refusal as a skipped entry: its path and the rule, without the "entry `…`:" prefix.
fn skipped(e: &TarError) -> Skipped {
    let path = e.entry_path().unwrap_or("(unnamed)").to_string();
    let text = e.to_string();
    let prefix = format!("entry `{path}`: ");
    let reason = text.strip_prefix(&prefix).unwrap_or(&text).to_string();
    Skipped { path, reason }
}
