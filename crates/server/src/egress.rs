//! A session's egress in serve: its policy (checked against the admin's `[egress] widest`
//! and the owner's quota, kept on the session row), the routes that show and change it, the
//! `PolicySource` and `EgressAudit` its proxy gets, and the one place the proxy is started
//! (egress_proxies.rs).
//!
//! The row is the truth: every replica's proxy reads the policy from the store at each
//! connection, so a PUT on one replica takes effect everywhere for the next connection.

use std::sync::Arc;

use async_trait::async_trait;
use axum::Extension;
use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ErrorCode, ErrorResponses};
use crate::runs::RunService;
use crate::sessions::owned_row;
use sandboxd_core::agent::EventKind;
use sandboxd_core::config::egress::{EgressConfig, EgressPolicy};
use sandboxd_core::egress::{EgressAudit, EgressRecord, PolicySource, TRACE_TARGET};
use sandboxd_core::store::egress::bounded;
use sandboxd_core::store::{EgressCounters, QuotaOverride, RunPatch, SessionState, Store};

/// The most recent records GET /v1/sessions/{id}/egress and the session page show.
pub const RECENT: u32 = 50;

/// The schema of a policy in a request: `"off"` or comma-separated rules as one string, or
/// an array (`["off"]`, or rules of which one allows). The patterns are the parser's grammar
/// (`egress_grammar`), so a policy the document allows is one the server takes.
pub fn policy_schema() -> utoipa::openapi::schema::Schema {
    use sandboxd_core::config::egress::MAX_RULES;
    use sandboxd_core::config::egress_grammar::{
        MAX_POLICY_CHARS, MAX_RULE_CHARS, allow_pattern, off_pattern, rule_pattern, string_pattern,
    };
    use utoipa::openapi::extensions::Extensions;
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
    let text = |pattern: String, max: usize| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(pattern))
            .min_length(Some(1))
            .max_length(Some(max))
    };
    // JSON Schema's `contains` (an array with one allowing rule): utoipa has no builder for
    // it, and Extensions serialize their keys as given.
    let contains = Extensions::from_iter([(
        "contains",
        serde_json::json!({"type": "string", "pattern": allow_pattern()}),
    )]);
    Schema::OneOf(
        OneOfBuilder::new()
            .item(text(string_pattern(), MAX_POLICY_CHARS).description(Some(
                "\"off\", \"any\" or comma-separated rules: host names, \"*.domain\", IP addresses ([IPv6] too), \"!rule\" to deny; at least one rule allows",
            )))
            .item(
                ArrayBuilder::new()
                    .items(text(off_pattern(), MAX_RULE_CHARS))
                    .min_items(Some(1))
                    .max_items(Some(1)),
            )
            .item(
                ArrayBuilder::new()
                    .items(text(rule_pattern(), MAX_RULE_CHARS))
                    .min_items(Some(1))
                    .max_items(Some(MAX_RULES))
                    .extensions(Some(contains)),
            )
            .build(),
    )
}

/// `policy_schema`, or null (an optional policy: absent or null means the default).
pub fn policy_schema_or_null() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
    Schema::OneOf(
        OneOfBuilder::new()
            .item(policy_schema())
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .build(),
    )
}

/// Checks that `policy` is within the admin's widest and the user's quota; the 403 names
/// the rule that reaches too far and whose limit it passes.
pub fn check_allowed(
    config: &EgressConfig,
    quota: &QuotaOverride,
    policy: &EgressPolicy,
) -> Result<(), ApiError> {
    policy.within(&config.widest).map_err(|m| {
        ApiError::not_allowed(format!(
            "field `egress`: {m}: the admin's [egress] widest does not allow it; ask for less"
        ))
    })?;
    if let Some(q) = &quota.egress {
        policy.within(q).map_err(|m| {
            ApiError::not_allowed(format!(
                "field `egress`: {m}: your quota's egress does not allow it; ask for less, or ask the admin to widen it"
            ))
        })?;
    }
    Ok(())
}

/// The policy of a new session: the one asked for, within both limits; absent, the
/// admin's default, or `off` when the user's quota is narrower than that default.
pub fn for_new_session(
    config: &EgressConfig,
    quota: &QuotaOverride,
    asked: Option<EgressPolicy>,
) -> Result<EgressPolicy, ApiError> {
    match asked {
        Some(policy) => check_allowed(config, quota, &policy).map(|()| policy),
        None => Ok(match check_allowed(config, quota, &config.default) {
            Ok(()) => config.default.clone(),
            Err(_) => EgressPolicy::Off,
        }),
    }
}

/// The quota of the session's owner (the caller's own, or, for an admin acting on another
/// user's session, that user's).
async fn owner_quota(
    st: &AppState,
    caller: &Caller,
    owner: &str,
) -> Result<QuotaOverride, ApiError> {
    if caller.id() == owner {
        return Ok(caller.user.quota.clone());
    }
    let users = st.store.users().await?;
    Ok(users
        .into_iter()
        .find(|u| u.id == owner)
        .map(|u| u.quota)
        .unwrap_or_default())
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetEgress {
    /// The new policy: `"off"`, `"any"`, `"a.org,*.b.org"` or an array of rules.
    #[schema(schema_with = policy_schema)]
    pub egress: EgressPolicy,
}

/// One connection through the proxy, as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EgressRecordView {
    /// `CONNECT`, or the forwarded request's method.
    pub method: String,
    pub host: String,
    pub port: u16,
    pub allowed: bool,
    /// The rule that decided (`*.wikipedia.org`, `not in the allowlist`, `egress off`, a cap).
    pub rule: String,
    pub reason: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub duration_ms: u64,
}

impl From<&EgressRecord> for EgressRecordView {
    fn from(r: &EgressRecord) -> Self {
        EgressRecordView {
            method: r.method.clone(),
            host: r.host.clone(),
            port: r.port,
            allowed: r.allowed,
            rule: r.rule.clone(),
            reason: r.reason.clone(),
            bytes_up: r.bytes_up,
            bytes_down: r.bytes_down,
            started_at: crate::types::time(r.started_ms),
            duration_ms: r.duration_ms,
        }
    }
}

/// A session's egress: who may reach what, and what did.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EgressView {
    /// The session's policy as rules (`["off"]`, `["any"]`, `["a.org", "!b.a.org"]`).
    pub policy: Vec<String>,
    /// The admin's `[egress] widest`: no session's policy reaches past it.
    pub widest: Vec<String>,
    /// The owner's quota (the widest they may set), when the admin set one.
    pub quota: Option<Vec<String>>,
    pub counters: EgressCounters,
    /// The newest connections, newest first (at most 50).
    pub recent: Vec<EgressRecordView>,
}

async fn view(st: &AppState, caller: &Caller, id: &str) -> Result<EgressView, ApiError> {
    let row = owned_row(st, caller, id).await?;
    let quota = owner_quota(st, caller, &row.owner).await?;
    let counters = st.store.egress_counters(&row.id).await?;
    let recent = st.store.egress_records(&row.id, None, RECENT).await?;
    Ok(EgressView {
        policy: row.egress.items(),
        widest: st.config.egress.widest.items(),
        quota: quota.egress.map(|q| q.items()),
        counters,
        recent: recent.iter().map(EgressRecordView::from).collect(),
    })
}

#[utoipa::path(get, path = "/v1/sessions/{id}/egress", tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    responses((status = 200, description = "The session's egress policy, the widest allowed, its counters and recent connections", body = EgressView), ErrorResponses),
    security(("bearer" = [])))]
pub async fn get_egress(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<EgressView>, ApiError> {
    Ok(Json(view(&st, &caller, &id).await?))
}

#[utoipa::path(put, path = "/v1/sessions/{id}/egress", tag = "sessions", request_body = SetEgress,
    params(("id" = String, Path, description = "The session id")),
    responses((status = 200, description = "The policy is changed: the next connection is decided by it", body = EgressView), ErrorResponses),
    security(("bearer" = [])))]
pub async fn put_egress(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SetEgress>,
) -> Result<Json<EgressView>, ApiError> {
    let row = owned_row(&st, &caller, &id).await?;
    if row.state == SessionState::Ended {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("session {id} has ended; its egress cannot change"),
        ));
    }
    let quota = owner_quota(&st, &caller, &row.owner).await?;
    check_allowed(&st.config.egress, &quota, &body.egress)?;
    if !st.store.set_session_egress(&row.id, &body.egress).await? {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("session {id} has ended; its egress cannot change"),
        ));
    }
    tracing::info!(target: TRACE_TARGET, session = %row.id, policy = %body.egress, "egress policy changed");
    let details = serde_json::json!({"owner": row.owner, "policy": body.egress.to_string()});
    crate::audit::record(&st, &caller.who, "egress.policy", &row.id, details).await;
    // This replica's sandbox object follows at once (its shell and python before their next
    // command); another replica's when it next reads the row (attach::live).
    if row.state == SessionState::Running
        && let Some(session) = crate::egress_proxies::held_session(&st, &row).await
    {
        let row = row.clone().with_egress(body.egress.clone());
        crate::egress_proxies::follow(&st, &session, &row).await;
    }
    Ok(Json(view(&st, &caller, &id).await?))
}

/// serve's `PolicySource`: the session row, read at every connection (a PUT on any replica
/// takes effect for the next one). An ended or vanished session allows nothing.
pub struct StorePolicy {
    pub store: Arc<dyn Store>,
    pub session: String,
}

#[async_trait]
impl PolicySource for StorePolicy {
    async fn policy(&self) -> Result<EgressPolicy, String> {
        match self.store.session(&self.session).await {
            Ok(Some(row)) if row.state != SessionState::Ended => Ok(row.egress),
            Ok(_) => Ok(EgressPolicy::Off),
            Err(e) => Err(format!("the session's policy cannot be read: {e}")),
        }
    }
}

/// serve's `EgressAudit`: the log under `sandboxd::egress`, the store's `egress_log` and
/// counters, and an `egress` event of the session's run in flight when this replica drives
/// it (a run driven elsewhere finds the connection in the log and in its summary).
pub struct StoreAudit {
    pub store: Arc<dyn Store>,
    pub runs: Arc<RunService>,
}

#[async_trait]
impl EgressAudit for StoreAudit {
    async fn record(&self, record: EgressRecord) {
        let record = bounded(&record);
        if let Some(m) = crate::metrics::get() {
            m.egress(record.allowed, record.bytes_up, record.bytes_down);
        }
        tracing::info!(target: TRACE_TARGET, session = %record.session, owner = %record.owner,
            host = %record.host, port = record.port, allowed = record.allowed, rule = %record.rule,
            bytes_up = record.bytes_up, bytes_down = record.bytes_down, "{record}");
        if let Err(e) = self.store.add_egress_record(&record).await {
            tracing::warn!(target: TRACE_TARGET, session = %record.session, error = %e, "cannot store an egress record");
        }
        if let Some(run) = self.runs.live_in_session(&record.session) {
            let _ = run
                .emit(EventKind::Egress { record }, RunPatch::default())
                .await;
        }
    }
}

/// What left the host through one destination during a run.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct HostEgress {
    pub host: String,
    pub port: u16,
    pub connections: u64,
    pub refused: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// How much left the host during a run, and to where: its session's egress records from
/// the run's start to its end (the session's log keeps its newest 2,000 connections).
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct RunEgress {
    pub counters: EgressCounters,
    /// Per destination, most bytes first (at most 20).
    pub hosts: Vec<HostEgress>,
}

/// The egress of session `session` between `from` and `to` (unix ms; None: until now).
pub async fn run_summary(
    store: &dyn Store,
    session: &str,
    from: i64,
    to: Option<i64>,
) -> Result<RunEgress, ApiError> {
    let limit =
        u32::try_from(sandboxd_core::store::egress::MAX_RECORDS_PER_SESSION).unwrap_or(u32::MAX);
    let records = store.egress_records(session, Some(from), limit).await?;
    let mut out = RunEgress::default();
    let mut hosts: Vec<HostEgress> = Vec::new();
    for r in records
        .iter()
        .filter(|r| to.is_none_or(|t| r.started_ms <= t))
    {
        out.counters.add(r);
        let i = match hosts
            .iter()
            .position(|h| h.host == r.host && h.port == r.port)
        {
            Some(i) => i,
            None => {
                hosts.push(HostEgress {
                    host: r.host.clone(),
                    port: r.port,
                    ..Default::default()
                });
                hosts.len() - 1
            }
        };
        let h = &mut hosts[i];
        if r.allowed {
            h.connections += 1;
        } else {
            h.refused += 1;
        }
        h.bytes_up = h.bytes_up.saturating_add(r.bytes_up);
        h.bytes_down = h.bytes_down.saturating_add(r.bytes_down);
    }
    hosts.sort_by_key(|h| std::cmp::Reverse(h.bytes_up.saturating_add(h.bytes_down)));
    hosts.truncate(20);
    out.hosts = hosts;
    Ok(out)
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
