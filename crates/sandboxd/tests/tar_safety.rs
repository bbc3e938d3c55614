//! Adversarial tests for host-side tar handling: every archive here is one an attacker could
//! send, and each test checks the exact refusal *and* that nothing was written (security.md 2.4).
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::tar_support as support;

#[path = "tar_safety/formats.rs"]
mod formats;
#[path = "tar_safety/positive.rs"]
mod positive;

use sandboxd_core::sandbox::tar_safety::{TarError, TarLimits};
use support::{Scene, Tar, raw_header};
use tar::EntryType;

type Res = anyhow::Result<()>;

fn limits() -> TarLimits {
    TarLimits::default()
}

#[test]
fn absolute_path_is_refused() -> Res {
    let scene = Scene::new()?;
    // Points right next to dest, so an extractor that honoured it would trip the canary check.
    let name = scene.root.path().join("abs-canary");
    let tar = Tar::new()
        .file(name.to_str().unwrap_or("/abs-canary"), b"x")
        .finish();
    let err = assert_refused!(scene, tar, limits(), TarError::AbsolutePath { .. });
    assert!(err.to_string().contains("abs-canary"), "{err}");
    Ok(())
}

#[test]
fn dotdot_escape_is_refused() -> Res {
    let tar = Tar::new().file("../escape", b"x").finish();
    let err = assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::ParentComponent { .. }
    );
    assert!(err.to_string().contains("../escape"), "{err}");
    Ok(())
}

#[test]
fn nested_dotdot_escape_is_refused() -> Res {
    let tar = Tar::new().file("a/../../escape", b"x").finish();
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::ParentComponent { .. }
    );
    Ok(())
}

#[test]
fn windows_dotdot_escape_is_refused() -> Res {
    let tar = Tar::new().file("..\\escape", b"x").finish();
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::ParentComponent { .. }
    );
    Ok(())
}

#[test]
fn hardlink_is_refused() -> Res {
    let tar = Tar::new()
        .raw(b"shadow", EntryType::Link, 0o644, b"/etc/shadow", b"")
        .finish();
    assert_refused!(Scene::new()?, tar, limits(), TarError::HardLink { .. });
    Ok(())
}

#[test]
fn symlink_to_absolute_target_is_refused() -> Res {
    let tar = Tar::new().symlink("passwd", "/etc/passwd").finish();
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::SymlinkAbsolute { .. }
    );
    Ok(())
}

#[test]
fn symlink_dotdot_dotdot_is_refused() -> Res {
    let tar = Tar::new().dir("sub/").symlink("sub/up", "../..").finish();
    assert_refused!(Scene::new()?, tar, limits(), TarError::SymlinkEscape { .. });
    Ok(())
}

/// The RUSTSEC-2021-0080 proof of concept: `symlink -> ..`, then a path through it.
#[test]
fn rustsec_2021_0080_poc_is_refused() -> Res {
    let tar = Tar::new()
        .symlink("symlink", "..")
        .file("symlink/exploit/foo/bar", b"x")
        .finish();
    assert_refused!(Scene::new()?, tar, limits(), TarError::SymlinkEscape { .. });
    Ok(())
}

#[test]
fn file_through_inside_symlink_is_refused() -> Res {
    let tar = Tar::new()
        .dir("sub/")
        .symlink("link", "sub")
        .file("link/file", b"x")
        .finish();
    let err = assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::ThroughSymlink { .. }
    );
    assert!(err.to_string().contains("link/file"), "{err}");
    Ok(())
}

/// Each link is inside on its own, but `..` after the first link leaves the root.
#[test]
fn dotdot_after_another_symlink_is_refused() -> Res {
    let tar = Tar::new()
        .dir("x/")
        .symlink("x/y", "..")
        .symlink("l", "x/y/..")
        .finish();
    assert_refused!(Scene::new()?, tar, limits(), TarError::SymlinkEscape { .. });
    Ok(())
}

#[test]
fn char_device_is_refused() -> Res {
    let tar = Tar::new()
        .raw(b"null", EntryType::Char, 0o666, b"", b"")
        .finish();
    let err = assert_refused!(Scene::new()?, tar, limits(), TarError::DeviceNode { .. });
    assert!(matches!(
        err,
        TarError::DeviceNode {
            kind: "character",
            ..
        }
    ));
    Ok(())
}

#[test]
fn block_device_is_refused() -> Res {
    let tar = Tar::new()
        .raw(b"sda", EntryType::Block, 0o660, b"", b"")
        .finish();
    let err = assert_refused!(Scene::new()?, tar, limits(), TarError::DeviceNode { .. });
    assert!(matches!(err, TarError::DeviceNode { kind: "block", .. }));
    Ok(())
}

#[test]
fn fifo_is_refused() -> Res {
    let tar = Tar::new()
        .raw(b"pipe", EntryType::Fifo, 0o644, b"", b"")
        .finish();
    assert_refused!(Scene::new()?, tar, limits(), TarError::Fifo { .. });
    Ok(())
}

#[test]
fn gnu_sparse_and_unknown_types_are_refused() -> Res {
    for kind in [EntryType::Continuous, EntryType::new(b'V')] {
        let tar = Tar::new().raw(b"odd", kind, 0o644, b"", b"").finish();
        assert_refused!(
            Scene::new()?,
            tar,
            limits(),
            TarError::UnsupportedType { .. }
        );
    }
    Ok(())
}

#[test]
fn setuid_file_is_refused() -> Res {
    let tar = Tar::new()
        .raw(b"suid", EntryType::Regular, 0o4755, b"", b"x")
        .finish();
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::PrivilegedMode { mode: 0o4755, .. }
    );
    Ok(())
}

#[test]
fn setgid_file_is_refused() -> Res {
    let tar = Tar::new()
        .raw(b"sgid", EntryType::Regular, 0o2755, b"", b"x")
        .finish();
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::PrivilegedMode { mode: 0o2755, .. }
    );
    Ok(())
}

#[test]
fn sticky_file_is_refused() -> Res {
    let tar = Tar::new()
        .raw(b"sticky", EntryType::Regular, 0o1644, b"", b"x")
        .finish();
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::PrivilegedMode { .. }
    );
    Ok(())
}

#[test]
fn too_many_entries_are_refused() -> Res {
    let small = TarLimits {
        max_entries: 3,
        ..limits()
    };
    let tar = Tar::new()
        .file("a", b"")
        .file("b", b"")
        .file("c", b"")
        .file("d", b"")
        .finish();
    let err = assert_refused!(
        Scene::new()?,
        tar,
        small,
        TarError::TooManyEntries { max: 3, .. }
    );
    assert!(err.to_string().contains("`d`"), "{err}");
    Ok(())
}

#[test]
fn oversize_total_is_refused() -> Res {
    let small = TarLimits {
        max_total_bytes: 1000,
        ..limits()
    };
    let chunk = [7u8; 400];
    let tar = Tar::new()
        .file("a", &chunk)
        .file("b", &chunk)
        .file("c", &chunk)
        .finish();
    assert_refused!(
        Scene::new()?,
        tar,
        small,
        TarError::TotalTooLarge { total: 1200, .. }
    );
    Ok(())
}

/// The declared size alone is enough: the data is not there, and must not be needed.
#[test]
fn declared_oversize_entry_is_refused_before_reading() -> Res {
    let small = TarLimits {
        max_total_bytes: 1000,
        ..limits()
    };
    let header = raw_header(b"bomb", EntryType::Regular, 0o644, 10_000_000_000, b"");
    let tar = Tar::new().header_only(&header).finish();
    let err = assert_refused!(Scene::new()?, tar, small, TarError::EntryTooLarge { .. });
    assert!(matches!(
        err,
        TarError::EntryTooLarge {
            size: 10_000_000_000,
            max: 1000,
            ..
        }
    ));
    Ok(())
}

#[test]
fn duplicate_path_is_refused() -> Res {
    let tar = Tar::new()
        .file("a.txt", b"one")
        .file("./a.txt", b"two")
        .finish();
    assert_refused!(Scene::new()?, tar, limits(), TarError::Duplicate { .. });
    Ok(())
}

#[test]
fn file_below_a_file_is_refused() -> Res {
    let tar = Tar::new().file("a", b"x").file("a/b", b"y").finish();
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::ParentNotDirectory { .. }
    );
    Ok(())
}

#[test]
fn empty_name_is_refused() -> Res {
    let tar = Tar::new().file("", b"x").finish();
    assert_refused!(
        Scene::new()?,
        tar,
        limits(),
        TarError::EmptyName { index: 0 }
    );
    Ok(())
}
