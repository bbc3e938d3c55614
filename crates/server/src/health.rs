//! /healthz (the process answers) and /readyz (the runtime's own checks — for Docker, engine
//! reachable and image present — and the store writable), both unauthenticated and saying nothing about users or sessions.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use crate::AppState;
use crate::types::Health;

#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "The server is up", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        checks: BTreeMap::new(),
    })
}

#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, description = "Ready to create sessions", body = Health),
              (status = 503, description = "Not ready; `checks` says what failed", body = Health)))]
pub async fn readyz(State(st): State<Arc<AppState>>) -> (StatusCode, Json<Health>) {
    let mut checks = BTreeMap::new();
    let mut ok = true;
    let mut record = |name: &str, r: Result<(), String>| {
        ok &= r.is_ok();
        checks.insert(name.to_string(), r.err().unwrap_or_else(|| "ok".into()));
    };
    if st.shutdown.is_cancelled() {
        record("server", Err("shutting down".into()));
    }
    for (name, result) in st.backend.manager().runtime().readiness().await {
        record(name, result);
    }
    record("store", st.store.ping().await.map_err(|e| e.to_string()));
    let status = if ok { "ok" } else { "not ready" };
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        Json(Health {
            status: status.into(),
            checks,
        }),
    )
}
