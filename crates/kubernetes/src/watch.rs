//! Pods that end outside sandboxd (`Runtime::vanished`), from a watch on the sandbox pods
//! (the managed label selector): one evicted (`status.reason == "Evicted"`), one whose
//! container was OOM-killed, one that stopped, and one deleted by someone else (its
//! `deletionTimestamp` set, or its DELETED event) are reported once each, by uid: a resumed
//! session's new pod has the old one's name. Pods this runtime deletes itself are never
//! reported (`remove_pod` marks their name and uid first; a new pod under a marked name is
//! unmarked when it is created).
//!
//! A plain list then watch, from the list's resourceVersion, with bookmarks; a watch that
//! times out goes on from the last resourceVersion seen, one the API server no longer has
//! (410 Gone) lists again, and a failure is logged and retried after a backoff (also a 410
//! or a watch that delivered nothing, so an API server that ends watches at once is not
//! asked in a busy loop). A pod that
//! was known before a new list and is missing from it was deleted meanwhile. One task per
//! runtime, started by the first follower and stopped when the runtime is dropped.
//!
//! What a pod is reported as is the runtime's say (`Resolve`): in pods mode the pod's name
//! and the session its labels record; in agent-sandbox mode the handle `<claim>/<pod>` and
//! the session of the claim this process bound the pod to (agent_sandbox/vanish.rs), and
//! nothing for a pod bound to no session of its own (a warm one). It is asked when the end is
//! reported, not when the pod was first seen: a warm pod is claimed after the watch saw it.
//!
//! Every string from the cluster is hostile: an eviction's message goes through
//! `VanishKind::evicted`, which cuts it and strips control characters.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use sandboxd_core::sandbox::runtime::meta_key;
use sandboxd_core::sandbox::vanished::{OwnRemovals, Reports, VanishKind, Vanished};
use tokio::sync::{broadcast, oneshot};

use crate::meta;

/// The first wait before a failed watch is opened again; doubled up to `BACKOFF_MAX`.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long one watch request lasts before the API server ends it (and it is opened again).
const WATCH_SECS: u32 = 290;

/// What an ended pod is reported as: its handle and session id, or None when it is no
/// session's sandbox this runtime answers for (not reported).
pub(crate) type Resolve = Arc<dyn Fn(&Pod) -> Option<(String, String)> + Send + Sync>;

/// Pods mode's `Resolve`: the pod's name, and the session its labels record.
pub(crate) fn by_labels() -> Resolve {
    Arc::new(|pod: &Pod| Some((name_of(pod), session_of(pod))))
}

/// The runtime's watch of its pods.
#[derive(Default)]
pub(crate) struct Watch {
    /// The pods this runtime deleted: never reported.
    pub(crate) own: OwnRemovals,
    /// The reports and the task (stopped when the runtime is dropped), once started.
    reports: Reports,
}

impl Watch {
    /// A new follower of the reports; the first one starts the task.
    pub(crate) fn subscribe(
        &self,
        pods: Api<Pod>,
        resolve: Resolve,
    ) -> broadcast::Receiver<Vanished> {
        self.reports.subscribe(|tx, stop| {
            Follower {
                pods,
                selector: meta::selector(None),
                resolve,
                tx,
                own: self.own.clone(),
                reported: OwnRemovals::default(),
                known: HashMap::new(),
                delivered: false,
            }
            .run(stop)
        })
    }
}

struct Follower {
    pods: Api<Pod>,
    selector: String,
    resolve: Resolve,
    tx: broadcast::Sender<Vanished>,
    own: OwnRemovals,
    /// Pods already reported (an eviction, then the deletion), by uid.
    reported: OwnRemovals,
    /// The pods seen, by uid (their name if they have none): their metadata, what `resolve`
    /// reads when one of them is gone.
    known: HashMap<String, Pod>,
    /// Whether a watch of this round delivered an event.
    delivered: bool,
}

impl Follower {
    async fn run(mut self, mut stop: oneshot::Receiver<()>) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let round = tokio::select! {
                r = self.round() => r,
                _ = &mut stop => return,
            };
            if std::mem::take(&mut self.delivered) {
                backoff = BACKOFF_MIN;
                // 410 after events: the resourceVersion is too old; list again at once.
                if round.is_ok() {
                    continue;
                }
            }
            if let Err(e) = round {
                tracing::warn!(error = %e, "the watch of the sandbox pods failed; watching again");
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = &mut stop => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One list, then watches from its resourceVersion until the API server no longer has
    /// that version (Ok) or something fails (Err).
    async fn round(&mut self) -> Result<(), kube::Error> {
        let list = self
            .pods
            .list(&ListParams::default().labels(&self.selector))
            .await?;
        let listed: HashSet<String> = list.items.iter().map(key_of).collect();
        let gone: Vec<String> = self
            .known
            .keys()
            .filter(|key| !listed.contains(*key))
            .cloned()
            .collect();
        for key in gone {
            if let Some(pod) = self.known.remove(&key) {
                self.report(&key, &pod, VanishKind::Deleted);
            }
        }
        for pod in &list.items {
            self.seen(pod);
        }
        let mut version = list.metadata.resource_version.unwrap_or_default();
        loop {
            let wp = WatchParams::default()
                .labels(&self.selector)
                .timeout(WATCH_SECS);
            let mut events = Box::pin(self.pods.watch(&wp, &version).await?);
            let mut any = false;
            while let Some(event) = events.try_next().await? {
                match event {
                    WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                        version = pod.metadata.resource_version.clone().unwrap_or(version);
                        self.seen(&pod);
                    }
                    WatchEvent::Deleted(pod) => {
                        version = pod.metadata.resource_version.clone().unwrap_or(version);
                        let key = key_of(&pod);
                        self.known.remove(&key);
                        self.report(&key, &pod, VanishKind::Deleted);
                    }
                    WatchEvent::Bookmark(b) => version = b.metadata.resource_version,
                    WatchEvent::Error(status) if status.code == 410 => return Ok(()),
                    WatchEvent::Error(status) => return Err(kube::Error::Api(status)),
                }
                // An event (an error is none: a watch answering 410 at once is not progress).
                any = true;
                self.delivered = true;
            }
            // Ended with nothing: not opened again at once (the round is cancelled on stop).
            if !any {
                tokio::time::sleep(BACKOFF_MIN).await;
            }
        }
    }

    /// A pod as it is now: known, and reported if it ended.
    fn seen(&mut self, pod: &Pod) {
        let key = key_of(pod);
        self.known.insert(key.clone(), remembered(pod));
        if let Some(kind) = ended(pod) {
            self.report(&key, pod, kind);
        }
    }

    /// Reports the end of the pod `key` (its uid) as what `resolve` says it is, unless this
    /// runtime deleted it, it is none of its sessions', or it was reported before.
    fn report(&self, key: &str, pod: &Pod, kind: VanishKind) {
        let Some((handle, session_id)) = (self.resolve)(pod) else {
            return;
        };
        let own = self.own.contains(&handle) || self.own.contains(key);
        if handle.is_empty() || own || !self.reported.mark(key) {
            return;
        }
        // No follower is not an error.
        let _ = self.tx.send(Vanished {
            handle,
            session_id,
            kind,
        });
    }
}

fn name_of(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// What tells one pod from another of the same name (a resumed session's): its uid, or its
/// name if it has none.
fn key_of(pod: &Pod) -> String {
    match pod.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid_key(uid),
        _ => name_of(pod),
    }
}

/// A pod's uid as the watch keys it (apart from names).
pub(crate) fn uid_key(uid: &str) -> String {
    format!("uid:{uid}")
}

/// What a seen pod is remembered as until it is gone: its name, uid, sandboxd's labels and
/// the session annotation, what `Resolve` reads; nothing else of its metadata (managed
/// fields, others' annotations) is kept for every pod the watch sees.
fn remembered(pod: &Pod) -> Pod {
    let m = &pod.metadata;
    let labels = m.labels.as_ref().map(|l| {
        l.iter()
            .filter(|(k, _)| k.starts_with(meta::PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    });
    let session = meta::name(meta_key::SESSION);
    let annotations = m.annotations.as_ref().map(|a| {
        a.iter()
            .filter(|(k, _)| **k == session)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    });
    Pod {
        metadata: ObjectMeta {
            name: m.name.clone(),
            uid: m.uid.clone(),
            labels,
            annotations,
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

fn session_of(pod: &Pod) -> String {
    meta::decode(
        pod.metadata.labels.as_ref().unwrap_or(&Default::default()),
        pod.metadata
            .annotations
            .as_ref()
            .unwrap_or(&Default::default()),
    )
    .session_id
}

/// How a pod ended, if it did: evicted, deleted (its deletion begun), its container
/// OOM-killed, or stopped; None while it starts or runs.
pub(crate) fn ended(pod: &Pod) -> Option<VanishKind> {
    let status = pod.status.as_ref();
    if let Some(s) = status
        && s.reason.as_deref() == Some("Evicted")
    {
        return Some(VanishKind::evicted(s.message.as_deref().unwrap_or("")));
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Some(VanishKind::Deleted);
    }
    let terminated = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find_map(|c| c.state.as_ref()?.terminated.clone()));
    if let Some(t) = &terminated
        && t.reason.as_deref() == Some("OOMKilled")
    {
        return Some(VanishKind::OomKilled);
    }
    let phase = status.and_then(|s| s.phase.as_deref());
    if terminated.is_some() || matches!(phase, Some("Succeeded" | "Failed")) {
        return Some(VanishKind::Exited {
            code: terminated.map(|t| i64::from(t.exit_code)).unwrap_or(-1),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(extra: serde_json::Value) -> Pod {
        let mut v = json!({"metadata": {"name": "p"}});
        if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            for (k, x) in extra {
                v.insert(k.clone(), x.clone());
            }
        }
        serde_json::from_value(v).unwrap_or_default()
    }

    fn terminated(reason: &str, code: i32) -> serde_json::Value {
        json!({"phase": "Failed", "containerStatuses": [{
            "name": "sandbox", "image": "", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"reason": reason, "exitCode": code}}}]})
    }

    #[test]
    fn how_pods_end() {
        assert_eq!(ended(&pod(json!({"status": {"phase": "Running"}}))), None);
        assert_eq!(ended(&pod(json!({"status": {"phase": "Pending"}}))), None);
        let evicted = pod(json!({"status": {"phase": "Failed", "reason": "Evicted",
            "message": "low on memory\u{1b}[2J\n"}}));
        // The escape is a space now, the newline cut: nothing of it reaches a terminal.
        assert_eq!(
            ended(&evicted),
            Some(VanishKind::Evicted {
                message: "low on memory [2J".into()
            })
        );
        assert_eq!(
            ended(&pod(json!({"status": terminated("OOMKilled", 137)}))),
            Some(VanishKind::OomKilled)
        );
        assert_eq!(
            ended(&pod(json!({"status": terminated("Error", 2)}))),
            Some(VanishKind::Exited { code: 2 })
        );
        let deleting = pod(json!({"metadata": {"name": "p",
            "deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}}));
        assert_eq!(ended(&deleting), Some(VanishKind::Deleted));
    }
}
