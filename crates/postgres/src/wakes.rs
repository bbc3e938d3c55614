//! Wake-ups about runs across replicas: an event's append sends `NOTIFY sandboxd_runs,
//! '<run id>'` inside its transaction (Postgres delivers it at COMMIT, only if it commits), and
//! each store keeps one listener connection of its own (not from the pool: a pooled connection
//! is handed to other work and recycled) doing `LISTEN sandboxd_runs` and forwarding every
//! notification into the process's `RunWakes`.
//!
//! NOTIFY is only a hint: notifications sent while the listener is disconnected are lost, and
//! a payload is limited to under 8000 bytes (so it carries the run id, never the event). On
//! every (re)connect the listener sends `WAKE_ALL` once LISTEN is in place, so waiters re-read
//! what they may have missed; a dead connection is found by a periodic check, not hours later
//! by TCP keepalive; reconnects back off. The task holds no handle of the store: it stops
//! when the store (which holds the other end of `stop`) is dropped.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio_postgres::{AsyncMessage, Config, NoTls};

use crate::chain;
use sandboxd_core::store::{RunWakes, WAKE_ALL};

/// The channel of run wake-ups (per database: replicas of another database never hear it).
pub(crate) const CHANNEL: &str = "sandboxd_runs";
/// The listener connection's `application_name` (pg_stat_activity).
pub const APPLICATION_NAME: &str = "sandboxd-wakes";
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often the listener proves its connection alive, and how long the proof may take.
const CHECK_EVERY: Duration = Duration::from_secs(10);
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts the listener on its own task: dropping the first returned value stops it, the
/// second resolves once LISTEN is first in place.
pub(crate) fn spawn(
    mut config: Config,
    wakes: RunWakes,
) -> (oneshot::Sender<()>, oneshot::Receiver<()>) {
    // Named, so an operator (and a test) can tell it from the pool's connections.
    config.application_name(APPLICATION_NAME);
    let (stop_tx, stop) = oneshot::channel();
    let (ready, ready_rx) = oneshot::channel();
    tokio::spawn(listen(config, wakes, stop, ready));
    (stop_tx, ready_rx)
}

async fn listen(
    config: Config,
    wakes: RunWakes,
    mut stop: oneshot::Receiver<()>,
    ready: oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut backoff = BACKOFF_MIN;
    loop {
        let (listened, why) = tokio::select! {
            _ = &mut stop => return,
            ended = session(&config, &wakes, &mut ready) => ended,
        };
        if listened {
            backoff = BACKOFF_MIN;
        }
        tracing::warn!(error = %why, retry_in_ms = backoff.as_millis() as u64,
            "the store's run wake-up listener lost its connection; reconnecting (followers re-read meanwhile)");
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One connection's life: connect, LISTEN, `WAKE_ALL`, then forward notifications until the
/// connection fails. Returns whether LISTEN was in place, and why it ended.
async fn session(
    config: &Config,
    wakes: &RunWakes,
    ready: &mut Option<oneshot::Sender<()>>,
) -> (bool, String) {
    let (client, mut connection) = match config.connect(NoTls).await {
        Ok(c) => c,
        Err(e) => return (false, chain(&e)),
    };
    // The connection must be polled for the client's queries to be answered; notifications
    // come out of the same poll.
    let forward = wakes.clone();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => forward.send(n.payload()),
                Some(Ok(_)) => {}
                Some(Err(e)) => return chain(&e),
                None => return "the server closed the connection".to_string(),
            }
        }
    });
    let mut driver = AbortOnDrop(driver);
    if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
        return (false, chain(&e));
    }
    // Anything committed before LISTEN took effect was not heard: re-read everything.
    wakes.send(WAKE_ALL);
    if let Some(tx) = ready.take() {
        let _ = tx.send(());
    }
    let mut check = tokio::time::interval(CHECK_EVERY);
    check.tick().await;
    loop {
        tokio::select! {
            ended = &mut driver.0 => {
                return (true, ended.unwrap_or_else(|e| e.to_string()));
            }
            _ = check.tick() => {
                match tokio::time::timeout(CHECK_TIMEOUT, client.simple_query("SELECT 1")).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return (true, chain(&e)),
                    Err(_) => return (true, format!("no answer to a check within {CHECK_TIMEOUT:?}")),
                }
            }
        }
    }
}

/// Ends the connection's task with the session that made it.
struct AbortOnDrop(tokio::task::JoinHandle<String>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
