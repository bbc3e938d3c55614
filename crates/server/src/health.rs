//! /healthz (the process answers) and /readyz (the runtime's own checks — for Docker, engine
//! reachable and image present — and the store writable), both unauthenticated and saying nothing about users or sessions.
//!
//! /healthz stays 200 while the store is down: it is what a supervisor restarts a process
//! on, and restarting every replica because their database restarts helps nobody. /readyz
//! is what a load balancer routes on: 503 with `checks.store` saying why, until it is back.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use crate::AppState;

/// How long /readyz waits for the store's write check.
const STORE_PING: std::time::Duration = std::time::Duration::from_secs(3);
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
    // A database that does not answer (a black-holed host) must not hold the probe past
    // the prober's own timeout: it is reported down instead.
    let ping = tokio::time::timeout(STORE_PING, st.store.ping()).await;
    record(
        "store",
        match ping {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!(
                "the store did not answer within {} s",
                STORE_PING.as_secs()
            )),
        },
    );
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
