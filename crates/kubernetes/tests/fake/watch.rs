//! The fake API server's watch of pods: `GET …/pods?watch=true` streams WatchEvents as JSON
//! lines (`{"type": "ADDED"|"MODIFIED"|"DELETED", "object": pod}`) from the resourceVersion
//! asked for, filtered by the label selector, until `timeoutSeconds`. Every change of a
//! pod (create, patch, the kubelet's status, delete) is one event with a new
//! resourceVersion, kept in a bounded history so a watch from an earlier version replays
//! what it missed; a version older than the history (or after `expire_history`) gets one
//! ERROR event, 410 Expired, as a real server answers, and the client lists again.
//!
//! And what happens to pods behind sandboxd's back, for the tests: `oom_kill` (the
//! container terminated, OOMKilled), `delete_behind` (deleted as `kubectl delete pod` would)
//! and the eviction `FakeApi::evict` (mod.rs), each also an event.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tokio::sync::broadcast;

use super::{Fake, FakeApi, key, matches, with_kind};

/// How many events the history keeps.
const HISTORY: usize = 1000;

#[derive(Clone)]
struct Entry {
    version: u64,
    ns: String,
    labels: std::collections::BTreeMap<String, String>,
    line: Bytes,
}

/// The events of every pod, kept and sent.
pub(crate) struct Watches {
    history: Mutex<VecDeque<Entry>>,
    /// Versions at or below this are gone from the history.
    expired: AtomicU64,
    live: broadcast::Sender<Entry>,
    /// Bumped to end every open watch (`cut_watches`).
    cuts: tokio::sync::watch::Sender<u64>,
}

impl Default for Watches {
    fn default() -> Self {
        Watches {
            history: Mutex::default(),
            expired: AtomicU64::new(0),
            live: broadcast::channel(HISTORY).0,
            cuts: tokio::sync::watch::channel(0).0,
        }
    }
}

impl Watches {
    /// Records a change of `pod` in `ns` as an event of `kind`, giving the pod its new
    /// resourceVersion (from the fake's one counter).
    pub(crate) fn changed(&self, version: &AtomicU64, ns: &str, kind: &str, pod: &mut Pod) {
        let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
        let v = version.fetch_add(1, Ordering::Relaxed);
        pod.metadata.resource_version = Some(v.to_string());
        let mut line = serde_json::to_vec(&json!({"type": kind, "object": with_kind(pod)}))
            .unwrap_or_default();
        line.push(b'\n');
        let entry = Entry {
            version: v,
            ns: ns.to_string(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            line: Bytes::from(line),
        };
        history.push_back(entry.clone());
        while history.len() > HISTORY {
            if let Some(old) = history.pop_front() {
                self.expired.store(old.version, Ordering::Relaxed);
            }
        }
        let _ = self.live.send(entry);
    }
}

/// Whether a list request asks for a watch.
pub(crate) fn wanted(query: &str) -> bool {
    url::form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "watch" && v == "true")
}

/// The watch a list request with `watch=true` asks for.
pub(crate) fn serve(fake: &Arc<Fake>, ns: String, query: &str) -> Response {
    let param = |name: &str| {
        url::form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let selector = param("labelSelector").unwrap_or_default();
    let from: u64 = param("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = param("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(290u64);
    let watches = &fake.watches;
    let (replay, live) = {
        let history = watches.history.lock().unwrap_or_else(|e| e.into_inner());
        if from != 0 && from < watches.expired.load(Ordering::Relaxed) {
            let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
                "message": format!("too old resource version: {from}")}});
            let mut line = serde_json::to_vec(&gone).unwrap_or_default();
            line.push(b'\n');
            return Response::new(Body::from(line));
        }
        let replay: VecDeque<Entry> = history
            .iter()
            .filter(|e| e.version > from)
            .cloned()
            .collect();
        (replay, watches.live.subscribe())
    };
    let mut cut = watches.cuts.subscribe();
    cut.mark_unchanged();
    let last = replay.back().map_or(from, |e| e.version);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    let wants = move |e: &Entry| e.ns == ns && matches(&selector, &e.labels);
    let stream = futures::stream::unfold(
        (replay, live, last, cut),
        move |(mut replay, mut live, mut last, mut cut)| {
            let wants = wants.clone();
            async move {
                loop {
                    if let Some(e) = replay.pop_front() {
                        if wants(&e) {
                            return Some((Ok::<_, Infallible>(e.line), (replay, live, last, cut)));
                        }
                        continue;
                    }
                    let next = tokio::select! {
                        n = tokio::time::timeout_at(deadline, live.recv()) => n,
                        _ = cut.changed() => return None,
                    };
                    match next {
                        Ok(Ok(e)) if e.version > last => {
                            last = e.version;
                            if wants(&e) {
                                return Some((Ok(e.line), (replay, live, last, cut)));
                            }
                        }
                        Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                        Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => return None,
                    }
                }
            }
        },
    );
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

impl FakeApi {
    /// Kills a pod's container for running out of memory, as the kernel and the kubelet
    /// report it: the container terminated, reason OOMKilled, exit code 137; the pod failed.
    pub fn oom_kill(&self, ns: &str, name: &str) {
        self.kubelet_says(ns, name, |pod| {
            pod.status = serde_json::from_value(json!({"phase": "Failed", "containerStatuses": [{
                "name": "sandbox", "image": "", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}))
            .ok();
        });
    }

    /// Deletes a pod as someone other than sandboxd would (`kubectl delete pod`).
    pub fn delete_behind(&self, ns: &str, name: &str) {
        let stored = self
            .state
            .pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key(ns, name));
        if let Some(mut s) = stored {
            super::docker::remove(&s.container);
            let state = &self.state;
            state
                .watches
                .changed(&state.version, ns, "DELETED", &mut s.pod);
        }
    }

    /// Changes a pod's status as its kubelet would, its container removed, and tells the
    /// watches.
    pub(crate) fn kubelet_says(&self, ns: &str, name: &str, change: impl FnOnce(&mut Pod)) {
        let mut pods = self.state.pods.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stored) = pods.get_mut(&key(ns, name)) {
            super::docker::remove(&stored.container);
            change(&mut stored.pod);
            let state = &self.state;
            state
                .watches
                .changed(&state.version, ns, "MODIFIED", &mut stored.pod);
        }
    }

    /// Ends every open watch and forgets every event so far, as an API server restarting
    /// behind a load balancer would: a watch opened again from an earlier resourceVersion
    /// gets 410, and its client must list again.
    pub fn cut_watches(&self) {
        self.expire_history();
        self.state.watches.cuts.send_modify(|n| *n += 1);
    }

    /// Forgets every event so far: a watch from an earlier resourceVersion gets 410.
    pub fn expire_history(&self) {
        let w = &self.state.watches;
        let mut history = w.history.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(last) = history.back() {
            w.expired.store(last.version + 1, Ordering::Relaxed);
        }
        history.clear();
    }
}
