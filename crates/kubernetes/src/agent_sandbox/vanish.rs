//! The vanish watch of agent-sandbox mode: the same watch of the pods labelled
//! `sandboxd/managed=true` as pods mode's (watch.rs; the template labels every pod it makes
//! so), but those pods carry no session labels (sandboxd's metadata is on the claim) and a
//! session's handle is `<claim>/<pod>`. So this runtime keeps which pod it bound to which
//! claim and session (`Bound`: filled when a create binds a claim or an attach takes one up,
//! emptied when it removes one), and a pod's end is reported under its claim's handle and
//! session only if it is one of those, and the same pod (by uid, where the bind saw one: a
//! cold claim's pod is named after the claim, so a resumed session's pod has the old one's
//! name). A warm pod nobody claimed, or a pod of a claim this process does not hold, is
//! not reported: no session of this manager could end by it.
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
    /// The pod's uid where the bind saw it (an attach does not).
    pub(super) uid: Option<String>,
}

/// The pods this process bound to its claims, by pod name.
#[derive(Clone, Default)]
pub(super) struct Bound(Arc<Mutex<HashMap<String, Binding>>>);

impl Bound {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Binding>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `pod` is the sandbox of `binding` from now on.
    pub(super) fn insert(&self, pod: &str, binding: Binding) {
        let mut map = self.lock();
        if map.len() >= REMEMBERED && !map.contains_key(pod) {
            // Never reached by a live process; a bound on memory all the same.
            map.clear();
        }
        map.insert(pod.to_string(), binding);
    }

    /// Forgets `pod`, returning what it was bound to.
    pub(super) fn remove(&self, pod: &str) -> Option<Binding> {
        self.lock().remove(pod)
    }

    /// The `Resolve` of the watch: a bound pod's claim handle and session.
    pub(super) fn resolver(&self) -> Resolve {
        let bound = self.clone();
        Arc::new(move |pod: &Pod| bound.resolve(pod))
    }

    fn resolve(&self, pod: &Pod) -> Option<(String, String)> {
        let name = pod.metadata.name.as_deref()?;
        let map = self.lock();
        let b = map.get(name)?;
        let uid = pod.metadata.uid.as_deref().filter(|u| !u.is_empty());
        if let (Some(want), Some(have)) = (b.uid.as_deref(), uid)
            && want != have
        {
            // Another pod under the name (an older one's late event): not this session's.
            return None;
        }
        Some((b.handle.clone(), b.session.clone()))
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
        assert_eq!(
            resolve(&pod("p1", "u1")),
            Some(("sandboxd-s1/p1".into(), "s1".into()))
        );
        assert_eq!(resolve(&pod("p1", "u0")), None, "an older pod of the name");
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
    }
}
