//! /v1/runs: start, list, get, cancel and answer runs, follow their events (SSE) and fetch
//! the images their events reference. A thin shell over `RunService`; every route resolves
//! the run through the store and answers 404 unless the caller owns it (or is an admin).

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};

use super::stream::Follower;
use super::types::*;
use super::{RunMode, RunServiceError, StartRun};
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ErrorBody, ErrorCode, ErrorResponses};
use crate::quota::Quota;
use crate::sessions;
use crate::streams::{Kind, Revoked};
use sandboxd_core::store::{RunQuery, RunRow, RunState, now_ms};

const MAX_ID_LEN: usize = 128;
const MAX_TASK_CHARS: usize = 100_000;
/// How long POST …/cancel waits for the run's ending to be recorded.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

impl From<RunServiceError> for ApiError {
    fn from(e: RunServiceError) -> Self {
        match e {
            RunServiceError::Store(s) => s.into(),
            RunServiceError::NotWaiting => ApiError::new(
                ErrorCode::NotWaiting,
                "the run has no pending question; answer only while it is waiting_for_human",
            ),
            e @ RunServiceError::NoLlm(_) => ApiError::new(ErrorCode::Conflict, e.to_string()),
            e @ RunServiceError::Fenced => ApiError::internal(e),
        }
    }
}

/// The caller's run, or 404 when it does not exist or is someone else's.
pub async fn owned_run(st: &AppState, caller: &Caller, id: &str) -> Result<RunRow, ApiError> {
    let row = if id.len() > MAX_ID_LEN {
        None
    } else {
        st.store.run(id).await?
    };
    match row {
        Some(r) if caller.owns(&r.owner) => Ok(r),
        _ => Err(ApiError::not_found("run", id)),
    }
}

async fn reread(st: &AppState, id: &str) -> Result<Json<Run>, ApiError> {
    let row = st
        .store
        .run(id)
        .await?
        .ok_or_else(|| ApiError::not_found("run", id))?;
    Ok(Json((&row).into()))
}

#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = CreateRun,
    responses((status = 201, description = "The run, queued", body = Run), ErrorResponses),
    security(("bearer" = [])))]
pub async fn create_run(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiJson(body): ApiJson<CreateRun>,
) -> Result<(StatusCode, Json<Run>), ApiError> {
    let row = start_run(&st, &caller, body).await?;
    Ok((StatusCode::CREATED, Json((&row).into())))
}

/// Refuses a new run of the caller past a quota: input tokens of today, runs in flight. (The
/// daily CPU quota is its session owner's, checked in `start_run`.)
async fn check_run_quotas(st: &AppState, caller: &Caller, quota: &Quota) -> Result<(), ApiError> {
    let usage = st.store.usage(caller.id(), now_ms()).await?;
    if quota.input_tokens_per_day > 0 && usage.input_tokens_today >= quota.input_tokens_per_day {
        return Err(ApiError::quota(
            "input_tokens_per_day",
            quota.input_tokens_per_day,
            format!(
                "you spent {} of your {} input tokens of today (UTC); wait for tomorrow or ask the admin to raise the quota",
                usage.input_tokens_today, quota.input_tokens_per_day
            ),
        ));
    }
    if usage.active_runs >= quota.runs {
        return Err(sandboxd_core::store::StoreError::RunQuota {
            limit: quota.runs,
            active: usage.active_runs,
        }
        .into());
    }
    Ok(())
}

/// Checks a run request (its fields, the caller's quotas, the session) and starts it, making
/// the session first when it names none: the one way a front end (/v1/runs, A2A) starts a run.
pub async fn start_run(
    st: &Arc<AppState>,
    caller: &Caller,
    body: CreateRun,
) -> Result<RunRow, ApiError> {
    if body.task.trim().is_empty() {
        return Err(ApiError::invalid(
            "field `task`: empty; say what the agent should do",
        ));
    }
    if body.task.chars().count() > MAX_TASK_CHARS {
        return Err(ApiError::invalid(format!(
            "field `task`: longer than {MAX_TASK_CHARS} characters; put the material in a file of the session"
        )));
    }
    if let Some(n) = body.max_steps
        && !(1..=1000).contains(&n)
    {
        return Err(ApiError::invalid(
            "field `max_steps`: must be between 1 and 1000",
        ));
    }
    let profile = super::agents::run_profile(&st.config, &body)?;
    if body.session_id.is_some() && body.session.is_some() {
        // 409, not 400: each field is valid alone; together they ask for two sessions.
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "fields `session_id` and `session`: give one (an existing session, or the new one's settings), not both",
        ));
    }
    st.runs.ready()?;
    let quota = Quota::resolve(&st.config.quotas, &caller.user.quota, &st.config.limits);
    check_run_quotas(st, caller, &quota).await?;
    // The daily CPU quota, checked once: in an existing session, its owner's (the CPU is
    // metered to them, and the run's tool calls are checked against theirs too); a new one
    // is the caller's own, checked here and not again by `create`.
    let (session_id, live, created, cpu) = match body.session_id {
        Some(id) => {
            let (live, admitted) = sessions::admitted_live(st, caller, &id).await?;
            let cpu = (admitted.owner().to_string(), admitted.limit());
            (id, live, false, cpu)
        }
        None => {
            let admitted = crate::cpu_quota::admit(st, caller).await?;
            let cpu = (admitted.owner().to_string(), admitted.limit());
            let new = body.session.unwrap_or_default();
            let row = sessions::create(st, caller, new, Some(admitted)).await?;
            let live = st
                .backend
                .get(&row)
                .await
                .ok_or_else(|| ApiError::internal("the new session has no sandbox"))?;
            (row.id, live, true, cpu)
        }
    };
    let started = async {
        let session = live.session().clone();
        let run = st
            .runs
            .start(StartRun {
                owner: caller.id().to_string(),
                session_id: session_id.clone(),
                session,
                task: body.task,
                mode: body.mode.unwrap_or(RunMode::Agent),
                max_steps: body.max_steps.map(|n| n as usize),
                profile,
                max_active: quota.runs,
                tokens_per_day: quota.input_tokens_per_day,
                cpu_owner: cpu.0,
                cpu_seconds_per_day: cpu.1,
                mcp_servers: st.config.mcp.servers_for(&caller.user.name),
            })
            .await?;
        Ok::<_, ApiError>(run)
    }
    .await;
    match started {
        Ok(row) => Ok(row),
        Err(e) => {
            if created {
                let _ = st.backend.remove(&live.owner, Some(&live.runtime_id)).await;
                let _ = st.store.delete_session(&session_id).await;
            }
            Err(e)
        }
    }
}

#[utoipa::path(get, path = "/v1/runs", tag = "runs", params(ListRunsQuery),
    responses((status = 200, description = "Your runs, newest first (an admin's: everyone's)", body = RunList), ErrorResponses),
    security(("bearer" = [])))]
pub async fn list_runs(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<ListRunsQuery>,
) -> Result<Json<RunList>, ApiError> {
    let before = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(c.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
            ApiError::invalid("parameter `cursor`: not a cursor this server issued; pass `next_cursor` from the previous page")
        })?),
    };
    let limit = q.limit.unwrap_or(50);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid(
            "parameter `limit`: must be between 1 and 100",
        ));
    }
    let wanted = q.owner.filter(|o| !o.is_empty());
    let owner = if caller.is_admin() {
        wanted
    } else if wanted.as_deref().is_none_or(|o| o == caller.id()) {
        Some(caller.id().to_string())
    } else {
        // A user's list holds only their own runs, so another user's id matches none: an
        // empty page, whether or not that user exists (as another's run is a 404).
        return Ok(Json(RunList {
            runs: Vec::new(),
            next_cursor: None,
        }));
    };
    let page = st
        .store
        .list_runs(&RunQuery {
            owner,
            session_id: q.session_id.filter(|s| !s.is_empty()),
            state: q.state,
            before,
            limit,
        })
        .await?;
    Ok(Json(RunList {
        runs: page.runs.iter().map(Run::from).collect(),
        next_cursor: page.next.map(|n| n.to_string()),
    }))
}

#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", params(("id" = String, Path)),
    responses((status = 200, description = "The run", body = Run), ErrorResponses),
    security(("bearer" = [])))]
pub async fn get_run(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Run>, ApiError> {
    let row = owned_run(&st, &caller, &id).await?;
    let mut run: Run = (&row).into();
    let from = row.started_at.unwrap_or(row.created_at);
    run.egress = Some(
        crate::egress::run_summary(st.store.as_ref(), &row.session_id, from, row.ended_at).await?,
    );
    Ok(Json(run))
}

#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "runs", params(("id" = String, Path)),
    responses((status = 200, description = "The run once it has ended (a run already ended as it is)", body = Run), ErrorResponses),
    security(("bearer" = [])))]
pub async fn cancel_run(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Run>, ApiError> {
    let row = owned_run(&st, &caller, &id).await?;
    if !row.state.is_terminal() {
        st.runs.cancel(&id, CANCEL_WAIT).await;
    }
    reread(&st, &id).await
}

#[utoipa::path(post, path = "/v1/runs/{id}/answer", tag = "runs", params(("id" = String, Path)),
    request_body = AnswerBody,
    responses((status = 200, description = "The run, which has taken the answer", body = Run), ErrorResponses),
    security(("bearer" = [])))]
pub async fn answer_run(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<AnswerBody>,
) -> Result<Json<Run>, ApiError> {
    let row = owned_run(&st, &caller, &id).await?;
    answer(&st, &row, body.answer).await?;
    reread(&st, &id).await
}

/// Hands `text` to the run's pending question (409 `not_waiting` when it has none): the one
/// way a front end (/v1/runs, A2A) answers `ask_human`.
pub async fn answer(st: &AppState, row: &RunRow, text: String) -> Result<(), ApiError> {
    if text.chars().count() > MAX_TASK_CHARS {
        return Err(ApiError::invalid(format!(
            "field `answer`: longer than {MAX_TASK_CHARS} characters"
        )));
    }
    let asked_at = match &row.question {
        Some(q) if row.state == RunState::WaitingForHuman => q.asked_at,
        _ => return Err(RunServiceError::NotWaiting.into()),
    };
    st.runs.answer(&row.id, asked_at, text).await?;
    Ok(())
}

#[utoipa::path(get, path = "/v1/runs/{id}/events", tag = "runs",
    params(("id" = String, Path), EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this seq (as `after`)")),
    responses((status = 200, description = "Server-sent events: `id: <seq>`, `event: <type>`, `data: <Event JSON of docs/events.md>`; `: keep-alive` comments every 15 s. While the run is driven by the replica serving the stream, `event: delta` (no id) with `{\"step\", \"after_seq\", \"text\"}` carries the model's text as it is written, right after the event whose seq is `after_seq`: live only, never stored, never replayed; the step's `assistant_text` event is the whole text. A stream opened while an answer is being written starts that answer with its text so far, as one delta. Ends after the run's terminal run_state (or at once with follow=false). When the key or sign-in the stream was opened with is rotated, removed, signed out or expires, a last `event: error` (no id) with `{\"error\": {\"code\": \"credential_revoked\", …}}` ends it. A user may hold `[server] streams_per_user` streams (event streams and streamed execs) open; one more that follows is 429 `too_many_streams`.",
        content_type = "text/event-stream", body = String), ErrorResponses),
    security(("bearer" = [])))]
pub async fn run_events(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    owned_run(&st, &caller, &id).await?;
    let after = match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::invalid(
                    "header `Last-Event-ID`: must be the seq (a number) of the last event you have",
                )
            })?,
        None => q.after.unwrap_or(0),
    };
    // After the ownership check, so a foreign id is a 404 whatever the caller holds open. A
    // stream that follows counts against the caller's cap; a finite one (follow=false) not.
    let follow = q.follow.unwrap_or(true);
    let kind = if follow { Kind::Stream } else { Kind::Request };
    let guard = st.streams.open(&caller, kind, &st.shutdown)?;
    // Subscribed before the follower's first read, so no piece between the two is lost.
    let deltas = follow
        .then(|| st.runs.live(&id).map(|run| run.deltas()))
        .flatten();
    let follower = Follower::new(
        st.store.clone(),
        id,
        after,
        follow,
        // Cancelled at shutdown, and when the caller's credential is revoked.
        guard.token().clone(),
    );
    let stream = super::sse::events(follower, after, guard, deltas);
    Ok(Sse::new(stream)
        .keep_alive(
            KeepAlive::new()
                .interval(Duration::from_secs(15))
                .text("keep-alive"),
        )
        .into_response())
}

/// The last event of a stream whose credential was revoked: `event: error`, the error body.
pub fn revoked_event(why: Revoked) -> SseEvent {
    let body = ErrorBody {
        error: why.error().detail,
    };
    SseEvent::default()
        .event("error")
        .json_data(&body)
        .unwrap_or_else(|_| SseEvent::default().event("error").data("{}"))
}

fn image_id_ok(id: &str) -> bool {
    id.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[utoipa::path(get, path = "/v1/runs/{id}/images/{image_id}", tag = "runs",
    params(("id" = String, Path), ("image_id" = String, Path, description = "`sha256:<64 hex>` from an event's `image.id`")),
    responses((status = 200, description = "The image's bytes (PNG or JPEG)", content((Vec<u8> = "image/png"), (Vec<u8> = "image/jpeg"))), ErrorResponses),
    security(("bearer" = [])))]
pub async fn run_image(
    State(st): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, image_id)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    owned_run(&st, &caller, &id).await?;
    let found = if image_id_ok(&image_id) {
        st.store.image(&id, &image_id).await?
    } else {
        None
    };
    let Some((media_type, data)) = found else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("run {id} has no image {image_id:?}; take ids from its events' `image.id`"),
        ));
    };
    let ct = match media_type.as_str() {
        "image/jpeg" => "image/jpeg",
        _ => "image/png",
    };
    let mut resp = data.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=31536000, immutable"),
    );
    Ok(resp)
}
