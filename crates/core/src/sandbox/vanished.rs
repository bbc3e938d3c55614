//! Sandboxes that end outside sandboxd's hands: a pod evicted, OOM-killed or deleted by
//! someone else, a container removed (`docker rm -f`), killed or OOM-killed behind the
//! service's back. A backend that can tell reports each one as it happens
//! (`Runtime::vanished`), so its session ends at once with the reason instead of being
//! noticed only when the next call into it fails.
//!
//! The manager follows those reports with one task (`SessionManager::spawn_vanish_watch`):
//! a report names a sandbox of a session this manager holds, whose sandbox then goes through
//! `destroy` (what is left of it is removed; a removal of a sandbox already gone is no error)
//! and whose end is announced once, as `EndReason::Vanished`. A report of a sandbox the
//! manager no longer holds (it ended it itself, or never held it) changes nothing. With
//! shared books (`SessionManager::share`) a session they no longer have live (another
//! replica hibernated or ended it, which removed its sandbox) is only forgotten here: no end
//! is announced and its records, which are shared, stay (`SharedSessions::vet_vanished`).
//!
//! A backend reports only what it did not do itself: `remove` marks the handle before it
//! asks (and unmarks it if the removal fails), and a report of a marked handle is dropped
//! (`OwnRemovals`).
//!
//! Every string here came from the engine or the cluster and is hostile: `VanishKind::evicted`
//! keeps at most `MESSAGE_MAX` characters, with control characters replaced by spaces.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast::{Receiver, Sender};
use tokio::sync::oneshot;

use super::ends::EndReason;
use super::manager::{SessionManager, lock};
use super::shared::VanishVerdict;

/// How many characters of a cluster's message a reason keeps.
pub const MESSAGE_MAX: usize = 160;

/// How a sandbox ended outside sandboxd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VanishKind {
    /// Deleted by someone else (`docker rm -f`, `kubectl delete pod`).
    Deleted,
    /// Evicted by the cluster (node pressure, preemption), with its message, cleaned.
    Evicted { message: String },
    /// Its main process was killed for running out of memory.
    OomKilled,
    /// Its main process exited (killed, or stopped) with this code.
    Exited { code: i64 },
}

impl VanishKind {
    /// An eviction, with the cluster's message cut and cleaned (see `clean`).
    pub fn evicted(message: &str) -> VanishKind {
        VanishKind::Evicted {
            message: clean(message),
        }
    }
}

/// At most `MESSAGE_MAX` characters of `raw`, control characters as spaces, invisible
/// format characters (bidi overrides and isolates, zero-width ones, the BOM) dropped, trimmed.
pub fn clean(raw: &str) -> String {
    raw.chars()
        .filter(|c| !invisible(*c))
        .take(MESSAGE_MAX)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

/// A format character that changes how the text around it reads without showing itself.
fn invisible(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

impl fmt::Display for VanishKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VanishKind::Deleted => f.write_str("its sandbox was removed outside sandboxd"),
            VanishKind::Evicted { message } if message.is_empty() => {
                f.write_str("its sandbox was evicted")
            }
            VanishKind::Evicted { message } => {
                write!(f, "its sandbox was evicted: {}", clean(message))
            }
            VanishKind::OomKilled => {
                f.write_str("its sandbox was killed for running out of memory")
            }
            VanishKind::Exited { code } => {
                write!(f, "its sandbox stopped outside sandboxd (exit code {code})")
            }
        }
    }
}

/// One sandbox that ended outside sandboxd, as its backend reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vanished {
    /// The backend's handle (what `Runtime::remove` takes).
    pub handle: String,
    /// The session id it recorded (empty when it recorded none of ours).
    pub session_id: String,
    pub kind: VanishKind,
}

/// How many reports a slow follower may fall behind by.
pub const REPORTS_BUFFERED: usize = 256;

/// A receiver that never reports: the seam's default for a backend that cannot tell.
pub fn never() -> tokio::sync::broadcast::Receiver<Vanished> {
    tokio::sync::broadcast::channel(1).1
}

/// A backend's reports and its one follower task: started by the first subscriber, stopped
/// when this is dropped (with the runtime). Outside a tokio runtime nothing is started and the
/// subscriber hears nothing (`never`).
#[derive(Default)]
pub struct Reports(Mutex<Option<(Sender<Vanished>, oneshot::Sender<()>)>>);

impl Reports {
    /// A new follower of the reports; the first one spawns `follow(sender, stop)`, which
    /// must return once `stop` resolves.
    pub fn subscribe<F>(
        &self,
        follow: impl FnOnce(Sender<Vanished>, oneshot::Receiver<()>) -> F,
    ) -> Receiver<Vanished>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut started = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((tx, _)) = started.as_ref() {
            return tx.subscribe();
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return never();
        };
        let (tx, rx) = tokio::sync::broadcast::channel(REPORTS_BUFFERED);
        let (stop_tx, stop_rx) = oneshot::channel();
        handle.spawn(follow(tx.clone(), stop_rx));
        *started = Some((tx, stop_tx));
        rx
    }
}

/// The handles a backend removed itself, so that their ends are not reported; and the
/// handles already reported, so that a sandbox is reported once (a container's `die` then
/// its `destroy`). Bounded: the oldest are forgotten first.
#[derive(Clone, Default)]
pub struct OwnRemovals(Arc<Mutex<(HashSet<String>, VecDeque<String>)>>);

/// How many handles `OwnRemovals` remembers.
const REMEMBERED: usize = 4096;

impl OwnRemovals {
    /// Marks `handle` as removed (or reported) now; true if it was not marked before.
    pub fn mark(&self, handle: &str) -> bool {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (set, order) = &mut *g;
        if !set.insert(handle.to_string()) {
            return false;
        }
        order.push_back(handle.to_string());
        while order.len() > REMEMBERED {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
        true
    }

    /// Forgets `handle`'s mark: a removal that failed (its end, later, is not ours), or a
    /// new sandbox under the same name.
    pub fn unmark(&self, handle: &str) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (set, order) = &mut *g;
        if set.remove(handle) {
            order.retain(|h| h != handle);
        }
    }

    /// Whether `handle` is marked.
    pub fn contains(&self, handle: &str) -> bool {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.0.contains(handle)
    }
}

impl SessionManager {
    /// Follows the runtime's reports of sandboxes that ended outside sandboxd and ends their
    /// sessions, until the runtime stops reporting (a backend that cannot tell: at once) or
    /// the manager is dropped. Holds the manager weakly; abort it at shutdown.
    pub fn spawn_vanish_watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let mut reports = self.runtime.vanished();
        tokio::spawn(async move {
            loop {
                let report = match reports.recv().await {
                    Ok(r) => r,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "reports of vanished sandboxes were missed");
                        continue;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let Some(manager) = weak.upgrade() else {
                    return;
                };
                manager.vanished(report).await;
            }
        })
    }

    /// Ends the session whose sandbox `report` names, if this manager holds it: exactly
    /// once, since only the caller that takes it out of the table announces its end. A
    /// warm sandbox that vanished leaves the pool (it was nobody's session).
    pub async fn vanished(&self, report: Vanished) -> bool {
        let (session, warm) = {
            let mut t = lock(&self.table);
            let id = t
                .sessions
                .values()
                .find(|s| s.handle == report.handle)
                .map(|s| s.id.clone());
            let session = id.and_then(|id| t.sessions.remove(&id));
            let warm = t
                .pool
                .iter()
                .position(|w| w.handle == report.handle)
                .and_then(|i| t.pool.remove(i));
            (session, warm)
        };
        if let Some(w) = warm {
            tracing::info!(handle = %w.handle, why = %report.kind, "a warm sandbox vanished");
            if let Err(e) = self.runtime.remove(&w.handle).await {
                tracing::warn!(handle = %w.handle, error = %e, "could not remove what is left of a vanished warm sandbox");
            }
            self.refill.notify_one();
        }
        let Some(s) = session else {
            return false;
        };
        let verdict = match self.shared.get() {
            Some(books) => books.vet_vanished(&s).await,
            None => VanishVerdict::End,
        };
        if verdict == VanishVerdict::Forget {
            // Another replica hibernated or ended it: what this one held is gone, its
            // records stay (`forget_held`).
            tracing::info!(session = %s.id, "a session's sandbox went with another replica's hibernation or end; forgotten here");
            return false;
        }
        tracing::info!(session = %s.id, why = %report.kind, "the session's sandbox ended outside sandboxd");
        let reason = EndReason::Vanished(report.kind);
        // Told as soon as it is an end (not for a session another replica hibernated or
        // ended, forgotten above): a caller that finds the session gone from now on can
        // also tell why (`end_of`), not only once the removal below announces it.
        self.recent_ends.note(&s.id, &reason);
        if let Err(e) = self.destroy(&s.id, &s.handle, reason.clone()).await {
            // What is left could not be removed (the backend is out of reach): the session
            // is over all the same, and the reconciler removes the rest later.
            tracing::warn!(session = %s.id, error = %e, "could not remove what is left of a vanished sandbox");
            self.announce_end(&s.id, reason, None).await;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_message_is_cut_and_has_no_control_characters() {
        let raw = format!("evil\n\u{1b}[31mred\r\t{}", "x".repeat(500));
        let VanishKind::Evicted { message } = VanishKind::evicted(&raw) else {
            panic!("not an eviction");
        };
        assert!(message.chars().count() <= MESSAGE_MAX);
        assert!(!message.chars().any(char::is_control), "{message:?}");
        assert!(message.starts_with("evil  [31mred"));
    }

    #[test]
    fn invisible_format_characters_are_dropped() {
        let raw = "a\u{202E}b\u{2066}c\u{2069}d\u{200B}e\u{200F}f\u{FEFF}g\u{202A}h";
        assert_eq!(clean(raw), "abcdefgh");
        let VanishKind::Evicted { message } = VanishKind::evicted("\u{FEFF} evil\u{202D} ") else {
            panic!("not an eviction");
        };
        assert_eq!(message, "evil");
    }

    #[test]
    fn each_kind_says_what_happened() {
        assert_eq!(
            VanishKind::Deleted.to_string(),
            "its sandbox was removed outside sandboxd"
        );
        assert_eq!(
            VanishKind::evicted("The node was low on resource: memory.").to_string(),
            "its sandbox was evicted: The node was low on resource: memory."
        );
        assert_eq!(
            VanishKind::OomKilled.to_string(),
            "its sandbox was killed for running out of memory"
        );
        assert_eq!(
            VanishKind::Exited { code: 137 }.to_string(),
            "its sandbox stopped outside sandboxd (exit code 137)"
        );
    }

    #[test]
    fn own_removals_are_marked_once_and_bounded() {
        let own = OwnRemovals::default();
        assert!(own.mark("a"));
        assert!(!own.mark("a"));
        assert!(own.contains("a"));
        for i in 0..REMEMBERED {
            own.mark(&i.to_string());
        }
        assert!(!own.contains("a"), "the oldest is forgotten first");
        own.unmark("0");
        assert!(!own.contains("0"));
        assert!(own.mark("0"), "marked again after an unmark");
    }
}
