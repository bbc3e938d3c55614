//! Wake-ups about runs: the hint every store sends after a run's event commits (and when
//! asked to, `Store::wake_run`), so a waiter on any replica reads the store again at once
//! instead of on its next timeout.
//!
//! A wake-up is only a hint and may be lost: the events table is the truth. A receiver that
//! lags behind the bounded channel (tokio's `Lagged`), or a store whose listener reconnected
//! (it sends `WAKE_ALL`), must re-read everything it waits on; and every waiter re-reads on
//! a timeout too, since a notification sent while a listener was disconnected never arrives.
//! `wait_for_run` folds those cases into one answer.
//!
//! Two kinds: an event's commit sends the run's id; `Store::wake_run` (a cancel requested, an
//! answer posted: the row changed without an event) sends `control_wake(id)`, the id behind
//! `CONTROL`. Waiters on a run take either; a run's driver re-reads its control state only on
//! the second, not after every event it commits itself (a read per event on Postgres).

use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};

/// The wake-up that means "re-read everything": sent after a store's listener (re)connects.
pub const WAKE_ALL: &str = "*";

/// Wake-ups a receiver may be behind before it lags (and then re-reads everything).
const CAPACITY: usize = 1024;

/// What starts a control wake-up's payload (a run id never does: ids are `run-…`).
const CONTROL: char = '!';

/// The payload of a control wake-up about `run_id` (`Store::wake_run` sends it).
pub fn control_wake(run_id: &str) -> String {
    format!("{CONTROL}{run_id}")
}

/// A wake-up as received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake<'a> {
    /// Re-read everything (`WAKE_ALL`).
    All,
    /// An event of this run committed.
    Event(&'a str),
    /// This run's row changed without an event (a cancel request, an answer).
    Control(&'a str),
}

impl<'a> Wake<'a> {
    pub fn parse(payload: &'a str) -> Self {
        if payload == WAKE_ALL {
            Wake::All
        } else if let Some(id) = payload.strip_prefix(CONTROL) {
            Wake::Control(id)
        } else {
            Wake::Event(payload)
        }
    }

    /// Whether a waiter on `run_id` must read again: any wake-up about it, or `All`.
    pub fn concerns(self, run_id: &str) -> bool {
        match self {
            Wake::All => true,
            Wake::Event(id) | Wake::Control(id) => id == run_id,
        }
    }
}

/// The in-process end of a store's wake-ups: what the store sends (after a commit, or what its
/// listener forwards) reaches every receiver of this process. Cloning shares the channel.
#[derive(Clone)]
pub struct RunWakes {
    tx: broadcast::Sender<String>,
}

impl Default for RunWakes {
    fn default() -> Self {
        Self::new()
    }
}

impl RunWakes {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(CAPACITY);
        Self { tx }
    }

    /// A receiver of every wake-up sent from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        self.tx.subscribe()
    }

    /// Wakes the waiters on a run (`payload` its id, or `control_wake` of it), or every
    /// waiter (`WAKE_ALL`), in this process.
    pub fn send(&self, payload: &str) {
        // Nobody waiting is not an error.
        let _ = self.tx.send(payload.to_string());
    }
}

/// Why `wait_for_run` returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// A wake-up for the run, `WAKE_ALL`, or a lag: read the store again now.
    Run,
    /// Nothing for the run within the timeout: read again anyway (a wake-up may be lost).
    Timeout,
}

/// Waits for a wake-up about `run_id` on `rx`, at most `within`. Other runs' wake-ups are
/// skipped. A lag counts as a wake-up (what was missed is unknown); a closed channel waits
/// out the timeout (the caller's re-read is then the only way to learn anything).
pub async fn wait_for_run(
    rx: &mut broadcast::Receiver<String>,
    run_id: &str,
    within: Duration,
) -> Woken {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Err(_) => return Woken::Timeout,
            Ok(Ok(id)) if Wake::parse(&id).concerns(run_id) => return Woken::Run,
            Ok(Ok(_)) => {}
            Ok(Err(RecvError::Lagged(_))) => return Woken::Run,
            Ok(Err(RecvError::Closed)) => {
                tokio::time::sleep_until(deadline).await;
                return Woken::Timeout;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_waiter_wakes_for_its_run_for_all_and_on_a_lag_and_times_out_otherwise() {
        let wakes = RunWakes::new();
        let mut rx = wakes.subscribe();
        let t = Duration::from_secs(1);
        wakes.send("run-b");
        wakes.send("run-a");
        assert_eq!(wait_for_run(&mut rx, "run-a", t).await, Woken::Run);
        let start = tokio::time::Instant::now();
        wakes.send("run-b");
        assert_eq!(wait_for_run(&mut rx, "run-a", t).await, Woken::Timeout);
        assert_eq!(start.elapsed(), t, "another run's wake-up is skipped");
        wakes.send(WAKE_ALL);
        assert_eq!(wait_for_run(&mut rx, "run-a", t).await, Woken::Run);
        wakes.send(&control_wake("run-b"));
        wakes.send(&control_wake("run-a"));
        assert_eq!(
            wait_for_run(&mut rx, "run-a", t).await,
            Woken::Run,
            "a control wake-up about the run counts"
        );
        assert_eq!(Wake::parse(&control_wake("run-a")), Wake::Control("run-a"));
        assert_eq!(Wake::parse("run-a"), Wake::Event("run-a"));
        assert_eq!(Wake::parse(WAKE_ALL), Wake::All);
        for _ in 0..CAPACITY + 1 {
            wakes.send("run-b");
        }
        assert_eq!(wait_for_run(&mut rx, "run-a", t).await, Woken::Run, "lag");
        drop(wakes);
        let start = tokio::time::Instant::now();
        assert_eq!(wait_for_run(&mut rx, "run-a", t).await, Woken::Timeout);
        assert_eq!(start.elapsed(), t, "a closed channel waits out the timeout");
    }
}
