//! A hibernated session's /workspace restored by the persistent shell's own process.
//!
//! bash reads its script from a pipe one byte at a time (it cannot seek back to give a
//! command what it read ahead), so a command it runs reads the rest of the same stdin: `head
//! -c LEN` takes exactly the archive's bytes that follow the line starting it, hands them to
//! `tar`, and the shell then goes on reading commands as ever. A resume so starts one process
//! in its new sandbox, the shell its first command needs anyway, instead of a `tar` of its
//! own beside it: the engine's exec start (~70 ms on Docker, CPU-bound, so two at once are no
//! faster than one after the other) was the largest part of what a resume cost over a cold
//! create.
//!
//! tar may stop reading at the archive's end marker: whatever follows it within `LEN` is
//! read to the end by `cat`, so head never stops early and not a byte of the archive is
//! ever read by bash as a command.
//!
//! Where the sandbox's main process was made to take the archive on its stdin (Docker:
//! `SandboxSpec::restore_bytes`, `ExecBackend::take_main_stdin`, the image's init.sh), the
//! archive goes there instead, fed from the moment the shell's start is asked for: its
//! transfer through the engine's attached stream (dockerd, the shim, a FIFO; ~2-3 ms a MiB
//! here) then runs while the engine starts the shell (~70 ms), instead of after it. The
//! shell's first line waits for init.sh's statuses of head and tar on a FIFO in /tmp, and
//! answers exactly as if it had unpacked the archive itself.
//!
//! The archive was checked on the host by the rules of uploads before it comes here
//! (snapshot.rs); tar runs as the sandbox user, into /workspace, keeping no owner and no
//! permission bits beyond the umask's, exactly as `transfer::unpack_tar_from` does. Nothing
//! else runs in the sandbox yet, so what the shell prints before its greeting is the
//! restore's; it is still read bounded.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::pin::Pin;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::output::CappedBuffer;
use super::shell::{GREETING, Running, greeting_pid, spawn_shell};
use super::transfer::{Copied, STDERR_CAP, copy_in, while_feeding};
use super::{OutputChunk, Sandbox, SandboxError, WORKSPACE};

/// The most stdout a restoring shell may print before its greeting (two short lines).
const STDOUT_CAP: usize = 4096;
/// What the restoring line prints after its pipeline: the statuses of head and tar.
const STATUS: &str = r#"builtin printf 'SBXRST %s %s\n' "${PIPESTATUS[0]}" "${PIPESTATUS[1]}""#;
/// The shell's first line where init.sh unpacks the archive (images/sandbox/helpers/init.sh):
/// it waits for init.sh's statuses on the FIFO, passes on tar's stderr (bounded), says them
/// as `STATUS` would, and leaves nothing behind in /tmp or the shell's variables.
const AWAIT_INIT: &str = r#"__f=/tmp/.sandboxd-restore; mkfifo -m 600 "$__f" 2> /dev/null; read -r __st < "$__f"; [ -s "$__f.err" ] && head -c 4096 "$__f.err" >&2; rm -f "$__f" "$__f.err"; builtin printf 'SBXRST %s\n' "$__st"; unset __f __st
"#;

/// Starts the persistent shell of `host` with the first `len` bytes of `archive` (a checked
/// tar) unpacked into /workspace first: by the sandbox's main process from `main_stdin`
/// when it was made to take it (see the module doc), else through the shell's own stdin.
/// The shell, ready for its first command.
pub(super) async fn start_restoring(
    host: &dyn Sandbox,
    archive: &File,
    len: u64,
    main_stdin: Option<Pin<Box<dyn AsyncWrite + Send>>>,
    timeout: Duration,
) -> Result<Running, SandboxError> {
    let src = archive
        .try_clone()
        .and_then(|mut f| f.seek(SeekFrom::Start(0)).map(|_| f))
        .map(tokio::fs::File::from_std)
        .map_err(|e| failed(format!("the host's snapshot file: {e}")))?;
    let mut stdout = Vec::new();
    let mut stderr = CappedBuffer::new(STDERR_CAP);
    let restore = async {
        match main_stdin {
            Some(main) => {
                // Fed while the shell starts: the transfer no longer waits for it.
                let shell = async {
                    let (mut process, proxy_env) = spawn_shell(host).await?;
                    let line = format!("{AWAIT_INIT}{GREETING}");
                    // A shell that stopped reading ended or failed: its output says which.
                    let _ = process.stdin.write_all(line.as_bytes()).await;
                    let _ = process.stdin.flush().await;
                    read_answer(&mut process.output, &mut stdout, &mut stderr).await?;
                    Ok((process, proxy_env))
                };
                while_feeding(feed_main(main, src, len), shell).await
            }
            None => {
                let (mut process, proxy_env) = spawn_shell(host).await?;
                let feed = feed_shell(&mut process.stdin, src, len);
                let read = read_answer(&mut process.output, &mut stdout, &mut stderr);
                while_feeding(feed, read).await?;
                Ok((process, proxy_env))
            }
        }
    };
    let (process, proxy_env) = match tokio::time::timeout(timeout, restore).await {
        Ok(done) => done?,
        Err(_) => {
            return Err(SandboxError::Timeout {
                what: "the restore of /workspace".into(),
                after: timeout,
            });
        }
    };
    let pid = answer(&stdout, stderr)?;
    Ok(Running {
        process,
        pid,
        proxy_env,
    })
}

fn failed(message: String) -> SandboxError {
    SandboxError::FileOp {
        operation: "restore",
        path: WORKSPACE.to_string(),
        message,
    }
}

/// The archive's bytes, all `len` of them, else why not.
async fn copy_archive(
    into: &mut Pin<Box<dyn AsyncWrite + Send>>,
    src: &mut tokio::fs::File,
    len: u64,
) -> Result<Copied, SandboxError> {
    match copy_in(into, src, len)
        .await
        .map_err(|e| failed(format!("the host's snapshot file: {e}")))?
    {
        Copied::Short(left) => Err(failed(format!(
            "the host's snapshot file ended {left} bytes before its checked length"
        ))),
        copied => Ok(copied),
    }
}

/// Writes the archive into the main process's stdin, then closes it. One that stopped
/// reading ended or failed, and the statuses the shell passes on say which.
async fn feed_main(
    mut main: Pin<Box<dyn AsyncWrite + Send>>,
    mut src: tokio::fs::File,
    len: u64,
) -> Result<(), SandboxError> {
    if let Copied::All = copy_archive(&mut main, &mut src, len).await? {
        let _ = main.shutdown().await;
    }
    Ok(())
}

/// Writes the restoring line, the archive, then the greeting into the shell's stdin. A host
/// file that cannot be read, or holds less than it should, fails the restore at once; a
/// shell that stopped reading ended or failed, and its output says which.
async fn feed_shell(
    stdin: &mut Pin<Box<dyn AsyncWrite + Send>>,
    mut src: tokio::fs::File,
    len: u64,
) -> Result<(), SandboxError> {
    // tar may stop at the end marker: `cat` reads the rest of `len`, never bash.
    let script = format!(
        "head -c {len} | {{ tar -C {WORKSPACE} -xf - --no-same-owner --no-same-permissions; s=$?; cat > /dev/null; exit $s; }}; {STATUS}\n"
    );
    if stdin.write_all(script.as_bytes()).await.is_err() {
        return Ok(());
    }
    if let Copied::Closed = copy_archive(stdin, &mut src, len).await? {
        return Ok(());
    }
    // Only after the archive: head reads on from the line that starts it.
    let _ = stdin.write_all(GREETING.as_bytes()).await;
    let _ = stdin.flush().await;
    Ok(())
}

/// Reads the shell's output until its two answer lines (the restore's status, the greeting)
/// are in `stdout`, bounded; stderr, capped, into `stderr`.
async fn read_answer(
    output: &mut BoxStream<'static, Result<OutputChunk, SandboxError>>,
    stdout: &mut Vec<u8>,
    stderr: &mut CappedBuffer,
) -> Result<(), SandboxError> {
    while let Some(chunk) = output.next().await {
        match chunk? {
            OutputChunk::Stdout(b) => {
                stdout.extend_from_slice(&b);
                if stdout.len() > STDOUT_CAP {
                    return Err(failed("the shell printed too much while restoring".into()));
                }
                if stdout.iter().filter(|&&c| c == b'\n').count() >= 2 {
                    return Ok(());
                }
            }
            OutputChunk::Stderr(b) => stderr.push(&b),
        }
    }
    Err(failed("the shell ended while restoring".into()))
}

/// The shell's pid from its answer, once the restore's status says head and tar succeeded;
/// else tar's own words.
fn answer(stdout: &[u8], stderr: CappedBuffer) -> Result<u32, SandboxError> {
    let text = String::from_utf8_lossy(stdout);
    let mut lines = text.lines();
    let status = lines.next().unwrap_or_default();
    let pid = greeting_pid(lines.next().unwrap_or_default().as_bytes())?;
    if status == "SBXRST 0 0" {
        return Ok(pid);
    }
    let detail = String::from_utf8_lossy(&stderr.finish().0)
        .trim()
        .to_string();
    Err(failed(if detail.is_empty() {
        format!("tar ended with {status:?}")
    } else {
        detail
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_awaiting_init_is_one_line_that_leaves_nothing_behind() {
        assert_eq!(AWAIT_INIT.matches('\n').count(), 1);
        assert!(AWAIT_INIT.ends_with('\n'));
        assert!(AWAIT_INIT.contains(r"builtin printf 'SBXRST %s\n'"));
        assert!(AWAIT_INIT.contains("unset __f __st"));
        assert!(STATUS.contains(r"'SBXRST %s %s\n'"));
    }
}
