//! Plain data types of the Sandbox trait: requests, outputs, file metadata and streams.
//!
//! These are domain types: no Docker type appears here, and the wire formats (API, MCP,
//! events) convert from them rather than exposing them.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWrite;

use super::SandboxError;

/// Default cap for one stream (stdout or stderr) of a command: enough for real logs,
/// small enough that a flood never grows the host process.
pub const DEFAULT_OUTPUT_CAP: usize = 256 * 1024;

/// A one-shot process run with `Sandbox::exec`.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Duration,
    pub output_cap: usize,
}

impl ExecRequest {
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            cwd: None,
            env: Vec::new(),
            stdin: None,
            timeout: Duration::from_secs(120),
            output_cap: DEFAULT_OUTPUT_CAP,
        }
    }

    /// A shell line, run by `bash -c`.
    pub fn shell_line(line: impl Into<String>) -> Self {
        Self::new(["bash".to_string(), "-c".to_string(), line.into()])
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn stdin(mut self, data: Vec<u8>) -> Self {
        self.stdin = Some(data);
        self
    }

    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn output_cap(mut self, cap: usize) -> Self {
        self.output_cap = cap;
        self
    }
}

/// What a finished command left behind. Output over the cap is cut in the middle.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExecOutput {
    /// None when the command did not finish (timeout) or the exit code was unavailable.
    pub exit_code: Option<i64>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    pub duration: Duration,
}

impl ExecOutput {
    pub fn stdout_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// A long-lived process started with `Sandbox::spawn`.
#[derive(Debug, Clone)]
pub struct SpawnRequest {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
}

impl SpawnRequest {
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            cwd: None,
            env: Vec::new(),
        }
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }
}

/// One piece of a spawned process's output, stdout and stderr kept apart.
#[derive(Debug, Clone)]
pub enum OutputChunk {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// A running process inside the sandbox. `stdin.shutdown()` closes the process's stdin (it
/// reads EOF); merely dropping `stdin` does not on every backend (Docker's attached stream
/// stays open until the output is dropped too). The output stream ends when the process exits.
pub struct AttachedProcess {
    pub stdin: Pin<Box<dyn AsyncWrite + Send>>,
    pub output: BoxStream<'static, Result<OutputChunk, SandboxError>>,
    /// Asks for the exit code; meaningful once `output` has ended.
    pub exit_code: ExitProbe,
}

/// A deferred exit-code lookup of a spawned process.
pub type ExitProbe = Box<dyn FnOnce() -> BoxFuture<'static, Option<i64>> + Send>;

/// Options of one persistent-shell call.
#[derive(Debug, Clone)]
pub struct ShellOptions {
    pub timeout: Duration,
    pub output_cap: usize,
}

impl Default for ShellOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(120),
            output_cap: DEFAULT_OUTPUT_CAP,
        }
    }
}

/// Which output stream of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StdStream {
    Stdout,
    Stderr,
}

/// One piece of a streamed shell call (`Sandbox::shell_stream`), in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShellPiece {
    /// The command was handed to the shell (the session's command before it has ended).
    Started,
    /// Output bytes as the command wrote them (at most `MAX_PIECE` bytes each); any bytes,
    /// valid UTF-8 or not.
    Output(StdStream, Bytes),
    /// The stream passed half its cap: from here on only its last half-cap of bytes is kept,
    /// and they come after a `Cut` when the command ends.
    Holding(StdStream),
    /// `bytes` were cut from the middle of the stream here; the kept tail follows.
    Cut { stream: StdStream, bytes: u64 },
}

/// The largest `ShellPiece::Output` a streamed call sends.
pub const MAX_PIECE: usize = 16 * 1024;

/// Where a streamed shell call sends its pieces, and how its caller stops it. Cancelling
/// `cancel` or dropping the receiver of `tx` stops the command as a timeout would.
#[derive(Debug, Clone)]
pub struct ShellStream {
    pub tx: tokio::sync::mpsc::Sender<ShellPiece>,
    pub cancel: tokio_util::sync::CancellationToken,
}

impl ShellStream {
    /// Resolves when the caller no longer wants the command: cancelled, or the receiver gone.
    pub async fn stopped(&self) {
        tokio::select! {
            _ = self.cancel.cancelled() => {}
            _ = self.tx.closed() => {}
        }
    }

    /// Sends one piece unless the caller stops first; false when it did.
    pub async fn send(&self, piece: ShellPiece) -> bool {
        tokio::select! {
            r = self.tx.send(piece) => r.is_ok(),
            _ = self.cancel.cancelled() => false,
        }
    }
}

/// What one persistent-shell call produced.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ShellOutput {
    /// None when the command timed out or the shell died under it.
    pub exit_code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    /// Set when the shell had to be (re)started around this call; says why, for the model.
    pub note: Option<String>,
    pub duration: Duration,
}

impl ShellOutput {
    /// The answer of a streamed call whose caller left before the command started.
    pub fn stopped_before_start() -> Self {
        Self {
            note: Some("the command was not run: its caller went away first".into()),
            ..Default::default()
        }
    }

    pub fn stdout_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    pub path: String,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    /// Seconds since the Unix epoch.
    pub modified: i64,
}

/// Resolves a path given by the model or a client against /workspace, refusing NUL bytes.
/// The container is the boundary, so any absolute path inside it is allowed.
pub fn resolve_path(path: &str) -> Result<String, SandboxError> {
    if path.is_empty() {
        return Err(SandboxError::InvalidPath {
            path: path.to_string(),
            reason: "the path is empty".into(),
        });
    }
    if path.contains('\0') {
        return Err(SandboxError::InvalidPath {
            path: path.replace('\0', "\\0"),
            reason: "the path contains a NUL byte".into(),
        });
    }
    if path.starts_with('/') {
        Ok(path.to_string())
    } else {
        Ok(format!("{}/{}", super::WORKSPACE, path))
    }
}
