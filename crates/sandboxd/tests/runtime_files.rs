//! Files and archives through the Sandbox trait: binary round trips, awkward names, errors,
//! and hostile tar archives refused before anything is written.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use sandboxd_core::sandbox::tar_safety::{self, TarLimits};
use sandboxd_core::sandbox::{FileKind, SandboxError, ShellOptions};

#[tokio::test]
async fn binary_round_trips_of_every_size() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = &s.sandbox;
    let ten_mib: Vec<u8> = (0..10 << 20)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    for (name, data) in [("empty", vec![]), ("one", vec![0u8]), ("ten-mib", ten_mib)] {
        let path = format!("/workspace/bin/{name}");
        sb.write_file(&path, &data).await.unwrap();
        assert_eq!(sb.read_file(&path).await.unwrap(), data, "{name}");
        assert_eq!(sb.stat(&path).await.unwrap().size, data.len() as u64);
    }
    // Written files belong to the sandbox user and are visible to the shell.
    let out = sb
        .shell(
            "stat -c '%u %s' /workspace/bin/ten-mib",
            ShellOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_lossy().trim(), format!("1000 {}", 10 << 20));
}

#[tokio::test]
async fn names_with_spaces_and_unicode_and_clear_errors() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = &s.sandbox;
    let path = "/workspace/dir with space/naïve 文件 ✓.txt";
    sb.write_file(path, b"hello").await.unwrap();
    assert_eq!(sb.read_file(path).await.unwrap(), b"hello");
    let listing = sb.list_dir("/workspace/dir with space").await.unwrap();
    assert_eq!(listing.len(), 1);
    assert_eq!(listing[0].name, "naïve 文件 ✓.txt");
    assert_eq!(listing[0].kind, FileKind::File);
    // Relative paths resolve against /workspace.
    assert_eq!(
        sb.read_file("dir with space/naïve 文件 ✓.txt")
            .await
            .unwrap(),
        b"hello"
    );
    let err = sb.read_file("/workspace/missing.txt").await.unwrap_err();
    assert!(matches!(err, SandboxError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("/workspace/missing.txt"));
    let err = sb.read_file("/workspace").await.unwrap_err();
    assert!(err.to_string().contains("directory"), "{err}");
    let err = sb.write_file("/etc/passwd", b"x").await.unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("read-only")
            || err.to_string().contains("ermission"),
        "{err}"
    );
    let err = sb.read_file("/workspace/a\0b").await.unwrap_err();
    assert!(matches!(err, SandboxError::InvalidPath { .. }));
    // A FIFO is refused at once instead of blocking the helper (and the host) for ever.
    sb.shell("mkfifo /workspace/pipe", ShellOptions::default())
        .await
        .unwrap();
    let t = std::time::Instant::now();
    let err = sb.read_file("/workspace/pipe").await.unwrap_err();
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
    assert!(err.to_string().contains("not a regular file"), "{err}");
    // The helper still answers afterwards.
    assert_eq!(sb.read_file(path).await.unwrap(), b"hello");
    sb.mkdir("/workspace/d1/d2").await.unwrap();
    assert_eq!(
        sb.stat("/workspace/d1/d2").await.unwrap().kind,
        FileKind::Dir
    );
    sb.remove("/workspace/d1", true).await.unwrap();
    assert!(matches!(
        sb.stat("/workspace/d1").await.unwrap_err(),
        SandboxError::NotFound { .. }
    ));
}

#[tokio::test]
async fn directories_go_in_and_out_as_tar() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = &s.sandbox;
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("sub")).unwrap();
    std::fs::write(src.path().join("sub/a.bin"), [0u8, 159, 146, 150]).unwrap();
    std::fs::write(src.path().join("top.txt"), "top").unwrap();
    let archive = tar_safety::archive_dir(src.path(), &TarLimits::default()).unwrap();
    sb.upload_tar("/workspace/up", &archive).await.unwrap();
    assert_eq!(
        sb.read_file("/workspace/up/sub/a.bin").await.unwrap(),
        [0u8, 159, 146, 150]
    );
    let out = sb
        .shell("stat -c %u /workspace/up/top.txt", ShellOptions::default())
        .await
        .unwrap();
    assert_eq!(out.stdout_lossy().trim(), "1000");
    let back = sb.download_tar("/workspace/up").await.unwrap();
    let dest = tempfile::tempdir().unwrap();
    tar_safety::extract_archive(&back, dest.path(), &TarLimits::default()).unwrap();
    assert_eq!(std::fs::read(dest.path().join("top.txt")).unwrap(), b"top");
    assert_eq!(
        std::fs::read(dest.path().join("sub/a.bin")).unwrap(),
        [0u8, 159, 146, 150]
    );
}

/// A tar whose first entry name is written raw, bypassing the tar crate's own checks.
fn raw_tar(name: &[u8], kind: tar::EntryType, link: Option<&[u8]>, data: &[u8]) -> Vec<u8> {
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    if let Some(l) = link {
        header.as_old_mut().linkname[..l.len()].copy_from_slice(l);
    }
    header.set_entry_type(kind);
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    let mut out = header.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out.extend_from_slice(&[0u8; 1024]);
    out
}

#[tokio::test]
async fn hostile_archives_are_refused_before_anything_is_written() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = &s.sandbox;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "absolute",
            raw_tar(b"/workspace/abs", tar::EntryType::Regular, None, b"x"),
        ),
        (
            "dotdot",
            raw_tar(b"../escape", tar::EntryType::Regular, None, b"x"),
        ),
        (
            "hardlink",
            raw_tar(b"hl", tar::EntryType::Link, Some(b"/etc/passwd"), b""),
        ),
        (
            "symlink-out",
            raw_tar(b"sl", tar::EntryType::Symlink, Some(b"/etc"), b""),
        ),
        ("device", raw_tar(b"dev", tar::EntryType::Char, None, b"")),
        ("fifo", raw_tar(b"fifo", tar::EntryType::Fifo, None, b"")),
    ];
    for (what, archive) in cases {
        let err = sb
            .upload_tar("/workspace/target", &archive)
            .await
            .unwrap_err();
        assert!(matches!(err, SandboxError::Tar(_)), "{what}: {err}");
    }
    let out = sb
        .shell(
            "ls -A /workspace; ls /workspace/target 2>&1 | head -1",
            ShellOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        out.stdout_lossy().trim(),
        "ls: cannot access '/workspace/target': No such file or directory"
    );
}
