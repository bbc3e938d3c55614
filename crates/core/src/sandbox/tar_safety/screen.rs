//! A pass over an archive file's headers before the `tar` crate parses it: the crate reads
//! each GNU long name, long link and PAX header (local or global) whole into memory, so one
//! hostile header of 1 GB would cost the host 1 GB however carefully the entries are then
//! bounded. Each such header is refused over `MAX_EXTENSION` bytes, from positioned reads of
//! 512-byte blocks and of at most `MAX_EXTENSION` bytes.
//!
//! The walk follows the crate's own: an entry's data is its header's size, or the size a
//! PAX header gave it (never for an extension header itself), and an old GNU sparse header
//! is followed by its extension blocks. What the walk cannot read (a bad size field, a cut
//! archive) it leaves to the parser, which refuses it.

use std::os::unix::fs::FileExt;

use super::{FileSource, TarError};

/// The largest GNU long name or link, or PAX header, accepted: names are at most a few KiB,
/// extended attributes at most 64 KiB each.
pub(super) const MAX_EXTENSION: u64 = 1 << 20;
const BLOCK: u64 = 512;

fn too_large(offset: u64, kind: u8, size: u64) -> TarError {
    TarError::Corrupt {
        path: format!("(the header at byte {offset})"),
        reason: format!(
            "a {} of {size} bytes; at most {MAX_EXTENSION} are accepted",
            match kind {
                b'L' => "GNU long name",
                b'K' => "GNU long link name",
                _ => "PAX header",
            }
        ),
    }
}

/// The `size` record of a PAX header's data (`"<len> size=<n>\n"`), if it has one.
fn pax_size(data: &[u8]) -> Option<u64> {
    let mut rest = data;
    while !rest.is_empty() {
        let space = rest.iter().position(|b| *b == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
        let record = rest.get(space + 1..len)?;
        if let Some(value) = record.strip_prefix(b"size=") {
            let value = value.strip_suffix(b"\n").unwrap_or(value);
            return std::str::from_utf8(value).ok()?.parse().ok();
        }
        rest = rest.get(len..)?;
    }
    None
}

/// Refuses an archive with a GNU long name or link, or a PAX header, over `MAX_EXTENSION`.
pub(super) fn screen_extensions(source: &FileSource) -> Result<(), TarError> {
    let mut at: u64 = 0;
    let mut block = [0u8; BLOCK as usize];
    let mut next_size: Option<u64> = None;
    while at + BLOCK <= source.len {
        if source.file.read_exact_at(&mut block, at).is_err() || block.iter().all(|b| *b == 0) {
            return Ok(());
        }
        let Ok(size) = tar::Header::from_byte_slice(&block).entry_size() else {
            return Ok(());
        };
        let (header_at, kind) = (at, block[156]);
        at += BLOCK;
        let extension = matches!(kind, b'L' | b'K' | b'x' | b'g');
        if extension && size > MAX_EXTENSION {
            return Err(too_large(header_at, kind, size));
        }
        let data_size = if kind == b'x' {
            let mut data = vec![0u8; size as usize];
            if source.file.read_exact_at(&mut data, at).is_err() {
                return Ok(());
            }
            next_size = pax_size(&data);
            size
        } else if extension {
            size
        } else {
            next_size.take().unwrap_or(size)
        };
        // An old GNU sparse header says in byte 482 that extension blocks follow it, each
        // saying the same of the next in its byte 504.
        if kind == b'S' && block[482] != 0 {
            loop {
                if source.file.read_exact_at(&mut block, at).is_err() {
                    return Ok(());
                }
                at += BLOCK;
                if block[504] == 0 {
                    break;
                }
            }
        }
        at = match data_size
            .checked_next_multiple_of(BLOCK)
            .and_then(|d| at.checked_add(d))
        {
            Some(next) => next,
            None => return Ok(()),
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str, kind: u8, size: u64) -> [u8; 512] {
        let mut h = tar::Header::new_gnu();
        h.set_path(name).unwrap();
        h.set_size(size);
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_mode(0o644);
        h.set_cksum();
        *h.as_bytes()
    }

    fn source(bytes: &[u8]) -> FileSource {
        use std::io::Write;
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        FileSource {
            file,
            len: bytes.len() as u64,
        }
    }

    #[test]
    fn a_huge_extension_header_is_refused_before_it_is_read() {
        for kind in [b'L', b'K', b'x', b'g'] {
            // Only the header is there: the 2 GB the header announces is never read.
            let mut archive = header("././@LongLink", kind, 2 << 30).to_vec();
            archive.extend_from_slice(&[0u8; 1024]);
            let err = screen_extensions(&source(&archive)).unwrap_err();
            assert!(
                err.to_string().contains("at most"),
                "{}: {err}",
                kind as char
            );
        }
    }

    #[test]
    fn an_ordinary_archive_passes_and_a_pax_size_is_followed() {
        let mut b = tar::Builder::new(Vec::new());
        let long = "d/".repeat(200) + "f.txt";
        let mut h = tar::Header::new_gnu();
        h.set_size(5);
        h.set_mode(0o644);
        b.append_data(&mut h, &long, &b"hello"[..]).unwrap();
        let archive = b.into_inner().unwrap();
        screen_extensions(&source(&archive)).unwrap();

        // A PAX size of 600 makes the next entry's data span two blocks; a big long name
        // hidden in them is data, not a header, and the one after them is found.
        let pax = b"12 size=600\n";
        let mut a = header("pax", b'x', pax.len() as u64).to_vec();
        a.extend_from_slice(pax);
        a.resize(1024, 0);
        a.extend_from_slice(&header("f", b'0', 0));
        a.extend_from_slice(&header("hidden", b'L', 2 << 30));
        a.resize(1536 + 1024, 0);
        a.extend_from_slice(&header("next", b'L', 2 << 30));
        a.extend_from_slice(&[0u8; 1024]);
        let err = screen_extensions(&source(&a)).unwrap_err();
        assert!(err.to_string().contains("byte 2560"), "{err}");
    }
}
