//! The Kubernetes encoding of `SandboxMeta`: the selectable entries become labels
//! `sandboxd/<key>` (what a list selects on), every other entry an annotation of the same
//! name. Kubernetes refuses an object whose label value is not 63 characters of
//! `[A-Za-z0-9._-]` alphanumeric at both ends, so a value that is not one (never ours: the
//! seam promises valid ones, but a hostile or future id must not make every create fail) is
//! replaced by a digest that is one, the same on write and in the selector. Annotation values
//! are free-form but bounded here, so no entry can push a pod past the API's 256 KiB.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use sandboxd_core::sandbox::runtime::{SandboxMeta, meta_key};

/// Prefix of every label and annotation sandboxd writes (a DNS-subdomain prefix, as the
/// Kubernetes rules for qualified names ask).
pub(crate) const PREFIX: &str = "sandboxd/";

/// The label a claimed warm pod carries, and the annotation with who claimed it
/// (`Runtime::mark_claimed`; informational, never read back as the binding).
pub const CLAIMED: &str = "sandboxd/claimed";
pub const CLAIMED_BY: &str = "sandboxd/claimed-by";

/// Longest annotation value written; longer ones (never ours) are left out.
const MAX_ANNOTATION: usize = 4096;

/// The label or annotation that holds the entry `key` (a `meta_key`).
pub(crate) fn name(key: &str) -> String {
    format!("{PREFIX}{key}")
}

/// Whether Kubernetes accepts `v` as a label value.
pub fn is_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    b.len() <= 63
        && (b.is_empty()
            || (b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))))
}

/// `v` itself when it is a valid label value, else `h-` and 40 hex digits of its SHA-256:
/// deterministic, so the selector for a value finds what `labels` wrote for it.
pub(crate) fn label_value(v: &str) -> String {
    if is_label_value(v) {
        return v.to_string();
    }
    let digest = hex::encode(Sha256::digest(v.as_bytes()));
    format!("h-{}", &digest[..40])
}

/// The pod name of a session: `sandboxd-<id>` when the id is a DNS label already (ours
/// are), else `sandboxd-h-<digest>` so no hostile id reaches a URL path or a name rule.
pub(crate) fn pod_name(session_id: &str) -> String {
    let plain = !session_id.is_empty()
        && session_id.len() <= 50
        && session_id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if plain {
        format!("sandboxd-{session_id}")
    } else {
        let digest = hex::encode(Sha256::digest(session_id.as_bytes()));
        format!("sandboxd-h-{}", &digest[..40])
    }
}

/// The labels of a new pod.
pub(crate) fn labels(meta: &SandboxMeta) -> BTreeMap<String, String> {
    meta.selectable()
        .into_iter()
        .map(|(k, v)| (name(k), label_value(&v)))
        .collect()
}

/// The annotations of a new pod: every non-selectable entry, bounded.
pub(crate) fn annotations(meta: &SandboxMeta) -> BTreeMap<String, String> {
    meta.annotations()
        .into_iter()
        .filter(|(_, v)| v.len() <= MAX_ANNOTATION)
        .map(|(k, v)| (name(k), v))
        .collect()
}

/// A label selector for "managed, and the entry `key` is `value`" (or only managed).
pub(crate) fn selector(session: Option<&str>) -> String {
    let mut s = format!("{}=true", name(meta_key::MANAGED));
    if let Some(id) = session {
        s.push_str(&format!(",{}={}", name(meta_key::SESSION), label_value(id)));
    }
    s
}

/// What a listed pod recorded: labels first, then annotations, each read as hostile by
/// `SandboxMeta::read` (a session id that is a digest reads as no id).
pub(crate) fn decode(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> SandboxMeta {
    SandboxMeta::read(|key| {
        let n = name(key);
        labels
            .get(&n)
            .or_else(|| annotations.get(&n))
            .map(String::as_str)
    })
}

#[cfg(test)]
mod tests {
    use sandboxd_core::config::Limits;
    use sandboxd_core::sandbox::Owner;
    use sandboxd_core::sandbox::runtime::SandboxSpec;

    use super::*;

    fn spec(id: &str) -> SandboxSpec {
        SandboxSpec {
            session_id: id.into(),
            owner: Some(Owner::new("serve:42").unwrap()),
            pooled: false,
            limits: Limits::default(),
            keep: true,
            replica: Some("replica-1".into()),
            image: None,
            restore_bytes: None,
        }
    }

    #[test]
    fn what_is_written_reads_back() {
        let meta = spec("0123456789ab").meta("lease:replica-1");
        let (l, a) = (labels(&meta), annotations(&meta));
        assert!(l.values().all(|v| is_label_value(v)));
        assert_eq!(l["sandboxd/session"], "0123456789ab");
        assert_eq!(a["sandboxd/owner"], "serve:42");
        assert_eq!(decode(&l, &a), meta);
        assert_eq!(
            selector(Some("0123456789ab")),
            "sandboxd/managed=true,sandboxd/session=0123456789ab"
        );
    }

    #[test]
    fn hostile_values_become_valid_labels_and_names() {
        for id in [
            "../../etc/passwd",
            "A".repeat(300).as_str(),
            "x,sandboxd/managed=false",
            "-lead",
            "",
            "UPPER",
        ] {
            let l = labels(&spec(id).meta("c"));
            assert!(l.values().all(|v| is_label_value(v)), "{id:?}: {l:?}");
            let name = pod_name(id);
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{name}"
            );
            // The selector never carries the raw value: no comma, no second requirement.
            assert_eq!(selector(Some(id)).matches(',').count(), 1, "{id:?}");
        }
        let mut meta = spec("ab").meta("c");
        meta.creator = Some("x".repeat(MAX_ANNOTATION + 1));
        assert!(!annotations(&meta).contains_key("sandboxd/creator"));
    }
}
