//! The Docker encoding of `SandboxMeta`: every entry becomes a container label named
//! `sandboxd.<key>`. Docker label values are free-form and every label can be filtered on,
//! so selectable entries and annotations alike are labels. The names and values are the
//! ones every earlier version wrote, so containers made before this encoding existed are
//! still found and read the same.

use std::collections::HashMap;

use sandboxd_core::sandbox::runtime::SandboxMeta;

/// Prefix of every label sandboxd writes.
const PREFIX: &str = "sandboxd.";

/// The label that holds the entry `key` (a `meta_key`).
pub(crate) fn name(key: &str) -> String {
    format!("{PREFIX}{key}")
}

/// A label filter for the list call: the entry `key` has `value`.
pub(crate) fn filter(key: &str, value: &str) -> String {
    format!("{}={value}", name(key))
}

/// The labels a new container carries.
pub(crate) fn encode(meta: &SandboxMeta) -> HashMap<String, String> {
    meta.selectable()
        .into_iter()
        .chain(meta.annotations())
        .map(|(k, v)| (name(k), v))
        .collect()
}

/// What a listed container recorded.
pub(crate) fn decode(labels: &HashMap<String, String>) -> SandboxMeta {
    SandboxMeta::read(|key| labels.get(&name(key)).map(String::as_str))
}

#[cfg(test)]
mod tests {
    use sandboxd_core::config::Limits;
    use sandboxd_core::sandbox::Owner;
    use sandboxd_core::sandbox::runtime::SandboxSpec;

    use super::*;

    /// The exact labels earlier versions wrote: existing containers and the tests that
    /// inspect them with `docker ps --format` depend on them.
    #[test]
    fn the_labels_are_the_ones_earlier_versions_wrote() {
        let limits = Limits::default();
        let spec = SandboxSpec {
            session_id: "0123456789ab".into(),
            owner: Some(Owner::new("serve:42").unwrap()),
            pooled: true,
            limits: limits.clone(),
            keep: true,
            replica: None,
            image: None,
            restore_bytes: None,
        };
        let labels = encode(&spec.meta("1234:5678"));
        let expected: HashMap<String, String> = [
            ("sandboxd.managed", "true".to_string()),
            ("sandboxd.session", "0123456789ab".to_string()),
            ("sandboxd.keep", "true".to_string()),
            ("sandboxd.creator", "1234:5678".to_string()),
            ("sandboxd.limits", serde_json::to_string(&limits).unwrap()),
            ("sandboxd.owner", "serve:42".to_string()),
            ("sandboxd.pool", "true".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(labels, expected);
        assert_eq!(decode(&labels), spec.meta("1234:5678"));

        // No owner and not pooled: neither label, as before.
        let plain = SandboxSpec {
            owner: None,
            pooled: false,
            keep: false,
            ..spec
        };
        let labels = encode(&plain.meta("1:2"));
        assert!(!labels.contains_key("sandboxd.owner"));
        assert!(!labels.contains_key("sandboxd.pool"));
        assert_eq!(labels["sandboxd.keep"], "false");
        assert_eq!(filter("managed", "true"), "sandboxd.managed=true");
    }
}
