//! The `runs` table: one row-mapping helper (`select`), the quota-checked insert, the
//! listing, and the patch an event's commit applies to its run.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::sessions::lock_owner;
use crate::{
    Args, arg_refs, col, corrupt, execute, page_split, page_tail, query, to_json, unsigned,
};
use sandboxd_core::store::{RunPage, RunPatch, RunQuery, RunRow, RunState, StoreError};

const COLS: &str = "rowid, id, session_id, owner, task, mode, max_steps, state, outcome, answer, steps, input_tokens, output_tokens, question, created_at, started_at, ended_at, last_seq";

const IN_FLIGHT: &str = "('queued', 'running', 'waiting_for_human')";

/// The advisory-lock class of an owner's run cap (the second key is the owner's hash).
const RUN_CAP_LOCK: i32 = 2;

fn from_row(r: &Row) -> Result<(i64, RunRow), StoreError> {
    let state: String = col(r, 7)?;
    let outcome: Option<String> = col(r, 8)?;
    let question: Option<String> = col(r, 13)?;
    let row = RunRow {
        id: col(r, 1)?,
        session_id: col(r, 2)?,
        owner: col(r, 3)?,
        task: col(r, 4)?,
        mode: col(r, 5)?,
        max_steps: col::<Option<i64>>(r, 6)?.map(unsigned),
        state: RunState::parse(&state).ok_or_else(|| corrupt("run state", &state))?,
        outcome: outcome
            .map(|o| serde_json::from_str(&o).map_err(|e| corrupt("run outcome", e)))
            .transpose()?,
        answer: col(r, 9)?,
        steps: unsigned(col(r, 10)?),
        input_tokens: unsigned(col(r, 11)?),
        output_tokens: unsigned(col(r, 12)?),
        question: question
            .map(|q| serde_json::from_str(&q).map_err(|e| corrupt("run question", e)))
            .transpose()?,
        created_at: col(r, 14)?,
        started_at: col(r, 15)?,
        ended_at: col(r, 16)?,
        last_seq: unsigned(col(r, 17)?),
    };
    Ok((col(r, 0)?, row))
}

/// The runs matching `tail` with their rowids (the paging cursor), JSON decoded.
pub(crate) async fn select(
    c: &impl GenericClient,
    tail: &str,
    args: &[&(dyn ToSql + Sync)],
) -> Result<Vec<(i64, RunRow)>, StoreError> {
    let rows = query(c, &format!("SELECT {COLS} FROM runs {tail}"), args).await?;
    rows.iter().map(from_row).collect()
}

pub(crate) async fn one(c: &impl GenericClient, id: &str) -> Result<Option<RunRow>, StoreError> {
    Ok(select(c, "WHERE id = $1", &[&id])
        .await?
        .into_iter()
        .next()
        .map(|(_, r)| r))
}

pub(crate) async fn in_flight(c: &impl GenericClient) -> Result<Vec<RunRow>, StoreError> {
    let tail = format!("WHERE state IN {IN_FLIGHT} ORDER BY rowid");
    let rows = select(c, &tail, &[]).await?;
    Ok(rows.into_iter().map(|(_, r)| r).collect())
}

/// The owner's runs in flight.
pub(crate) async fn active_of(c: &impl GenericClient, owner: &str) -> Result<u32, StoreError> {
    let statement = format!("SELECT COUNT(*) FROM runs WHERE owner = $1 AND state IN {IN_FLIGHT}");
    let rows = query(c, &statement, &[&owner]).await?;
    let n: i64 = match rows.first() {
        Some(r) => col(r, 0)?,
        None => 0,
    };
    Ok(n.clamp(0, i64::from(u32::MAX)) as u32)
}

/// Inserts the run unless its owner already has `max_active` runs in flight; runs in a
/// transaction, under the owner's cap lock.
pub(crate) async fn insert(
    c: &impl GenericClient,
    row: &RunRow,
    max_active: u32,
) -> Result<(), StoreError> {
    lock_owner(c, RUN_CAP_LOCK, &row.owner).await?;
    let active = active_of(c, &row.owner).await?;
    if active >= max_active {
        return Err(StoreError::RunQuota {
            limit: max_active,
            active,
        });
    }
    execute(
        c,
        "INSERT INTO runs (id, session_id, owner, task, mode, max_steps, state, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &row.id,
            &row.session_id,
            &row.owner,
            &row.task,
            &row.mode,
            &row.max_steps.map(|v| v.min(i64::MAX as u64) as i64),
            &row.state.as_str(),
            &row.created_at,
        ],
    )
    .await?;
    Ok(())
}

pub(crate) async fn list(c: &impl GenericClient, q: &RunQuery) -> Result<RunPage, StoreError> {
    let mut where_ = vec!["TRUE".to_string()];
    let mut args: Args = Vec::new();
    let mut add = |clause: &str, v: Box<dyn ToSql + Sync + Send>| {
        args.push(v);
        where_.push(format!("{clause} ${}", args.len()));
    };
    if let Some(owner) = &q.owner {
        add("owner =", Box::new(owner.clone()));
    }
    if let Some(s) = &q.session_id {
        add("session_id =", Box::new(s.clone()));
    }
    if let Some(s) = q.state {
        add("state =", Box::new(s.as_str().to_string()));
    }
    if let Some(b) = q.before {
        add("rowid <", Box::new(b));
    }
    let (tail, limit) = page_tail(&where_, &mut args, q.limit);
    let rows = select(c, &tail, &arg_refs(&args)).await?;
    let (runs, next) = page_split(rows, limit);
    Ok(RunPage { runs, next })
}

fn big(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// Applies `patch` (and the new last seq, when given) to the run.
pub(crate) async fn patch(
    c: &impl GenericClient,
    id: &str,
    last_seq: Option<u64>,
    p: &RunPatch,
) -> Result<(), StoreError> {
    let outcome = p.outcome.as_ref().map(to_json).transpose()?;
    let (set_question, question) = match &p.question {
        None => (false, None),
        Some(q) => (true, q.as_ref().map(to_json).transpose()?),
    };
    execute(
        c,
        "UPDATE runs SET
            state = COALESCE($2, state),
            outcome = COALESCE($3, outcome),
            answer = COALESCE($4, answer),
            steps = COALESCE($5, steps),
            input_tokens = input_tokens + $6,
            output_tokens = output_tokens + $7,
            question = CASE WHEN $8 THEN $9 ELSE question END,
            started_at = COALESCE(started_at, $10),
            ended_at = COALESCE($11, ended_at),
            last_seq = COALESCE($12, last_seq)
         WHERE id = $1",
        &[
            &id,
            &p.state.map(|s| s.as_str()),
            &outcome,
            &p.answer,
            &p.steps.map(big),
            &big(p.add_input_tokens),
            &big(p.add_output_tokens),
            &set_question,
            &question,
            &p.started_at,
            &p.ended_at,
            &last_seq.map(big),
        ],
    )
    .await?;
    Ok(())
}
