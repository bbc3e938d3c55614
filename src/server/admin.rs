//! /v1/me and /v1/users: who the caller is, their quota and usage; the admin's view of
//! every user. A non-admin gets 404 from /v1/users, as for any object not theirs.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::State;

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, ErrorCode, ErrorResponses};
use super::settings::Quota;
use super::types::*;
use crate::store::{User, now_ms};

async fn view(st: &AppState, u: &User) -> Result<UserView, ApiError> {
    let q = Quota::resolve(&st.config.quotas, &u.quota, &st.config.limits);
    let usage = st.store.usage(&u.id, now_ms()).await?;
    Ok(UserView {
        id: u.id.clone(),
        name: u.name.clone(),
        admin: u.admin,
        key_prefix: u.key_prefix.clone(),
        created_at: time(u.created_at),
        last_used_at: u.last_used_at.map(time),
        expires_at: u.expires_at.map(time),
        quota: QuotaView {
            sessions: q.sessions,
            runs: q.runs,
            input_tokens_per_day: q.input_tokens_per_day,
            ceiling: (&q.ceiling).into(),
        },
        usage: UsageView {
            active_sessions: usage.active_sessions,
            active_runs: usage.active_runs,
            input_tokens_today: usage.input_tokens_today,
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
    if !caller.is_admin() {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "no such route for this key (it is for admins)",
        ));
    }
    let mut out = Vec::new();
    for u in st.store.users().await? {
        out.push(view(&st, &u).await?);
    }
    Ok(Json(out))
}
