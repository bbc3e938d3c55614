//! Streamed transfers between host files and a sandbox: a file or an archive goes in from a
//! host file in chunks, a file or an archive comes out into one, so the host holds a few
//! buffers per transfer whatever the size (the service's files and archive routes, and the
//! CLI's copy-out through `copy_out::tar_to_file`).
//!
//! Each transfer is one process started with `Sandbox::spawn` (a small bash script, `cat` or
//! `tar`; ~70 ms, so the service keeps the file helper for small files). Every call has a
//! deadline, watches that the sandbox keeps running (`watch::while_alive`), kills the
//! process tree when it gives up, and keeps at most `STDERR_CAP` of the process's stderr,
//! which sandboxed code can flood through /proc/<pid>/fd/2. What comes out is bounded on the
//! host before it is written: the sandbox is hostile, so its stdout is too.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::pin::Pin;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::output::CappedBuffer;
use super::{AttachedProcess, OutputChunk, Sandbox, SandboxError, SpawnRequest, helpers};

/// How much of a process's stderr is kept: enough for its warnings, never a flood.
pub const STDERR_CAP: usize = 4096;
/// The size of one read from a host file into the process's stdin.
const CHUNK: usize = 256 << 10;

/// Exit statuses the scripts below use for conditions the caller maps to a precise error.
/// (21, a directory, and 22, not a regular file, are reported with their stderr.)
pub(super) const NOT_FOUND: i64 = 20;
const TOO_LARGE: i64 = 23;
/// A directory to pack is, or goes through, a symbolic link.
pub(super) const THROUGH_LINK: i64 = 24;

/// Writes stdin to `$1` as the file helper does: parents created, written beside the target
/// and renamed over it (a reader never sees half a file), the old file's mode kept.
const WRITE: &str = r#"p=$1
[ -d "$p" ] && { echo "is a directory" >&2; exit 21; }
mkdir -p -- "${p%/*}" || exit 1
t="$p.sandboxd-$$.tmp"
trap 'rm -f -- "$t"' EXIT
cat > "$t" || exit 1
[ -d "$p" ] && { echo "is a directory" >&2; exit 21; }
if [ -e "$p" ]; then chmod --reference="$p" -- "$t" 2>/dev/null; fi
mv -fT -- "$t" "$p" || exit 1
trap - EXIT"#;

/// Writes the regular file `$1` to stdout, refusing one over `$2` bytes before reading it.
const READ: &str = r#"p=$1
[ -e "$p" ] || { echo "no such file or directory" >&2; exit 20; }
[ -d "$p" ] && { echo "is a directory" >&2; exit 21; }
[ -f "$p" ] || { echo "not a regular file (a FIFO, socket or device)" >&2; exit 22; }
s=$(stat -Lc %s -- "$p") || exit 1
[ "$s" -gt "$2" ] && { echo "$s" >&2; exit 23; }
exec cat -- "$p""#;

/// Unpacks the tar on stdin into `$1` (created if missing), as the sandbox user.
const UNPACK: &str =
    r#"mkdir -p -- "$1" && exec tar -C "$1" -xf - --no-same-owner --no-same-permissions"#;

/// What a finished transfer process left.
pub(super) struct Finished {
    pub exit: Option<i64>,
    /// Its stderr, capped and trimmed.
    pub stderr: String,
    /// How many bytes it wrote to stdout (into the output file, when one was given).
    pub out_len: u64,
}

/// One transfer process: `argv` run with `input` (a host file of that many bytes, read from
/// its start) on stdin and stdout into `output` (at most that many bytes, else
/// `FileTooLarge`), within `timeout`.
pub(super) async fn run(
    sandbox: &dyn Sandbox,
    argv: Vec<String>,
    operation: &'static str,
    path: &str,
    input: Option<(&File, u64)>,
    output: Option<(&File, u64)>,
    timeout: Duration,
) -> Result<Finished, SandboxError> {
    let io = |e: std::io::Error| SandboxError::FileOp {
        operation,
        path: path.to_string(),
        message: format!("host temp file: {e}"),
    };
    let tag = format!("{:032x}", rand::random::<u128>());
    let req = spawn_request(argv, &tag);
    let input = match input {
        Some((f, len)) => {
            let mut f = f.try_clone().map_err(io)?;
            f.seek(SeekFrom::Start(0)).map_err(io)?;
            Some((tokio::fs::File::from_std(f), len))
        }
        None => None,
    };
    let output = match output {
        Some((f, max)) => Some((tokio::fs::File::from_std(f.try_clone().map_err(io)?), max)),
        None => None,
    };
    let AttachedProcess {
        stdin,
        output: mut stream,
        exit_code,
    } = sandbox.spawn(req).await?;
    let mut stderr = CappedBuffer::new(STDERR_CAP);
    let feed = feed(stdin, input, &io);
    let drain = drain(&mut stream, output, &mut stderr, path, &io);
    let both = while_feeding(feed, drain);
    // Watched: under gVisor a sandbox that died keeps the exec's stream open.
    let watched = super::watch::while_alive(sandbox, both);
    let out_len = match tokio::time::timeout(timeout, watched).await {
        Ok(Ok(len)) => len,
        Ok(Err(gone @ SandboxError::SandboxGone { .. })) => return Err(gone),
        Ok(Err(e)) => {
            let _ = sandbox.kill_tagged(&tag).await;
            return Err(e);
        }
        Err(_) => {
            let _ = sandbox.kill_tagged(&tag).await;
            return Err(SandboxError::Timeout {
                what: format!("{operation} of {path}"),
                after: timeout,
            });
        }
    };
    let exit = exit_code().await;
    let stderr = String::from_utf8_lossy(&stderr.finish().0)
        .trim()
        .to_string();
    Ok(Finished {
        exit,
        stderr,
        out_len,
    })
}

/// The process with the helpers' environment, tagged so a give-up can kill its whole tree.
fn spawn_request(argv: Vec<String>, tag: &str) -> SpawnRequest {
    let mut req = SpawnRequest::new(argv);
    for (k, v) in helpers::env() {
        req = req.env(k, v);
    }
    req.env("SANDBOXD_TAG", tag)
}

/// Drives a process's `feed` and the `drain` of its output together until the drain
/// answers, which is the result: the output ends when the process has what it wants (tar
/// stops at the end-of-archive marker), so what was not fed is not waited for. A feed that
/// fails ends both.
pub(super) async fn while_feeding<T>(
    feed: impl std::future::Future<Output = Result<(), SandboxError>>,
    drain: impl std::future::Future<Output = Result<T, SandboxError>>,
) -> Result<T, SandboxError> {
    tokio::pin!(feed, drain);
    let mut fed = false;
    loop {
        tokio::select! {
            r = &mut feed, if !fed => {
                r?;
                fed = true;
            }
            r = &mut drain => return r,
        }
    }
}

/// How a `copy_in` ended.
pub(super) enum Copied {
    /// All `len` bytes were written.
    All,
    /// The host file ended this many bytes early.
    Short(u64),
    /// The process stopped reading: it ended or failed, and its status says which.
    Closed,
}

/// Writes `len` bytes of `src`, from where it stands, into a process's stdin in chunks.
pub(super) async fn copy_in(
    stdin: &mut Pin<Box<dyn AsyncWrite + Send>>,
    src: &mut tokio::fs::File,
    len: u64,
) -> std::io::Result<Copied> {
    let mut buf = vec![0u8; CHUNK.min(len as usize)];
    let mut left = len;
    while left > 0 {
        let n = src.read(&mut buf[..(left as usize).min(CHUNK)]).await?;
        if n == 0 {
            return Ok(Copied::Short(left));
        }
        if stdin.write_all(&buf[..n]).await.is_err() {
            return Ok(Copied::Closed);
        }
        left -= n as u64;
    }
    Ok(Copied::All)
}

/// Feeds `len` bytes of `src` into the process's stdin, then closes it.
async fn feed(
    mut stdin: Pin<Box<dyn AsyncWrite + Send>>,
    input: Option<(tokio::fs::File, u64)>,
    io: &(dyn Fn(std::io::Error) -> SandboxError + Sync),
) -> Result<(), SandboxError> {
    if let Some((mut src, len)) = input
        && let Copied::Closed = copy_in(&mut stdin, &mut src, len).await.map_err(io)?
    {
        return Ok(());
    }
    let _ = stdin.shutdown().await;
    drop(stdin);
    Ok(())
}

/// Reads the process's output until it ends: stdout into `output` (refused past its limit),
/// stderr into `stderr`. Returns how many bytes came on stdout.
async fn drain(
    stream: &mut BoxStream<'static, Result<OutputChunk, SandboxError>>,
    mut output: Option<(tokio::fs::File, u64)>,
    stderr: &mut CappedBuffer,
    path: &str,
    io: &(dyn Fn(std::io::Error) -> SandboxError + Sync),
) -> Result<u64, SandboxError> {
    let mut len: u64 = 0;
    while let Some(chunk) = stream.next().await {
        match chunk? {
            OutputChunk::Stdout(bytes) => {
                len += bytes.len() as u64;
                if let Some((out, max)) = output.as_mut() {
                    if len > *max {
                        return Err(SandboxError::FileTooLarge {
                            path: path.to_string(),
                            size: len,
                            limit: *max,
                        });
                    }
                    out.write_all(&bytes).await.map_err(io)?;
                }
            }
            OutputChunk::Stderr(bytes) => stderr.push(&bytes),
        }
    }
    if let Some((out, _)) = output.as_mut() {
        out.flush().await.map_err(io)?;
    }
    Ok(len)
}

pub(super) fn bash(script: &str, args: &[&str]) -> Vec<String> {
    let mut argv = vec!["bash".into(), "-c".into(), script.into(), "sandboxd".into()];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv
}

pub(super) fn failed(operation: &'static str, path: &str, done: &Finished) -> SandboxError {
    SandboxError::FileOp {
        operation,
        path: path.to_string(),
        message: if done.stderr.is_empty() {
            format!("ended with status {:?}", done.exit)
        } else {
            done.stderr.clone()
        },
    }
}

/// Writes the first `len` bytes of `src` to the file `path` in the sandbox (parents created,
/// replaced whole), refusing more than `max` bytes.
pub async fn write_file_from(
    sandbox: &dyn Sandbox,
    path: &str,
    src: &File,
    len: u64,
    max: u64,
    timeout: Duration,
) -> Result<(), SandboxError> {
    let path = super::resolve_path(path)?;
    if len > max {
        return Err(SandboxError::FileTooLarge {
            path,
            size: len,
            limit: max,
        });
    }
    let argv = bash(WRITE, &[&path]);
    let done = run(
        sandbox,
        argv,
        "write",
        &path,
        Some((src, len)),
        None,
        timeout,
    )
    .await?;
    match done.exit {
        Some(0) => Ok(()),
        _ => Err(failed("write", &path, &done)),
    }
}

/// Copies the regular file `path` of the sandbox into `into` (from its start), refusing one
/// over `max` bytes; returns how many bytes it has.
pub async fn read_file_into(
    sandbox: &dyn Sandbox,
    path: &str,
    into: &File,
    max: u64,
    timeout: Duration,
) -> Result<u64, SandboxError> {
    let path = super::resolve_path(path)?;
    let argv = bash(READ, &[&path, &max.to_string()]);
    let done = run(
        sandbox,
        argv,
        "read",
        &path,
        None,
        Some((into, max)),
        timeout,
    )
    .await?;
    match done.exit {
        Some(0) => Ok(done.out_len),
        Some(NOT_FOUND) => Err(SandboxError::NotFound { path }),
        Some(TOO_LARGE) => Err(SandboxError::FileTooLarge {
            size: done.stderr.parse().unwrap_or(0),
            path,
            limit: max,
        }),
        _ => Err(failed("read", &path, &done)),
    }
}

/// Unpacks the first `len` bytes of `src`, a tar archive the caller has validated
/// (`tar_safety::validate_archive_file`), into the directory `dir` of the sandbox.
pub async fn unpack_tar_from(
    sandbox: &dyn Sandbox,
    dir: &str,
    src: &File,
    len: u64,
    timeout: Duration,
) -> Result<(), SandboxError> {
    let dir = super::resolve_path(dir)?;
    let argv = bash(UNPACK, &[&dir]);
    let done = run(
        sandbox,
        argv,
        "upload",
        &dir,
        Some((src, len)),
        None,
        timeout,
    )
    .await?;
    match done.exit {
        Some(0) => Ok(()),
        _ => Err(failed("upload", &dir, &done)),
    }
}
