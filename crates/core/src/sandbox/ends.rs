//! Why a session ended, as the manager tells it: every sandbox the manager destroys (and
//! every one a caller reports gone) is announced once on its end events, with the reason.
//!
//! The reason is for people: serve writes its text into the session's row (`end_reason`),
//! so an API client reads "idle for more than 60 s" where the manager's reaper took the
//! session. The text names no backend and quotes nothing a client or a sandbox wrote.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

/// Why the manager ended a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndReason {
    /// Unused for longer than its idle timeout (the one reaper, `reap_idle`).
    Idle(Duration),
    /// Removed to bring the host back under its memory budget.
    MemoryBudget,
    /// Removed by a caller: closed, deleted, its owner removed, or shut down.
    Removed,
    /// An orphan the reconciler removed: its creator is gone, or it stopped.
    Orphan,
    /// Its sandbox was found gone (`SessionManager::session_ended`).
    Gone,
    /// Its sandbox ended outside sandboxd, as the backend reported it (vanished.rs): the
    /// text says how ("its sandbox was evicted: …").
    Vanished(super::vanished::VanishKind),
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndReason::Idle(timeout) => write!(f, "idle for more than {} s", timeout.as_secs()),
            EndReason::MemoryBudget => {
                f.write_str("removed to keep the host within its memory budget")
            }
            EndReason::Removed => f.write_str("its sandbox was removed"),
            EndReason::Orphan => {
                f.write_str("its sandbox was an orphan (its creator is gone, or it stopped)")
            }
            EndReason::Gone => f.write_str("its sandbox is gone"),
            EndReason::Vanished(kind) => kind.fmt(f),
        }
    }
}

/// One session's end: the manager's session id and why, and the last reading of its
/// sandbox's cgroup taken just before the manager removed it on its own (idle, memory
/// budget, orphan), which usage metering adds as the session's final sample. None: the
/// backend could not tell, the sandbox was already gone, or a caller asked for the removal
/// (`Removed`: that caller reads it first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub id: String,
    pub reason: EndReason,
    pub reading: Option<crate::store::Reading>,
}

/// How many ends `RecentEnds` remembers.
const REMEMBERED: usize = 1024;

/// The last ends a manager announced, so that whoever held a session can tell why it is
/// gone when it next reaches for it (an MCP client's next call after its sandbox vanished
/// says so instead of silently starting anew). Bounded: the oldest are forgotten first.
#[derive(Default)]
pub struct RecentEnds(Mutex<VecDeque<(String, EndReason)>>);

impl RecentEnds {
    /// Remembers that session `id` ended, and why.
    pub fn note(&self, id: &str, reason: &EndReason) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.push_back((id.to_string(), reason.clone()));
        while g.len() > REMEMBERED {
            g.pop_front();
        }
    }

    /// Why session `id` ended, if it did lately.
    pub fn of(&self, id: &str) -> Option<EndReason> {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.iter()
            .rev()
            .find(|(i, _)| i == id)
            .map(|(_, r)| r.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_end_says_the_sessions_own_timeout_in_whole_seconds() {
        assert_eq!(
            EndReason::Idle(Duration::from_millis(1_500)).to_string(),
            "idle for more than 1 s"
        );
        assert_eq!(
            EndReason::Idle(Duration::from_secs(600)).to_string(),
            "idle for more than 600 s"
        );
    }

    #[test]
    fn recent_ends_say_why_a_session_went_and_forget_the_oldest() {
        let ends = RecentEnds::default();
        ends.note("a", &EndReason::MemoryBudget);
        ends.note("a", &EndReason::Gone);
        assert_eq!(ends.of("a"), Some(EndReason::Gone), "the latest end counts");
        assert_eq!(ends.of("b"), None);
        for i in 0..REMEMBERED {
            ends.note(&i.to_string(), &EndReason::Removed);
        }
        assert_eq!(ends.of("a"), None, "forgotten after REMEMBERED newer ends");
        assert_eq!(ends.of("0"), Some(EndReason::Removed));
    }
}
