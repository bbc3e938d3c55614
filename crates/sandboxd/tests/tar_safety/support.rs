//! Helpers for crafting hostile archives byte by byte and checking that nothing was written.

use std::fs;
use std::path::PathBuf;

use tar::{Builder, EntryType, Header};

/// Builds archives with raw header fields, bypassing the checks `tar::Header::set_path` makes.
pub struct Tar(Builder<Vec<u8>>);

impl Tar {
    pub fn new() -> Self {
        Tar(Builder::new(Vec::new()))
    }

    /// Appends one entry with exactly these name/link bytes (each at most 100 bytes).
    pub fn raw(
        mut self,
        name: &[u8],
        kind: EntryType,
        mode: u32,
        link: &[u8],
        data: &[u8],
    ) -> Self {
        let header = raw_header(name, kind, mode, data.len() as u64, link);
        self.0.append(&header, data).expect("append to Vec");
        self
    }

    pub fn file(self, name: &str, data: &[u8]) -> Self {
        self.raw(name.as_bytes(), EntryType::Regular, 0o644, b"", data)
    }

    pub fn dir(self, name: &str) -> Self {
        self.raw(name.as_bytes(), EntryType::Directory, 0o755, b"", b"")
    }

    pub fn symlink(self, name: &str, target: &str) -> Self {
        self.raw(
            name.as_bytes(),
            EntryType::Symlink,
            0o777,
            target.as_bytes(),
            b"",
        )
    }

    pub fn pax(mut self, fields: &[(&str, &[u8])]) -> Self {
        self.0
            .append_pax_extensions(fields.iter().copied())
            .expect("append pax");
        self
    }

    /// Appends a header block as is, e.g. one whose declared size has no data behind it.
    pub fn header_only(mut self, header: &Header) -> Self {
        self.0.get_mut().extend_from_slice(header.as_bytes());
        self
    }

    pub fn finish(self) -> Vec<u8> {
        self.0.into_inner().expect("finish archive")
    }
}

pub fn raw_header(name: &[u8], kind: EntryType, mode: u32, size: u64, link: &[u8]) -> Header {
    let mut header = Header::new_gnu();
    let old = header.as_old_mut();
    old.name[..name.len()].copy_from_slice(name);
    old.linkname[..link.len()].copy_from_slice(link);
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(0);
    header.set_cksum();
    header
}

/// A fresh `root/dest` pair: anything an escape writes lands in `root` next to `dest`.
pub struct Scene {
    pub root: tempfile::TempDir,
    pub dest: PathBuf,
}

impl Scene {
    pub fn new() -> anyhow::Result<Self> {
        let root = tempfile::tempdir()?;
        let dest = root.path().join("dest");
        fs::create_dir(&dest)?;
        Ok(Scene { root, dest })
    }

    /// `dest` is empty and `root` holds nothing but `dest`: no canary appeared anywhere.
    pub fn assert_untouched(&self) -> anyhow::Result<()> {
        let in_dest: Vec<_> = fs::read_dir(&self.dest)?.collect::<Result<_, _>>()?;
        assert!(in_dest.is_empty(), "dest was written: {in_dest:?}");
        let in_root: Vec<_> = fs::read_dir(self.root.path())?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        assert_eq!(in_root, vec!["dest"], "something escaped next to dest");
        Ok(())
    }
}

/// Asserts that validation and extraction both refuse with `$pat` and that nothing was written.
macro_rules! assert_refused {
    ($scene:expr, $bytes:expr, $limits:expr, $pat:pat) => {{
        let scene: &crate::tar_support::Scene = &$scene;
        let bytes: &[u8] = &$bytes;
        let limits: &sandboxd_core::sandbox::tar_safety::TarLimits = &$limits;
        let err = sandboxd_core::sandbox::tar_safety::validate_archive(bytes, limits)
            .expect_err("validate_archive accepted a hostile archive");
        assert!(matches!(err, $pat), "validate_archive: unexpected {err:?}");
        let err = sandboxd_core::sandbox::tar_safety::extract_archive(bytes, &scene.dest, limits)
            .expect_err("extract_archive accepted a hostile archive");
        assert!(matches!(err, $pat), "extract_archive: unexpected {err:?}");
        scene.assert_untouched()?;
        err
    }};
}
