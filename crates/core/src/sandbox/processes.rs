//! `ProcessTable`: several processes at once in one session, beside its persistent shell.
//!
//! The persistent shell runs one command at a time (a second waits behind the first); a
//! client that wants a server, a watcher or two independent commands at once starts them
//! here instead. Each process is its own `Sandbox::spawn` with its own argv, environment and
//! working directory, tagged with a SANDBOXD_TAG so a signal kills its whole tree
//! (`Sandbox::kill_tagged`). The table lives in the session's slots, so every front end
//! (the /v1 routes, the E2B envd shell) sees the same processes.
//!
//! Bounded: at most `MAX_PROCESSES` running per session, and each process keeps only the
//! last `REPLAY_BYTES` of its output for a late subscriber (a live subscriber gets every
//! chunk unless it falls `LIVE_CHUNKS` behind, when it is told how much it missed).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::sync::broadcast;

pub use super::process_feed::Subscription;
use super::process_feed::{Proc, ProcState, lock, pump};
use super::{Sandbox, SandboxError, SpawnRequest};

/// Running processes a session may have at once in its table.
pub const MAX_PROCESSES: usize = 16;
/// Output each process keeps for a subscriber that comes late (connect, a second stream).
pub const REPLAY_BYTES: usize = 1 << 20;
/// Chunks a live subscriber may fall behind before it skips ahead.
const LIVE_CHUNKS: usize = 1024;
/// Environment variables a start may set (names and values are checked by the caller's API).
pub const MAX_ENV: usize = 128;
/// The most bytes one variable (name and value) may take: far below the kernel's 128 KiB
/// per string, so a process always starts.
pub const MAX_ENV_ENTRY_BYTES: usize = 32 * 1024;
/// The most bytes an environment may take in all (a session's is kept in its row and read
/// with it).
pub const MAX_ENV_BYTES: usize = 256 * 1024;

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct ProcessSpec {
    /// The program and its arguments (not a shell line: `["bash", "-c", line]` for one).
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// A caller's name for it, unique among the running ones (E2B's `tag`).
    pub tag: Option<String>,
    /// Keep stdin open for `send_stdin`; otherwise the process reads EOF at once.
    pub stdin: bool,
}

/// One event of a process, in order: output pieces, then one `Exit`.
#[derive(Debug, Clone)]
pub enum ProcessEvent {
    Stdout(Bytes),
    Stderr(Bytes),
    /// Output the subscriber did not get: bytes cut from the replay buffer's start, or
    /// chunks a slow reader skipped.
    Missed(u64),
    Exit(ProcessExit),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessExit {
    /// None when the backend could not tell (e.g. killed by a signal).
    pub code: Option<i64>,
    /// A signal sent through the table ended it.
    pub signaled: bool,
}

/// A running process as `list` shows it.
#[derive(Debug, Clone)]
pub struct ProcessInfo {
    pub pid: u32,
    pub spec: ProcessSpec,
}

/// Which signal `signal` sends. The whole tree is killed either way (killtree stops and kills
/// by tag); TERM is accepted for the clients that send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

/// One session's processes.
pub struct ProcessTable {
    sandbox: Arc<dyn Sandbox>,
    procs: Mutex<Procs>,
}

#[derive(Default)]
struct Procs {
    next_pid: u32,
    running: BTreeMap<u32, Arc<Proc>>,
    /// The last processes that ended, newest last: a late reader still gets what they kept
    /// and their exit (at most `KEPT_ENDED`, so ended processes never pile up).
    ended: std::collections::VecDeque<Arc<Proc>>,
    /// Starts between their reservation and their entry (counted against the bound).
    starting: usize,
}

/// Ended processes kept for a late reader.
const KEPT_ENDED: usize = 8;

impl ProcessTable {
    /// The session's table (made on first use, kept in its slots).
    pub fn of(session: &super::manager::Session) -> Arc<Self> {
        session
            .slots
            .get_or_insert_with(|| Self::new(session.sandbox.clone()))
    }

    pub fn new(sandbox: Arc<dyn Sandbox>) -> Self {
        Self {
            sandbox,
            procs: Mutex::new(Procs {
                next_pid: 1000,
                running: BTreeMap::new(),
                ended: std::collections::VecDeque::new(),
                starting: 0,
            }),
        }
    }

    /// Starts a process; the subscription sees it from its first byte.
    pub async fn start(
        self: &Arc<Self>,
        mut spec: ProcessSpec,
    ) -> Result<Subscription, SandboxError> {
        check_spec(&spec)?;
        spec.cwd = spec.cwd.as_deref().map(super::resolve_path).transpose()?;
        check_cwd(&*self.sandbox, spec.cwd.as_deref()).await?;
        let pid = {
            let mut procs = lock(&self.procs);
            if procs.running.len() + procs.starting >= MAX_PROCESSES {
                return Err(SandboxError::Refused {
                    message: format!(
                        "this session already runs {MAX_PROCESSES} processes, the most it may; wait for one to end or kill one"
                    ),
                });
            }
            if let Some(tag) = &spec.tag
                && procs
                    .running
                    .values()
                    .any(|p| p.spec.tag.as_ref() == Some(tag))
            {
                return Err(SandboxError::Conflict(format!(
                    "a running process already has the tag {tag:?}"
                )));
            }
            procs.next_pid += 1;
            procs.starting += 1;
            procs.next_pid
        };
        let kill_tag = format!("{:032x}", rand::random::<u128>());
        let mut req = SpawnRequest::new(spec.argv.iter().cloned());
        for (k, v) in &spec.env {
            req = req.env(k.clone(), v.clone());
        }
        req = req.env("SANDBOXD_TAG", kill_tag.clone());
        if let Some(cwd) = &spec.cwd {
            req = req.cwd(cwd.clone());
        }
        // Released on every way out, a caller that went away mid-spawn included.
        let reserved = Reserved(&self.procs);
        let super::AttachedProcess {
            stdin,
            output,
            exit_code,
        } = self.sandbox.spawn(req).await?;
        let (events, _) = broadcast::channel(LIVE_CHUNKS);
        let proc = Arc::new(Proc {
            pid,
            spec,
            kill_tag,
            state: Mutex::new(ProcState::default()),
            events,
            stdin: tokio::sync::Mutex::new(Some(stdin)),
        });
        let sub = proc.subscribe();
        lock(&self.procs).running.insert(pid, proc.clone());
        drop(reserved);
        if !proc.spec.stdin
            && let Some(mut w) = proc.stdin.lock().await.take()
        {
            let _ = w.shutdown().await;
        }
        tokio::spawn(pump(proc, output, exit_code, Arc::downgrade(self)));
        Ok(sub)
    }

    fn find(&self, pid: Option<u32>, tag: Option<&str>) -> Option<Arc<Proc>> {
        let procs = lock(&self.procs);
        match (pid, tag) {
            (Some(pid), _) => procs.running.get(&pid).cloned(),
            (None, Some(tag)) => procs
                .running
                .values()
                .find(|p| p.spec.tag.as_deref() == Some(tag))
                .cloned(),
            (None, None) => None,
        }
    }

    /// Takes an ended process out of the running ones; it stays readable among the last
    /// `KEPT_ENDED` that ended.
    pub(super) fn forget(&self, pid: u32) {
        let mut procs = lock(&self.procs);
        if let Some(proc) = procs.running.remove(&pid) {
            if procs.ended.len() >= KEPT_ENDED {
                procs.ended.pop_front();
            }
            procs.ended.push_back(proc);
        }
    }

    /// A running process's pid by its pid or tag.
    pub fn resolve(&self, pid: Option<u32>, tag: Option<&str>) -> Option<u32> {
        self.find(pid, tag).map(|p| p.pid)
    }

    /// The running processes, oldest first.
    pub fn list(&self) -> Vec<ProcessInfo> {
        lock(&self.procs)
            .running
            .values()
            .map(|p| ProcessInfo {
                pid: p.pid,
                spec: p.spec.clone(),
            })
            .collect()
    }

    /// Follows a process: what it kept, then what comes (for one that ended lately, what it
    /// kept and its exit).
    pub fn subscribe(&self, pid: u32) -> Option<Subscription> {
        self.find(Some(pid), None)
            .or_else(|| {
                let procs = lock(&self.procs);
                procs.ended.iter().find(|p| p.pid == pid).cloned()
            })
            .map(|p| p.subscribe())
    }

    /// Writes to a running process's stdin. Err(Conflict) when it was started without
    /// stdin or closed it; None when there is no such process.
    pub async fn send_stdin(&self, pid: u32, data: &[u8]) -> Option<Result<(), SandboxError>> {
        let proc = self.find(Some(pid), None)?;
        let mut stdin = proc.stdin.lock().await;
        let Some(w) = stdin.as_mut().filter(|_| proc.spec.stdin) else {
            return Some(Err(SandboxError::Conflict(format!(
                "process {pid} was started without stdin (or closed it)"
            ))));
        };
        let written = async {
            w.write_all(data).await?;
            w.flush().await
        };
        Some(
            written.await.map_err(|e| {
                SandboxError::Conflict(format!("process {pid}'s stdin is closed: {e}"))
            }),
        )
    }

    /// Closes a running process's stdin (it reads EOF).
    pub async fn close_stdin(&self, pid: u32) -> Option<()> {
        let proc = self.find(Some(pid), None)?;
        if let Some(mut w) = proc.stdin.lock().await.take() {
            let _ = w.shutdown().await;
        }
        Some(())
    }

    /// Kills a running process and everything it started. None: no such process.
    pub async fn signal(&self, pid: u32, _signal: Signal) -> Option<Result<(), SandboxError>> {
        let proc = self.find(Some(pid), None)?;
        lock(&proc.state).signaled = true;
        Some(self.sandbox.kill_tagged(&proc.kill_tag).await)
    }
}

/// A start's place under the bound, from its check until its entry in the table.
struct Reserved<'a>(&'a Mutex<Procs>);

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        lock(self.0).starting -= 1;
    }
}

/// Refuses a working directory that is not a directory of the sandbox (a backend would fail
/// the start in its own words).
pub async fn check_cwd(sandbox: &dyn Sandbox, cwd: Option<&str>) -> Result<(), SandboxError> {
    let Some(cwd) = cwd else {
        return Ok(());
    };
    let path = super::resolve_path(cwd)?;
    match sandbox.stat(&path).await {
        Ok(st) if st.kind == super::FileKind::Dir => Ok(()),
        Ok(_) => Err(SandboxError::Conflict(format!(
            "the working directory {cwd:?} is not a directory"
        ))),
        Err(SandboxError::NotFound { .. }) => Err(SandboxError::NotFound {
            path: format!("{path} (the working directory)"),
        }),
        Err(e) => Err(e),
    }
}

/// Refuses what a process cannot be started with, saying why.
pub fn check_spec(spec: &ProcessSpec) -> Result<(), SandboxError> {
    let bad = |why: String| Err(SandboxError::InvalidRequest(why));
    if spec.argv.first().is_none_or(|c| c.is_empty()) {
        return bad("the command is empty".into());
    }
    let nul = |s: &String| s.contains('\0');
    if spec.argv.iter().any(nul) || spec.cwd.as_ref().is_some_and(nul) {
        return bad("the command or its working directory contains a NUL byte".into());
    }
    check_env(&spec.env)
}

/// Refuses an environment a process cannot be given (a process's, or a session's), saying
/// why: at most `MAX_ENV` variables, names `[A-Za-z_][A-Za-z0-9_]*` but not `SANDBOXD_TAG`,
/// values without NUL.
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), SandboxError> {
    let bad = |why: String| Err(SandboxError::InvalidRequest(why));
    if env.len() > MAX_ENV {
        return bad(format!(
            "{} environment variables; at most {MAX_ENV} are allowed",
            env.len()
        ));
    }
    for (k, v) in env {
        let name_ok = k
            .bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()));
        if k.is_empty() || !name_ok || v.contains('\0') {
            return bad(format!(
                "environment variable {k:?}: names match [A-Za-z_][A-Za-z0-9_]* and values have no NUL byte"
            ));
        }
        if k == "SANDBOXD_TAG" {
            return bad("SANDBOXD_TAG is sandboxd's own variable".into());
        }
        if k.len() + v.len() > MAX_ENV_ENTRY_BYTES {
            return bad(format!(
                "environment variable {k}: name and value are {} bytes; at most {MAX_ENV_ENTRY_BYTES} are allowed (put larger data in a file)",
                k.len() + v.len()
            ));
        }
    }
    let total: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if total > MAX_ENV_BYTES {
        return bad(format!(
            "the environment is {total} bytes; at most {MAX_ENV_BYTES} are allowed (put larger data in a file)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn an_environment_is_bounded_per_variable_and_in_all() {
        assert!(check_env(&env(&[("A", "x".repeat(30 * 1024))])).is_ok());
        let one = check_env(&env(&[("A", "x".repeat(MAX_ENV_ENTRY_BYTES))]));
        assert!(one.unwrap_err().to_string().contains("at most 32768"));
        let many: Vec<(String, String)> = (0..10)
            .map(|i| (format!("V{i}"), "x".repeat(30 * 1024)))
            .collect();
        let many: Vec<(&str, String)> = many.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let all = check_env(&env(&many));
        assert!(all.unwrap_err().to_string().contains("at most 262144"));
        assert!(check_env(&env(&[("BAD=", "x".into())])).is_err());
    }
}
