//! Counting the API server round trips a client makes, for `sandboxd bench kubernetes`: what
//! a real cluster adds to an operation is at least its round trips times the API server's
//! latency, and the count is the same against the fake and a real cluster because it is
//! taken in the client, before the request leaves (a tower layer on kube's own stack, so a
//! WebSocket exec counts as the one upgrade request it is). `connect_to` is `connect` with an
//! explicit kubeconfig and, optionally, this counter; serve never asks for one.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use sandboxd_core::sandbox::SandboxError;

use crate::{install_tls_provider, unavailable};

/// Requests sent so far, by kind (`"GET pods"`, `"LIST pods"`, `"PATCH pods"`,
/// `"GET pods/exec"`, `"PUT leases"`, …). Clones share one count.
#[derive(Clone, Default, Debug)]
pub struct ApiCalls(Arc<Mutex<BTreeMap<String, u64>>>);

impl ApiCalls {
    fn note(&self, method: &http::Method, path: &str) {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry(kind(method, path)).or_default() += 1;
    }

    /// The counts now.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What was sent since `before` (a `snapshot`), kinds with none left out.
    pub fn since(&self, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
        self.snapshot()
            .into_iter()
            .filter_map(|(k, n)| {
                let d = n.saturating_sub(before.get(&k).copied().unwrap_or(0));
                (d > 0).then_some((k, d))
            })
            .collect()
    }
}

/// A request's kind from its method and path: the resource (and subresource) after the
/// namespace, or the path's last segment for a cluster-scoped call; a GET of a collection is
/// a `LIST`. The names of objects never appear, so the kinds stay few.
fn kind(method: &http::Method, path: &str) -> String {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (resource, named) = match segments.iter().position(|s| *s == "namespaces") {
        Some(i) if segments.len() > i + 2 => {
            let rest = &segments[i + 2..];
            match rest {
                [r] => (r.to_string(), false),
                [r, _name] => (r.to_string(), true),
                [r, _name, sub, ..] => (format!("{r}/{sub}"), true),
                [] => (String::new(), false),
            }
        }
        _ => (segments.last().copied().unwrap_or("/").to_string(), true),
    };
    let verb = if method == http::Method::GET && !named {
        "LIST"
    } else {
        method.as_str()
    };
    format!("{verb} {resource}")
}

/// The client for the cluster a kubeconfig file names (None: as `connect`, `KUBECONFIG`,
/// `~/.kube/config` or the in-cluster service account), counting its requests in `calls`
/// when given.
pub async fn connect_to(
    kubeconfig: Option<&Path>,
    calls: Option<ApiCalls>,
) -> Result<Client, SandboxError> {
    install_tls_provider();
    let config = match kubeconfig {
        None => Config::infer()
            .await
            .map_err(|e| unavailable(e.to_string()))?,
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| unavailable(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| unavailable(format!("{}: {e}", path.display())))?
        }
    };
    let Some(calls) = calls else {
        return Client::try_from(config).map_err(|e| unavailable(e.to_string()));
    };
    let builder = ClientBuilder::try_from(config).map_err(|e| unavailable(e.to_string()))?;
    let count = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        calls.note(req.method(), req.uri().path());
        req
    });
    Ok(builder.with_layer(&count).build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn kinds_name_the_resource_and_never_the_object() {
        let ns = "/api/v1/namespaces/sandboxd";
        assert_eq!(kind(&Method::GET, &format!("{ns}/pods")), "LIST pods");
        assert_eq!(kind(&Method::POST, &format!("{ns}/pods")), "POST pods");
        assert_eq!(kind(&Method::GET, &format!("{ns}/pods/sb-1")), "GET pods");
        assert_eq!(
            kind(&Method::PATCH, &format!("{ns}/pods/sb-1")),
            "PATCH pods"
        );
        assert_eq!(
            kind(&Method::GET, &format!("{ns}/pods/sb-1/exec")),
            "GET pods/exec"
        );
        assert_eq!(
            kind(
                &Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/sandboxd/leases/r-1"
            ),
            "PUT leases"
        );
        assert_eq!(kind(&Method::GET, "/version"), "GET version");
        assert_eq!(
            kind(
                &Method::POST,
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
            ),
            "POST selfsubjectaccessreviews"
        );
    }

    #[test]
    fn since_counts_only_what_was_sent_after() {
        let calls = ApiCalls::default();
        calls.note(&Method::POST, "/api/v1/namespaces/x/pods");
        let before = calls.snapshot();
        calls.note(&Method::GET, "/api/v1/namespaces/x/pods/a");
        calls.note(&Method::GET, "/api/v1/namespaces/x/pods/a");
        let d = calls.since(&before);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d.get("GET pods"), Some(&2));
        assert!(calls.since(&calls.snapshot()).is_empty());
    }
}
