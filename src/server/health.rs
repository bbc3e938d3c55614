//! /healthz (the process answers) and /readyz (engine reachable, image present, store
//! writable), both unauthenticated and saying nothing about users or sessions.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use super::AppState;
use super::types::Health;
use crate::sandbox::docker::DockerRuntime;

/// What readiness asks of the runtime.
#[async_trait]
pub trait Readiness: Send + Sync {
    async fn engine(&self) -> Result<(), String>;
    async fn image(&self) -> Result<(), String>;
}

#[async_trait]
impl Readiness for DockerRuntime {
    async fn engine(&self) -> Result<(), String> {
        self.engine_version()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn image(&self) -> Result<(), String> {
        match self.image_present().await {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "the sandbox image {} is missing; run `sandboxd image build`",
                self.image()
            )),
            Err(e) => Err(e.to_string()),
        }
    }
}

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
    record("engine", st.ready.engine().await);
    record("image", st.ready.image().await);
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
