//! Reads a whole archive (in memory, or streamed from a file) and turns it into a list of safe
//! write actions, or refuses. In lenient mode (the copy of /workspace to the host) an entry the
//! rules refuse is skipped and recorded instead, and only damage to the archive itself is fatal.

use std::collections::{HashMap, HashSet};
use std::io::Read;

use tar::{Archive, Entry, EntryType};

use super::{
    Action, ArchiveSummary, Planned, Source, TarError, TarLimits, join, lossy, resolve_link,
};

const BLOCK: u64 = 512;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Node {
    ImplicitDir,
    Dir,
    File,
    Symlink,
}

/// A symlink's `..` steps, re-checked once every path in the archive is known.
struct PendingLink {
    path: String,
    target: String,
    popped: Vec<Vec<u8>>,
    /// Its action's index in `planned`.
    planned: usize,
}

/// Names a PAX header gave the next entry, so they can be compared with what the crate used.
#[derive(Default)]
struct PaxNames {
    path: Option<Vec<u8>>,
    linkpath: Option<Vec<u8>>,
}

fn corrupt(path: &str, reason: impl ToString) -> TarError {
    TarError::Corrupt {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

/// Checks one name and returns its normal components; empty means the archive root.
fn check_name(raw: &[u8], index: usize) -> Result<Vec<Vec<u8>>, TarError> {
    let path = lossy(raw);
    if raw.is_empty() {
        return Err(TarError::EmptyName { index });
    }
    if raw[0] == b'/' || raw[0] == b'\\' {
        return Err(TarError::AbsolutePath { path });
    }
    if raw.split(|b| *b == b'/' || *b == b'\\').any(|c| c == b"..") {
        return Err(TarError::ParentComponent { path });
    }
    Ok(raw
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
        .collect())
}

fn read_pax<R: Read>(entry: &mut Entry<'_, R>, path: &str) -> Result<PaxNames, TarError> {
    let global = entry.header().entry_type() == EntryType::XGlobalHeader;
    let mut names = PaxNames::default();
    let Some(pax) = entry.pax_extensions().map_err(|e| corrupt(path, e))? else {
        return Ok(names);
    };
    let mut seen = HashSet::new();
    for field in pax {
        let field = field.map_err(|e| corrupt(path, e))?;
        let key = field.key_bytes();
        // Parsers disagree on whether the first or the last copy of a key wins.
        if !seen.insert(key.to_vec()) {
            return Err(corrupt(path, format!("PAX key `{}` repeated", lossy(key))));
        }
        match key {
            // The crate ignores global headers but other tools apply them to every entry.
            b"path" | b"linkpath" | b"size" if global => {
                let key = lossy(key);
                return Err(TarError::GlobalPaxOverride {
                    path: path.to_owned(),
                    key,
                });
            }
            b"path" => names.path = Some(field.value_bytes().to_vec()),
            b"linkpath" => names.linkpath = Some(field.value_bytes().to_vec()),
            // GNU tar takes the real name of a PAX sparse file from GNU.sparse.name.
            k if k.starts_with(b"GNU.sparse") => {
                let kind = "PAX sparse file".to_owned();
                return Err(TarError::UnsupportedType {
                    path: path.to_owned(),
                    kind,
                });
            }
            _ => {}
        }
    }
    Ok(names)
}

fn check_type(kind: EntryType, mode: u32, path: &str, target: &[u8]) -> Result<(), TarError> {
    let path = path.to_owned();
    match kind {
        EntryType::Link => {
            let target = lossy(target);
            return Err(TarError::HardLink { path, target });
        }
        EntryType::Char => {
            let kind = "character";
            return Err(TarError::DeviceNode { path, kind });
        }
        EntryType::Block => {
            let kind = "block";
            return Err(TarError::DeviceNode { path, kind });
        }
        EntryType::Fifo => return Err(TarError::Fifo { path }),
        EntryType::Regular | EntryType::Directory | EntryType::Symlink => {}
        other => {
            let kind = format!("{other:?} ({:?})", char::from(other.as_byte()));
            return Err(TarError::UnsupportedType { path, kind });
        }
    }
    if mode & 0o6000 != 0 || (kind != EntryType::Directory && mode & 0o1000 != 0) {
        return Err(TarError::PrivilegedMode { path, mode });
    }
    Ok(())
}

struct Validator<'a> {
    source: &'a dyn Source,
    /// Lenient mode: refused entries are recorded here instead of failing the archive.
    skipped: Option<Vec<TarError>>,
    limits: &'a TarLimits,
    nodes: HashMap<Vec<u8>, Node>,
    links: Vec<PendingLink>,
    planned: Vec<Planned>,
    summary: ArchiveSummary,
    end_of_data: u64,
}

impl Validator<'_> {
    /// Applies the limits before any data is looked at; returns the entry's data range.
    fn account(&mut self, path: &str, start: u64, size: u64) -> Result<(u64, u64), TarError> {
        let (path, max) = (path.to_owned(), self.limits.max_total_bytes);
        self.summary.entries += 1;
        if self.summary.entries > self.limits.max_entries {
            let max = self.limits.max_entries;
            return Err(TarError::TooManyEntries { path, max });
        }
        if size > max {
            return Err(TarError::EntryTooLarge { path, size, max });
        }
        let total = self.summary.total_bytes.saturating_add(size);
        self.summary.total_bytes = total;
        if total > max {
            return Err(TarError::TotalTooLarge { path, total, max });
        }
        let end = start
            .checked_add(size)
            .filter(|end| *end <= self.source.len());
        let end = end.ok_or_else(|| corrupt(&path, "entry data runs past the end"))?;
        self.end_of_data = end.div_ceil(BLOCK) * BLOCK;
        Ok((start, end))
    }

    /// Records `components` as a `node`, refusing duplicates and paths through links or files.
    fn claim(&mut self, components: &[Vec<u8>], node: Node) -> Result<(), TarError> {
        let path = lossy(&join(components));
        for depth in 1..=components.len() {
            let key = join(&components[..depth]);
            let existing = self.nodes.get(&key).copied();
            if depth < components.len() {
                match existing {
                    Some(Node::Symlink) => {
                        let link = lossy(&key);
                        return Err(TarError::ThroughSymlink { path, link });
                    }
                    Some(Node::File) => {
                        let parent = lossy(&key);
                        return Err(TarError::ParentNotDirectory { path, parent });
                    }
                    Some(_) => {}
                    None => {
                        self.nodes.insert(key, Node::ImplicitDir);
                    }
                }
            } else {
                match (existing, node) {
                    (None, _) | (Some(Node::ImplicitDir), Node::Dir) => {
                        self.nodes.insert(key, node);
                    }
                    _ => return Err(TarError::Duplicate { path }),
                }
            }
        }
        Ok(())
    }

    fn symlink<R: Read>(
        &mut self,
        entry: &Entry<'_, R>,
        components: &[Vec<u8>],
        path: &str,
        pax: &PaxNames,
    ) -> Result<Action, TarError> {
        let target = entry
            .link_name_bytes()
            .map(|t| t.into_owned())
            .unwrap_or_default();
        if pax.linkpath.as_ref().is_some_and(|l| *l != target) {
            return Err(corrupt(
                path,
                "PAX linkpath disagrees with the GNU long link",
            ));
        }
        let raw_target = entry
            .header()
            .link_name_bytes()
            .unwrap_or_default()
            .into_owned();
        let parent = &components[..components.len() - 1];
        for t in [&target, &raw_target] {
            let (path, shown) = (path.to_owned(), lossy(t));
            if t.first().is_some_and(|b| *b == b'/' || *b == b'\\') {
                return Err(TarError::SymlinkAbsolute {
                    path,
                    target: shown,
                });
            }
            if target.is_empty() || resolve_link(parent, t).is_none() {
                return Err(TarError::SymlinkEscape {
                    path,
                    target: shown,
                });
            }
        }
        self.claim(components, Node::Symlink)?;
        let popped = resolve_link(parent, &target).unwrap_or_default();
        let (path, shown) = (path.to_owned(), lossy(&target));
        self.links.push(PendingLink {
            path,
            target: shown,
            popped,
            planned: self.planned.len(),
        });
        Ok(Action::Symlink { target })
    }

    fn entry<R: Read>(&mut self, index: usize, entry: &mut Entry<'_, R>) -> Result<(), TarError> {
        let resolved = entry.path_bytes().into_owned();
        let path = lossy(&resolved);
        // A sparse entry's size() is its apparent size; only the stored data is in the archive.
        // Its holes are never expanded onto the host: the entry is refused, saying how big it
        // would have become.
        if entry.header().entry_type().is_gnu_sparse() {
            let stored = entry.header().entry_size().map_err(|e| corrupt(&path, e))?;
            self.account(&path, entry.raw_file_position(), stored)?;
            let apparent_size = entry.size();
            return Err(TarError::Sparse {
                path,
                apparent_size,
            });
        }
        let (start, end) = self.account(&path, entry.raw_file_position(), entry.size())?;
        let pax = read_pax(entry, &path)?;
        let kind = entry.header().entry_type();
        if kind == EntryType::XGlobalHeader {
            return Ok(());
        }
        if pax.path.as_ref().is_some_and(|p| *p != resolved) {
            return Err(corrupt(&path, "PAX path disagrees with the GNU long name"));
        }
        let components = check_name(&resolved, index)?;
        check_name(&entry.header().path_bytes(), index)?;
        let mut mode = entry.header().mode().map_err(|e| corrupt(&path, e))?;
        if self.skipped.is_some() {
            // The copy-out sets every mode itself (0o755/0o644), so setuid/setgid/sticky bits
            // are dropped there rather than costing the user the file.
            mode &= 0o777;
        }
        let target = entry.link_name_bytes().unwrap_or_default();
        check_type(kind, mode, &path, &target)?;
        // Old tars mark directories only by the trailing slash.
        let is_dir = kind == EntryType::Directory
            || (kind == EntryType::Regular && resolved.ends_with(b"/"));
        let action = match (is_dir, components.is_empty()) {
            // `./` names the destination itself, which already exists.
            (true, true) => return Ok(()),
            (false, true) => return Err(TarError::EmptyName { index }),
            (true, false) => {
                self.claim(&components, Node::Dir)?;
                Action::Dir
            }
            (false, false) if kind == EntryType::Symlink => {
                self.symlink(entry, &components, &path, &pax)?
            }
            (false, false) => {
                self.claim(&components, Node::File)?;
                let executable = mode & 0o111 != 0;
                Action::File {
                    start,
                    end,
                    executable,
                }
            }
        };
        self.planned.push(Planned { components, action });
        Ok(())
    }

    fn finish(mut self, last: &str) -> Result<Plan, TarError> {
        // Without the marker, a cut exactly at a block boundary would look complete.
        if !self.source.zero_block_at(self.end_of_data) {
            return Err(corrupt(last, "missing end-of-archive marker"));
        }
        let mut dropped = vec![false; self.planned.len()];
        for link in std::mem::take(&mut self.links) {
            let only_dirs = link
                .popped
                .iter()
                .all(|p| matches!(self.nodes.get(p), Some(Node::Dir | Node::ImplicitDir)));
            if !only_dirs {
                let (path, target) = (link.path, link.target);
                let refused = TarError::SymlinkEscape { path, target };
                match self.skipped.as_mut() {
                    Some(skipped) => {
                        skipped.push(refused);
                        dropped[link.planned] = true;
                    }
                    None => return Err(refused),
                }
            }
        }
        let planned = self
            .planned
            .into_iter()
            .zip(dropped)
            .filter_map(|(p, drop)| (!drop).then_some(p))
            .collect();
        Ok(Plan {
            planned,
            summary: self.summary,
            skipped: self.skipped.unwrap_or_default(),
        })
    }
}

/// What an archive asks to be written, and (lenient mode) what was refused.
pub(super) struct Plan {
    pub planned: Vec<Planned>,
    pub summary: ArchiveSummary,
    pub skipped: Vec<TarError>,
}

/// Refusals that concern one entry only: in lenient mode the entry is skipped and the rest
/// of the archive still counts. Everything else (a corrupt archive, the count and size
/// bounds, names no honest tar writes) stops the whole archive.
fn skippable(e: &TarError) -> bool {
    matches!(
        e,
        TarError::HardLink { .. }
            | TarError::SymlinkAbsolute { .. }
            | TarError::SymlinkEscape { .. }
            | TarError::DeviceNode { .. }
            | TarError::Fifo { .. }
            | TarError::UnsupportedType { .. }
            | TarError::Sparse { .. }
            | TarError::EntryTooLarge { .. }
            | TarError::PrivilegedMode { .. }
            | TarError::ThroughSymlink { .. }
            | TarError::ParentNotDirectory { .. }
            | TarError::Duplicate { .. }
    )
}

/// Validates the whole archive and returns what to write, without touching the filesystem.
/// `lenient` skips (and lists) entries the rules refuse instead of refusing the archive.
pub(super) fn plan_from<R: Read>(
    reader: R,
    source: &dyn Source,
    limits: &TarLimits,
    lenient: bool,
) -> Result<Plan, TarError> {
    let mut archive = Archive::new(reader);
    let entries = archive.entries().map_err(|e| corrupt("(start)", e))?;
    let mut validator = Validator {
        source,
        skipped: lenient.then(Vec::new),
        limits,
        nodes: HashMap::new(),
        links: Vec::new(),
        planned: Vec::new(),
        summary: ArchiveSummary::default(),
        end_of_data: 0,
    };
    let mut last = String::from("(start)");
    for (index, entry) in entries.enumerate() {
        let mut entry = entry.map_err(|e| corrupt(&last, e))?;
        last = lossy(&entry.path_bytes());
        match validator.entry(index, &mut entry) {
            Ok(()) => {}
            Err(e) if lenient && skippable(&e) => {
                // Nothing may later be written *under* a skipped non-directory (a refused
                // symlink to / must not become a real directory of that name).
                let is_dir = entry.header().entry_type() == EntryType::Directory;
                if !is_dir && let Ok(components) = check_name(&entry.path_bytes(), index) {
                    let key = join(&components);
                    if !key.is_empty() {
                        validator.nodes.entry(key).or_insert(Node::File);
                    }
                }
                if let Some(skipped) = validator.skipped.as_mut() {
                    skipped.push(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
    validator.finish(&last)
}

/// The strict plan of an in-memory archive.
pub(super) fn plan(
    bytes: &[u8],
    limits: &TarLimits,
) -> Result<(Vec<Planned>, ArchiveSummary), TarError> {
    let plan = plan_from(bytes, &bytes, limits, false)?;
    Ok((plan.planned, plan.summary))
}

/// `validate_archive` of the first `len` bytes of a file, read in bounded pieces (a buffered
/// pass over the entries, positioned reads for the end marker): the archive is never loaded.
pub fn validate_archive_file(
    file: &std::fs::File,
    len: u64,
    limits: &TarLimits,
) -> Result<ArchiveSummary, TarError> {
    use std::io::{BufReader, Seek, SeekFrom};
    let io = |source| TarError::Io {
        path: "(archive)".into(),
        source,
    };
    let mut reader = file.try_clone().map_err(io)?;
    reader.seek(SeekFrom::Start(0)).map_err(io)?;
    let source = super::FileSource {
        file: file.try_clone().map_err(io)?,
        len,
    };
    super::screen::screen_extensions(&source)?;
    let reader = BufReader::new(reader).take(len);
    plan_from(reader, &source, limits, false).map(|plan| plan.summary)
}

/// Reads and checks the whole archive; nothing is written anywhere.
pub fn validate_archive(bytes: &[u8], limits: &TarLimits) -> Result<ArchiveSummary, TarError> {
    plan(bytes, limits).map(|(_, summary)| summary)
}
