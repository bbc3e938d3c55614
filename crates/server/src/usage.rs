//! `GET /v1/usage`: what was used (usage metering, metering.rs), per user and UTC day and
//! per session, over the last `days` days. A user reads their own; an admin reads everyone's,
//! or one user's with `?user=NAME`. A non-admin naming anyone else gets 404, as for a user
//! that does not exist. `?format=csv` exports the days as CSV (one row per user and day,
//! tokens summed over models).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiQuery, ErrorCode, ErrorResponses};
use crate::types::time;
use sandboxd_core::store::metering::{MAX_USAGE_DAYS, MAX_USAGE_ROWS, MAX_USAGE_SESSIONS};
use sandboxd_core::store::{Store, StoreError, UsageQuery, UsageTotals, now_ms};

const DAY_MS: i64 = 86_400_000;

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Whose usage, by user name: admins may name anyone (none: everyone); anyone else only
    /// themselves (none: themselves).
    #[param(max_length = 256)]
    pub user: Option<String>,
    /// How many UTC days back, today included: 1 to 400 (default 30).
    #[param(minimum = 1, maximum = 400)]
    pub days: Option<u32>,
    /// `json` (default), or `csv`: the days only, one row per user and day.
    #[param(pattern = "^(json|csv)?$")]
    pub format: Option<String>,
}

/// One user's usage on one UTC day.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UsageDay {
    /// The user's name (their id, if the user was removed since).
    pub user: String,
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    pub usage: UsageTotals,
}

/// One session's usage over its life.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UsageSession {
    pub session_id: String,
    pub user: String,
    /// When its first measure was recorded.
    pub first_at: DateTime<Utc>,
    pub usage: UsageTotals,
}

/// The usage of the range: per user and day (oldest first), and per session first measured
/// in it. The days of one user sum to their sessions' totals over the same days.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UsageReport {
    /// The first day of the range, `YYYY-MM-DD` (UTC).
    pub from: String,
    /// The last day (today, UTC).
    pub to: String,
    pub days: Vec<UsageDay>,
    pub sessions: Vec<UsageSession>,
    /// True when there were more sessions than the 1000 listed (the days count them all).
    pub sessions_truncated: bool,
}

#[utoipa::path(get, path = "/v1/usage", tag = "users", params(UsageParams),
    responses((status = 200, description = "Usage metering: CPU-seconds and memory GiB-seconds from each sandbox's cgroup, wall-clock seconds alive, bytes in and out through the file and archive routes, tokens per model and tool calls, per user and UTC day and per session. Your own; an admin's is everyone's unless `user` names one. With format=csv, the days as text/csv",
        content((UsageReport = "application/json"), (String = "text/csv"))), ErrorResponses),
    security(("bearer" = [])))]
pub async fn get_usage(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<UsageParams>,
) -> Result<Response, ApiError> {
    let days = q.days.unwrap_or(30);
    if !(1..=MAX_USAGE_DAYS).contains(&days) {
        return Err(ApiError::invalid(
            "parameter `days`: must be between 1 and 400",
        ));
    }
    let csv = match q.format.as_deref() {
        None | Some("") | Some("json") => false,
        Some("csv") => true,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "parameter `format`: {other:?} is not json or csv"
            )));
        }
    };
    let owner = whose(&st, &caller, q.user.as_deref()).await?;
    let report = report(st.store.as_ref(), owner, days, now_ms()).await?;
    if csv {
        let mut resp = csv_text(&report.days).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/csv; charset=utf-8"),
        );
        return Ok(resp);
    }
    Ok(Json(report).into_response())
}

/// The usage of `owner` (None: everyone) over the `days` UTC days up to `now`'s, user ids
/// shown as names (`GET /v1/usage`, `sandboxd users usage`).
pub async fn report(
    store: &dyn Store,
    owner: Option<String>,
    days: u32,
    now: i64,
) -> Result<UsageReport, StoreError> {
    let from = (now - now.rem_euclid(DAY_MS)) - i64::from(days.max(1) - 1) * DAY_MS;
    let query = UsageQuery {
        owner,
        from,
        to: now,
        limit: MAX_USAGE_ROWS,
    };
    let names: HashMap<String, String> = store
        .users()
        .await?
        .into_iter()
        .map(|u| (u.id, u.name))
        .collect();
    let name = |id: &str| names.get(id).cloned().unwrap_or_else(|| id.to_string());
    let days = store
        .usage_days(&query)
        .await?
        .into_iter()
        .map(|d| UsageDay {
            user: name(&d.owner),
            day: d.day,
            usage: d.totals,
        })
        .collect();
    let session_rows = store
        .usage_sessions(&UsageQuery {
            limit: MAX_USAGE_SESSIONS + 1,
            ..query
        })
        .await?;
    let sessions_truncated = session_rows.len() > MAX_USAGE_SESSIONS as usize;
    let sessions = session_rows
        .into_iter()
        .take(MAX_USAGE_SESSIONS as usize)
        .map(|s| UsageSession {
            user: name(&s.owner),
            session_id: s.session_id,
            first_at: time(s.first_at),
            usage: s.totals,
        })
        .collect();
    Ok(UsageReport {
        from: time(from).format("%Y-%m-%d").to_string(),
        to: time(now).format("%Y-%m-%d").to_string(),
        days,
        sessions,
        sessions_truncated,
    })
}

/// The owner id to read: the caller's own unless an admin names another (or nobody: every
/// owner). Anyone else naming another user, and anyone naming a user that does not exist,
/// gets the same 404.
async fn whose(
    st: &AppState,
    caller: &Caller,
    user: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let not_found = || ApiError::new(ErrorCode::NotFound, "no such user");
    match user {
        None | Some("") if caller.is_admin() => Ok(None),
        None | Some("") => Ok(Some(caller.id().to_string())),
        Some(name) if name == caller.user.name => Ok(Some(caller.id().to_string())),
        Some(_) if !caller.is_admin() => Err(not_found()),
        Some(name) => match st.store.user_by_name(name).await? {
            Some(u) => Ok(Some(u.id)),
            None => Err(not_found()),
        },
    }
}

/// A CSV field: quoted when it must be, and never read as a formula by a spreadsheet.
fn field(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

/// The days as CSV, one row per user and day, tokens summed over models.
pub fn csv_text(days: &[UsageDay]) -> String {
    let mut out = String::from(
        "day,user,cpu_seconds,memory_gib_seconds,wall_seconds,bytes_in,bytes_out,tool_calls,tokens_in,tokens_out\n",
    );
    for d in days {
        let u = &d.usage;
        let tin: u64 = u.tokens.iter().map(|t| t.tokens_in).sum();
        let tout: u64 = u.tokens.iter().map(|t| t.tokens_out).sum();
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "{},{},{:.6},{:.6},{:.3},{},{},{},{},{}",
            field(&d.day),
            field(&d.user),
            u.cpu_seconds,
            u.memory_gib_seconds,
            u.wall_seconds,
            u.bytes_in,
            u.bytes_out,
            u.tool_calls,
            tin,
            tout
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_and_never_formulas() {
        assert_eq!(field("alice"), "alice");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\"\n"), "\"say \"\"hi\"\"\n\"");
        assert_eq!(field("=SUM(A1)"), "'=SUM(A1)");
        assert_eq!(field("-1,2"), "\"'-1,2\"");
    }
}
