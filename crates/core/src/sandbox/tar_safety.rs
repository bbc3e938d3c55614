//! Host-side handling of hostile tar archives (uploads into, downloads out of, a sandbox).
//!
//! Every byte of an archive comes from the model or the sandbox, so it is hostile. The worst
//! code-runner escapes on record came from exactly this kind of host-side copy code (tar slip,
//! RUSTSEC-2021-0080 symlink-then-file, Judge0 CVE-2024-28185 planted symlinks, docker cp
//! CVE-2018-15664). The rules, and why each exists:
//!
//! * The whole archive is validated before anything is written, so a bad archive can never leave
//!   a half-extracted tree behind (a partial success would be a foothold for the next request).
//! * No absolute names and no `..` component, in the resolved (GNU/PAX long) name *and* in the raw
//!   header name: other tools prefer one or the other, and that disagreement is an attack surface.
//!   `\` also counts as a separator for the `..` check because Windows-side tools treat it so.
//! * PAX headers may not repeat a key and a PAX `path`/`linkpath` must agree with the name the
//!   `tar` crate resolves: parsers differ in which copy wins (first, last, GNU vs PAX).
//! * Hard links are refused outright: their target is resolved by the extractor against the
//!   destination, the classic way to alias a host file.
//! * Symlinks must be relative and, resolved lexically from the link's own directory, stay inside
//!   the root; a `..` in a target may only leave a directory this archive itself creates, because
//!   `..` after a symlink (or after a directory that exists only on the host) goes elsewhere.
//! * No entry may go *through* an earlier symlink, even one pointing inside: a writer that
//!   follows links is the bug class we are defending against, so we never depend on one.
//! * Only regular files, directories and symlinks: devices, FIFOs and sparse/unknown types have
//!   side effects on open or differ between parsers. A sparse file is never expanded (1000 MB
//!   of holes costs the sandbox nothing and would cost the host 1000 MB): it is refused with
//!   its apparent size. Setuid/setgid (and sticky on files) are
//!   refused rather than silently dropped so the caller notices.
//! * Entry count and total declared size are bounded (checked before any data is read) against
//!   tar bombs; duplicates are refused because "last one wins" is how overwrites sneak in;
//!   truncated archives and a missing end-of-archive marker are errors.
//! * Extraction never overwrites (`create_new`), never writes through an existing symlink in the
//!   destination (Judge0 CVE-2024-28185), and sets modes itself: directories 0o755, files 0o755
//!   if any execute bit was set, else 0o644, so nothing privileged or world-writable lands on the
//!   host. It dry-runs every path against `dest` first, so a conflict also writes nothing. It
//!   cannot close a race with a process concurrently modifying `dest` (std has no `openat`), so
//!   `dest` must not be writable by a running sandbox: use a host-private staging dir, or pause.
//! * `archive_dir` never follows symlinks, refuses links that leave `src` and special files, and
//!   re-validates its own output so we never emit what we would refuse to accept. A file swapped
//!   for a link between `lstat` and `open` is caught by comparing device and inode before reading;
//!   a swap to a FIFO could still block the open, so the same "no concurrent writer" rule applies.
//! * `extract_lenient` (the copy of /workspace to the host) reads the archive from a file and
//!   skips, and lists, each entry the rules refuse instead of refusing the whole archive: one
//!   venv symlink must not cost the user every deliverable. The rules themselves are the same,
//!   nothing refused is written, and a damaged archive or a broken bound still stops it all.
//! * An archive in a file (`validate_archive_file`, `extract_lenient`) is read in bounded pieces,
//!   and its GNU long names and PAX headers, which the `tar` crate reads whole into memory, are
//!   refused over 1 MiB by a pass over its headers first (`screen`).

use std::io;
use std::path::Path;

mod build;
mod extract;
mod screen;
mod validate;

pub use build::archive_dir;
pub use extract::{LenientSummary, Skipped, extract_archive, extract_lenient};
pub use validate::{validate_archive, validate_archive_file};

const DIR_MODE: u32 = 0o755;
const EXEC_MODE: u32 = 0o755;
const FILE_MODE: u32 = 0o644;

/// Upper bounds enforced while reading or building an archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TarLimits {
    pub max_total_bytes: u64,
    pub max_entries: usize,
}

impl Default for TarLimits {
    fn default() -> Self {
        Self {
            max_total_bytes: 1 << 30,
            max_entries: 100_000,
        }
    }
}

/// What a validated archive contains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArchiveSummary {
    pub entries: usize,
    pub total_bytes: u64,
}

const ALLOWED: &str = "only regular files, directories and relative in-tree symlinks are allowed";

#[derive(thiserror::Error, Debug)]
pub enum TarError {
    #[error("entry `{path}`: absolute paths are not allowed; names must be relative to the root")]
    AbsolutePath { path: String },
    #[error("entry `{path}`: `..` components are not allowed; names must stay inside the root")]
    ParentComponent { path: String },
    #[error("entry #{index} has an empty name; every non-directory entry needs a relative name")]
    EmptyName { index: usize },
    #[error("entry `{path}`: hard links are not allowed (target `{target}`); {ALLOWED}")]
    HardLink { path: String, target: String },
    #[error("entry `{path}`: symlink target `{target}` is absolute; targets must be relative")]
    SymlinkAbsolute { path: String, target: String },
    #[error(
        "entry `{path}`: symlink target `{target}` escapes the root; targets must resolve inside \
         it and `..` may only leave directories created by the archive"
    )]
    SymlinkEscape { path: String, target: String },
    #[error("entry `{path}`: {kind} device nodes are not allowed; {ALLOWED}")]
    DeviceNode { path: String, kind: &'static str },
    #[error(
        "entry `{path}`: a sparse file of {apparent_size} bytes (apparent size); sparse files \
         are not expanded onto the host"
    )]
    Sparse { path: String, apparent_size: u64 },
    #[error("entry `{path}`: FIFOs are not allowed; {ALLOWED}")]
    Fifo { path: String },
    #[error("entry `{path}`: entry type {kind} is not supported; {ALLOWED}")]
    UnsupportedType { path: String, kind: String },
    #[error(
        "entry `{path}`: mode {mode:#o} has setuid/setgid/sticky bits; only 0o777 bits allowed"
    )]
    PrivilegedMode { path: String, mode: u32 },
    #[error("entry `{path}`: more than {max} entries; at most {max} are allowed")]
    TooManyEntries { path: String, max: usize },
    #[error("entry `{path}`: declared size {size} exceeds the limit of {max} bytes")]
    EntryTooLarge { path: String, size: u64, max: u64 },
    #[error("entry `{path}`: total size reaches {total} bytes; at most {max} are allowed")]
    TotalTooLarge { path: String, total: u64, max: u64 },
    #[error("entry `{path}` goes through symlink `{link}`; paths must not traverse symlinks")]
    ThroughSymlink { path: String, link: String },
    #[error("entry `{path}`: parent `{parent}` is not a directory; parents must be directories")]
    ParentNotDirectory { path: String, parent: String },
    #[error("entry `{path}` appears more than once; each path may be declared only once")]
    Duplicate { path: String },
    #[error("entry `{path}`: global PAX header sets `{key}`; only metadata keys are allowed")]
    GlobalPaxOverride { path: String, key: String },
    #[error("archive is corrupt or truncated at `{path}`: {reason}; only complete tars accepted")]
    Corrupt { path: String, reason: String },
    #[error("`{path}` must be an existing directory that is not a symlink")]
    NotADirectory { path: String },
    #[error("`{path}` is an existing symlink; extraction never writes through symlinks")]
    DestSymlink { path: String },
    #[error("`{path}` already exists in the destination; extraction never overwrites")]
    DestExists { path: String },
    #[error("I/O error at `{path}`: {source}")]
    Io { path: String, source: io::Error },
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> TarError + '_ {
    move |source| TarError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl TarError {
    /// The entry the error is about, when it is about one.
    pub fn entry_path(&self) -> Option<&str> {
        use TarError::*;
        match self {
            AbsolutePath { path }
            | ParentComponent { path }
            | HardLink { path, .. }
            | SymlinkAbsolute { path, .. }
            | SymlinkEscape { path, .. }
            | DeviceNode { path, .. }
            | Sparse { path, .. }
            | Fifo { path }
            | UnsupportedType { path, .. }
            | PrivilegedMode { path, .. }
            | TooManyEntries { path, .. }
            | EntryTooLarge { path, .. }
            | TotalTooLarge { path, .. }
            | ThroughSymlink { path, .. }
            | ParentNotDirectory { path, .. }
            | Duplicate { path }
            | GlobalPaxOverride { path, .. }
            | Corrupt { path, .. }
            | DestSymlink { path }
            | DestExists { path } => Some(path),
            EmptyName { .. } | NotADirectory { .. } | Io { .. } => None,
        }
    }
}

/// Where an archive's bytes are: the bounds check and the end-of-archive marker need them.
pub(crate) trait Source {
    fn len(&self) -> u64;
    /// Whether a full block of zeros starts at `offset`.
    fn zero_block_at(&self, offset: u64) -> bool;
    /// Copies `start..end` of the archive into `out`.
    fn copy_range(&self, start: u64, end: u64, out: &mut dyn io::Write) -> io::Result<()>;
}

impl Source for &[u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }

    fn zero_block_at(&self, offset: u64) -> bool {
        let start = usize::try_from(offset).ok();
        let block = start.and_then(|s| self.get(s..s.checked_add(512)?));
        block.is_some_and(|b| b.iter().all(|x| *x == 0))
    }

    fn copy_range(&self, start: u64, end: u64, out: &mut dyn io::Write) -> io::Result<()> {
        let range = usize::try_from(start).ok().zip(usize::try_from(end).ok());
        let data = range.and_then(|(s, e)| self.get(s..e));
        out.write_all(data.ok_or_else(|| io::Error::other("range outside the archive"))?)
    }
}

/// An archive in a file, read with positioned reads (the file is never mapped or loaded).
pub(crate) struct FileSource {
    pub file: std::fs::File,
    pub len: u64,
}

impl Source for FileSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn zero_block_at(&self, offset: u64) -> bool {
        use std::os::unix::fs::FileExt;
        let mut block = [0u8; 512];
        self.file.read_exact_at(&mut block, offset).is_ok() && block.iter().all(|b| *b == 0)
    }

    fn copy_range(&self, start: u64, end: u64, out: &mut dyn io::Write) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; 256 * 1024];
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            self.file.read_exact_at(&mut buf[..n], at)?;
            out.write_all(&buf[..n])?;
            at += n as u64;
        }
        Ok(())
    }
}

/// A validated entry, ready to be written; file data is a range of the archive.
enum Action {
    Dir,
    File {
        start: u64,
        end: u64,
        executable: bool,
    },
    Symlink {
        target: Vec<u8>,
    },
}

struct Planned {
    components: Vec<Vec<u8>>,
    action: Action,
}

fn join(components: &[Vec<u8>]) -> Vec<u8> {
    components.join(&b'/')
}

/// Lexically resolves `target` from `parent`; returns the directories left via `..`, or `None`
/// if the walk leaves the root. Runs with `/` only and with `\` too, and both must stay inside.
fn resolve_link(parent: &[Vec<u8>], target: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut popped = Vec::new();
    for backslash_too in [false, true] {
        let mut stack = parent.to_vec();
        let split = target.split(|b| *b == b'/' || (backslash_too && *b == b'\\'));
        for component in split {
            match component {
                b"" | b"." => {}
                b".." => {
                    popped.push(join(&stack));
                    stack.pop()?;
                }
                other => stack.push(other.to_vec()),
            }
        }
    }
    Some(popped)
}

#[cfg(test)]
mod tests {
    use super::resolve_link;

    fn parts(s: &str) -> Vec<Vec<u8>> {
        s.split('/')
            .filter(|c| !c.is_empty())
            .map(|c| c.as_bytes().to_vec())
            .collect()
    }

    #[test]
    fn resolve_link_stays_inside_or_says_none() {
        // Each of the two passes records the directory it leaves.
        let left = Some(vec![b"a/b".to_vec(), b"a/b".to_vec()]);
        assert_eq!(resolve_link(&parts("a/b"), b"../c"), left);
        assert!(resolve_link(&parts("a"), b"../..").is_none());
        assert!(resolve_link(&[], b"..").is_none());
        assert!(resolve_link(&parts("a"), b"..\\..").is_none());
        assert_eq!(resolve_link(&[], b"x/./y"), Some(vec![]));
    }
}
