//! The audit log's server side: `Who` (the actor, the request id the access log gave the
//! request, the client address), `record` (one entry appended, bounded by `[audit]`), and
//! `GET /v1/audit` (admins only: anyone else gets 404), paged by cursor, or the whole log
//! as JSON lines (`?format=jsonl`, streamed a page at a time).
//!
//! What is recorded, and where: key use after an hour without one (`auth.rs`), web sign-in
//! and failure (`ui/login.rs`), user creation, key rotation and user removal (`admin.rs`;
//! `sandboxd users` on the host records as `cli`), session creation (with its limits and
//! backend handle: `sessions::create` for /v1, runs and E2B, `mcp_quota.rs` for /mcp
//! sandboxes) and end (whoever ends a row goes through `end_session` here: a request by its
//! actor, the reaper, upkeep and sweeps as `system`), an admin's action on another
//! user's session (`sessions::owned_row`), egress policy and credential changes
//! (`egress.rs`, `egress_credentials.rs`). Details never hold a key, a token, a credential's
//! value or a command.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::body::Body;
use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiQuery, ErrorCode, ErrorResponses};
use crate::proxies::ClientAddr;
use crate::types::time;
use sandboxd_core::config::AuditConfig;
use sandboxd_core::store::audit::MAX_AUDIT_PAGE;
use sandboxd_core::store::{
    AuditBound, AuditEntry, AuditQuery, NewAudit, SessionRow, Store, StoreError, now_ms,
};

/// The request id the access log gave a request (also its `x-request-id` answer header).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Who made a request, for its audit entries.
#[derive(Debug, Clone, Default)]
pub struct Who {
    pub actor: String,
    pub request_id: String,
    pub client: String,
}

impl Who {
    /// The same request, acting as `actor` (a sign-in names its user once the key is known).
    pub fn as_actor(&self, actor: &str) -> Who {
        Who {
            actor: actor.to_string(),
            ..self.clone()
        }
    }

    /// `sandboxd users` on the host.
    pub fn cli() -> Who {
        Who {
            actor: "cli".into(),
            ..Default::default()
        }
    }

    /// The service itself (an idle session's end, a reconcile).
    pub fn system() -> Who {
        Who {
            actor: "system".into(),
            ..Default::default()
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Who {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let ext = &parts.extensions;
        if let Some(c) = ext.get::<Caller>() {
            return Ok(c.who.clone());
        }
        let client = ext
            .get::<ClientAddr>()
            .map(|c| c.0.to_string())
            .or_else(|| {
                ext.get::<ConnectInfo<SocketAddr>>()
                    .map(|c| c.0.ip().to_canonical().to_string())
            });
        Ok(Who {
            actor: "-".to_string(),
            request_id: ext
                .get::<RequestId>()
                .map(|r| r.0.clone())
                .unwrap_or_default(),
            client: client.unwrap_or_default(),
        })
    }
}

/// The bound of the log under `[audit]` at `now`.
fn bound(cfg: &AuditConfig, now: i64) -> AuditBound {
    let keep_ms = i64::try_from(cfg.retention_days.saturating_mul(86_400_000)).unwrap_or(i64::MAX);
    AuditBound {
        before: now.saturating_sub(keep_ms),
        max_rows: cfg.max_rows,
    }
}

/// Appends one entry; a store that fails is logged (the action it records has happened).
pub async fn record_in(
    store: &dyn Store,
    cfg: &AuditConfig,
    who: &Who,
    action: &str,
    target: &str,
    details: serde_json::Value,
) {
    let now = now_ms();
    let entry = NewAudit {
        at: now,
        actor: who.actor.clone(),
        action: action.to_string(),
        target: target.to_string(),
        request_id: who.request_id.clone(),
        client: who.client.clone(),
        details,
    };
    if let Err(e) = store.append_audit(&entry, bound(cfg, now)).await {
        tracing::error!(action, target, error = %e, "cannot append to the audit log");
    }
}

/// `record_in` with the service's store and config.
pub async fn record(
    st: &AppState,
    who: &Who,
    action: &str,
    target: &str,
    details: serde_json::Value,
) {
    record_in(
        st.store.as_ref(),
        &st.config.audit,
        who,
        action,
        target,
        details,
    )
    .await;
}

/// Ends a session's row for `reason`, and when this call is the one that ended it (not an
/// earlier end), records `session.end` by `who`. Every path that ends a row (a request, the
/// idle reaper, the upkeep, a sweep of gone replicas, an MCP sandbox's close) comes through
/// here, so the log holds each end exactly once. The row is read back for its details.
pub async fn end_session(
    store: &dyn Store,
    cfg: &AuditConfig,
    who: &Who,
    row_id: &str,
    reason: &str,
) -> Result<bool, StoreError> {
    if !store.end_session(row_id, reason, now_ms()).await? {
        return Ok(false);
    }
    let row = store.session(row_id).await.ok().flatten();
    record_end(store, cfg, who, row_id, reason, row.as_ref()).await;
    Ok(true)
}

/// The `session.end` entry of a row that has just ended (`row`: as read after its end, for
/// the details; None if it could not be read). For a store call that ends rows by itself.
pub async fn record_end(
    store: &dyn Store,
    cfg: &AuditConfig,
    who: &Who,
    row_id: &str,
    reason: &str,
    row: Option<&SessionRow>,
) {
    let details = serde_json::json!({
        "owner": row.map(|r| r.owner.as_str()),
        "kind": row.map(|r| r.kind),
        "reason": reason,
        "handle": row.and_then(|r| r.container_id.as_deref()),
    });
    record_in(store, cfg, who, "session.end", row_id, details).await;
}

/// `end_session` with the service's store and config.
pub async fn end(st: &AppState, who: &Who, row_id: &str, reason: &str) -> Result<bool, StoreError> {
    end_session(st.store.as_ref(), &st.config.audit, who, row_id, reason).await
}

/// One audit entry.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AuditView {
    /// Its sequence number: the cursor.
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// A user's name; `-` before authentication, `system` for the service, `cli` for `sandboxd users`.
    pub actor: String,
    /// What happened, e.g. `user.create`, `session.end`, `sign_in.failed`.
    pub action: String,
    /// The object acted on: a user's name, a session id, a host.
    pub target: String,
    pub request_id: String,
    pub client: String,
    /// What else is known (limits, handles, policies); never a secret.
    pub details: serde_json::Value,
}

impl From<AuditEntry> for AuditView {
    fn from(e: AuditEntry) -> Self {
        let n = e.entry;
        AuditView {
            seq: e.seq,
            at: time(n.at),
            actor: n.actor,
            action: n.action,
            target: n.target,
            request_id: n.request_id,
            client: n.client,
            details: n.details,
        }
    }
}

/// A page of the log.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AuditPage {
    pub entries: Vec<AuditView>,
    /// Pass as `cursor` (with the same `order`) for the next page; absent at the end.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// The `next_cursor` of the previous page (none: from the oldest, or with
    /// `order=newest` from the newest).
    #[param(pattern = "^([0-9]{1,18})?$")]
    pub cursor: Option<String>,
    /// `oldest` (default): oldest first; `newest`: newest first (the admin page's view).
    #[param(pattern = "^(oldest|newest)?$")]
    pub order: Option<String>,
    /// Page size, 1 to 1000 (default 100); ignored by `format=jsonl`, which returns everything.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// `json` (default): one page; `jsonl`: the whole log from `cursor` on, oldest first,
    /// one entry per line.
    #[param(pattern = "^(json|jsonl)?$")]
    pub format: Option<String>,
}

fn parse_cursor(cursor: Option<&str>) -> Result<Option<i64>, ApiError> {
    match cursor {
        None | Some("") => Ok(None),
        Some(c) => c.parse::<i64>().ok().filter(|n| *n >= 0).map(Some).ok_or_else(|| {
            ApiError::invalid("parameter `cursor`: not a cursor this server issued; pass `next_cursor` from the previous page")
        }),
    }
}

#[utoipa::path(get, path = "/v1/audit", tag = "users", params(AuditParams),
    responses((status = 200, description = "The audit log, a page at a time (admins only); with format=jsonl, every entry from `cursor` on as JSON lines (application/jsonl, one AuditView per line)",
        content((AuditPage = "application/json"), (String = "application/jsonl"))), ErrorResponses),
    security(("bearer" = [])))]
pub async fn list_audit(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<AuditParams>,
) -> Result<Response, ApiError> {
    if !caller.is_admin() {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "no such route for this key (it is for admins)",
        ));
    }
    let cursor = parse_cursor(q.cursor.as_deref())?;
    let newest_first = match q.order.as_deref() {
        None | Some("") | Some("oldest") => false,
        Some("newest") => true,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "parameter `order`: {other:?} is not oldest or newest"
            )));
        }
    };
    match q.format.as_deref() {
        None | Some("") | Some("json") => {}
        Some("jsonl") => return Ok(jsonl(st, cursor)),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "parameter `format`: {other:?} is not json or jsonl"
            )));
        }
    }
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_AUDIT_PAGE).contains(&limit) {
        return Err(ApiError::invalid(
            "parameter `limit`: must be between 1 and 1000",
        ));
    }
    let entries = st
        .store
        .audit_page(AuditQuery {
            after: if newest_first { None } else { cursor },
            before: if newest_first { cursor } else { None },
            newest_first,
            limit,
        })
        .await?;
    let next_cursor = (entries.len() == limit as usize)
        .then(|| entries.last().map(|e| e.seq.to_string()))
        .flatten();
    let page = AuditPage {
        entries: entries.into_iter().map(AuditView::from).collect(),
        next_cursor,
    };
    Ok(Json(page).into_response())
}

/// The whole log from `after` on, a page at a time, as JSON lines; a store failure midway
/// ends the body with an error line (the status was sent already).
fn jsonl(st: Arc<AppState>, after: Option<i64>) -> Response {
    let pages = futures::stream::unfold(Some(after), move |cursor| {
        let st = st.clone();
        async move {
            let after = cursor?;
            let q = AuditQuery {
                after,
                before: None,
                newest_first: false,
                limit: MAX_AUDIT_PAGE,
            };
            match st.store.audit_page(q).await {
                Ok(entries) if entries.is_empty() => None,
                Ok(entries) => {
                    let next = (entries.len() == MAX_AUDIT_PAGE as usize)
                        .then(|| entries.last().map(|e| e.seq));
                    let mut out = String::new();
                    for e in entries {
                        if let Ok(line) = serde_json::to_string(&AuditView::from(e)) {
                            out.push_str(&line);
                            out.push('\n');
                        }
                    }
                    Some((Ok::<_, std::io::Error>(out), next))
                }
                Err(e) => {
                    let line = serde_json::json!({"error": {"code": "store_unavailable", "message": e.to_string()}});
                    Some((Ok(format!("{line}\n")), None))
                }
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "application/jsonl; charset=utf-8")],
        Body::from_stream(pages),
    )
        .into_response()
}
