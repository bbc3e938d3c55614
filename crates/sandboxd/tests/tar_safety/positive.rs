//! What must keep working: ordinary archives extract exactly, and `archive_dir` round-trips.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use sandboxd_core::sandbox::tar_safety::{
    ArchiveSummary, TarError, TarLimits, archive_dir, extract_archive, validate_archive,
};
use tar::EntryType;

use crate::tar_support::{Scene, Tar};

type Res = anyhow::Result<()>;
type Plant = fn(&Path) -> std::io::Result<()>;

fn limits() -> TarLimits {
    TarLimits::default()
}

fn mode(path: &Path) -> anyhow::Result<u32> {
    Ok(fs::symlink_metadata(path)?.permissions().mode() & 0o7777)
}

#[test]
fn nested_dirs_extract() -> Res {
    let scene = Scene::new()?;
    let tar = Tar::new()
        .dir("./")
        .dir("a/")
        .dir("a/b/")
        .file("a/b/c.txt", b"deep")
        .file("x/y/z.txt", b"implicit parents")
        .finish();
    let summary = extract_archive(&tar, &scene.dest, &limits())?;
    assert_eq!(
        summary,
        ArchiveSummary {
            entries: 5,
            total_bytes: 20
        }
    );
    assert_eq!(fs::read(scene.dest.join("a/b/c.txt"))?, b"deep");
    assert_eq!(fs::read(scene.dest.join("x/y/z.txt"))?, b"implicit parents");
    assert_eq!(mode(&scene.dest.join("a/b"))?, 0o755);
    Ok(())
}

#[test]
fn relative_in_tree_symlink_extracts() -> Res {
    let scene = Scene::new()?;
    let tar = Tar::new()
        .file("data.txt", b"hello")
        .dir("sub/")
        .symlink("sub/link", "../data.txt")
        .symlink("self", ".")
        .finish();
    extract_archive(&tar, &scene.dest, &limits())?;
    let link = scene.dest.join("sub/link");
    assert_eq!(fs::read_link(&link)?, Path::new("../data.txt"));
    assert_eq!(fs::read(&link)?, b"hello");
    Ok(())
}

#[test]
fn empty_file_extracts() -> Res {
    let scene = Scene::new()?;
    let tar = Tar::new().file("empty", b"").finish();
    let summary = extract_archive(&tar, &scene.dest, &limits())?;
    assert_eq!(summary.total_bytes, 0);
    assert_eq!(fs::metadata(scene.dest.join("empty"))?.len(), 0);
    Ok(())
}

#[test]
fn modes_are_masked() -> Res {
    let scene = Scene::new()?;
    let tar = Tar::new()
        .raw(b"tool", EntryType::Regular, 0o777, b"", b"#!/bin/sh\n")
        .raw(b"notes", EntryType::Regular, 0o666, b"", b"n")
        .raw(b"locked/", EntryType::Directory, 0o1000, b"", b"")
        .finish();
    extract_archive(&tar, &scene.dest, &limits())?;
    assert_eq!(mode(&scene.dest.join("tool"))?, 0o755);
    assert_eq!(mode(&scene.dest.join("notes"))?, 0o644);
    assert_eq!(mode(&scene.dest.join("locked"))?, 0o755);
    Ok(())
}

#[test]
fn unicode_and_space_names_extract() -> Res {
    let scene = Scene::new()?;
    let tar = Tar::new()
        .file("dossier été/résumé final.txt", b"ok")
        .file("日本語 ファイル", b"ok")
        .file("with\\backslash", b"ok")
        .finish();
    extract_archive(&tar, &scene.dest, &limits())?;
    assert!(scene.dest.join("dossier été/résumé final.txt").is_file());
    assert!(scene.dest.join("日本語 ファイル").is_file());
    assert!(scene.dest.join("with\\backslash").is_file());
    Ok(())
}

#[test]
fn round_trip_preserves_bytes_and_links() -> Res {
    let src = tempfile::tempdir()?;
    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    fs::create_dir_all(src.path().join("bin/deeper"))?;
    fs::write(src.path().join("bin/deeper/blob"), &binary)?;
    fs::write(src.path().join("empty"), b"")?;
    let long = "n".repeat(120); // needs a GNU long name
    fs::write(src.path().join(&long), b"long")?;
    symlink("bin/deeper/blob", src.path().join("alias"))?;
    fs::set_permissions(src.path().join("empty"), fs::Permissions::from_mode(0o4755))?;

    let tar = archive_dir(src.path(), &limits())?;
    assert_eq!(
        tar,
        archive_dir(src.path(), &limits())?,
        "not deterministic"
    );
    let scene = Scene::new()?;
    let summary = extract_archive(&tar, &scene.dest, &limits())?;
    assert_eq!(summary.entries, 6);
    assert_eq!(fs::read(scene.dest.join("bin/deeper/blob"))?, binary);
    assert_eq!(fs::read(scene.dest.join(&long))?, b"long");
    assert_eq!(
        fs::read_link(scene.dest.join("alias"))?,
        Path::new("bin/deeper/blob")
    );
    assert_eq!(
        mode(&scene.dest.join("empty"))?,
        0o755,
        "setuid must be dropped"
    );
    Ok(())
}

#[test]
fn archive_dir_refuses_escaping_links_and_special_files() -> Res {
    let cases: [(&str, Plant); 3] = [
        ("abs", |d| symlink("/etc/passwd", d.join("abs"))),
        ("up", |d| symlink("../outside", d.join("up"))),
        ("fifo", |d| {
            let status = std::process::Command::new("mkfifo")
                .arg(d.join("fifo"))
                .status()?;
            assert!(status.success(), "mkfifo failed");
            Ok(())
        }),
    ];
    for (name, make) in cases {
        let src = tempfile::tempdir()?;
        make(src.path())?;
        let err = archive_dir(src.path(), &limits()).expect_err(name);
        let expected = match name {
            "abs" => matches!(err, TarError::SymlinkAbsolute { .. }),
            "up" => matches!(err, TarError::SymlinkEscape { .. }),
            _ => matches!(err, TarError::Fifo { .. }),
        };
        assert!(expected, "{name}: {err:?}");
        assert!(err.to_string().contains(name), "{err}");
    }
    Ok(())
}

#[test]
fn archive_dir_enforces_limits() -> Res {
    let src = tempfile::tempdir()?;
    fs::write(src.path().join("a"), [0u8; 600])?;
    fs::write(src.path().join("b"), [0u8; 600])?;
    let bytes = TarLimits {
        max_total_bytes: 1000,
        ..limits()
    };
    let err = archive_dir(src.path(), &bytes).expect_err("over byte limit");
    assert!(matches!(err, TarError::TotalTooLarge { .. }), "{err:?}");
    let entries = TarLimits {
        max_entries: 1,
        ..limits()
    };
    let err = archive_dir(src.path(), &entries).expect_err("over entry limit");
    assert!(matches!(err, TarError::TooManyEntries { .. }), "{err:?}");
    Ok(())
}

/// Judge0 CVE-2024-28185 shape: a link planted in dest must not be written through.
#[test]
fn symlink_planted_in_dest_is_refused() -> Res {
    let scene = Scene::new()?;
    let elsewhere = tempfile::tempdir()?;
    symlink(elsewhere.path(), scene.dest.join("x"))?;
    let tar = Tar::new()
        .file("a-first", b"x")
        .file("x/file", b"pwned")
        .finish();
    validate_archive(&tar, &limits())?;
    let err = extract_archive(&tar, &scene.dest, &limits()).expect_err("wrote through a link");
    assert!(matches!(err, TarError::DestSymlink { .. }), "{err:?}");
    assert_eq!(
        fs::read_dir(elsewhere.path())?.count(),
        0,
        "wrote into the link target"
    );
    assert!(!scene.dest.join("a-first").exists(), "partial extraction");
    Ok(())
}

#[test]
fn existing_file_in_dest_is_not_overwritten() -> Res {
    let scene = Scene::new()?;
    fs::write(scene.dest.join("keep"), b"original")?;
    let tar = Tar::new().file("keep", b"replaced").finish();
    let err = extract_archive(&tar, &scene.dest, &limits()).expect_err("overwrote");
    assert!(matches!(err, TarError::DestExists { .. }), "{err:?}");
    assert_eq!(fs::read(scene.dest.join("keep"))?, b"original");
    Ok(())
}

#[test]
fn dest_must_be_a_real_directory() -> Res {
    let scene = Scene::new()?;
    let link = scene.root.path().join("dest-link");
    symlink(&scene.dest, &link)?;
    let tar = Tar::new().file("a", b"x").finish();
    let err = extract_archive(&tar, &link, &limits()).expect_err("followed dest symlink");
    assert!(matches!(err, TarError::NotADirectory { .. }), "{err:?}");
    Ok(())
}
