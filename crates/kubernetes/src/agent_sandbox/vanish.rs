//! The vanish watch of agent-sandbox mode: the same watch of the pods labelled
//! `sandboxd/managed=true` as pods mode's (watch.rs; the template labels every pod it makes
//! so), but those pods carry no session labels (sandboxd's metadata is on the claim) and a
//! session's handle is `<claim>/<pod>`. So this runtime keeps which pod it bound to which
//! claim and session (`Bound`: filled when a create binds a claim or an attach takes one up,
//! emptied when it removes one), and a pod's end is reported under its claim's handle and
//! session only if it is one of those, and the same pod (by uid, where the bind saw one: a
//! cold claim's pod is named after the claim, so a resumed session's pod has the old one's
//! name). A warm pod nobody claimed, or a pod of a claim this process does not hold, is
//! not reported: no session of this manager could end by it. An entry goes when its pod's
//! end is resolved (the session ends by it) or when remove forgets it; at the size cap the
//! oldest entry makes room, never the others.
//!
//! Removals sandboxd makes itself are never reported: `remove` takes the pod out of `Bound`
//! and marks the handle and the pod's uid as its own (`OwnRemovals`) before it deletes the
//! claim, and puts both back if the deletion is refused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

use crate::watch::{Resolve, uid_key};

/// How many bound pods a process remembers: more than it can hold sessions.
const REMEMBERED: usize = 65_536;

/// One pod bound to a claim of this process.
#[derive(Clone, Debug)]
pub(super) struct Binding {
    pub(super) handle: String,
    pub(super) session: String,
    /// The pod's uid where the bind or the attach's check saw it.
    pub(super) uid: Option<String>,
}

/// The pods this process bound to its claims, by pod name, each with when it was bound.
#[derive(Clone, Default)]
pub(super) struct Bound(Arc<Mutex<Bindings>>);

#[derive(Default)]
struct Bindings {
    by_pod: HashMap<String, (u64, Binding)>,
    next: u64,
}

impl Bound {
    fn lock(&self) -> std::sync::MutexGuard<'_, Bindings> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `pod` is the sandbox of `binding` from now on.
    pub(super) fn insert(&self, pod: &str, binding: Binding) {
        self.insert_within(pod, binding, REMEMBERED);
    }

    fn insert_within(&self, pod: &str, binding: Binding, most: usize) {
        let mut map = self.lock();
        if map.by_pod.len() >= most && !map.by_pod.contains_key(pod) {
            // Never reached by a live process; a bound on memory that costs the oldest only.
            let oldest = map.by_pod.iter().min_by_key(|(_, (n, _))| *n);
            if let Some(old) = oldest.map(|(p, _)| p.clone()) {
                map.by_pod.remove(&old);
            }
        }
        map.next += 1;
        let n = map.next;
        map.by_pod.insert(pod.to_string(), (n, binding));
    }

    /// Forgets `pod`, returning what it was bound to.
    pub(super) fn remove(&self, pod: &str) -> Option<Binding> {
        self.lock().by_pod.remove(pod).map(|(_, b)| b)
    }

    /// The `Resolve` of the watch: a bound pod's claim handle and session.
    pub(super) fn resolver(&self) -> Resolve {
        let bound = self.clone();
        Arc::new(move |pod: &Pod| bound.resolve(pod))
    }

    /// Called for a pod that ended: its session ends by it, so the entry goes.
    fn resolve(&self, pod: &Pod) -> Option<(String, String)> {
        let name = pod.metadata.name.as_deref()?;
        let mut map = self.lock();
        let (_, b) = map.by_pod.get(name)?;
        let uid = pod.metadata.uid.as_deref().filter(|u| !u.is_empty());
        if let (Some(want), Some(have)) = (b.uid.as_deref(), uid)
            && want != have
        {
            // Another pod under the name (an older one's late event): not this session's.
            return None;
        }
        let (_, b) = map.by_pod.remove(name)?;
        Some((b.handle, b.session))
    }
}

/// The key `OwnRemovals` marks a pod's uid under (the watch's).
pub(super) fn own_uid(uid: &str) -> String {
    uid_key(uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, uid: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "uid": uid}})).unwrap()
    }

    #[test]
    fn only_a_bound_pod_and_the_same_one_resolves() {
        let bound = Bound::default();
        let resolve = bound.resolver();
        assert_eq!(
            resolve(&pod("p1", "u1")),
            None,
            "a warm pod is no session's"
        );
        bound.insert(
            "p1",
            Binding {
                handle: "sandboxd-s1/p1".into(),
                session: "s1".into(),
                uid: Some("u1".into()),
            },
        );
        assert_eq!(resolve(&pod("p1", "u0")), None, "an older pod of the name");
        assert_eq!(
            resolve(&pod("p1", "u1")),
            Some(("sandboxd-s1/p1".into(), "s1".into()))
        );
        assert_eq!(resolve(&pod("p1", "u1")), None, "resolved once: forgotten");
        bound.insert(
            "p1",
            Binding {
                handle: "sandboxd-s1/p1".into(),
                session: "s1".into(),
                uid: Some("u1".into()),
            },
        );
        assert!(bound.remove("p1").is_some());
        assert_eq!(resolve(&pod("p1", "u1")), None, "removed: not reported");
        // An attach knows no uid: any pod of the name is the session's.
        bound.insert(
            "p2",
            Binding {
                handle: "c/p2".into(),
                session: "s2".into(),
                uid: None,
            },
        );
        assert_eq!(
            resolve(&pod("p2", "u9")),
            Some(("c/p2".into(), "s2".into()))
        );
        assert_eq!(resolve(&pod("p2", "u9")), None, "resolved once: forgotten");
    }

    #[test]
    fn at_the_cap_only_the_oldest_entry_goes() {
        let bound = Bound::default();
        let b = |h: &str| Binding {
            handle: h.into(),
            session: h.into(),
            uid: None,
        };
        bound.insert_within("p1", b("c1/p1"), 2);
        bound.insert_within("p2", b("c2/p2"), 2);
        bound.insert_within("p3", b("c3/p3"), 2);
        assert!(bound.remove("p1").is_none(), "the oldest made room");
        assert!(bound.remove("p2").is_some() && bound.remove("p3").is_some());
    }
}
