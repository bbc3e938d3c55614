//! Builds a tar of a directory tree that a sandbox may have filled with hostile names and links.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use tar::{Builder, EntryType, Header};

use super::{
    DIR_MODE, EXEC_MODE, FILE_MODE, TarError, TarLimits, io_err, join, lossy, resolve_link,
    validate_archive,
};

struct Budget<'a> {
    limits: &'a TarLimits,
    entries: usize,
    bytes: u64,
}

/// Reads a regular file that `lstat` saw, refusing if the name now points at something else.
fn read_regular(
    full: &Path,
    seen: &fs::Metadata,
    budget: &mut Budget,
    path: &str,
) -> Result<Vec<u8>, TarError> {
    let file = fs::File::open(full).map_err(io_err(full))?;
    let opened = file.metadata().map_err(io_err(full))?;
    // If the name was swapped for a symlink after lstat, open followed it: compare identities
    // before reading a single byte.
    if !opened.is_file() || opened.dev() != seen.dev() || opened.ino() != seen.ino() {
        let source = io::Error::other("file was replaced while archiving");
        let path = full.display().to_string();
        return Err(TarError::Io { path, source });
    }
    let max = budget.limits.max_total_bytes;
    let room = max.saturating_sub(budget.bytes);
    let mut data = Vec::new();
    // One byte over the room is enough to know the limit is blown; a growing file can't OOM us.
    let read = file.take(room.saturating_add(1)).read_to_end(&mut data);
    read.map_err(io_err(full))?;
    budget.bytes = budget.bytes.saturating_add(data.len() as u64);
    if budget.bytes > max {
        let (path, total) = (path.to_owned(), budget.bytes);
        return Err(TarError::TotalTooLarge { path, total, max });
    }
    Ok(data)
}

fn append_symlink(
    builder: &mut Builder<Vec<u8>>,
    header: &mut Header,
    full: &Path,
    parent: &[Vec<u8>],
    name: &Path,
) -> Result<(), TarError> {
    let path = name.display().to_string();
    let target = fs::read_link(full).map_err(io_err(full))?;
    let target_bytes = target.as_os_str().as_bytes();
    let shown = lossy(target_bytes);
    if target.is_absolute() {
        return Err(TarError::SymlinkAbsolute {
            path,
            target: shown,
        });
    }
    if target_bytes.is_empty() || resolve_link(parent, target_bytes).is_none() {
        return Err(TarError::SymlinkEscape {
            path,
            target: shown,
        });
    }
    header.set_entry_type(EntryType::Symlink);
    header.set_mode(0o777);
    header.set_size(0);
    let appended = builder.append_link(header, name, &target);
    appended.map_err(io_err(full))
}

fn walk(
    builder: &mut Builder<Vec<u8>>,
    dir: &Path,
    rel: &[Vec<u8>],
    budget: &mut Budget,
) -> Result<(), TarError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        names.push(entry.map_err(io_err(dir))?.file_name());
    }
    names.sort(); // byte order on unix, so the archive is deterministic
    for name in names {
        let full = dir.join(&name);
        let mut components = rel.to_vec();
        components.push(name.as_bytes().to_vec());
        let joined = join(&components);
        let path = lossy(&joined);
        budget.entries += 1;
        if budget.entries > budget.limits.max_entries {
            let max = budget.limits.max_entries;
            return Err(TarError::TooManyEntries { path, max });
        }
        let meta = fs::symlink_metadata(&full).map_err(io_err(&full))?;
        let kind = meta.file_type();
        let mut header = Header::new_gnu();
        // Host uids/gids mean nothing to the receiver and leak host details; mtime is kept.
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
        let name_path = Path::new(OsStr::from_bytes(&joined));
        if kind.is_dir() {
            header.set_entry_type(EntryType::Directory);
            header.set_mode(DIR_MODE);
            header.set_size(0);
            let appended = builder.append_data(&mut header, name_path, io::empty());
            appended.map_err(io_err(&full))?;
            walk(builder, &full, &components, budget)?;
        } else if kind.is_file() {
            let data = read_regular(&full, &meta, budget, &path)?;
            header.set_entry_type(EntryType::Regular);
            let executable = meta.mode() & 0o111 != 0;
            header.set_mode(if executable { EXEC_MODE } else { FILE_MODE });
            header.set_size(data.len() as u64);
            let appended = builder.append_data(&mut header, name_path, data.as_slice());
            appended.map_err(io_err(&full))?;
        } else if kind.is_symlink() {
            append_symlink(builder, &mut header, &full, rel, name_path)?;
        } else if kind.is_char_device() {
            let kind = "character";
            return Err(TarError::DeviceNode { path, kind });
        } else if kind.is_block_device() {
            let kind = "block";
            return Err(TarError::DeviceNode { path, kind });
        } else if kind.is_fifo() {
            return Err(TarError::Fifo { path });
        } else {
            let kind = "socket".to_owned();
            return Err(TarError::UnsupportedType { path, kind });
        }
    }
    Ok(())
}

/// Builds a tar of `src` (a real directory, not a symlink) without following symlinks.
pub fn archive_dir(src: &Path, limits: &TarLimits) -> Result<Vec<u8>, TarError> {
    if !fs::symlink_metadata(src).is_ok_and(|m| m.is_dir()) {
        let path = src.display().to_string();
        return Err(TarError::NotADirectory { path });
    }
    let mut builder = Builder::new(Vec::new());
    let mut budget = Budget {
        limits,
        entries: 0,
        bytes: 0,
    };
    walk(&mut builder, src, &[], &mut budget)?;
    let bytes = builder.into_inner().map_err(io_err(src))?;
    // Links are checked one at a time above; the full rules (e.g. `..` after another link)
    // need the whole tree, so run the same validation a receiver would.
    validate_archive(&bytes, limits)?;
    Ok(bytes)
}
