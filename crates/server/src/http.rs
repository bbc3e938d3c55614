//! The middleware around every route: the Host allow-list (DNS-rebinding guard), per-group
//! time limits, structured access logs with a request id and the client address, and JSON
//! answers for unknown routes and methods.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ErrorCode};
use crate::proxies::{ClientAddr, TrustedProxies};

/// Host names (without port) a request may name. IP literals are always accepted: DNS
/// rebinding needs a name, and any address that reaches the listener is one of ours.
#[derive(Debug, Clone)]
pub struct HostAllowList {
    names: Arc<Vec<String>>,
}

impl HostAllowList {
    pub fn new(extra: &[String]) -> Self {
        let mut names = vec!["localhost".to_string()];
        names.extend(extra.iter().map(|h| h.trim().to_ascii_lowercase()));
        Self {
            names: Arc::new(names),
        }
    }

    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        // "[::1]:8080", "127.0.0.1:8080", "name:8080", "name"
        let bare = if let Some(rest) = host.strip_prefix('[') {
            rest.split(']').next().unwrap_or("")
        } else {
            match host.rsplit_once(':') {
                Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
                _ => host.as_str(),
            }
        };
        if bare.parse::<IpAddr>().is_ok() {
            return true;
        }
        let bare = bare.strip_suffix('.').unwrap_or(bare);
        self.names.iter().any(|n| n == bare)
    }
}

pub async fn check_host(State(allow): State<HostAllowList>, req: Request, next: Next) -> Response {
    let host = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_string())
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(String::from)
        });
    match host {
        Some(h) if allow.allows(&h) => next.run(req).await,
        Some(h) => ApiError::new(
            ErrorCode::HostNotAllowed,
            format!(
                "Host {h:?} is not allowed; add it to [server] allowed_hosts if the service is reached by that name"
            ),
        )
        .into_response(),
        None => ApiError::new(ErrorCode::HostNotAllowed, "the request has no Host header")
            .into_response(),
    }
}

/// A time limit for one group of routes.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub Duration);

pub async fn deadline(State(d): State<Deadline>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(d.0, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::new(
            ErrorCode::Timeout,
            format!(
                "the request did not finish within {} s; use a shorter command timeout or split the work",
                d.0.as_secs()
            ),
        )
        .into_response(),
    }
}

/// Who made a request, put in the response extensions by the auth layer for the access log.
#[derive(Debug, Clone)]
pub struct AccessUser(pub String);

/// One structured log line per request (target `sandboxd::access`): no keys, no bodies.
/// `peer` is the TCP peer, `client` the address behind a trusted proxy (`proxies`), which
/// this layer, the outermost, works out once and puts in the request for the throttle.
pub async fn access_log(
    State(proxies): State<Arc<TrustedProxies>>,
    mut req: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let peer_ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let peer = peer_ip.map(|ip| ip.to_string()).unwrap_or_default();
    let client = match peer_ip {
        Some(ip) => {
            let client = proxies.client(ip, req.headers());
            req.extensions_mut().insert(ClientAddr(client));
            client.to_string()
        }
        None => String::new(),
    };
    let request_id = uuid::Uuid::new_v4().simple().to_string();
    req.extensions_mut()
        .insert(crate::audit::RequestId(request_id.clone()));
    let mut resp = next.run(req).await;
    let user = resp
        .extensions()
        .get::<AccessUser>()
        .map(|u| u.0.clone())
        .unwrap_or_default();
    tracing::info!(
        target: "sandboxd::access",
        request_id = %request_id,
        peer = %peer,
        client = %client,
        method = %method,
        path = %path,
        status = resp.status().as_u16(),
        user = %user,
        ms = start.elapsed().as_secs_f64() * 1000.0,
        "request"
    );
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

pub async fn not_found() -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        "no such route; the API is described at /v1/openapi.json",
    )
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "this route does not take that method; see /v1/openapi.json",
    )
}

/// A panic in a handler answers 500 in the API's shape instead of dropping the connection.
pub fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::new(
        ErrorCode::Internal,
        "sandboxd failed while handling this request",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        let a = HostAllowList::new(&["sandbox.example.org".into()]);
        for ok in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:8080",
            "[::1]:8080",
            "10.1.2.3",
            "sandbox.example.org:443",
            "SANDBOX.example.org.",
        ] {
            assert!(a.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example.com",
            "evil.example.com:8080",
            "localhost.evil.com",
            "",
        ] {
            assert!(!a.allows(bad), "{bad}");
        }
    }
}
