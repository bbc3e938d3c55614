//! The API's errors: `{"error": {"code": "...", "message": "..."}}` with a stable set of
//! codes, and the extractors that turn malformed requests into them (naming the field).
//!
//! The codes are part of the API: clients branch on them, so one is never renamed or reused
//! for another meaning; new ones may be added. README.md lists them.

use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;

use sandboxd_core::sandbox::SandboxError;
use sandboxd_core::store::StoreError;

/// Every error code the API answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed; the message names the field. 403 with this code: the
    /// request asks for more than the caller may have (an egress policy wider than allowed).
    InvalidRequest,
    /// 400: the Host header is not in the allow-list.
    HostNotAllowed,
    /// 401: no valid API key.
    Unauthorized,
    /// 401 (as the last event of a stream): the key or sign-in the stream was opened with was
    /// rotated, removed, signed out or expired, so the stream was ended.
    CredentialRevoked,
    /// 403: a request made with the web UI's cookie lacks its CSRF token or comes from
    /// another origin.
    CsrfFailed,
    /// 404: no such object, or it belongs to someone else.
    NotFound,
    /// 405
    MethodNotAllowed,
    /// 409: the object is not in a state that allows this (e.g. the session ended).
    Conflict,
    /// 409: the run has no pending question to answer.
    NotWaiting,
    /// 413: the body is over the limit.
    PayloadTooLarge,
    /// 415: the body is not JSON where JSON is expected.
    UnsupportedMediaType,
    /// 429: a quota of the user; `quota` and `limit` say which.
    QuotaExceeded,
    /// 429: too many failed authentications from this address; retry later.
    RateLimited,
    /// 429: the user has `[server] streams_per_user` event streams and streamed execs open.
    TooManyStreams,
    /// 500
    Internal,
    /// 503: the server-wide session capacity is used up.
    CapacityUnavailable,
    /// 503: the container engine or the sandbox image is unavailable.
    SandboxUnavailable,
    /// 503: the server is shutting down.
    ShuttingDown,
    /// 503: the store (the database) cannot be reached now; retry after `Retry-After`.
    StoreUnavailable,
    /// 504: the request took longer than its time limit.
    Timeout,
}

impl ErrorCode {
    pub fn status(self) -> StatusCode {
        use ErrorCode::*;
        match self {
            InvalidRequest | HostNotAllowed => StatusCode::BAD_REQUEST,
            Unauthorized | CredentialRevoked => StatusCode::UNAUTHORIZED,
            CsrfFailed => StatusCode::FORBIDDEN,
            NotFound => StatusCode::NOT_FOUND,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Conflict | NotWaiting => StatusCode::CONFLICT,
            PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            QuotaExceeded | RateLimited | TooManyStreams => StatusCode::TOO_MANY_REQUESTS,
            Internal => StatusCode::INTERNAL_SERVER_ERROR,
            CapacityUnavailable | SandboxUnavailable | ShuttingDown | StoreUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Timeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// What was wrong and what to do about it.
    pub message: String,
    /// For `quota_exceeded`: the quota that was hit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<String>,
    /// For `quota_exceeded`: the quota's value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub detail: ErrorDetail,
    /// Seconds for Retry-After (429, and 503 when the store is unavailable).
    pub retry_after: Option<u64>,
    /// A status other than the code's (see `not_allowed`).
    pub status: Option<StatusCode>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            detail: ErrorDetail {
                code,
                message: message.into(),
                quota: None,
                limit: None,
            },
            retry_after: None,
            status: None,
        }
    }

    /// 403 with `invalid_request`: a well-formed request for more than the caller may have
    /// (an egress policy wider than the admin's or the user's quota). Retrying the same
    /// request never helps, so it is not a 429; the message names the rule that reaches too far.
    pub fn not_allowed(message: impl Into<String>) -> Self {
        let mut e = Self::new(ErrorCode::InvalidRequest, message);
        e.status = Some(StatusCode::FORBIDDEN);
        e
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    pub fn not_found(what: &str, id: &str) -> Self {
        Self::new(
            ErrorCode::NotFound,
            format!("no {what} {id:?}; list yours with GET /v1/{what}s"),
        )
    }

    pub fn quota(name: &str, limit: impl ToString, message: impl Into<String>) -> Self {
        let mut e = Self::new(ErrorCode::QuotaExceeded, message);
        e.detail.quota = Some(name.into());
        e.detail.limit = Some(limit.to_string());
        e
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        tracing::error!(error = %message, "internal error");
        Self::new(ErrorCode::Internal, format!("sandboxd failed: {message}"))
    }

    pub fn code(&self) -> ErrorCode {
        self.detail.code
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status.unwrap_or(self.detail.code.status());
        let mut resp = (
            status,
            axum::Json(ErrorBody {
                error: self.detail.clone(),
            }),
        )
            .into_response();
        if let Some(s) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sandboxd\""),
            );
        }
        resp
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::SessionQuota { limit, active } => ApiError::quota(
                "sessions",
                limit,
                format!(
                    "you have {active} sessions alive and your quota is {limit}; delete one (DELETE /v1/sessions/{{id}}) or ask the admin to raise it"
                ),
            ),
            StoreError::RunQuota { limit, active } => ApiError::quota(
                "runs",
                limit,
                format!(
                    "you have {active} runs in flight and your quota is {limit}; wait for one to end, cancel one (POST /v1/runs/{{id}}/cancel) or ask the admin to raise it"
                ),
            ),
            StoreError::CredentialQuota { limit } => ApiError::quota(
                "egress_credentials",
                limit,
                format!(
                    "you have {limit} egress credentials, the most [egress] user_credentials allows; remove one (DELETE /v1/egress/credentials/{{host}}) or ask the admin to raise it"
                ),
            ),
            StoreError::Unavailable(message) => {
                tracing::warn!(error = %message, "the store is unavailable");
                let mut e = ApiError::new(
                    ErrorCode::StoreUnavailable,
                    format!(
                        "sandboxd cannot reach its store (database) now; retry in {STORE_RETRY_SECS} s ({message})"
                    ),
                );
                e.retry_after = Some(STORE_RETRY_SECS);
                e
            }
            other => ApiError::internal(other),
        }
    }
}

/// Seconds a client is told to wait (`Retry-After`) when the store is unavailable: long
/// enough not to hammer a database that is restarting, short enough to notice it is back.
pub const STORE_RETRY_SECS: u64 = 2;

impl From<SandboxError> for ApiError {
    fn from(e: SandboxError) -> Self {
        use SandboxError::*;
        let code = match &e {
            BackendUnavailable { .. } | ImageMissing { .. } | Busy(_) => {
                ErrorCode::SandboxUnavailable
            }
            SandboxGone { .. } => ErrorCode::Conflict,
            SessionNotFound { .. } | NotFound { .. } => ErrorCode::NotFound,
            TooManySessions { .. } => ErrorCode::CapacityUnavailable,
            Refused { .. } => ErrorCode::QuotaExceeded,
            TooManySessionsForOwner { limit, .. } => {
                return ApiError::quota(
                    "sessions",
                    limit,
                    format!("{e}; delete a session of yours or ask the admin"),
                );
            }
            // The request was well-formed; the file system disagrees (a directory, a name
            // too long, a file over the cap, permission denied).
            FileTooLarge { .. } | FileOp { .. } | Conflict(_) => ErrorCode::Conflict,
            InvalidPath { .. } | Tar(_) | InvalidRequest(_) => ErrorCode::InvalidRequest,
            // The command timed out and its process tree could not be confirmed gone: still
            // a timeout to the client, with the message saying what was left.
            Timeout { .. } | KillUnconfirmed { .. } => ErrorCode::Timeout,
            Protocol { .. } | Backend { .. } => return ApiError::internal(e),
        };
        ApiError::new(code, e.to_string())
    }
}

/// A JSON body, parsed so that an error names the field at fault. Unknown fields are
/// refused by the target types (`deny_unknown_fields`).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|m| {
                let m = m.trim().to_ascii_lowercase();
                m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
            });
        if !is_json {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "send the body as JSON with Content-Type: application/json",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(body_error)?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Parses JSON and reports the path of the offending field.
///
/// A number such as `1841.0` is an integer to JSON Schema (and to every JavaScript client),
/// but serde refuses it for an integer field. So when the typed parse fails, integral floats
/// are made integers and the parse is tried once more; only a failed request pays for it.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let first = match serde_path_to_error::deserialize(de) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    if !first.inner().is_syntax()
        && !first.inner().is_eof()
        && let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(bytes)
        && integral_floats_to_ints(&mut value)
    {
        return serde_path_to_error::deserialize(value).map_err(field_error);
    }
    Err(field_error(first))
}

fn field_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        ApiError::invalid(format!("the body is not valid JSON: {inner}"))
    } else if path == "." || path.is_empty() {
        ApiError::invalid(format!("the JSON body is invalid: {inner}"))
    } else {
        ApiError::invalid(format!("field `{path}`: {inner}"))
    }
}

/// Turns every float with no fractional part that an i64 or u64 holds exactly into that
/// integer; says whether it changed anything. serde_json's parser caps nesting at 128 levels,
/// so the recursion is bounded.
fn integral_floats_to_ints(v: &mut serde_json::Value) -> bool {
    use serde_json::{Number, Value};
    match v {
        Value::Number(n) if n.is_f64() => {
            let Some(f) = n.as_f64() else { return false };
            // 2^63 and 2^64, exact as floats: below them the casts are exact for integral values.
            let two_63 = -(i64::MIN as f64);
            let int = if f.fract() != 0.0 || !f.is_finite() {
                None
            } else if (-two_63..two_63).contains(&f) {
                Some(Number::from(f as i64))
            } else if (0.0..2.0 * two_63).contains(&f) {
                Some(Number::from(f as u64))
            } else {
                None
            };
            match int {
                Some(i) => {
                    *n = i;
                    true
                }
                None => false,
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, i| integral_floats_to_ints(i) | changed),
        Value::Object(fields) => fields
            .values_mut()
            .fold(false, |changed, f| integral_floats_to_ints(f) | changed),
        _ => false,
    }
}

#[cfg(test)]
mod json_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        days: u32,
        cpus: Option<f64>,
        list: Option<Vec<i64>>,
    }

    #[test]
    fn integral_floats_are_integers_and_the_rest_is_still_refused() {
        let b: Body = parse_json(br#"{"days": 1841.0, "cpus": 2.0, "list": [-3.0, 4]}"#).unwrap();
        assert_eq!(b.days, 1841);
        assert_eq!(b.cpus, Some(2.0));
        assert_eq!(b.list, Some(vec![-3, 4]));
        for (body, want) in [
            (&br#"{"days": 1.5}"#[..], "field `days`"),
            (br#"{"days": -1.0}"#, "field `days`"),
            (br#"{"days": 1e300}"#, "field `days`"),
            (br#"{"days": 1, "extra": 2.0}"#, "extra"),
            (br#"{"days": "#, "not valid JSON"),
        ] {
            let err = parse_json::<Body>(body).unwrap_err().detail.message;
            assert!(
                err.contains(want),
                "{}: {err}",
                String::from_utf8_lossy(body)
            );
        }
    }
}

/// Maps a body-reading failure: over the limit is 413, anything else 400.
pub fn body_error(e: BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            "the request body is over the limit ([server] body_limit_kb for JSON, upload_limit_mb for uploads)",
        )
    } else {
        ApiError::invalid(format!("cannot read the request body: {}", e.body_text()))
    }
}

/// A raw body (uploads), bounded by the route's body limit.
pub struct ApiBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        Bytes::from_request(req, state)
            .await
            .map(ApiBody)
            .map_err(body_error)
    }
}

/// Query parameters, with errors naming the parameter.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|e: QueryRejection| {
                ApiError::invalid(format!("bad query parameters: {}", e.body_text()))
            })
    }
}

/// Path parameters.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|e: PathRejection| {
                ApiError::invalid(format!("bad path parameter: {}", e.body_text()))
            })
    }
}

/// Every error status a route may answer with, for the OpenAPI document.
#[derive(utoipa::IntoResponses)]
pub enum ErrorResponses {
    #[response(status = 400, description = "invalid_request or host_not_allowed")]
    BadRequest(#[to_schema] ErrorBody),
    #[response(status = 401, description = "unauthorized or credential_revoked")]
    Unauthorized(ErrorBody),
    #[response(status = 403, description = "csrf_failed")]
    Forbidden(ErrorBody),
    #[response(status = 404, description = "not_found")]
    NotFound(ErrorBody),
    #[response(status = 405, description = "method_not_allowed")]
    MethodNotAllowed(ErrorBody),
    #[response(status = 409, description = "conflict or not_waiting")]
    Conflict(ErrorBody),
    #[response(status = 413, description = "payload_too_large")]
    PayloadTooLarge(ErrorBody),
    #[response(status = 415, description = "unsupported_media_type")]
    UnsupportedMediaType(ErrorBody),
    #[response(
        status = 429,
        description = "quota_exceeded, rate_limited or too_many_streams"
    )]
    TooManyRequests(ErrorBody),
    #[response(status = 500, description = "internal")]
    Internal(ErrorBody),
    #[response(
        status = 503,
        description = "capacity_unavailable, sandbox_unavailable, shutting_down or store_unavailable"
    )]
    Unavailable(ErrorBody),
    #[response(status = 504, description = "timeout")]
    Timeout(ErrorBody),
}
