//! Containers that end outside sandboxd (`Runtime::vanished`), from the engine's events API:
//! `die` and `destroy` of the containers labelled `sandboxd.managed=true`.
//!
//! One task per runtime follows the events, started by the first follower and stopped when
//! the runtime is dropped. A stream that drops (the engine restarted, a proxy timed out) is
//! logged and opened again after a backoff, from the time of the last event it saw, so
//! nothing in between is lost (what is seen twice is reported once).
//!
//! A `destroy` is a deletion. A `die` is looked at: a container being removed (or already
//! gone) was deleted (`docker rm -f` kills, then removes), one the kernel killed for memory is
//! `OomKilled`, any other stopped one `Exited` with its code. An `oom` event alone is not
//! an end: a process inside hit the limit, and the container may well live on. Containers
//! this runtime removed itself are never reported (`remove_container` marks them first).

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{ContainerStateStatusEnum, EventMessage};
use bollard::query_parameters::EventsOptionsBuilder;
use futures::StreamExt;
use sandboxd_core::sandbox::runtime::meta_key;
use sandboxd_core::sandbox::vanished::{OwnRemovals, Reports, VanishKind, Vanished};
use tokio::sync::{broadcast, oneshot};

use crate::labels;

/// The first wait before the events stream is opened again; doubled up to `BACKOFF_MAX`.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The runtime's follower of the engine's events.
#[derive(Default)]
pub(crate) struct Watch {
    /// The containers this runtime removed: never reported.
    pub(crate) own: OwnRemovals,
    /// The reports and the task (stopped when the runtime is dropped), once started.
    reports: Reports,
}

impl Watch {
    /// A new follower of the reports; the first one starts the task.
    pub(crate) fn subscribe(&self, docker: &Docker) -> broadcast::Receiver<Vanished> {
        self.reports.subscribe(|tx, stop| {
            Follower {
                docker: docker.clone(),
                tx,
                own: self.own.clone(),
                reported: OwnRemovals::default(),
            }
            .run(stop)
        })
    }
}

struct Follower {
    docker: Docker,
    tx: broadcast::Sender<Vanished>,
    own: OwnRemovals,
    /// Containers already reported (a `die` then its `destroy`; events seen twice).
    reported: OwnRemovals,
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

impl Follower {
    async fn run(self, mut stop: oneshot::Receiver<()>) {
        let filters = HashMap::from([
            ("type", vec!["container".to_string()]),
            ("event", vec!["die".to_string(), "destroy".to_string()]),
            ("label", vec![labels::filter(meta_key::MANAGED, "true")]),
        ]);
        let mut since = now_secs();
        let mut backoff = BACKOFF_MIN;
        loop {
            let options = EventsOptionsBuilder::new()
                .since(&since.to_string())
                .filters(&filters)
                .build();
            let mut events = self.docker.events(Some(options));
            loop {
                let next = tokio::select! {
                    n = events.next() => n,
                    _ = &mut stop => return,
                };
                match next {
                    Some(Ok(event)) => {
                        backoff = BACKOFF_MIN;
                        since = since.max(event.time.unwrap_or(since));
                        self.on_event(event).await;
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "the engine's events stream failed; opening it again");
                        break;
                    }
                    None => {
                        tracing::warn!("the engine's events stream ended; opening it again");
                        break;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = &mut stop => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    async fn on_event(&self, event: EventMessage) {
        let Some(actor) = event.actor else {
            return;
        };
        let Some(handle) = actor.id.filter(|id| plausible_container_id(id)) else {
            return;
        };
        if self.own.contains(&handle) || self.reported.contains(&handle) {
            return;
        }
        let attributes = actor.attributes.unwrap_or_default();
        let kind = match event.action.as_deref() {
            Some("destroy") => VanishKind::Deleted,
            Some("die") => match self.died(&handle, &attributes).await {
                Some(kind) => kind,
                None => return,
            },
            _ => return,
        };
        // Looked at again: the inspection above took a round trip, during which this
        // runtime may have begun to remove it.
        if self.own.contains(&handle) || !self.reported.mark(&handle) {
            return;
        }
        let session_id = labels::decode(&attributes).session_id;
        // No follower is not an error.
        let _ = self.tx.send(Vanished {
            handle,
            session_id,
            kind,
        });
    }

    /// What a `die` means: None when the container still runs (a restart policy, which
    /// ours never have, or a stale event).
    async fn died(&self, handle: &str, attributes: &HashMap<String, String>) -> Option<VanishKind> {
        let from_event = || VanishKind::Exited {
            code: attributes
                .get("exitCode")
                .and_then(|c| c.parse().ok())
                .unwrap_or(-1),
        };
        let inspected = match self.docker.inspect_container(handle, None).await {
            Ok(i) => i,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Some(VanishKind::Deleted),
            Err(e) => {
                tracing::warn!(container = %handle, error = %e, "cannot inspect a container that stopped");
                return Some(from_event());
            }
        };
        let state = inspected.state.unwrap_or_default();
        Some(match state.status {
            Some(ContainerStateStatusEnum::REMOVING) | Some(ContainerStateStatusEnum::DEAD) => {
                VanishKind::Deleted
            }
            Some(ContainerStateStatusEnum::RUNNING)
            | Some(ContainerStateStatusEnum::RESTARTING) => {
                return None;
            }
            _ if state.oom_killed == Some(true) => VanishKind::OomKilled,
            _ => match state.exit_code {
                Some(code) => VanishKind::Exited { code },
                None => from_event(),
            },
        })
    }
}

/// A container id as the engine writes it (64 hex digits): anything else is not looked up.
fn plausible_container_id(id: &str) -> bool {
    (12..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_container_ids_are_looked_up() {
        assert!(plausible_container_id(&"ab".repeat(32)));
        assert!(!plausible_container_id("../../etc"));
        assert!(!plausible_container_id("abc"));
    }
}
