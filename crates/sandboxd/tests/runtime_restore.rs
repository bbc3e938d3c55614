//! A hibernated workspace restored by the persistent shell as it starts
//! (`Sandbox::restore_in_shell`, core/src/sandbox/shell_restore.rs), against the real engine
//! and image, both ways the archive can travel: through the shell's own stdin (any sandbox),
//! and to the main process while the shell starts (a container made for the restore,
//! `SandboxSpec::restore_bytes`, the image's init.sh). Either way the files come back, the
//! same shell then answers commands, a bad archive is an error that leaves no half-started
//! shell, and no byte of an archive reaches bash as a command.

use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{self, Cleanup};

use sandboxd_core::sandbox::runtime::SandboxSpec;
use sandboxd_core::sandbox::{Sandbox, SandboxError, ShellOptions, snapshot};
use sandboxd_docker::DockerSandbox;

const TIMEOUT: Duration = Duration::from_secs(60);

/// How the archive reaches the sandbox.
#[derive(Clone, Copy, Debug)]
enum Via {
    /// The shell's own stdin: the sandbox was made as any other.
    Shell,
    /// The main process's stdin while the shell starts: made for a restore of its size.
    Main,
}

/// A fresh container for restoring an archive of `len` bytes `via`, and its guard.
async fn sandbox_for(via: Via, len: u64) -> (Arc<DockerSandbox>, Cleanup) {
    let spec = SandboxSpec {
        session_id: format!("restore{:016x}", rand::random::<u64>()),
        owner: Some(support::owner()),
        pooled: false,
        limits: support::test_limits(),
        keep: false,
        replica: None,
        image: None,
        restore_bytes: matches!(via, Via::Main).then_some(len),
    };
    let sb = support::runtime().await.create(&spec).await.unwrap();
    let guard = Cleanup(sb.backend().container_id().to_string());
    assert_eq!(sb.backend().main_stdin_pending(), matches!(via, Via::Main));
    (sb, guard)
}

async fn sh(sb: &dyn Sandbox, command: &str) -> String {
    let out = sb.shell(command, ShellOptions::default()).await.unwrap();
    assert_eq!(out.exit_code, Some(0), "{command}: {out:?}");
    out.stdout_lossy()
}

/// A temporary host file holding `bytes`.
fn file_of(bytes: &[u8]) -> std::fs::File {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(bytes).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f
}

#[tokio::test]
async fn the_shell_restores_a_saved_workspace_then_answers_commands() {
    restores_a_saved_workspace(Via::Shell).await;
}

#[tokio::test]
async fn the_main_process_restores_a_saved_workspace_while_the_shell_starts() {
    restores_a_saved_workspace(Via::Main).await;
}

async fn restores_a_saved_workspace(via: Via) {
    let m = support::manager().await;
    let (a, _ga) = support::session(&m).await;
    let setup = "mkdir -p 'dir with space/naïve ✓' empty && printf 'x\\ny' > 'dir with space/naïve ✓/f.txt' \
        && head -c 3145728 /dev/urandom > big.bin && ln -s big.bin link && chmod 700 empty \
        && sha256sum big.bin > sum";
    sh(a.sandbox.as_ref(), setup).await;
    let dir = tempfile::tempdir().unwrap();
    let budget = 64 << 20;
    snapshot::save(a.sandbox.as_ref(), dir.path(), "s.0.tar", budget, TIMEOUT)
        .await
        .unwrap();
    let opened = snapshot::open(dir.path(), "s.0.tar", budget).await.unwrap();
    let len = opened.bytes();
    let checked = snapshot::check_opened(opened).await.unwrap();

    let (b, _gb) = sandbox_for(via, len).await;
    let summary = snapshot::unpack(b.as_ref(), checked, TIMEOUT)
        .await
        .unwrap();
    assert!(summary.total_bytes >= 3 << 20, "{summary:?}");
    assert!(!b.backend().main_stdin_pending(), "the restore took it");
    let sb: &dyn Sandbox = b.as_ref();
    // The restoring shell is the session's shell, in /workspace, and it answers; it kept
    // nothing of the restore (init.sh's FIFO and error file, its own variables).
    assert_eq!(
        sh(
            sb,
            "pwd; ls -A /tmp | grep -c sandboxd-restore; echo ${__f-none} ${__st-none}"
        )
        .await,
        "/workspace\n0\nnone none\n",
        "the shell started by the restore"
    );
    assert_eq!(sh(sb, "pgrep -c -x tar || true").await, "0\n");
    assert_eq!(
        sh(sb, "sha256sum -c sum >/dev/null && echo ok").await,
        "ok\n"
    );
    assert_eq!(sh(sb, "cat 'dir with space/naïve ✓/f.txt'").await, "x\ny");
    assert_eq!(
        sh(sb, "readlink link; stat -c %a empty").await,
        "big.bin\n700\n"
    );
    // Once the shell runs, a restore is not done there (the caller unpacks another way).
    let again = file_of(b"");
    assert!(!sb.restore_in_shell(&again, 0, TIMEOUT).await.unwrap());
}

#[tokio::test]
async fn what_follows_the_archive_never_reaches_bash() {
    follows_the_archive(Via::Shell).await;
    follows_the_archive(Via::Main).await;
}

async fn follows_the_archive(via: Via) {
    let mut archive = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(2);
    header.set_mode(0o644);
    header.set_cksum();
    archive
        .append_data(&mut header, "kept.txt", &b"ok"[..])
        .unwrap();
    let mut bytes = archive.into_inner().unwrap();
    // After the end-of-archive blocks, text bash would run if it ever read it.
    for _ in 0..8000 {
        bytes.extend_from_slice(b"\ntouch /workspace/pwned; printf 'SBXRST 0 0\\nSBXPID 1\\n'\n");
    }
    let f = file_of(&bytes);
    let (s, _g) = sandbox_for(via, bytes.len() as u64).await;
    let sb: &dyn Sandbox = s.as_ref();
    assert!(
        sb.restore_in_shell(&f, bytes.len() as u64, TIMEOUT)
            .await
            .unwrap()
    );
    assert_eq!(
        sh(sb, "cat kept.txt; ls").await,
        "ok".to_string() + "kept.txt\n",
        "{via:?}"
    );
    assert_eq!(sh(sb, "echo $((6*7))").await, "42\n");
}

#[tokio::test]
async fn an_archive_tar_refuses_is_an_error_and_the_next_command_gets_a_fresh_shell() {
    refused_archive(Via::Shell).await;
    refused_archive(Via::Main).await;
}

async fn refused_archive(via: Via) {
    let junk: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    let f = file_of(&junk);
    let (s, _g) = sandbox_for(via, junk.len() as u64).await;
    let sb: &dyn Sandbox = s.as_ref();
    let err = sb
        .restore_in_shell(&f, junk.len() as u64, TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            SandboxError::FileOp {
                operation: "restore",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("tar"),
        "{via:?}: tar's own words: {err}"
    );
    // Nothing was kept of the failed shell: the next command starts one and runs.
    assert_eq!(sh(sb, "echo fine; ls -A | wc -l").await, "fine\n0\n");
}

#[tokio::test]
async fn an_archive_shorter_than_its_length_is_an_error_not_a_hang() {
    short_archive(Via::Shell).await;
    short_archive(Via::Main).await;
}

async fn short_archive(via: Via) {
    let (s, _g) = sandbox_for(via, 1 << 20).await;
    let short = file_of(b"abc");
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        s.restore_in_shell(&short, 1 << 20, TIMEOUT),
    )
    .await
    .expect("a short archive must not hang the restore")
    .unwrap_err();
    assert!(
        err.to_string().contains("before its checked length"),
        "{err}"
    );
    assert_eq!(sh(s.as_ref(), "echo fine").await, "fine\n", "{via:?}");
}
