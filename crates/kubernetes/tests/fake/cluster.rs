//! The fake's cluster beyond pods: the API server's version, which namespaces exist (all,
//! unless a test names them), what the caller's account may do (everything, unless a test
//! denies a verb) answered as SelfSubjectAccessReview and enforced on pod creates, dry-run
//! creates (`?dryRun=All`: admitted and checked, never run), and an "outside" listener on the
//! host that a pod reaches only where the fake's network plugin does not enforce
//! NetworkPolicy (a Docker bridge reaches the host at its gateway; `--network none` does not).
//! Pods also take a JSON merge patch (RFC 7386) of their metadata, as a claim relabels.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::{Fake, status};

/// Namespaces and permissions.
#[derive(Default)]
pub struct Cluster {
    /// None: every namespace exists.
    namespaces: Mutex<Option<BTreeSet<String>>>,
    /// `(verb, resource)` pairs the account may not do (`pods/exec` for a subresource).
    denied: Mutex<BTreeSet<(String, String)>>,
}

impl Cluster {
    /// Only these namespaces exist from now on.
    pub fn set_namespaces(&self, names: &[&str]) {
        *self.namespaces.lock().unwrap() = Some(names.iter().map(|s| s.to_string()).collect());
    }

    /// The account may no longer `verb` `resource`.
    pub fn deny(&self, verb: &str, resource: &str) {
        self.denied
            .lock()
            .unwrap()
            .insert((verb.to_string(), resource.to_string()));
    }

    fn allowed(&self, verb: &str, resource: &str) -> bool {
        !self
            .denied
            .lock()
            .unwrap()
            .contains(&(verb.to_string(), resource.to_string()))
    }

    /// What the API server answers before it looks at the object, when it refuses: the
    /// namespace must exist and the account may `verb` `resource`.
    pub(crate) fn refusal(&self, ns: &str, verb: &str, resource: &str) -> Option<Response> {
        let exists = self
            .namespaces
            .lock()
            .unwrap()
            .as_ref()
            .is_none_or(|n| n.contains(ns));
        if !exists {
            return Some(status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("namespaces \"{ns}\" not found"),
            ));
        }
        if !self.allowed(verb, resource) {
            return Some(status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!(
                    "{resource} is forbidden: User \"fake\" cannot {verb} resource \"{resource}\" in API group \"\" in the namespace \"{ns}\""
                ),
            ));
        }
        None
    }
}

/// `PATCH` with `application/merge-patch+json`: only metadata may change (labels and
/// annotations are what sandboxd patches); a body that is not a merge patch is refused.
pub(crate) async fn patch_pod(
    axum::extract::State(fake): axum::extract::State<Arc<Fake>>,
    axum::extract::Path((ns, name)): axum::extract::Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let merge = headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes() == b"application/merge-patch+json");
    let patch: Value = match serde_json::from_slice(&body) {
        Ok(p) if merge => p,
        _ => {
            return status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                "a merge patch",
            );
        }
    };
    if patch
        .as_object()
        .is_none_or(|o| o.keys().any(|k| k != "metadata"))
    {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "only metadata is patched here",
        );
    }
    let mut pods = fake.pods.lock().unwrap();
    let Some(stored) = pods.get_mut(&super::key(&ns, &name)) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("pods \"{name}\" not found"),
        );
    };
    let mut v = serde_json::to_value(&stored.pod).unwrap();
    merge_patch(&mut v, &patch);
    match serde_json::from_value(v) {
        Ok(pod) => {
            stored.pod = pod;
            fake.watches
                .changed(&fake.version, &ns, "MODIFIED", &mut stored.pod);
            Json(super::with_kind(&stored.pod)).into_response()
        }
        Err(e) => status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &e.to_string()),
    }
}

/// RFC 7386: objects merge key by key, null removes, anything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Whether a query asks for a dry run.
pub(crate) fn dry_run(query: Option<&str>) -> bool {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .any(|(k, v)| k == "dryRun" && v == "All")
}

pub(crate) fn routes() -> axum::Router<Arc<Fake>> {
    axum::Router::new().route("/version", get(version)).route(
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        post(access_review),
    )
}

async fn version() -> Json<Value> {
    Json(json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-sandboxd-fake",
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-12-01T00:00:00Z",
        "goVersion": "none", "compiler": "none", "platform": "linux/amd64"
    }))
}

async fn access_review(
    axum::extract::State(fake): axum::extract::State<Arc<Fake>>,
    Json(mut review): Json<Value>,
) -> Response {
    let attrs = &review["spec"]["resourceAttributes"];
    let mut resource = attrs["resource"].as_str().unwrap_or_default().to_string();
    if let Some(sub) = attrs["subresource"].as_str().filter(|s| !s.is_empty()) {
        resource = format!("{resource}/{sub}");
    }
    let verb = attrs["verb"].as_str().unwrap_or_default();
    let allowed = fake.cluster.allowed(verb, &resource);
    review["status"] = json!({ "allowed": allowed });
    review["kind"] = json!("SelfSubjectAccessReview");
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    (StatusCode::CREATED, Json(review)).into_response()
}

/// A TCP listener on every address of the host, standing for "the outside": a pod on a
/// Docker bridge reaches it at the bridge's gateway, a pod with no network does not.
pub struct Outside {
    /// `gateway:port`, as a probe target.
    pub target: String,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Outside {
    pub async fn start() -> anyhow::Result<Outside> {
        let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await?;
        let port = listener.local_addr()?.port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                drop(conn);
            }
        });
        Ok(Outside {
            target: format!("{}:{port}", bridge_gateway()?),
            accepted,
            task,
        })
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The host's address on Docker's default bridge (`docker0`).
fn bridge_gateway() -> anyhow::Result<String> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "docker0"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no IPv4 address on docker0: {text}"))
}
