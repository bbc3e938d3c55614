//! A fake Kubernetes API server on loopback, precise enough for kube's client and for the
//! real shell, files, tunnel and helper code of sandboxd to run through it: pods (create,
//! get, list by label selector, delete), NetworkPolicies (create, get) and the exec
//! subresource over a WebSocket (exec.rs) with `v5.channel.k8s.io`, or only
//! `v4.channel.k8s.io` when made with `v4_only`. Each pod is a real Docker container of the
//! pod's image, started with the docker CLI under the hardening the pod spec asks for
//! (docker.rs), so a field the backend forgets is a setting the container lacks. Like an
//! admission controller, it refuses pods the restricted Pod Security profile refuses, and
//! (unlike a cluster, standing in for an enforcing network plugin) pods that no deny-all
//! NetworkPolicy selects. Its network plugin enforces NetworkPolicy (each container runs
//! with `--network none`) or, after `set_enforcing(false)`, does not (a Docker bridge, from
//! which the fake's "outside" listener is reachable); the version, dry-run creates and
//! SelfSubjectAccessReview are in cluster.rs, Leases in leases.rs, the watch of pods (and
//! pods evicted, OOM-killed or deleted behind sandboxd's back) in watch.rs, agent-sandbox's
//! CRDs and controller (once installed) in agent_sandbox.rs. What it does not do:
//! scheduling, the kubelet's status timeline beyond Pending then Running.

mod agent_sandbox;
pub mod cluster;
mod docker;
mod exec;
mod leases;
mod watch;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

/// One fake API server and the containers it runs; dropping it removes them.
pub struct FakeApi {
    pub addr: SocketAddr,
    state: Arc<Fake>,
    server: tokio::task::JoinHandle<()>,
}

pub(crate) struct Fake {
    /// Speaks only v4 (no stdin close).
    pub(crate) v4_only: bool,
    /// The label every container of this fake carries, for cleanup.
    pub(crate) tag: String,
    pods: Mutex<BTreeMap<(String, String), Stored>>,
    policies: Mutex<BTreeMap<(String, String), NetworkPolicy>>,
    version: std::sync::atomic::AtomicU64,
    /// Whether the fake's network plugin enforces NetworkPolicy.
    pub(crate) enforcing: std::sync::atomic::AtomicBool,
    /// The cluster's rules beyond pods: namespaces, RBAC (cluster.rs).
    pub(crate) cluster: cluster::Cluster,
    leases: leases::Leases,
    /// Every change of a pod, for `?watch=true` (watch.rs).
    pub(crate) watches: watch::Watches,
    /// agent-sandbox's CRDs and controller, when installed (agent_sandbox.rs).
    agent_sandbox: Arc<agent_sandbox::AgentSandbox>,
}

struct Stored {
    pod: Pod,
    container: String,
}

impl FakeApi {
    pub async fn start(v4_only: bool) -> anyhow::Result<FakeApi> {
        let tag = format!("{}-{}", std::process::id(), rand_suffix());
        let state = Arc::new(Fake {
            v4_only,
            tag,
            pods: Mutex::default(),
            policies: Mutex::default(),
            version: 1.into(),
            enforcing: true.into(),
            cluster: cluster::Cluster::default(),
            leases: leases::Leases::default(),
            watches: watch::Watches::default(),
            agent_sandbox: Arc::default(),
        });
        let app = axum::Router::new()
            .route(
                "/api/v1/namespaces/{ns}/pods",
                get(list_pods).post(create_pod),
            )
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}",
                get(get_pod).delete(delete_pod).patch(cluster::patch_pod),
            )
            .route("/api/v1/namespaces/{ns}/pods/{name}/exec", get(exec::exec))
            .route(
                "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
                axum::routing::post(create_policy),
            )
            .route(
                "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}",
                get(get_policy),
            )
            .merge(cluster::routes())
            .merge(leases::routes())
            .merge(agent_sandbox::routes())
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            // TCP_NODELAY, as a Go API server has by default: without it, Nagle's algorithm
            // holds an exec WebSocket's small frames for the client's delayed ACK (~40 ms a
            // shell command, measured by `sandboxd bench kubernetes`).
            use axum::serve::ListenerExt as _;
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeApi {
            addr,
            state,
            server,
        })
    }

    /// A kube client of this server (plain HTTP on loopback).
    pub fn client(&self) -> anyhow::Result<kube::Client> {
        sandboxd_kubernetes::install_tls_provider();
        let uri: axum::http::Uri = format!("http://{}", self.addr).parse()?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = "sandboxd".into();
        Ok(kube::Client::try_from(config)?)
    }

    /// Whether the fake's network plugin enforces NetworkPolicy from now on (for pods
    /// created after this).
    pub fn set_enforcing(&self, on: bool) {
        self.state
            .enforcing
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The cluster's rules beyond pods (namespaces, RBAC).
    pub fn cluster(&self) -> &cluster::Cluster {
        &self.state.cluster
    }

    /// Marks a pod evicted, as the kubelet does under node pressure.
    pub fn evict(&self, ns: &str, name: &str) {
        self.kubelet_says(ns, name, |pod| {
            if let Some(status) = pod.status.as_mut() {
                status.phase = Some("Failed".into());
                status.reason = Some("Evicted".into());
                status.message = Some("The node was low on resource: memory.".into());
            }
        });
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.server.abort();
        docker::remove_tagged(&self.state.tag);
    }
}

fn rand_suffix() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{n:x}")
}

/// A `metav1.Status` error, as the API server answers.
pub(crate) fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16()
    });
    (code, Json(body)).into_response()
}

pub(crate) fn key(ns: &str, name: &str) -> (String, String) {
    (ns.to_string(), name.to_string())
}

impl Fake {
    fn next_version(&self) -> String {
        self.version
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_string()
    }

    /// The container of a pod, when the pod exists.
    pub(crate) fn container(&self, ns: &str, name: &str) -> Option<String> {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.get(&key(ns, name)).map(|s| s.container.clone())
    }

    /// Whether a pod exists and runs (not evicted).
    pub(crate) fn running(&self, ns: &str, name: &str) -> bool {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.get(&key(ns, name)).is_some_and(|s| {
            s.pod.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Running")
        })
    }

    fn selected_by_policy(&self, ns: &str, labels: &BTreeMap<String, String>) -> bool {
        let policies = self.policies.lock().unwrap_or_else(|e| e.into_inner());
        policies.iter().any(|((pns, _), p)| {
            let Some(spec) = p.spec.as_ref() else {
                return false;
            };
            let types = spec.policy_types.clone().unwrap_or_default();
            let denies_all = types.iter().any(|t| t == "Ingress")
                && types.iter().any(|t| t == "Egress")
                && spec.ingress.as_ref().is_none_or(|r| r.is_empty())
                && spec.egress.as_ref().is_none_or(|r| r.is_empty());
            let want = spec
                .pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone())
                .unwrap_or_default();
            pns == ns && denies_all && want.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
    }
}

/// Equality-based selectors only (`a=b,c=d`), which is all sandboxd sends.
fn matches(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    selector
        .split(',')
        .filter(|s| !s.is_empty())
        .all(|req| match req.split_once('=') {
            Some((k, v)) => labels.get(k).map(String::as_str) == Some(v),
            None => false,
        })
}

pub(crate) fn with_kind(pod: &Pod) -> Value {
    let mut v = serde_json::to_value(pod).unwrap_or(Value::Null);
    v["kind"] = json!("Pod");
    v["apiVersion"] = json!("v1");
    v
}

async fn create_pod(
    State(fake): State<Arc<Fake>>,
    Path(ns): Path<String>,
    RawQuery(query): RawQuery,
    Json(mut pod): Json<Pod>,
) -> Response {
    if let Some(refusal) = fake.cluster.refusal(&ns, "create", "pods") {
        return refusal;
    }
    if let Err(why) = docker::restricted(&pod) {
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!("violates PodSecurity \"restricted:latest\": {why}"),
        );
    }
    // A dry run is admission only (the policy rule below is the fake's, not a server's).
    if cluster::dry_run(query.as_deref()) {
        pod.metadata.namespace = Some(ns);
        return (StatusCode::CREATED, Json(with_kind(&pod))).into_response();
    }
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    if !fake.selected_by_policy(&ns, &labels) {
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "this fake runs only pods a deny-all NetworkPolicy selects",
        );
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    if fake.container(&ns, &name).is_some() {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("pods \"{name}\" already exists"),
        );
    }
    let network = if fake.enforcing.load(std::sync::atomic::Ordering::Relaxed) {
        "none"
    } else {
        "bridge"
    };
    let container = match docker::run(&pod, &fake.tag, network).await {
        Ok(c) => c,
        Err(e) => return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &e),
    };
    pod.metadata.namespace = Some(ns.clone());
    pod.metadata.resource_version = Some(fake.next_version());
    pod.metadata.uid = Some(container.clone());
    pod.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    // Created, not yet seen by a kubelet: the first read after this one finds it running.
    pod.status = Some(serde_json::from_value(json!({"phase": "Pending"})).unwrap_or_default());
    let body = with_kind(&pod);
    let mut running = pod;
    running.status = serde_json::from_value(json!({"phase": "Running", "containerStatuses": [{
        "name": "sandbox", "image": "", "imageID": "", "ready": true, "restartCount": 0,
        "state": {"running": {}}}]}))
    .ok();
    let mut pods = fake.pods.lock().unwrap_or_else(|e| e.into_inner());
    fake.watches
        .changed(&fake.version, &ns, "ADDED", &mut running);
    pods.insert(
        key(&ns, &name),
        Stored {
            pod: running,
            container,
        },
    );
    (StatusCode::CREATED, Json(body)).into_response()
}

async fn get_pod(
    State(fake): State<Arc<Fake>>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let pods = fake.pods.lock().unwrap_or_else(|e| e.into_inner());
    match pods.get(&key(&ns, &name)) {
        Some(s) => Json(with_kind(&s.pod)).into_response(),
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("pods \"{name}\" not found"),
        ),
    }
}

async fn list_pods(
    State(fake): State<Arc<Fake>>,
    Path(ns): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    if watch::wanted(&query) {
        return watch::serve(&fake, ns, &query);
    }
    let selector = url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "labelSelector")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let pods = fake.pods.lock().unwrap_or_else(|e| e.into_inner());
    let items: Vec<Value> = pods
        .iter()
        .filter(|((pns, _), s)| {
            pns == &ns
                && matches(
                    &selector,
                    s.pod.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
                )
        })
        .map(|(_, s)| with_kind(&s.pod))
        .collect();
    Json(json!({"kind": "PodList", "apiVersion": "v1",
                "metadata": {"resourceVersion": fake.next_version()}, "items": items}))
    .into_response()
}

async fn delete_pod(
    State(fake): State<Arc<Fake>>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let stored = fake
        .pods
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&key(&ns, &name));
    match stored {
        Some(mut s) => {
            docker::remove(&s.container);
            fake.watches
                .changed(&fake.version, &ns, "DELETED", &mut s.pod);
            Json(with_kind(&s.pod)).into_response()
        }
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("pods \"{name}\" not found"),
        ),
    }
}

async fn create_policy(
    State(fake): State<Arc<Fake>>,
    Path(ns): Path<String>,
    Json(policy): Json<NetworkPolicy>,
) -> Response {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let mut policies = fake.policies.lock().unwrap_or_else(|e| e.into_inner());
    if policies.contains_key(&key(&ns, &name)) {
        return status(StatusCode::CONFLICT, "AlreadyExists", "exists");
    }
    policies.insert(key(&ns, &name), policy.clone());
    let mut v = serde_json::to_value(&policy).unwrap_or(Value::Null);
    v["kind"] = json!("NetworkPolicy");
    v["apiVersion"] = json!("networking.k8s.io/v1");
    (StatusCode::CREATED, Json(v)).into_response()
}

async fn get_policy(
    State(fake): State<Arc<Fake>>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let policies = fake.policies.lock().unwrap_or_else(|e| e.into_inner());
    match policies.get(&key(&ns, &name)) {
        Some(p) => {
            let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
            v["kind"] = json!("NetworkPolicy");
            v["apiVersion"] = json!("networking.k8s.io/v1");
            Json(v).into_response()
        }
        None => status(StatusCode::NOT_FOUND, "NotFound", "not found"),
    }
}
