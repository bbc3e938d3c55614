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
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::output::CappedBuffer;
use super::shell::{GREETING, Running, greeting_pid, spawn_shell};
use super::transfer::STDERR_CAP;
use super::{AttachedProcess, OutputChunk, Sandbox, SandboxError, WORKSPACE};

/// The most stdout a restoring shell may print before its greeting (two short lines).
const STDOUT_CAP: usize = 4096;
/// The size of one read from the archive into the shell's stdin.
const CHUNK: usize = 256 << 10;

/// Starts the persistent shell of `host` with the first `len` bytes of `archive` (a checked
/// tar) unpacked into /workspace first; the shell, ready for its first command.
pub(super) async fn start_restoring(
    host: &dyn Sandbox,
    archive: &File,
    len: u64,
    timeout: Duration,
) -> Result<Running, SandboxError> {
    let src = archive
        .try_clone()
        .and_then(|mut f| f.seek(SeekFrom::Start(0)).map(|_| f))
        .map(tokio::fs::File::from_std)
        .map_err(|e| failed(format!("the host's snapshot file: {e}")))?;
    let (process, proxy_env) = spawn_shell(host).await?;
    let AttachedProcess {
        mut stdin,
        mut output,
        exit_code,
    } = process;
    let mut stdout = Vec::new();
    let mut stderr = CappedBuffer::new(STDERR_CAP);
    let both = async {
        let feed = feed(&mut stdin, src, len);
        let read = read_answer(&mut output, &mut stdout, &mut stderr);
        tokio::pin!(feed, read);
        let mut fed = false;
        loop {
            tokio::select! {
                r = &mut feed, if !fed => {
                    r?;
                    fed = true;
                }
                r = &mut read => return r,
            }
        }
    };
    match tokio::time::timeout(timeout, both).await {
        Ok(done) => done?,
        Err(_) => {
            return Err(SandboxError::Timeout {
                what: "the restore of /workspace".into(),
                after: timeout,
            });
        }
    }
    let pid = answer(&stdout, stderr)?;
    Ok(Running {
        process: AttachedProcess {
            stdin,
            output,
            exit_code,
        },
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

/// Writes the restoring line, the archive, then the greeting into the shell's stdin. A host
/// file that cannot be read, or holds less than it should, fails the restore at once; a
/// shell that stopped reading ended or failed, and its output says which.
async fn feed(
    stdin: &mut Pin<Box<dyn AsyncWrite + Send>>,
    mut src: tokio::fs::File,
    len: u64,
) -> Result<(), SandboxError> {
    let script = format!(
        "head -c {len} | {{ tar -C {WORKSPACE} -xf - --no-same-owner --no-same-permissions; s=$?; cat > /dev/null; exit $s; }}; builtin printf 'SBXRST %s %s\\n' \"${{PIPESTATUS[0]}}\" \"${{PIPESTATUS[1]}}\"\n"
    );
    if stdin.write_all(script.as_bytes()).await.is_err() {
        return Ok(());
    }
    let mut buf = vec![0u8; CHUNK];
    let mut left = len;
    while left > 0 {
        let n = src
            .read(&mut buf[..(left as usize).min(CHUNK)])
            .await
            .map_err(|e| failed(format!("the host's snapshot file: {e}")))?;
        if n == 0 {
            return Err(failed(format!(
                "the host's snapshot file ended {left} bytes before its checked length"
            )));
        }
        if stdin.write_all(&buf[..n]).await.is_err() {
            return Ok(());
        }
        left -= n as u64;
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

/// The shell's pid from its answer, once the restore's status says tar and head succeeded;
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
