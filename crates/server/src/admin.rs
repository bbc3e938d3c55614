//! /v1/me and /v1/users: who the caller is, their quota and usage; the admin's view of
//! every user, and adding, removing and re-keying them (the flow of `accounts`, shared with
//! the CLI). A non-admin gets 404 from every /v1/users route, as for any object not theirs.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use crate::AppState;
use crate::accounts::{self, AccountError};
use crate::audit::{self, Who};
use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ErrorCode, ErrorResponses};
use crate::quota::Quota;
use crate::streams::Revoked;
use crate::types::*;
use sandboxd_core::store::{User, now_ms};

/// How long removing a user waits for each of their runs' endings to be recorded.
const RUN_CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

async fn view(st: &AppState, u: &User) -> Result<UserView, ApiError> {
    let q = Quota::resolve(&st.config.quotas, &u.quota, &st.config.limits);
    let now = now_ms();
    let usage = st.store.usage(&u.id, now).await?;
    // Read only for a user with a CPU quota: the figure is there to be set against it.
    let cpu_today = match q.cpu_seconds_per_day {
        0 => 0.0,
        _ => crate::cpu_quota::cpu_seconds_today(st.store.as_ref(), &u.id, now).await?,
    };
    Ok(UserView {
        id: u.id.clone(),
        name: u.name.clone(),
        admin: u.admin,
        key_prefix: u.key_prefix.clone(),
        key_created_at: time(u.key_created_at),
        created_at: time(u.created_at),
        last_used_at: u.last_used_at.map(time),
        expires_at: u.expires_at.map(time),
        quota: QuotaView {
            sessions: q.sessions,
            runs: q.runs,
            input_tokens_per_day: q.input_tokens_per_day,
            cpu_seconds_per_day: q.cpu_seconds_per_day,
            ceiling: (&q.ceiling).into(),
        },
        usage: UsageView {
            active_sessions: usage.active_sessions,
            active_mcp_sessions: usage.active_mcp_sessions,
            active_runs: usage.active_runs,
            input_tokens_today: usage.input_tokens_today,
            cpu_seconds_today: cpu_today,
        },
    })
}

#[utoipa::path(get, path = "/v1/me", tag = "users",
    responses((status = 200, description = "The caller, their quota and usage", body = UserView), ErrorResponses),
    security(("bearer" = [])))]
pub async fn me(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<UserView>, ApiError> {
    Ok(Json(view(&st, &caller.user).await?))
}

#[utoipa::path(get, path = "/v1/users", tag = "users",
    responses((status = 200, description = "Every user with quota and usage (admins only)", body = Vec<UserView>), ErrorResponses),
    security(("bearer" = [])))]
pub async fn users(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<UserView>>, ApiError> {
    admin_only(&caller)?;
    let mut out = Vec::new();
    for u in st.store.users().await? {
        out.push(view(&st, &u).await?);
    }
    Ok(Json(out))
}

fn admin_only(caller: &Caller) -> Result<(), ApiError> {
    if caller.is_admin() {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::NotFound,
            "no such route for this key (it is for admins)",
        ))
    }
}

impl From<AccountError> for ApiError {
    fn from(e: AccountError) -> Self {
        match e {
            AccountError::BadName(_) => ApiError::invalid(format!("field `name`: {e}")),
            AccountError::Exists(name) => ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "a user named {name:?} exists; POST /v1/users/{name}/rotate gives them a new key"
                ),
            ),
            AccountError::NoSuchUser(name) => ApiError::not_found("user", &name),
            AccountError::Store(e) => e.into(),
        }
    }
}

#[utoipa::path(post, path = "/v1/users", tag = "users", request_body = CreateUser,
    responses((status = 201, description = "The new user and their API key, shown only in this answer", body = NewKey), ErrorResponses),
    security(("bearer" = [])))]
pub async fn create_user(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    who: Who,
    ApiJson(body): ApiJson<CreateUser>,
) -> Result<(StatusCode, Json<NewKey>), ApiError> {
    admin_only(&caller)?;
    let (user, key) = accounts::add(
        st.store.as_ref(),
        &body.name,
        body.admin,
        accounts::expiry(body.expires_in_days),
        Default::default(),
    )
    .await?;
    let details = serde_json::json!({"admin": user.admin, "key_prefix": user.key_prefix, "expires_at": user.expires_at});
    audit::record(&st, &who, "user.create", &user.name, details).await;
    let user = view(&st, &user).await?;
    Ok((StatusCode::CREATED, Json(NewKey { user, key })))
}

#[utoipa::path(delete, path = "/v1/users/{name}", tag = "users",
    params(("name" = String, Path, description = "The user's name")),
    responses((status = 204, description = "The user is gone: their key stops working, their open streams end, their runs are cancelled, their sessions end and their containers are removed"), ErrorResponses),
    security(("bearer" = [])))]
pub async fn delete_user(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    who: Who,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    admin_only(&caller)?;
    if name == caller.user.name {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "you cannot remove yourself; another admin can, or use `sandboxd users rm`",
        ));
    }
    let user = st.store.user_by_name(&name).await?;
    let live = accounts::remove(st.store.as_ref(), &name).await?;
    let details = serde_json::json!({"sessions_ended": live.len()});
    audit::record(&st, &who, "user.remove", &name, details).await;
    if let Some(user) = &user {
        user_removed(&st, &user.id).await;
    }
    for row in live {
        if let Err(e) = st
            .backend
            .remove(&row.owner, row.runtime_id.as_deref())
            .await
        {
            // The reconciler removes what is left of an ended session later.
            tracing::warn!(session = %row.id, error = %e, "could not remove a removed user's container now");
        }
    }
    // Their /mcp sessions close and their MCP sandboxes go now, not at their idle timeout.
    if let Some(user) = user {
        st.mcp.remove_user(&user.id).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// What ends with a removed user in this process: their streams and long requests, and
/// their runs, which end `cancelled` (before their containers go, so not `failed`).
async fn user_removed(st: &AppState, user_id: &str) {
    st.streams.revoke_user(user_id, Revoked::UserRemoved);
    st.runs.cancel_owner(user_id, RUN_CANCEL_WAIT).await;
}

#[utoipa::path(post, path = "/v1/users/{name}/rotate", tag = "users",
    params(("name" = String, Path, description = "The user's name")),
    responses((status = 200, description = "The user's new API key, shown only in this answer; the old key and its web sign-ins stop working, and the streams they opened end", body = NewKey), ErrorResponses),
    security(("bearer" = [])))]
pub async fn rotate_user(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    who: Who,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<NewKey>, ApiError> {
    admin_only(&caller)?;
    let (user, key) = accounts::rotate(st.store.as_ref(), &name, None).await?;
    let details = serde_json::json!({"key_prefix": user.key_prefix});
    audit::record(&st, &who, "key.rotate", &user.name, details).await;
    // Every credential the user had (the old key, its sign-ins) is dead, and nothing can
    // have opened a stream with the new key before this answer.
    st.streams.revoke_user(&user.id, Revoked::Rotated);
    let user = view(&st, &user).await?;
    Ok(Json(NewKey { user, key }))
}
