//! agent-sandbox in the fake API server: its CRDs served (discovery of
//! `extensions.agents.x-k8s.io/v1beta1` and `agents.x-k8s.io/v1beta1`, and create, get, list
//! by label, replace and delete of SandboxTemplate, SandboxWarmPool, SandboxClaim and
//! Sandbox), only after `install_agent_sandbox` (a fake starts without them, as a cluster
//! without agent-sandbox), and a minimal controller (controller.rs) that is a client of this
//! API as the real one is of a cluster, and can be made to bind a claim to a pod that is not
//! its Sandbox's (`misbind_next`). Objects are kept as JSON, as a CRD's are.

mod controller;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::{Fake, FakeApi, status};

pub(crate) const EXT: &str = "extensions.agents.x-k8s.io";
pub(crate) const CORE: &str = "agents.x-k8s.io";
const KINDS: [(&str, &str, &str); 4] = [
    ("sandboxtemplates", "SandboxTemplate", EXT),
    ("sandboxwarmpools", "SandboxWarmPool", EXT),
    ("sandboxclaims", "SandboxClaim", EXT),
    ("sandboxes", "Sandbox", CORE),
];

/// `(plural, namespace, name)`.
pub(crate) type Key = (String, String, String);

/// The CRDs' objects and whether they are installed.
#[derive(Default)]
pub struct AgentSandbox {
    installed: AtomicBool,
    pub(crate) objects: Mutex<BTreeMap<Key, Value>>,
    version: AtomicU64,
    /// Woken at every write, so the controller acts at once.
    pub(crate) wake: tokio::sync::Notify,
    /// The pod the next cold claim is wrongly bound to (controller.rs).
    pub(crate) misbind: Mutex<Option<String>>,
}

impl FakeApi {
    /// Installs agent-sandbox's CRDs from now on, and its controller unless `controller` is
    /// false (CRDs installed, controller down: claims are never bound).
    pub fn install_agent_sandbox(&self, controller: bool) -> anyhow::Result<()> {
        self.state
            .agent_sandbox
            .installed
            .store(true, Ordering::SeqCst);
        if controller {
            let store = Arc::downgrade(&self.state.agent_sandbox);
            tokio::spawn(controller::run(store, self.client()?));
        }
        Ok(())
    }

    /// Binds the next claim that would be a cold start to a Sandbox naming `pod` as its pod,
    /// a pod that Sandbox does not own (controller.rs).
    pub fn misbind_next(&self, pod: &str) {
        let mut next = self
            .state
            .agent_sandbox
            .misbind
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *next = Some(pod.to_string());
    }

    /// Stores an object of a kind (by plural) as someone else writing it would.
    pub fn agent_sandbox_put(&self, plural: &str, ns: &str, obj: Value) {
        self.state.agent_sandbox.put(plural, ns, obj);
    }

    /// Deletes an object of a kind (by plural) as someone else would.
    pub fn agent_sandbox_delete(&self, plural: &str, ns: &str, name: &str) {
        self.state.agent_sandbox.remove(plural, ns, name);
    }

    /// Every stored object of a kind (by plural) in a namespace, as JSON.
    pub fn agent_sandbox_objects(&self, plural: &str, ns: &str) -> Vec<Value> {
        self.state.agent_sandbox.all(plural, ns)
    }
}

impl AgentSandbox {
    pub(crate) fn all(&self, plural: &str, ns: &str) -> Vec<Value> {
        let objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        objects
            .iter()
            .filter(|((p, n, _), _)| p == plural && n == ns)
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub(crate) fn get(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        objects.get(&key(plural, ns, name)).cloned()
    }

    /// Stores an object (created or changed), with a new resourceVersion.
    pub(crate) fn put(&self, plural: &str, ns: &str, mut obj: Value) -> Value {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let v = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        obj["metadata"]["resourceVersion"] = json!(v.to_string());
        obj["metadata"]["namespace"] = json!(ns);
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{plural}-{name}-{v}"));
            obj["metadata"]["creationTimestamp"] =
                json!(k8s_openapi::jiff::Timestamp::now().to_string());
        }
        if let Some((_, kind, group)) = KINDS.iter().find(|(p, _, _)| *p == plural) {
            obj["kind"] = json!(kind);
            obj["apiVersion"] = json!(format!("{group}/v1beta1"));
        }
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        objects.insert(key(plural, ns, &name), obj.clone());
        drop(objects);
        self.wake.notify_one();
        obj
    }

    pub(crate) fn remove(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let mut objects = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        let gone = objects.remove(&key(plural, ns, name));
        drop(objects);
        self.wake.notify_one();
        gone
    }
}

pub(crate) fn key(plural: &str, ns: &str, name: &str) -> Key {
    (plural.to_string(), ns.to_string(), name.to_string())
}

pub(crate) fn routes() -> axum::Router<Arc<Fake>> {
    let mut r = axum::Router::new();
    for group in [EXT, CORE] {
        let base = format!("/apis/{group}/v1beta1");
        r = r
            .route(&base, get(move |s: State<Arc<Fake>>| discovery(s, group)))
            .route(
                &format!("{base}/namespaces/{{ns}}/{{plural}}"),
                get(list).post(create),
            )
            .route(
                &format!("{base}/namespaces/{{ns}}/{{plural}}/{{name}}"),
                get(read).put(replace).delete(delete),
            );
    }
    r
}

fn not_found(what: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{what} not found"),
    )
}

/// The plural if the CRDs are installed and it is one of theirs.
fn served(fake: &Fake, plural: &str) -> bool {
    fake.agent_sandbox.installed.load(Ordering::SeqCst)
        && KINDS.iter().any(|(p, _, _)| *p == plural)
}

async fn discovery(State(fake): State<Arc<Fake>>, group: &'static str) -> Response {
    if !fake.agent_sandbox.installed.load(Ordering::SeqCst) {
        return not_found("the server could not find the requested resource");
    }
    let resources: Vec<Value> = KINDS
        .iter()
        .filter(|(_, _, g)| *g == group)
        .map(|(plural, kind, _)| {
            json!({"name": plural, "singularName": kind.to_lowercase(), "namespaced": true,
                   "kind": kind, "verbs": ["create", "delete", "get", "list", "update", "watch"]})
        })
        .collect();
    Json(json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": format!("{group}/v1beta1"), "resources": resources}))
    .into_response()
}

/// Equality selectors only (`a=b,c=d`), which is all sandboxd sends.
fn selected(query: Option<&str>, obj: &Value) -> bool {
    let selector = url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "labelSelector")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let labels = &obj["metadata"]["labels"];
    selector
        .split(',')
        .filter(|s| !s.is_empty())
        .all(|req| match req.split_once('=') {
            Some((k, v)) => labels[k].as_str() == Some(v),
            None => false,
        })
}

async fn list(
    State(fake): State<Arc<Fake>>,
    Path((ns, plural)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    if !served(&fake, &plural) {
        return not_found(&plural);
    }
    let items: Vec<Value> = fake
        .agent_sandbox
        .all(&plural, &ns)
        .into_iter()
        .filter(|o| selected(query.as_deref(), o))
        .collect();
    let version = fake
        .agent_sandbox
        .version
        .load(Ordering::SeqCst)
        .to_string();
    Json(json!({"kind": "List", "apiVersion": "v1",
                "metadata": {"resourceVersion": version}, "items": items}))
    .into_response()
}

async fn create(
    State(fake): State<Arc<Fake>>,
    Path((ns, plural)): Path<(String, String)>,
    Json(obj): Json<Value>,
) -> Response {
    if !served(&fake, &plural) {
        return not_found(&plural);
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    if name.is_empty() || obj["spec"].is_null() {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "metadata.name and spec are required",
        );
    }
    if fake.agent_sandbox.get(&plural, &ns, name).is_some() {
        let msg = format!("{plural} \"{name}\" already exists");
        return status(StatusCode::CONFLICT, "AlreadyExists", &msg);
    }
    let stored = fake.agent_sandbox.put(&plural, &ns, obj);
    (StatusCode::CREATED, Json(stored)).into_response()
}

async fn read(
    State(fake): State<Arc<Fake>>,
    Path((ns, plural, name)): Path<(String, String, String)>,
) -> Response {
    match fake.agent_sandbox.get(&plural, &ns, &name) {
        Some(o) if served(&fake, &plural) => Json(o).into_response(),
        _ => not_found(&format!("{plural} \"{name}\"")),
    }
}

/// PUT: the whole object; its resourceVersion must be the stored one; status is kept (the
/// status subresource is the controller's).
async fn replace(
    State(fake): State<Arc<Fake>>,
    Path((ns, plural, name)): Path<(String, String, String)>,
    Json(mut obj): Json<Value>,
) -> Response {
    let Some(have) = fake
        .agent_sandbox
        .get(&plural, &ns, &name)
        .filter(|_| served(&fake, &plural))
    else {
        return not_found(&format!("{plural} \"{name}\""));
    };
    if obj["metadata"]["resourceVersion"] != have["metadata"]["resourceVersion"] {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            "the object has been modified",
        );
    }
    obj["metadata"]["uid"] = have["metadata"]["uid"].clone();
    obj["metadata"]["creationTimestamp"] = have["metadata"]["creationTimestamp"].clone();
    if !have["status"].is_null() {
        obj["status"] = have["status"].clone();
    }
    Json(fake.agent_sandbox.put(&plural, &ns, obj)).into_response()
}

/// DELETE: gone at once (no finalizers); the controller deletes what it owned.
async fn delete(
    State(fake): State<Arc<Fake>>,
    Path((ns, plural, name)): Path<(String, String, String)>,
) -> Response {
    if !served(&fake, &plural) {
        return not_found(&plural);
    }
    match fake.agent_sandbox.remove(&plural, &ns, &name) {
        Some(o) => Json(o).into_response(),
        None => not_found(&format!("{plural} \"{name}\"")),
    }
}
