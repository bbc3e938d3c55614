//! PersistentShell: one long-lived bash per session over an attached process.
//!
//! Measured on this machine: a command through a persistent shell costs ~0.1 ms, against
//! ~72 ms for a `docker exec` each, so this is the hot path of the bash tool.
//!
//! Protocol: each command is sent as `eval $'…'` with every byte outside [A-Za-z0-9 ]
//! written as `\xHH`, so no command text can break out of the wrapper, followed by two
//! sentinels that carry a fresh random nonce per call (one on stdout with the exit code,
//! one on stderr). The nonce never sits in a shell variable, and the sentinels are printed by
//! `builtin printf` after the command's traps are reset, so ordinary commands (even ones that
//! define their own `printf` or a DEBUG trap) cannot see or forge them. Code that sets out to
//! subvert its own shell (redefining `builtin`) can still forge the exit codes of its own later
//! commands: that deceives only its own session, and the host side stays bounded whatever the
//! stream holds (see `Scanner`).
//!
//! The command's stdin is /dev/null: a program that waits for input gets EOF at once instead
//! of hanging until the timeout.
//!
//! A streamed call (`run_streamed`, behind `Sandbox::shell_stream` and the API's streamed
//! exec) is the same protocol in the same shell: only where the output goes differs (pieces
//! to a bounded channel instead of a buffer, see shell_scan.rs), and a caller that leaves is
//! treated as a timeout: the command's process tree is killed and the shell kept.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use super::output::CappedBuffer;
use super::shell_scan::{Kept, Scanner, StreamCap};
use super::{
    AttachedProcess, OutputChunk, Sandbox, SandboxError, ShellOptions, ShellOutput, ShellPiece,
    ShellStream, SpawnRequest, StdStream,
};

/// How long a timed-out command gets to die before the shell itself is replaced.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// The `SANDBOXD_TAG` every persistent shell carries in its environment, and so every
/// command it runs (and what they start, unless they scrub their environment). A process
/// that re-attaches a kept sandbox after its previous holder died kills what that holder
/// left running with `Sandbox::kill_tagged(SHELL_TAG)`: a command in flight there has
/// nobody watching its timeout any more. It must be done before this process starts a
/// shell of its own in the sandbox, whose commands carry the same tag.
pub const SHELL_TAG: &str = "sandboxd-shell";

/// The tag this process's shells carry instead of `SHELL_TAG`, once set (`tag_shells`).
static PROCESS_TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Makes every shell this process starts from now on carry `tag` (a replica of serve:
/// `shared::shell_tag_of(its id)`), so that another replica that finds this one dead kills
/// what its shells left running without touching a live replica's shells in the same
/// session. Per process, not per sandbox: a process is one replica, and shells are started
/// deep inside every backend's sandbox. Set once, before any shell starts; a second call
/// is ignored.
pub fn tag_shells(tag: String) {
    if PROCESS_TAG.set(tag).is_err() {
        tracing::debug!("this process's shell tag was already set; the first one stays");
    }
}

/// The tag this process's shells carry.
pub fn shell_tag() -> &'static str {
    PROCESS_TAG.get().map(String::as_str).unwrap_or(SHELL_TAG)
}

pub(super) struct Running {
    pub(super) process: AttachedProcess,
    pub(super) pid: u32,
    /// The generation of the proxy environment this shell has (None: not known yet).
    pub(super) proxy_env: Option<u64>,
}

#[derive(Default)]
pub struct PersistentShell {
    inner: Mutex<Option<Running>>,
    /// Why the last shell ended, told to the model on the next call.
    pending_note: std::sync::Mutex<Option<String>>,
    ever_started: AtomicBool,
    /// The cgroup's OOM-kill counter as last seen, to tell an OOM kill from another SIGKILL.
    oom_kills_seen: AtomicU64,
}

enum Outcome {
    Done(i32),
    TimedOut,
    /// The streamed call's caller went away.
    Stopped,
    Died(String),
}

impl PersistentShell {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs one command; calls on one session are serialized by the mutex, never interleaved.
    pub async fn run(
        &self,
        host: &dyn Sandbox,
        command: &str,
        opts: &ShellOptions,
    ) -> Result<ShellOutput, SandboxError> {
        self.run_with(host, command, opts, None).await
    }

    /// `run`, with the output sent to `to` as it comes (see `Sandbox::shell_stream`): the same
    /// shell, so cwd and variables are shared with `run`. A stop is handled as a timeout is
    /// (the command's process tree killed and the shell kept when that works), so a client
    /// that leaves costs neither the session's state nor a stray process.
    pub async fn run_streamed(
        &self,
        host: &dyn Sandbox,
        command: &str,
        opts: &ShellOptions,
        to: &ShellStream,
    ) -> Result<ShellOutput, SandboxError> {
        self.run_with(host, command, opts, Some(to)).await
    }

    async fn run_with(
        &self,
        host: &dyn Sandbox,
        command: &str,
        opts: &ShellOptions,
        to: Option<&ShellStream>,
    ) -> Result<ShellOutput, SandboxError> {
        if command.contains('\0') {
            return Err(SandboxError::InvalidRequest(
                "the command contains a NUL byte, which bash cannot take".into(),
            ));
        }
        let started = Instant::now();
        // A streamed caller that leaves while the session's previous command still runs
        // never gets its command started.
        let mut guard = match to {
            None => self.inner.lock().await,
            Some(to) => tokio::select! {
                g = self.inner.lock() => g,
                _ = to.stopped() => return Ok(ShellOutput::stopped_before_start()),
            },
        };
        let note = self.ensure_started(host, &mut guard).await?;
        let Some(running) = guard.as_mut() else {
            return Err(SandboxError::InvalidRequest("shell not started".into()));
        };

        let nonce = format!("{:032x}", rand::random::<u128>());
        let mut line = proxy_prefix(host, running);
        line.push_str(&command_line(command, &nonce));
        if let Some(to) = to
            && !to.send(ShellPiece::Started).await
        {
            self.restore_note(note);
            return Ok(ShellOutput::stopped_before_start());
        }
        if let Err(e) = running.process.stdin.write_all(line.as_bytes()).await {
            *guard = None;
            self.set_note(format!("the shell had died ({e}); it will be restarted"));
            return Err(SandboxError::Protocol {
                helper: "bash".into(),
                message: format!("cannot write to the shell: {e}"),
            });
        }
        let _ = running.process.stdin.flush().await;

        let kept = |stream| match to {
            None => Kept::Buffer(CappedBuffer::new(opts.output_cap)),
            Some(_) => Kept::Stream(StreamCap::new(stream, opts.output_cap)),
        };
        // The sentinels follow the command's output directly (no newline of their own before
        // them), so the only output a scanner holds back is a trailing `_…` that may begin
        // one: a streamed line goes out with its newline at once.
        let mut out = Scanner::new(format!("__SBXO_{nonce}_"), kept(StdStream::Stdout));
        let mut err = Scanner::new(format!("__SBXE_{nonce}__\n"), kept(StdStream::Stderr));
        let deadline = tokio::time::Instant::now() + opts.timeout;
        let mut outcome =
            read_until_done(&mut running.process, &mut out, &mut err, deadline, to).await;
        if matches!(outcome, Outcome::TimedOut | Outcome::Stopped) {
            outcome = self
                .kill_overrun(host, &mut guard, &mut out, &mut err, outcome)
                .await?;
        }
        let shell_exit = self.after_shell_death(host, &mut guard, &outcome).await?;
        let oom_note = self.oom_note(host, &outcome).await;
        // The next command may start now; a streamed call's held tail is sent after.
        drop(guard);
        let notes = Notes {
            before: note,
            oom: oom_note,
        };
        Ok(finish(to, out, err, outcome, shell_exit, notes, started).await)
    }

    /// Makes sure a live shell is in `slot`, starting one when there is none or the last one
    /// died, and returns the note for the model: the pending one, or why the shell is new.
    async fn ensure_started(
        &self,
        host: &dyn Sandbox,
        slot: &mut Option<Running>,
    ) -> Result<Option<String>, SandboxError> {
        let mut note = self.take_note();
        if slot
            .as_mut()
            .is_some_and(|r| !drain_and_check_alive(&mut r.process))
        {
            *slot = None;
            note = Some("the shell had died since the last command (killed from outside?); a new one was started, so the working directory and variables were reset".into());
        }
        if slot.is_none() {
            *slot = Some(start(host).await?);
            if note.is_none() && self.ever_started.load(Ordering::Relaxed) {
                note = Some("a new shell was started; the working directory and variables of the old one are gone".into());
            }
            self.ever_started.store(true, Ordering::Relaxed);
        }
        Ok(note)
    }

    /// A command that timed out or was stopped: kills its process tree and lets the shell
    /// resynchronize, replacing the whole shell when that fails. Returns the outcome, `Died`
    /// when the shell ended meanwhile; an error when the kill cannot be confirmed.
    async fn kill_overrun(
        &self,
        host: &dyn Sandbox,
        slot: &mut Option<Running>,
        out: &mut Scanner,
        err: &mut Scanner,
        mut outcome: Outcome,
    ) -> Result<Outcome, SandboxError> {
        let Some(running) = slot.as_mut() else {
            return Ok(outcome);
        };
        let why = if matches!(outcome, Outcome::Stopped) {
            "was stopped"
        } else {
            "timed out"
        };
        let pid = running.pid;
        let mut killed = killtree(host, "--descendants", pid).await;
        let grace = tokio::time::Instant::now() + KILL_GRACE;
        // Nothing is sent while the shell resynchronizes (the caller may be gone); what
        // the command still prints is kept, capped, and sent after.
        match read_until_done(&mut running.process, out, err, grace, None).await {
            Outcome::Done(_) if killed.is_ok() => {}
            Outcome::Done(_) | Outcome::TimedOut | Outcome::Stopped => {
                // A builtin looping in bash itself, or descendants that would not die:
                // replace the whole shell, and verify that too.
                killed = killtree(host, "--tree", pid).await;
                *slot = None;
                self.set_note(format!("the previous command {why} inside the shell itself, so the shell was restarted: the working directory and variables were reset"));
            }
            Outcome::Died(reason) => outcome = Outcome::Died(reason),
        }
        // Never claim a kill that did not happen.
        if let Err(detail) = killed {
            *slot = None;
            return Err(SandboxError::KillUnconfirmed {
                what: format!("the command that {why}"),
                detail,
            });
        }
        Ok(outcome)
    }

    /// When the command ended the shell (`exit 4`): drops it, notes the restart for the next
    /// call and returns the shell's own exit status; an error when the sandbox is gone too.
    async fn after_shell_death(
        &self,
        host: &dyn Sandbox,
        slot: &mut Option<Running>,
        outcome: &Outcome,
    ) -> Result<Option<i32>, SandboxError> {
        let mut shell_exit = None;
        if let Outcome::Died(why) = outcome {
            if let Some(dead) = slot.take() {
                shell_exit = (dead.process.exit_code)().await.map(|c| c as i32);
            }
            if !still_alive(host, shell_exit).await {
                return Err(SandboxError::SandboxGone {
                    session: host.session_id().to_string(),
                    message: format!("the shell ended ({why}) and the container is not running"),
                });
            }
            self.set_note(format!(
                "the shell exited ({why}); a new one was started, so the working directory and variables were reset"
            ));
        }
        Ok(shell_exit)
    }

    /// The note for a command killed by SIGKILL (137) when the cgroup's OOM-kill counter grew.
    async fn oom_note(&self, host: &dyn Sandbox, outcome: &Outcome) -> Option<String> {
        if matches!(outcome, Outcome::Done(137))
            && let Some(count) = oom_kill_count(host).await
            && count > self.oom_kills_seen.swap(count, Ordering::Relaxed)
        {
            return Some("the command was killed by the out-of-memory killer: it reached the sandbox's memory limit".to_string());
        }
        None
    }

    /// Starts the shell by `start` when none runs yet, under the lock so no command runs
    /// before it: None when one runs already (nothing is started).
    pub(super) async fn start_first(
        &self,
        start: impl std::future::Future<Output = Result<Running, SandboxError>>,
    ) -> Option<Result<(), SandboxError>> {
        let mut guard = self.inner.lock().await;
        if guard.is_some() {
            return None;
        }
        Some(start.await.map(|running| {
            *guard = Some(running);
            self.ever_started.store(true, Ordering::Relaxed);
        }))
    }

    /// Forgets the shell without a word to it: for a sandbox found stopped, where nothing can
    /// be killed and a call may have been dropped in the middle of a command.
    pub async fn discard(&self) {
        self.inner.lock().await.take();
    }

    pub async fn restart(&self, host: &dyn Sandbox) {
        let mut guard = self.inner.lock().await;
        if let Some(running) = guard.take() {
            let _ = killtree(host, "--tree", running.pid).await;
        }
        if let Ok(mut n) = self.pending_note.lock() {
            *n = None;
        }
        self.ever_started.store(false, Ordering::Relaxed);
    }

    fn take_note(&self) -> Option<String> {
        self.pending_note.lock().ok().and_then(|mut n| n.take())
    }

    /// Puts back a note taken for a call that did not run, for the next one.
    fn restore_note(&self, note: Option<String>) {
        if let Some(n) = note {
            self.set_note(n);
        }
    }

    fn set_note(&self, note: String) {
        if let Ok(mut n) = self.pending_note.lock() {
            *n = Some(note);
        }
    }
}

/// Kills a process tree inside the sandbox with the image's killtree helper. `Ok` only when
/// killtree's final scan found nothing of the tree alive; `Err` says what survived.
async fn killtree(host: &dyn Sandbox, mode: &str, pid: u32) -> Result<(), String> {
    let mut req = super::ExecRequest::new(super::helpers::argv(
        "killtree.py",
        &[mode, &pid.to_string()],
    ))
    .timeout(Duration::from_secs(10))
    .output_cap(4096);
    req.env = super::helpers::env();
    match host.exec(req).await {
        Ok(out) if super::helpers::kill_confirmed(out.exit_code) => Ok(()),
        Ok(out) => {
            let detail = out.stderr_lossy().trim().to_string();
            tracing::warn!(pid, %detail, "a process tree in the sandbox survived killtree");
            Err(if detail.is_empty() {
                format!("killtree ended with status {:?}", out.exit_code)
            } else {
                detail
            })
        }
        Err(e) => {
            tracing::warn!(pid, error = %e, "could not kill a process tree in the sandbox");
            Err(e.to_string())
        }
    }
}

/// The container's OOM-kill counter (cgroup v2 memory.events or v1 memory.oom_control).
pub async fn oom_kill_count(host: &dyn Sandbox) -> Option<u64> {
    for path in [
        "/sys/fs/cgroup/memory.events",
        "/sys/fs/cgroup/memory/memory.oom_control",
    ] {
        if let Ok(text) = host.read_file(path).await {
            let text = String::from_utf8_lossy(&text);
            return text
                .lines()
                .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok());
        }
    }
    None
}

/// Whether the sandbox still runs after its shell died. A shell killed by a signal may be
/// the container being killed, which the engine reports a moment later: look twice then.
async fn still_alive(host: &dyn Sandbox, shell_exit: Option<i32>) -> bool {
    if !host.is_alive().await {
        return false;
    }
    if shell_exit.is_some_and(|c| c < 128) {
        return true;
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    host.is_alive().await
}

/// Discards stray output left by background jobs and tells whether the shell still runs.
fn drain_and_check_alive(process: &mut AttachedProcess) -> bool {
    use futures::FutureExt;
    loop {
        match process.output.next().now_or_never() {
            None => return true,
            Some(Some(Ok(_))) => continue,
            Some(None) | Some(Some(Err(_))) => return false,
        }
    }
}

fn join_notes(a: Option<String>, b: Option<String>) -> Option<String> {
    match (a, b) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    }
}

async fn start(host: &dyn Sandbox) -> Result<Running, SandboxError> {
    let (mut process, proxy_env) = spawn_shell(host).await?;
    process
        .stdin
        .write_all(GREETING.as_bytes())
        .await
        .map_err(|e| SandboxError::Protocol {
            helper: "bash".into(),
            message: format!("cannot start the shell: {e}"),
        })?;
    let mut line = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let next = tokio::time::timeout_at(deadline, process.output.next()).await;
        match next {
            Ok(Some(Ok(OutputChunk::Stdout(b)))) => line.extend_from_slice(&b),
            Ok(Some(Ok(OutputChunk::Stderr(_)))) => {}
            Ok(Some(Err(e))) => return Err(e),
            Ok(None) | Err(_) => {
                return Err(SandboxError::Protocol {
                    helper: "bash".into(),
                    message: "the shell did not start".into(),
                });
            }
        }
        if let Some(end) = line.iter().position(|&c| c == b'\n') {
            let pid = greeting_pid(&line[..end])?;
            return Ok(Running {
                process,
                pid,
                proxy_env,
            });
        }
    }
}

/// What a new shell is told first: it answers with its pid (`greeting_pid`).
pub(super) const GREETING: &str = "printf 'SBXPID %s\\n' \"$$\"\n";

/// Starts bash as the persistent shell: in /workspace, tagged, with the proxy variables of
/// this generation (or a later one, which the first command then applies again), which it
/// returns.
pub(super) async fn spawn_shell(
    host: &dyn Sandbox,
) -> Result<(AttachedProcess, Option<u64>), SandboxError> {
    let proxy_env = host.proxy_env_state().map(|s| s.generation);
    let process = host
        .spawn(
            SpawnRequest::new(["bash", "--noprofile", "--norc"])
                .cwd(super::WORKSPACE)
                .env("SANDBOXD_SHELL", "1")
                .env("SANDBOXD_TAG", shell_tag()),
        )
        .await?;
    Ok((process, proxy_env))
}

/// The pid in the shell's answer to `GREETING` (its first line, newline removed).
pub(super) fn greeting_pid(line: &[u8]) -> Result<u32, SandboxError> {
    let text = String::from_utf8_lossy(line);
    text.strip_prefix("SBXPID ")
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| SandboxError::Protocol {
            helper: "bash".into(),
            message: format!("unexpected greeting {text:?}"),
        })
}

/// The session's proxy variables, exported or unset, when they changed since this shell last
/// had them (sandbox/proxy_env.rs); empty otherwise.
fn proxy_prefix(host: &dyn Sandbox, running: &mut Running) -> String {
    match host.proxy_env_state() {
        Some(want) if running.proxy_env != Some(want.generation) => {
            running.proxy_env = Some(want.generation);
            super::proxy_env::shell_line(want)
        }
        _ => String::new(),
    }
}

/// The line that runs `command` in the shell and then prints the sentinels of `nonce`.
/// After the command: drop DEBUG/RETURN/ERR traps it may have set (they would see the nonce),
/// then print the sentinels with `builtin printf`, so a script's own printf function cannot
/// break the protocol. (An external printf would be immune to a redefined `builtin` too, but
/// costs two forks per command on the hot path.)
fn command_line(command: &str, nonce: &str) -> String {
    format!(
        "eval {} </dev/null; __sbx_rc=$?; builtin trap - DEBUG RETURN ERR; builtin printf '__SBXO_{nonce}_%d__\\n' \"$__sbx_rc\"; builtin printf '__SBXE_{nonce}__\\n' >&2\n",
        ansi_c_quote(command)
    )
}

/// What the model is told about how the command ended, beyond its exit code.
fn outcome_note(outcome: &Outcome, shell_exit: Option<i32>) -> Option<String> {
    match outcome {
        Outcome::Died(_) if shell_exit.is_some() => Some(format!(
            "the shell itself ended with status {} during this command (an `exit`, or a kill); the next command gets a fresh shell, so cd and variables are reset",
            shell_exit.unwrap_or_default()
        )),
        Outcome::Died(why) => Some(format!(
            "the shell exited during this command ({why}); the next command gets a fresh shell"
        )),
        Outcome::Stopped => Some(
            "the command was stopped because its caller went away, and its processes were killed"
                .into(),
        ),
        _ => None,
    }
}

/// The notes of a call gathered before its end: the one from before the command (a pending or
/// restart note) and the out-of-memory one.
struct Notes {
    before: Option<String>,
    oom: Option<String>,
}

/// The call's result, once the shell is free for the next command: what was kept of the
/// output, and for a streamed call the held tail sent now.
async fn finish(
    to: Option<&ShellStream>,
    out: Scanner,
    err: Scanner,
    outcome: Outcome,
    shell_exit: Option<i32>,
    notes: Notes,
    started: Instant,
) -> ShellOutput {
    let (stdout, stdout_truncated, out_rest) = settle(out.finish());
    let (stderr, stderr_truncated, err_rest) = settle(err.finish());
    let timed_out = matches!(outcome, Outcome::TimedOut);
    let outcome_note = outcome_note(&outcome, shell_exit);
    if let Some(to) = to {
        for piece in out_rest.into_iter().chain(err_rest) {
            if !to.send(piece).await {
                break;
            }
        }
    }
    ShellOutput {
        exit_code: match outcome {
            Outcome::Done(code) => Some(code),
            Outcome::Died(_) => shell_exit,
            Outcome::TimedOut | Outcome::Stopped => None,
        },
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        timed_out,
        note: join_notes(join_notes(notes.before, outcome_note), notes.oom),
        duration: started.elapsed(),
    }
}

/// Reads the shell's output until both sentinels came, the deadline passed, the shell died
/// or (streamed) the caller stopped. A streamed call's pieces are sent as they are made; the
/// wait for a slow reader counts against the deadline too.
async fn read_until_done(
    process: &mut AttachedProcess,
    out: &mut Scanner,
    err: &mut Scanner,
    deadline: tokio::time::Instant,
    to: Option<&ShellStream>,
) -> Outcome {
    loop {
        if let Some(to) = to {
            for scanner in [&mut *out, &mut *err] {
                if let Some(stop) = flush(to, scanner, deadline).await {
                    return stop;
                }
            }
        }
        if out.code.is_some() && err.done {
            return Outcome::Done(out.code.unwrap_or(-1));
        }
        // Checked here too: a flood of output keeps the stream ready and never lets the
        // timeout below fire.
        if tokio::time::Instant::now() >= deadline {
            return Outcome::TimedOut;
        }
        let next = tokio::select! {
            biased;
            _ = stopped(to) => return Outcome::Stopped,
            next = tokio::time::timeout_at(deadline, process.output.next()) => next,
        };
        match next {
            Err(_) => return Outcome::TimedOut,
            Ok(None) => return Outcome::Died("its output closed".into()),
            Ok(Some(Err(e))) => return Outcome::Died(e.to_string()),
            Ok(Some(Ok(OutputChunk::Stdout(b)))) => out.push(&b),
            Ok(Some(Ok(OutputChunk::Stderr(b)))) => err.push(&b),
        }
    }
}

/// Sends a streamed scanner's waiting pieces; a piece leaves the outbox only once the
/// channel has room for it, so a deadline in between loses nothing.
async fn flush(
    to: &ShellStream,
    scanner: &mut Scanner,
    deadline: tokio::time::Instant,
) -> Option<Outcome> {
    let outbox = scanner.kept.outbox()?;
    while !outbox.is_empty() {
        let permit = tokio::select! {
            permit = to.tx.reserve() => match permit {
                Ok(p) => p,
                Err(_) => return Some(Outcome::Stopped),
            },
            _ = to.cancel.cancelled() => return Some(Outcome::Stopped),
            _ = tokio::time::sleep_until(deadline) => return Some(Outcome::TimedOut),
        };
        if let Some(piece) = outbox.pop_front() {
            permit.send(piece);
        }
    }
    None
}

async fn stopped(to: Option<&ShellStream>) {
    match to {
        Some(to) => to.stopped().await,
        None => std::future::pending().await,
    }
}

/// A finished scanner's bytes (a plain call) or its pieces still to send (a streamed one).
fn settle(kept: Kept) -> (Vec<u8>, bool, VecDeque<ShellPiece>) {
    match kept {
        Kept::Buffer(b) => {
            let (bytes, cut) = b.finish();
            (bytes, cut, VecDeque::new())
        }
        Kept::Stream(s) => {
            let (rest, cut) = s.finish();
            (Vec::new(), cut, rest)
        }
    }
}

/// Quotes arbitrary text as a bash ANSI-C string in which only [A-Za-z0-9 ] stay literal.
pub fn ansi_c_quote(text: &str) -> String {
    let mut q = String::with_capacity(text.len() * 2 + 3);
    q.push_str("$'");
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b == b' ' {
            q.push(b as char);
        } else {
            let _ = write!(q, "\\x{b:02x}");
        }
    }
    q.push('\'');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_leaves_no_way_out() {
        assert_eq!(ansi_c_quote("a'b"), "$'a\\x27b'");
        assert_eq!(ansi_c_quote("x\ny"), "$'x\\x0ay'");
        assert!(!ansi_c_quote("'; rm -rf / #").contains('\''.to_string().repeat(2).as_str()));
    }
}
