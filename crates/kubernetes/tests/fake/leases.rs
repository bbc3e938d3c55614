//! The fake's `coordination.k8s.io/v1` Leases in a namespace: create (409 when the name is
//! taken), get, a JSON merge patch (what a renewal sends) and delete, each 404 when the
//! Lease is not there, and subject to the cluster's namespaces and denied verbs
//! (cluster.rs). The server sets `creationTimestamp`, `uid` and `resourceVersion`, as an
//! API server does; it never expires a Lease (nothing in Kubernetes does: readers judge).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::{Fake, key, status};

/// The Leases, by namespace and name.
#[derive(Default)]
pub struct Leases(Mutex<BTreeMap<(String, String), Lease>>);

fn body(lease: &Lease) -> Value {
    let mut v = serde_json::to_value(lease).unwrap_or(Value::Null);
    v["kind"] = json!("Lease");
    v["apiVersion"] = json!("coordination.k8s.io/v1");
    v
}

fn not_found(name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("leases.coordination.k8s.io \"{name}\" not found"),
    )
}

impl Fake {
    /// The Lease as stored now (tests look at it without a client).
    pub(crate) fn lease(&self, ns: &str, name: &str) -> Option<Lease> {
        self.leases.0.lock().unwrap().get(&key(ns, name)).cloned()
    }
}

async fn create(
    State(fake): State<Arc<Fake>>,
    Path(ns): Path<String>,
    Json(mut lease): Json<Lease>,
) -> Response {
    if let Some(refusal) = fake.cluster.refusal(&ns, "create", "leases") {
        return refusal;
    }
    let name = lease.metadata.name.clone().unwrap_or_default();
    let mut leases = fake.leases.0.lock().unwrap();
    if leases.contains_key(&key(&ns, &name)) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            &format!("leases.coordination.k8s.io \"{name}\" already exists"),
        );
    }
    lease.metadata.namespace = Some(ns.clone());
    lease.metadata.uid = Some(format!("lease-{}", fake.next_version()));
    lease.metadata.resource_version = Some(fake.next_version());
    lease.metadata.creation_timestamp = Some(Time(Timestamp::now()));
    leases.insert(key(&ns, &name), lease.clone());
    (StatusCode::CREATED, Json(body(&lease))).into_response()
}

async fn read(State(fake): State<Arc<Fake>>, Path((ns, name)): Path<(String, String)>) -> Response {
    if let Some(refusal) = fake.cluster.refusal(&ns, "get", "leases") {
        return refusal;
    }
    match fake.lease(&ns, &name) {
        Some(l) => Json(body(&l)).into_response(),
        None => not_found(&name),
    }
}

/// `PATCH` with `application/merge-patch+json` (RFC 7386); metadata the server owns stays.
async fn patch(
    State(fake): State<Arc<Fake>>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Response {
    if let Some(refusal) = fake.cluster.refusal(&ns, "patch", "leases") {
        return refusal;
    }
    let merge = headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes() == b"application/merge-patch+json");
    let Some(patch) = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .filter(|_| merge)
    else {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            "a merge patch",
        );
    };
    let mut leases = fake.leases.0.lock().unwrap();
    let Some(stored) = leases.get_mut(&key(&ns, &name)) else {
        return not_found(&name);
    };
    let mut v = serde_json::to_value(&*stored).unwrap();
    super::cluster::merge_patch(&mut v, &patch);
    match serde_json::from_value::<Lease>(v) {
        Ok(mut lease) => {
            lease.metadata.name = stored.metadata.name.clone();
            lease.metadata.namespace = stored.metadata.namespace.clone();
            lease.metadata.uid = stored.metadata.uid.clone();
            lease.metadata.creation_timestamp = stored.metadata.creation_timestamp.clone();
            lease.metadata.resource_version = Some(fake.next_version());
            *stored = lease;
            Json(body(stored)).into_response()
        }
        Err(e) => status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", &e.to_string()),
    }
}

async fn delete(
    State(fake): State<Arc<Fake>>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    if let Some(refusal) = fake.cluster.refusal(&ns, "delete", "leases") {
        return refusal;
    }
    match fake.leases.0.lock().unwrap().remove(&key(&ns, &name)) {
        Some(l) => Json(body(&l)).into_response(),
        None => not_found(&name),
    }
}

pub(crate) fn routes() -> axum::Router<Arc<Fake>> {
    let base = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases";
    axum::Router::new().route(base, post(create)).route(
        &format!("{base}/{{name}}"),
        get(read).patch(patch).delete(delete),
    )
}
