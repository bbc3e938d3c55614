//! The persistent shell against the real engine and image: state, exit codes, streams,
//! binary and large output, timeouts and a killed shell.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::time::{Duration, Instant};

use sandboxd_core::sandbox::{ExecRequest, ShellOptions};

fn opts(secs: u64) -> ShellOptions {
    ShellOptions {
        timeout: Duration::from_secs(secs),
        ..ShellOptions::default()
    }
}

#[tokio::test]
async fn cwd_env_exit_codes_and_streams() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = &s.sandbox;
    let out = sb
        .shell(
            "mkdir -p /workspace/a/b && cd /workspace/a && export FOO=bar",
            opts(10),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0));
    let out = sb.shell("pwd; echo $FOO", opts(10)).await.unwrap();
    assert_eq!(out.stdout_lossy(), "/workspace/a\nbar\n");
    let out = sb
        .shell(
            "echo to-out; echo to-err >&2; exit_with() { return $1; }; exit_with 7",
            opts(10),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(7));
    assert_eq!(out.stdout_lossy(), "to-out\n");
    assert_eq!(out.stderr_lossy(), "to-err\n");
    let out = sb.shell("false", opts(10)).await.unwrap();
    assert_eq!(out.exit_code, Some(1));
    let out = sb.shell("printf 'no newline'", opts(10)).await.unwrap();
    assert_eq!(out.stdout_lossy(), "no newline");
    // Quotes and special characters reach bash unchanged.
    let out = sb
        .shell(
            r#"echo "it's \"quoted\" $((6*7)) \$HOME" 'single'"#,
            opts(10),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_lossy(), "it's \"quoted\" 42 $HOME single\n");
    // A script's own printf function or DEBUG trap does not break the protocol.
    sb.shell(
        "printf() { builtin printf 'X%s' \"$@\"; }; trap 'true' DEBUG",
        opts(10),
    )
    .await
    .unwrap();
    let out = sb.shell("false", opts(10)).await.unwrap();
    assert_eq!(out.exit_code, Some(1));
    let out = sb.shell("printf hi", opts(10)).await.unwrap();
    assert_eq!(out.stdout_lossy(), "Xhi");
    sb.shell("unset -f printf", opts(10)).await.unwrap();
    // A command that waits for input gets EOF at once.
    let t = Instant::now();
    let out = sb.shell("read x; echo \"got:$x\"", opts(30)).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(out.stdout_lossy(), "got:\n");
}

#[tokio::test]
async fn binary_and_large_output() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = &s.sandbox;
    let out = sb
        .shell("printf '\\x00\\x01\\xff\\xfe'", opts(10))
        .await
        .unwrap();
    assert_eq!(out.stdout, vec![0u8, 1, 0xff, 0xfe]);
    let big = ShellOptions {
        timeout: Duration::from_secs(30),
        output_cap: 2 << 20,
    };
    let out = sb
        .shell("head -c 1048576 /dev/zero | tr '\\0' 'x'", big)
        .await
        .unwrap();
    assert_eq!(out.stdout.len(), 1 << 20);
    assert!(!out.stdout_truncated);
    // Past the cap the middle is cut and marked; the host keeps only the cap.
    let out = sb.shell("seq 1 200000", opts(30)).await.unwrap();
    assert!(out.stdout_truncated);
    let text = out.stdout_lossy();
    assert!(text.starts_with("1\n2\n3\n"));
    assert!(text.ends_with("199999\n200000\n"));
    assert!(text.contains("bytes cut by sandboxd"));
    assert!(text.len() < 300 * 1024);
}

#[tokio::test]
async fn timeout_kills_the_command_and_the_shell_stays_usable() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = &s.sandbox;
    sb.shell("cd /tmp && export KEEP=1", opts(10))
        .await
        .unwrap();
    let t = Instant::now();
    let out = sb.shell("sleep 1000", opts(2)).await.unwrap();
    assert!(out.timed_out);
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "took {:?}",
        t.elapsed()
    );
    let out = sb
        .shell("echo ok; pwd; echo $KEEP", opts(10))
        .await
        .unwrap();
    assert_eq!(out.stdout_lossy(), "ok\n/tmp\n1\n");
    // No sleep survived the kill.
    let ps = sb
        .exec(ExecRequest::shell_line(
            "ps -eo args= | grep -x 'sleep 1000' || true",
        ))
        .await
        .unwrap();
    assert_eq!(ps.stdout_lossy().trim(), "");
    // A loop inside bash itself cannot be killed as a child: the shell is replaced.
    let out = sb.shell("while :; do :; done", opts(2)).await.unwrap();
    assert!(out.timed_out);
    let out = sb.shell("echo again", opts(10)).await.unwrap();
    assert_eq!(out.stdout_lossy(), "again\n");
    assert!(out.note.unwrap_or_default().contains("restarted"));
}

#[tokio::test]
async fn a_killed_shell_is_restarted_with_a_note() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = &s.sandbox;
    let pid = sb.shell("echo $$", opts(10)).await.unwrap().stdout_lossy();
    let kill = sb
        .exec(ExecRequest::new(["kill", "-9", pid.trim()]))
        .await
        .unwrap();
    assert_eq!(kill.exit_code, Some(0), "{}", kill.stderr_lossy());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = sb.shell("echo alive", opts(10)).await.unwrap();
    assert_eq!(out.stdout_lossy(), "alive\n");
    assert!(out.note.is_some_and(|n| n.contains("died")));
    // `exit` in a command ends the shell; the next call gets a fresh one and says so.
    let out = sb.shell("echo bye; exit 3", opts(10)).await.unwrap();
    assert_eq!(out.exit_code, Some(3));
    assert_eq!(out.stdout_lossy(), "bye\n");
    assert!(
        out.note
            .as_deref()
            .unwrap_or_default()
            .contains("ended with status 3"),
        "{:?}",
        out.note
    );
    let out = sb.shell("echo fresh", opts(10)).await.unwrap();
    assert_eq!(out.stdout_lossy(), "fresh\n");
    assert!(out.note.is_some());
}

#[tokio::test]
async fn concurrent_calls_are_serialized() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let mut handles = Vec::new();
    for i in 0..8 {
        let sb = s.sandbox.clone();
        handles.push(tokio::spawn(async move {
            sb.shell(
                &format!("echo start-{i}; sleep 0.05; echo end-{i}"),
                opts(10),
            )
            .await
            .unwrap()
        }));
    }
    for (i, h) in handles.into_iter().enumerate() {
        let out = h.await.unwrap();
        assert_eq!(out.stdout_lossy(), format!("start-{i}\nend-{i}\n"));
    }
}
