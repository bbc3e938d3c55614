//! The Sandbox trait: the only way anything reaches a session's container.
//!
//! Tools, the agent and the servers see this trait and the plain types below, never a
//! Docker type. A backend implements the `Runtime` seam (runtime.rs: create, list, find,
//! remove sandboxes) and, for the sandbox itself, only `ExecBackend` (exec_sandbox.rs:
//! spawn a process, say whether it lives); files, archives, the shell and timeouts are
//! built on that once. Only `docker*.rs` in this folder import bollard.

mod budget;
pub mod copy_in;
pub mod copy_out;
pub mod ends;
mod exec_ops;
pub mod exec_sandbox;
#[cfg(test)]
mod exec_watch_tests;
pub mod file_mode;
pub mod framed;
pub mod fs_client;
pub mod helpers;
pub mod hibernate;
pub mod host;
pub mod in_use;
pub mod manager;
mod output;
mod owner;
mod pool;
mod process_feed;
pub mod processes;
pub mod proxy_env;
pub mod records;
pub mod runtime;
pub mod shared;
pub mod shell;
mod shell_restore;
mod shell_scan;
pub mod slots;
pub mod snapshot;
pub mod tar_safety;
pub mod templates;
pub mod transfer;
pub mod tunnel;
pub mod vanished;
pub mod watch;
pub mod ws_guard;

mod error;
mod types;

pub use error::SandboxError;
pub use manager::{CreateOptions, SessionInfo, SessionManager};
pub use owner::{Owner, Viewer};
pub use runtime::{Runtime, SandboxState, Usage};
pub use types::*;

use async_trait::async_trait;

/// One session's sandbox. Every method is safe to call concurrently; implementations
/// serialize where the underlying channel demands it (the persistent shell does).
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// The session id this sandbox belongs to.
    fn session_id(&self) -> &str;

    /// Runs one process to completion (one `docker exec`; ~70 ms, so not for the hot path).
    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError>;

    /// Starts a long-lived process with attached stdin/stdout/stderr (drivers, tunnels).
    async fn spawn(&self, req: SpawnRequest) -> Result<AttachedProcess, SandboxError>;

    /// Runs a shell line in the session's persistent bash: cwd and exported variables persist.
    async fn shell(&self, command: &str, opts: ShellOptions) -> Result<ShellOutput, SandboxError>;

    /// `shell`, with the output sent to `to` as it comes instead of returned: the same
    /// persistent bash (cwd and exports persist across both), the same timeout and caps. Each
    /// stream's first half-cap goes out live; past it only the last half-cap is kept and sent
    /// when the command ends, after a `Cut` naming what was dropped (the sync call's bytes,
    /// in pieces). The returned output has empty stdout and stderr. When the caller stops
    /// (`to.cancel`, or the receiver dropped) the command is killed as on a timeout, and the
    /// answer's `note` says so.
    ///
    /// This default, for sandboxes without a streaming shell, runs `shell` and sends its
    /// whole output at the end; a stop replaces the shell.
    async fn shell_stream(
        &self,
        command: &str,
        opts: ShellOptions,
        to: ShellStream,
    ) -> Result<ShellOutput, SandboxError> {
        if !to.send(ShellPiece::Started).await {
            return Ok(ShellOutput::stopped_before_start());
        }
        let out = tokio::select! {
            out = self.shell(command, opts) => out?,
            _ = to.stopped() => {
                // Dropping the call mid-command leaves the shell unsynchronized: replace it.
                self.restart_shell().await?;
                return Ok(ShellOutput {
                    note: Some("the command was stopped because its caller went away; the shell was restarted".into()),
                    ..Default::default()
                });
            }
        };
        for (stream, data) in [
            (StdStream::Stdout, &out.stdout),
            (StdStream::Stderr, &out.stderr),
        ] {
            for piece in data.chunks(MAX_PIECE) {
                let piece = ShellPiece::Output(stream, bytes::Bytes::copy_from_slice(piece));
                if !to.send(piece).await {
                    break;
                }
            }
        }
        Ok(ShellOutput {
            stdout: Vec::new(),
            stderr: Vec::new(),
            ..out
        })
    }

    /// Throws the persistent shell away; the next call starts a fresh one.
    async fn restart_shell(&self) -> Result<(), SandboxError>;

    async fn read_file(&self, path: &str) -> Result<Vec<u8>, SandboxError>;

    /// At most the first `max` bytes of a regular file, and the file's size: for callers that
    /// use only a bounded part, so the host never holds a whole 100 MB file for a 4 MB answer.
    async fn read_head(&self, path: &str, max: usize) -> Result<(Vec<u8>, u64), SandboxError> {
        let mut data = self.read_file(path).await?;
        let size = data.len() as u64;
        data.truncate(max);
        Ok((data, size))
    }
    async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), SandboxError>;
    async fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, SandboxError>;
    async fn stat(&self, path: &str) -> Result<FileStat, SandboxError>;
    async fn mkdir(&self, path: &str) -> Result<(), SandboxError>;
    async fn remove(&self, path: &str, recursive: bool) -> Result<(), SandboxError>;

    /// Unpacks a tar archive (validated on the host first) into `dir` inside the sandbox.
    /// The archive is in memory: for archives of any size, spool them to a host file and use
    /// `transfer::unpack_tar_from` (the service does).
    async fn upload_tar(&self, dir: &str, archive: &[u8]) -> Result<(), SandboxError>;
    /// Packs `dir` inside the sandbox into a tar archive (to be validated by the caller),
    /// returned in memory: `copy_out::tar_to_file` packs into a host file instead (the service
    /// and the CLI's copy-out use it).
    async fn download_tar(&self, dir: &str) -> Result<Vec<u8>, SandboxError>;

    /// Kills every process in the sandbox that carries `SANDBOXD_TAG=<tag>` in its environment.
    async fn kill_tagged(&self, tag: &str) -> Result<(), SandboxError>;

    /// Whether the container is still running; a cheap inspect.
    async fn is_alive(&self) -> bool;

    /// `SandboxGone`, with why it stopped where the backend knows, when the sandbox no
    /// longer runs: for callers that saw their own process end and must tell a dead
    /// sandbox (gVisor's out-of-memory kill takes all of it) from a dead process.
    async fn check_alive(&self) -> Result<(), SandboxError> {
        if self.is_alive().await {
            Ok(())
        } else {
            Err(SandboxError::SandboxGone {
                session: self.session_id().to_string(),
                message: "it stopped running".into(),
            })
        }
    }

    /// Starts what the first call would otherwise start (the persistent shell, the file
    /// helper) now, so that call pays nothing: the warm pool does this before it offers a
    /// sandbox. A sandbox with nothing to start answers at once.
    async fn warm_up(&self) -> Result<(), SandboxError> {
        Ok(())
    }

    /// Unpacks the first `len` bytes of `archive`, a tar the caller checked by the rules of
    /// uploads (`tar_safety`), into /workspace as the persistent shell starts, in the
    /// shell's own process (shell_restore.rs): a resume's restore without a process of its
    /// own (taken on the sandbox's main process's stdin where it was made for this,
    /// `SandboxSpec::restore_bytes`). Ok(false) when this sandbox has no persistent shell or
    /// has started it already: nothing was done, and the caller unpacks with a process of
    /// its own (`transfer::unpack_tar_from`).
    async fn restore_in_shell(
        &self,
        _archive: &std::fs::File,
        _len: u64,
        _timeout: std::time::Duration,
    ) -> Result<bool, SandboxError> {
        Ok(false)
    }

    /// Turns the egress proxy's variables (`egress::proxy_env()`) on or off for this
    /// sandbox's processes: those started from now on, the persistent shell before its
    /// next command and the python interpreter before its next cell (proxy_env.rs). A
    /// sandbox without processes of its own ignores it.
    fn set_proxy_env(&self, _on: bool) {}

    /// The session's own environment, given to every process started from now on (the
    /// persistent shell after its next restart, the python interpreter when it starts);
    /// never part of a command line or an event. A sandbox without processes of its own
    /// ignores it.
    fn set_session_env(&self, _env: Vec<(String, String)>) {}

    /// Adds (or drops) the session CA's trust variables (`mitm_trust::trust_env()`) to the
    /// proxy variables, the same way: once its files are written (egress/inject.rs).
    fn set_egress_trust(&self, _on: bool) {}

    /// The wanted proxy environment, for a tool that keeps a process of its own (the python
    /// interpreter) up to date; None when this sandbox does not manage one.
    fn proxy_env_state(&self) -> Option<proxy_env::ProxyEnvState> {
        None
    }
}

/// The prefix every path inside the sandbox is resolved against when relative.
pub const WORKSPACE: &str = "/workspace";

/// Where the image keeps the in-container helpers (see images/sandbox/helpers).
pub const HELPERS_DIR: &str = "/usr/local/lib/sandboxd";
