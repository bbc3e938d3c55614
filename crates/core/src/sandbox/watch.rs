//! A call that watches its sandbox: some runtimes keep an attached process open after the
//! whole sandbox died (gVisor's runsc, whose kernel is the process the host's out-of-memory
//! killer takes), so a call waiting on that process alone would wait for its timeout.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;

use super::{Sandbox, SandboxError};

/// How often a call that is still waiting checks that its sandbox runs: one cheap query of
/// the backend a second, and only for calls that last that long.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// How many looks in a row must find the sandbox stopped. `check_alive` counts only the
/// backend's definite answer, not a failed query; two looks also let a backend that reports a
/// dying sandbox for a moment settle.
const MISSES: u32 = 2;

/// Runs `call`; if the sandbox is found stopped while it waits (`MISSES` looks in a row), the
/// call is dropped and the answer is `Sandbox::check_alive`'s error (gone, with the backend's
/// reason). The caller must then forget every channel the call used (it may have been dropped
/// in the middle of a frame or a command); `ExecSandbox::watched` does.
pub async fn while_alive<T, E>(
    sandbox: &dyn Sandbox,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, E>
where
    E: From<SandboxError>,
{
    tokio::pin!(call);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + WATCH_EVERY, WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The look runs beside the call, never instead of it: a slow engine must not hold up
    // output the call is streaming, or an answer that is already there.
    let mut look: Option<BoxFuture<'_, Result<(), SandboxError>>> = None;
    let mut misses = 0;
    loop {
        tokio::select! {
            r = &mut call => return r,
            _ = tick.tick(), if look.is_none() => look = Some(sandbox.check_alive()),
            seen = async {
                match look.as_mut() {
                    Some(f) => f.await,
                    None => std::future::pending().await,
                }
            }, if look.is_some() => {
                look = None;
                match seen {
                    Ok(()) => misses = 0,
                    Err(gone) => {
                        misses += 1;
                        if misses >= MISSES {
                            return Err(gone.into());
                        }
                    }
                }
            }
        }
    }
}
