//! Hostile archives that abuse the format itself: long names, PAX records, truncation.

use sandboxd_core::sandbox::tar_safety::{TarError, TarLimits};
use tar::EntryType;

use crate::tar_support::{Scene, Tar};

type Res = anyhow::Result<()>;

fn limits() -> TarLimits {
    TarLimits::default()
}

#[test]
fn truncated_archive_is_refused() -> Res {
    let full = Tar::new()
        .file("first", b"ok")
        .file("second", &[1u8; 2000])
        .finish();
    // Cut inside the second file's data: the first entry alone must not count as success.
    let cut = &full[..512 * 4];
    assert_refused!(Scene::new()?, cut, limits(), TarError::Corrupt { .. });
    // Cut mid-header.
    assert_refused!(
        Scene::new()?,
        full[..512 * 2 + 100],
        limits(),
        TarError::Corrupt { .. }
    );
    Ok(())
}

/// A cut exactly at a block boundary parses as a shorter archive unless the end marker is checked.
#[test]
fn missing_end_marker_is_refused() -> Res {
    let full = Tar::new()
        .file("first", b"ok")
        .file("second", b"ok")
        .finish();
    assert_refused!(
        Scene::new()?,
        full[..512 * 2],
        limits(),
        TarError::Corrupt { .. }
    );
    Ok(())
}

#[test]
fn corrupt_checksum_is_refused() -> Res {
    let mut tar = Tar::new().file("a", b"x").finish();
    tar[0] ^= 0x20;
    assert_refused!(Scene::new()?, tar, limits(), TarError::Corrupt { .. });
    Ok(())
}

#[test]
fn pax_long_name_with_dotdot_is_refused() -> Res {
    let long = format!("{}/../../../escape", "d".repeat(150));
    let tar = Tar::new()
        .pax(&[("path", long.as_bytes())])
        .file("innocent", b"x")
        .finish();
    let err = assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::ParentComponent { .. }
    );
    assert!(err.to_string().contains("escape"), "{err}");
    Ok(())
}

#[test]
fn gnu_long_name_with_dotdot_is_refused() -> Res {
    let long = format!("{}/../../escape\0", "d".repeat(150));
    let tar = Tar::new()
        .raw(
            b"././@LongLink",
            EntryType::GNULongName,
            0o644,
            b"",
            long.as_bytes(),
        )
        .file("innocent", b"x")
        .finish();
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::ParentComponent { .. }
    );
    Ok(())
}

/// Some parsers take the first `path`, some the last: refuse rather than pick one.
#[test]
fn repeated_pax_key_is_refused() -> Res {
    let tar = Tar::new()
        .pax(&[("path", b"safe"), ("path", b"../../evil")])
        .file("safe", b"x")
        .finish();
    assert_refused!(Scene::new()?, tar, limits(), TarError::Corrupt { .. });
    Ok(())
}

#[test]
fn pax_symlink_target_escape_is_refused() -> Res {
    let tar = Tar::new()
        .pax(&[("linkpath", b"../../../etc")])
        .symlink("etc", "harmless")
        .finish();
    assert_refused!(Scene::new()?, tar, limits(), TarError::SymlinkEscape { .. });
    Ok(())
}

#[test]
fn global_pax_path_is_refused() -> Res {
    let mut tar = Tar::new()
        .pax(&[("path", b"../evil")])
        .file("a", b"x")
        .finish();
    tar[156] = b'g'; // turn the local PAX header into a global one
    let mut header = tar::Header::from_byte_slice(&tar[..512]).clone();
    header.set_cksum();
    tar[..512].copy_from_slice(header.as_bytes());
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::GlobalPaxOverride { .. }
    );
    Ok(())
}

#[test]
fn non_utf8_name_with_dotdot_is_refused() -> Res {
    let tar = Tar::new()
        .raw(
            b"\xff\xfe/../../escape",
            EntryType::Regular,
            0o644,
            b"",
            b"x",
        )
        .finish();
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::ParentComponent { .. }
    );
    Ok(())
}

/// Tools that ignore PAX would use the raw header name, so it is checked too.
#[test]
fn raw_header_name_is_checked_behind_benign_pax_name() -> Res {
    let tar = Tar::new()
        .pax(&[("path", b"benign")])
        .file("../escape", b"x")
        .finish();
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::ParentComponent { .. }
    );
    Ok(())
}
