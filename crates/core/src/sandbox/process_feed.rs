//! One process of a `ProcessTable` and its output: `Proc` keeps the last `REPLAY_BYTES` for
//! late subscribers and broadcasts each piece to live ones; `pump` feeds it from the
//! sandbox; a `Subscription` reads the replay, then the live feed, with no piece between the
//! two lost or repeated (both are taken under the state lock).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use tokio::io::AsyncWrite;
use tokio::sync::broadcast;

use super::processes::{ProcessEvent, ProcessExit, ProcessSpec, ProcessTable, REPLAY_BYTES};
use super::{OutputChunk, SandboxError};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a few pushes; a panic cannot leave half a state.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) struct Proc {
    pub(super) pid: u32,
    pub(super) spec: ProcessSpec,
    pub(super) kill_tag: String,
    pub(super) state: Mutex<ProcState>,
    pub(super) events: broadcast::Sender<ProcessEvent>,
    pub(super) stdin: tokio::sync::Mutex<Option<Pin<Box<dyn AsyncWrite + Send>>>>,
}

#[derive(Default)]
pub(super) struct ProcState {
    pub(super) log: VecDeque<ProcessEvent>,
    pub(super) log_bytes: usize,
    pub(super) dropped: u64,
    pub(super) exit: Option<ProcessExit>,
    pub(super) signaled: bool,
}

/// What a subscriber gets: the replay, then the live events.
pub struct Subscription {
    pub pid: u32,
    replay: VecDeque<ProcessEvent>,
    live: Option<broadcast::Receiver<ProcessEvent>>,
}

impl Subscription {
    /// The next event; None after `Exit` (or when the table went away).
    pub async fn next(&mut self) -> Option<ProcessEvent> {
        if let Some(e) = self.replay.pop_front() {
            if matches!(e, ProcessEvent::Exit(_)) {
                self.live = None;
            }
            return Some(e);
        }
        let live = self.live.as_mut()?;
        match live.recv().await {
            Ok(e) => {
                if matches!(e, ProcessEvent::Exit(_)) {
                    self.live = None;
                }
                Some(e)
            }
            Err(broadcast::error::RecvError::Lagged(n)) => Some(ProcessEvent::Missed(n)),
            Err(broadcast::error::RecvError::Closed) => {
                self.live = None;
                None
            }
        }
    }
}

/// Feeds a process's output to its subscribers until it ends, then its exit, and takes it out
/// of the table.
pub(super) async fn pump(
    proc: Arc<Proc>,
    mut output: futures::stream::BoxStream<'static, Result<OutputChunk, SandboxError>>,
    exit_code: super::ExitProbe,
    table: std::sync::Weak<ProcessTable>,
) {
    while let Some(chunk) = output.next().await {
        match chunk {
            Ok(OutputChunk::Stdout(b)) => proc.push(ProcessEvent::Stdout(b)),
            Ok(OutputChunk::Stderr(b)) => proc.push(ProcessEvent::Stderr(b)),
            Err(_) => break,
        }
    }
    drop(output);
    let code = exit_code().await;
    let signaled = lock(&proc.state).signaled;
    proc.push(ProcessEvent::Exit(ProcessExit { code, signaled }));
    *proc.stdin.lock().await = None;
    if let Some(table) = table.upgrade() {
        table.forget(proc.pid);
    }
}

impl Proc {
    pub(super) fn subscribe(&self) -> Subscription {
        // Under the state lock, so no event falls between the replay and the live feed.
        let state = lock(&self.state);
        let mut replay = state.log.clone();
        if state.dropped > 0 {
            replay.push_front(ProcessEvent::Missed(state.dropped));
        }
        let live = state.exit.is_none().then(|| self.events.subscribe());
        Subscription {
            pid: self.pid,
            replay,
            live,
        }
    }

    pub(super) fn push(&self, e: ProcessEvent) {
        let mut state = lock(&self.state);
        let size = match &e {
            ProcessEvent::Stdout(b) | ProcessEvent::Stderr(b) => b.len(),
            _ => 0,
        };
        if let ProcessEvent::Exit(x) = &e {
            state.exit = Some(*x);
        }
        state.log.push_back(e.clone());
        state.log_bytes += size;
        while state.log_bytes > REPLAY_BYTES {
            match state.log.pop_front() {
                Some(ProcessEvent::Stdout(b) | ProcessEvent::Stderr(b)) => {
                    state.log_bytes -= b.len();
                    state.dropped += b.len() as u64;
                }
                Some(_) => {}
                None => break,
            }
        }
        // No receiver is fine: the log keeps it for the next subscriber.
        let _ = self.events.send(e);
    }
}
