//! The HTTP side of the metrics: the layer that counts every request by its matched route
//! template (axum's `MatchedPath`, which a `Router::layer` sees on each route; a request no
//! route matched is `unmatched`), `GET /metrics` on the main address (an admin's key, like
//! the rest of the admin API: no key 401, a user's key 404), and the optional
//! `[server] metrics_listen` address that serves only `/metrics`, unauthenticated.

use std::sync::Arc;
use std::time::Instant;

use axum::Extension;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Metrics;
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorCode};

/// The path of the scrape, on both addresses.
pub const PATH: &str = "/metrics";

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Counts the request under its route template and status, with its time to the response
/// head (a stream's body is not waited for).
pub async fn track(State(metrics): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(req.method());
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let resp = next.run(req).await;
    metrics.http(method, route, resp.status().as_u16(), started.elapsed());
    resp
}

/// Whether the scraper asked for OpenMetrics (Prometheus does, among others).
fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"))
}

fn scrape(st: &AppState, headers: &HeaderMap) -> Response {
    let openmetrics = wants_openmetrics(headers);
    let census = st.backend.manager().census();
    match st.metrics.render(census, openmetrics) {
        Ok(body) => {
            let ctype = if openmetrics {
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
            } else {
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE
            };
            ([(header::CONTENT_TYPE, ctype)], body).into_response()
        }
        Err(_) => {
            ApiError::new(ErrorCode::Internal, "the metrics could not be encoded").into_response()
        }
    }
}

/// `GET /metrics` on the main address: admins only (another user's key gets 404, as for
/// every admin route; no key 401 from the auth layer).
pub async fn admin_scrape(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
) -> Response {
    if !caller.is_admin() {
        return ApiError::new(
            ErrorCode::NotFound,
            "no such route for this key (it is for admins)",
        )
        .into_response();
    }
    scrape(&st, &headers)
}

/// Serves `[server] metrics_listen`: `GET /metrics` for anyone who reaches the address,
/// 404 for every other path, until `shutdown`; the main address's connection bounds (header
/// and idle timeouts), with at most 64 connections.
pub async fn serve_open(listener: TcpListener, st: Arc<AppState>, shutdown: CancellationToken) {
    let mut bounds = crate::listen::Bounds::new(&st.config.server, None);
    bounds.max_connections = bounds.max_connections.min(64);
    let app = axum::Router::new()
        .route(
            PATH,
            axum::routing::get(
                |State(st): State<Arc<AppState>>, headers: HeaderMap| async move {
                    scrape(&st, &headers)
                },
            ),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "only GET /metrics is served here\n") })
        .with_state(st);
    crate::listen::serve(listener, app, bounds, shutdown).await;
}
