//! The `[runtime]` and `[kubernetes]` config sections: which backend makes the sandboxes
//! (`docker`, the default, or `kubernetes`; also `SANDBOXD_RUNTIME_BACKEND`) and how the
//! Kubernetes backend makes its pods. The binary (crates/sandboxd/src/backends.rs) builds
//! the one named here; this crate only checks the names.

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// `docker` (one container per session on the engine DOCKER_HOST names) or
    /// `kubernetes` (one pod per session in `[kubernetes] namespace`).
    pub backend: String,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            backend: "docker".into(),
        }
    }
}

/// Which backend a config names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Docker,
    Kubernetes,
}

impl RuntimeConfig {
    pub fn kind(&self) -> BackendKind {
        match self.backend.trim() {
            "kubernetes" => BackendKind::Kubernetes,
            _ => BackendKind::Docker,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.backend.trim() {
            "docker" | "kubernetes" => Ok(()),
            _ => Err(ConfigError::Invalid {
                key: "[runtime] backend".into(),
                message: "must be \"docker\" or \"kubernetes\"".into(),
            }),
        }
    }
}

/// How the Kubernetes backend makes session pods (its hardening is not configurable).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// The namespace of every sandbox pod; label it
    /// `pod-security.kubernetes.io/enforce=restricted`.
    pub namespace: String,
    /// The sandbox image as the cluster's nodes pull it (pushed to the cluster's registry).
    pub image: String,
    /// `IfNotPresent`, `Always` or `Never`.
    pub pull_policy: String,
    /// An optional RuntimeClass (`gvisor`, `kata-qemu`); empty: the cluster's default.
    pub runtime_class: String,
    /// /workspace and /tmp as memory-backed emptyDirs (counted in the memory limit, as the
    /// Docker backend's tmpfs mounts are); false: on the node's disk.
    pub memory_backed: bool,
    /// What the network probe (a pod like every session's, under the deny-all policy) tries
    /// to reach, as `host:port`: where a name resolves or a connection completes, the
    /// cluster's network plugin does not enforce NetworkPolicy and no session is started.
    /// Names should be ones only a network can resolve (not in the image's /etc/hosts).
    pub egress_probe: Vec<String>,
    /// Seconds a replica's `coordination.k8s.io` Lease lasts unrenewed (renewed every third
    /// of it): once it has run out, the replica counts as gone and its pods as orphans.
    pub lease_secs: u64,
    /// How sessions become pods: `pods` (sandboxd makes each pod itself), `agent-sandbox`
    /// (each session a `SandboxClaim` of kubernetes-sigs/agent-sandbox against a
    /// `SandboxWarmPool` sandboxd writes; refuses to start without its CRDs) or `auto`
    /// (agent-sandbox where discovery shows its CRDs, else pods).
    pub mode: String,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            namespace: "sandboxd".into(),
            image: String::new(),
            pull_policy: "IfNotPresent".into(),
            runtime_class: String::new(),
            memory_backed: true,
            egress_probe: vec![
                "1.1.1.1:443".into(),
                "kubernetes.default.svc:443".into(),
                "example.com:443".into(),
            ],
            lease_secs: 30,
            mode: "pods".into(),
        }
    }
}

impl KubernetesConfig {
    pub fn validate(&self, backend: BackendKind) -> Result<(), ConfigError> {
        if !matches!(
            self.pull_policy.as_str(),
            "IfNotPresent" | "Always" | "Never"
        ) {
            return Err(ConfigError::Invalid {
                key: "[kubernetes] pull_policy".into(),
                message: "must be IfNotPresent, Always or Never".into(),
            });
        }
        if backend == BackendKind::Kubernetes && self.image.trim().is_empty() {
            return Err(ConfigError::Invalid {
                key: "[kubernetes] image".into(),
                message: "the Kubernetes backend needs the sandbox image as the cluster pulls it (push it to the cluster's registry, README \"On Kubernetes\")".into(),
            });
        }
        self.validate_probe()?;
        if !(3..=3600).contains(&self.lease_secs) {
            return Err(ConfigError::Invalid {
                key: "[kubernetes] lease_secs".into(),
                message: "must be 3 to 3600 seconds".into(),
            });
        }
        if KubeMode::parse(&self.mode).is_none() {
            return Err(ConfigError::Invalid {
                key: "[kubernetes] mode".into(),
                message: "must be \"pods\", \"agent-sandbox\" or \"auto\"".into(),
            });
        }
        let ns = &self.namespace;
        let dns_label = !ns.is_empty()
            && ns.len() <= 63
            && ns
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !dns_label {
            return Err(ConfigError::Invalid {
                key: "[kubernetes] namespace".into(),
                message: "must be a DNS label (lowercase letters, digits and '-')".into(),
            });
        }
        Ok(())
    }
}

/// `[kubernetes] mode`, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeMode {
    Pods,
    AgentSandbox,
    Auto,
}

impl KubeMode {
    pub fn parse(s: &str) -> Option<KubeMode> {
        match s.trim() {
            "pods" => Some(KubeMode::Pods),
            "agent-sandbox" => Some(KubeMode::AgentSandbox),
            "auto" => Some(KubeMode::Auto),
            _ => None,
        }
    }
}

impl KubernetesConfig {
    /// The configured mode (`validate` refused anything else; unchecked, `pods`).
    pub fn kube_mode(&self) -> KubeMode {
        KubeMode::parse(&self.mode).unwrap_or(KubeMode::Pods)
    }

    /// Each probe target is `host:port` of at most 253 plain characters (it becomes an argv
    /// word of the probe, never a shell word), and there is at least one and at most 8.
    fn validate_probe(&self) -> Result<(), ConfigError> {
        let ok = |t: &String| {
            let Some((host, port)) = t.rsplit_once(':') else {
                return false;
            };
            let host = host.trim_start_matches('[').trim_end_matches(']');
            !host.is_empty()
                && t.len() <= 253
                && port.parse::<u16>().is_ok_and(|p| p > 0)
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.:_".contains(&b))
        };
        if self.egress_probe.is_empty()
            || self.egress_probe.len() > 8
            || !self.egress_probe.iter().all(ok)
        {
            return Err(ConfigError::Invalid {
                key: "[kubernetes] egress_probe".into(),
                message: "must be 1 to 8 targets \"host:port\" (a name or an IP address)".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_and_settings_are_checked() {
        assert_eq!(RuntimeConfig::default().kind(), BackendKind::Docker);
        let k = RuntimeConfig {
            backend: "kubernetes".into(),
        };
        assert_eq!(k.kind(), BackendKind::Kubernetes);
        assert!(k.validate().is_ok());
        assert!(
            RuntimeConfig {
                backend: "podman".into()
            }
            .validate()
            .is_err()
        );
        let mut kc = KubernetesConfig::default();
        assert!(kc.validate(BackendKind::Docker).is_ok());
        assert!(kc.validate(BackendKind::Kubernetes).is_err(), "no image");
        kc.image = "registry.local/sandboxd-sandbox:1".into();
        assert!(kc.validate(BackendKind::Kubernetes).is_ok());
        kc.namespace = "../kube-system".into();
        assert!(kc.validate(BackendKind::Kubernetes).is_err());
        kc.namespace = "sandboxd".into();
        kc.pull_policy = "Sometimes".into();
        assert!(kc.validate(BackendKind::Kubernetes).is_err());
        kc.pull_policy = "Always".into();
        for (mode, ok) in [
            ("pods", Some(KubeMode::Pods)),
            ("agent-sandbox", Some(KubeMode::AgentSandbox)),
            ("auto", Some(KubeMode::Auto)),
            ("claims", None),
        ] {
            kc.mode = mode.into();
            assert_eq!(kc.validate(BackendKind::Kubernetes).is_ok(), ok.is_some());
            assert_eq!(KubeMode::parse(mode), ok);
        }
        kc.mode = "pods".into();
        for bad in [
            "",
            "example.com",
            "a b:80",
            "x:0",
            "x:99999",
            "$(id):80",
            ":80",
        ] {
            kc.egress_probe = vec![bad.into()];
            assert!(kc.validate(BackendKind::Kubernetes).is_err(), "{bad:?}");
        }
        kc.egress_probe = vec!["[fd00::1]:53".into(), "10.0.0.1:80".into()];
        assert!(kc.validate(BackendKind::Kubernetes).is_ok());
        kc.egress_probe = Vec::new();
        assert!(kc.validate(BackendKind::Kubernetes).is_err(), "none");
        kc.egress_probe = vec!["10.0.0.1:80".into()];
        for (secs, ok) in [(2, false), (3, true), (30, true), (3601, false)] {
            kc.lease_secs = secs;
            assert_eq!(kc.validate(BackendKind::Kubernetes).is_ok(), ok, "{secs}");
        }
    }
}
