//! The signals that ask a command to stop: SIGINT (Ctrl-C), SIGTERM (what `timeout`,
//! systemd, CI runners and supervisors send) and SIGHUP (the terminal went away). A command
//! that holds a session listens for all three from its start, so each of them cleans up as
//! Ctrl-C does instead of killing the process and leaving the container behind.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// Which stop signal arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopSignal {
    Interrupt,
    Terminate,
    Hangup,
}

impl StopSignal {
    /// The conventional exit status of a process ended by this signal (128 + its number).
    pub(crate) fn exit_status(self) -> u8 {
        match self {
            StopSignal::Interrupt => 130,
            StopSignal::Terminate => 143,
            StopSignal::Hangup => 129,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            StopSignal::Interrupt => "SIGINT",
            StopSignal::Terminate => "SIGTERM",
            StopSignal::Hangup => "SIGHUP",
        }
    }
}

/// Listens for the stop signals from the moment it is made: one that arrives while the
/// command is still setting up is kept and returned by the next `recv`.
pub(crate) struct StopSignals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl StopSignals {
    pub(crate) fn listen() -> std::io::Result<StopSignals> {
        Ok(StopSignals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next stop signal.
    pub(crate) async fn recv(&mut self) -> StopSignal {
        tokio::select! {
            Some(()) = self.int.recv() => StopSignal::Interrupt,
            Some(()) = self.term.recv() => StopSignal::Terminate,
            Some(()) = self.hup.recv() => StopSignal::Hangup,
            // The streams never end while the process runs; if they did, nothing can arrive.
            else => std::future::pending().await,
        }
    }
}
