//! /v1/egress/credentials: a user's own secrets for the egress proxy (a thin shell over
//! `sandboxd_core::egress::user_credentials`). A user attaches a credential to one host
//! (`PUT /v1/egress/credentials/{host}`), lists theirs (hosts, headers and prefixes: never a
//! value) and removes one; an admin does the same for any user with `?user=NAME`. A user
//! never sees or touches another's: every route is scoped to the caller (or, for an admin,
//! the named user), so another user's host answers 404 like any object not theirs.
//!
//! A change takes effect for the next connection of the owner's running sessions: this
//! replica brings their injectors in line at once (egress_proxies::follow), another replica
//! at its next upkeep.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ErrorCode, ErrorResponses};
use sandboxd_core::config::egress::{CredentialValue, EgressPolicy};
use sandboxd_core::egress::user_credentials::{
    self, CredentialError, CredentialInfo, NewCredential,
};
use sandboxd_core::egress::vault::VaultError;
use sandboxd_core::store::{QuotaOverride, SessionState};

/// Whose credentials a request is about.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WhoseQuery {
    /// Admins only: the user (by name) whose credentials to act on; absent: the caller's.
    pub user: Option<String>,
}

/// A credential to attach. The value is write-only: no answer ever contains it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachCredential {
    /// The header the proxy sets on every request to the host, e.g. `Authorization`.
    #[schema(max_length = 64)]
    pub header: String,
    /// Written before the value, e.g. `"Bearer "`.
    #[serde(default)]
    #[schema(max_length = 64)]
    pub prefix: String,
    /// The secret (printable ASCII, at most 8 KiB).
    #[schema(max_length = 8192)]
    pub value: String,
    /// Also add it to plain `http://` requests (in cleartext); false: those are refused.
    #[serde(default)]
    pub allow_http: bool,
}

/// A credential as listed: never its value.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CredentialView {
    pub host: String,
    pub header: String,
    pub prefix: String,
    pub allow_http: bool,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl From<&CredentialInfo> for CredentialView {
    fn from(c: &CredentialInfo) -> Self {
        CredentialView {
            host: c.host.clone(),
            header: c.header.clone(),
            prefix: c.prefix.clone(),
            allow_http: c.allow_http,
            created_at: crate::types::time(c.created_ms),
        }
    }
}

impl From<CredentialError> for ApiError {
    fn from(e: CredentialError) -> Self {
        match e {
            CredentialError::Vault(VaultError::NoKey) => {
                ApiError::new(ErrorCode::Conflict, e.to_string())
            }
            CredentialError::Vault(v) => ApiError::internal(v),
            CredentialError::Invalid { .. } => ApiError::invalid(e.to_string()),
            CredentialError::NotAllowed(m) => ApiError::not_allowed(m),
            CredentialError::Store(s) => s.into(),
        }
    }
}

/// The owner a request acts for (id) and their quota: the caller, or for an admin the user
/// `?user=` names. A non-admin naming anyone but themselves gets 404.
async fn owner(
    st: &AppState,
    caller: &Caller,
    q: &WhoseQuery,
) -> Result<(String, QuotaOverride), ApiError> {
    match q.user.as_deref() {
        None => Ok((caller.id().to_string(), caller.user.quota.clone())),
        Some(name) if name == caller.user.name => {
            Ok((caller.id().to_string(), caller.user.quota.clone()))
        }
        Some(name) if caller.is_admin() => match st.store.user_by_name(name).await? {
            Some(u) => Ok((u.id, u.quota)),
            None => Err(ApiError::not_found("user", name)),
        },
        Some(name) => Err(ApiError::not_found("user", name)),
    }
}

/// Brings the owner's running sessions held here (API and /mcp) in line with their credentials.
async fn follow_owner(st: &AppState, owner: &str) {
    let rows = match st.store.active_sessions().await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list sessions to apply a credential change");
            return;
        }
    };
    for row in rows
        .iter()
        .filter(|r| r.owner == owner && r.state == SessionState::Running)
    {
        if let Some(session) = crate::egress_proxies::held_session(st, row).await {
            crate::egress_proxies::follow(st, &session, row).await;
        }
    }
}

#[utoipa::path(get, path = "/v1/egress/credentials", tag = "egress", params(WhoseQuery),
    responses((status = 200, description = "The user's egress credentials (never their values)", body = Vec<CredentialView>), ErrorResponses),
    security(("bearer" = [])))]
pub async fn list_credentials(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<WhoseQuery>,
) -> Result<Json<Vec<CredentialView>>, ApiError> {
    let (owner, _) = owner(&st, &caller, &q).await?;
    let list = user_credentials::list(st.store.as_ref(), &owner).await?;
    Ok(Json(list.iter().map(CredentialView::from).collect()))
}

#[utoipa::path(put, path = "/v1/egress/credentials/{host}", tag = "egress", request_body = AttachCredential,
    params(("host" = String, Path, description = "The exact destination host"), WhoseQuery),
    responses((status = 200, description = "Attached (replacing the user's credential for this host): the next connection of the user's sessions carries it", body = CredentialView), ErrorResponses),
    security(("bearer" = [])))]
pub async fn put_credential(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(host): ApiPath<String>,
    ApiQuery(q): ApiQuery<WhoseQuery>,
    ApiJson(body): ApiJson<AttachCredential>,
) -> Result<Json<CredentialView>, ApiError> {
    let (owner, quota) = owner(&st, &caller, &q).await?;
    let limit: EgressPolicy = quota
        .egress
        .unwrap_or_else(|| st.config.egress.widest.clone());
    let new = NewCredential {
        host,
        header: body.header,
        prefix: body.prefix,
        allow_http: body.allow_http,
        value: CredentialValue::new(&body.value),
    };
    let (info, _) =
        user_credentials::attach(st.store.as_ref(), &st.config.egress, &limit, &owner, new).await?;
    tracing::info!(target: sandboxd_core::egress::TRACE_TARGET, owner = %owner, host = %info.host,
        header = %info.header, "egress credential attached");
    let details =
        serde_json::json!({"owner": owner, "header": info.header, "allow_http": info.allow_http});
    crate::audit::record(
        &st,
        &caller.who,
        "egress.credential.put",
        &info.host,
        details,
    )
    .await;
    follow_owner(&st, &owner).await;
    Ok(Json(CredentialView::from(&info)))
}

#[utoipa::path(delete, path = "/v1/egress/credentials/{host}", tag = "egress",
    params(("host" = String, Path, description = "The exact destination host"), WhoseQuery),
    responses((status = 204, description = "Removed: the next connection of the user's sessions goes without it"), ErrorResponses),
    security(("bearer" = [])))]
pub async fn delete_credential(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(host): ApiPath<String>,
    ApiQuery(q): ApiQuery<WhoseQuery>,
) -> Result<StatusCode, ApiError> {
    let (owner, _) = owner(&st, &caller, &q).await?;
    if !user_credentials::remove(st.store.as_ref(), &owner, &host).await? {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "no egress credential for {host:?}; list yours with GET /v1/egress/credentials"
            ),
        ));
    }
    tracing::info!(target: sandboxd_core::egress::TRACE_TARGET, owner = %owner, host = %host,
        "egress credential removed");
    let details = serde_json::json!({"owner": owner});
    crate::audit::record(&st, &caller.who, "egress.credential.remove", &host, details).await;
    follow_owner(&st, &owner).await;
    Ok(StatusCode::NO_CONTENT)
}
