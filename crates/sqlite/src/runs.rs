//! The `runs` table: one row-mapping helper (`select`), the quota-checked insert, the
//! listing, and the patch an event's commit applies to its run.

use rusqlite::{Connection, Params, Transaction, params};

use crate::{page, sql, to_json};
use sandboxd_core::store::{RunPage, RunPatch, RunQuery, RunRow, RunState, StoreError};

const COLS: &str = "rowid, id, session_id, owner, task, mode, max_steps, state, outcome, answer, steps, input_tokens, output_tokens, question, created_at, started_at, ended_at, last_seq";

const IN_FLIGHT: &str = "('queued', 'running', 'waiting_for_human')";

fn corrupt(what: &'static str, message: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what,
        message: message.to_string(),
    }
}

/// The runs matching `tail` with their rowids (the paging cursor), JSON decoded.
pub(super) fn select(
    c: &Connection,
    tail: &str,
    args: impl Params,
) -> Result<Vec<(i64, RunRow)>, StoreError> {
    let mut st = c
        .prepare(&format!("SELECT {COLS} FROM runs {tail}"))
        .map_err(sql)?;
    let n = |v: Option<i64>| v.unwrap_or(0).max(0) as u64;
    let rows = st
        .query_map(args, |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(7)?,
                r.get::<_, Option<String>>(8)?,
                r.get::<_, Option<String>>(13)?,
                RunRow {
                    id: r.get(1)?,
                    session_id: r.get(2)?,
                    owner: r.get(3)?,
                    task: r.get(4)?,
                    mode: r.get(5)?,
                    max_steps: r.get::<_, Option<i64>>(6)?.map(|v| v.max(0) as u64),
                    state: RunState::Queued,
                    outcome: None,
                    answer: r.get(9)?,
                    steps: n(r.get(10)?),
                    input_tokens: n(r.get(11)?),
                    output_tokens: n(r.get(12)?),
                    question: None,
                    created_at: r.get(14)?,
                    started_at: r.get(15)?,
                    ended_at: r.get(16)?,
                    last_seq: n(r.get(17)?),
                },
            ))
        })
        .map_err(sql)?;
    rows.map(|row| {
        let (rowid, state, outcome, question, mut row) = row.map_err(sql)?;
        row.state = RunState::parse(&state).ok_or_else(|| corrupt("run state", &state))?;
        row.outcome = outcome
            .map(|o| serde_json::from_str(&o).map_err(|e| corrupt("run outcome", e)))
            .transpose()?;
        row.question = question
            .map(|q| serde_json::from_str(&q).map_err(|e| corrupt("run question", e)))
            .transpose()?;
        Ok((rowid, row))
    })
    .collect()
}

pub(super) fn one(c: &Connection, id: &str) -> Result<Option<RunRow>, StoreError> {
    Ok(select(c, "WHERE id = ?1", [id])?
        .into_iter()
        .next()
        .map(|(_, r)| r))
}

pub(super) fn in_flight(c: &Connection) -> Result<Vec<RunRow>, StoreError> {
    let rows = select(c, &format!("WHERE state IN {IN_FLIGHT} ORDER BY rowid"), [])?;
    Ok(rows.into_iter().map(|(_, r)| r).collect())
}

/// Inserts the run unless its owner already has `max_active` runs in flight.
pub(super) fn insert(
    tx: &Transaction<'_>,
    row: &RunRow,
    max_active: u32,
) -> Result<(), StoreError> {
    let active: i64 = tx
        .query_row(
            &format!("SELECT COUNT(*) FROM runs WHERE owner = ?1 AND state IN {IN_FLIGHT}"),
            [&row.owner],
            |r| r.get(0),
        )
        .map_err(sql)?;
    if active >= max_active as i64 {
        return Err(StoreError::RunQuota {
            limit: max_active,
            active: active as u32,
        });
    }
    tx.execute(
        "INSERT INTO runs (id, session_id, owner, task, mode, max_steps, state, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            row.id,
            row.session_id,
            row.owner,
            row.task,
            row.mode,
            row.max_steps.map(|v| v as i64),
            row.state.as_str(),
            row.created_at
        ],
    )
    .map_err(sql)?;
    Ok(())
}

pub(super) fn list(c: &Connection, q: &RunQuery) -> Result<RunPage, StoreError> {
    let mut where_ = vec!["1 = 1".to_string()];
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    let mut add = |clause: &str, v: rusqlite::types::Value| {
        args.push(v);
        where_.push(format!("{clause} ?{}", args.len()));
    };
    if let Some(owner) = &q.owner {
        add("owner =", owner.clone().into());
    }
    if let Some(s) = &q.session_id {
        add("session_id =", s.clone().into());
    }
    if let Some(s) = q.state {
        add("state =", s.as_str().to_string().into());
    }
    if let Some(b) = q.before {
        add("rowid <", b.into());
    }
    let (runs, next) = page(c, &where_, args, q.limit, |c, tail, args| {
        select(c, tail, args)
    })?;
    Ok(RunPage { runs, next })
}

/// Applies `patch` (and the new last seq, when given) to the run.
pub(super) fn patch(
    tx: &Transaction<'_>,
    id: &str,
    last_seq: Option<u64>,
    p: &RunPatch,
) -> Result<(), StoreError> {
    let outcome = p.outcome.as_ref().map(to_json).transpose()?;
    let (set_question, question) = match &p.question {
        None => (false, None),
        Some(q) => (true, q.as_ref().map(to_json).transpose()?),
    };
    tx.execute(
        "UPDATE runs SET
            state = COALESCE(?2, state),
            outcome = COALESCE(?3, outcome),
            answer = COALESCE(?4, answer),
            steps = COALESCE(?5, steps),
            input_tokens = input_tokens + ?6,
            output_tokens = output_tokens + ?7,
            question = CASE WHEN ?8 THEN ?9 ELSE question END,
            started_at = COALESCE(started_at, ?10),
            ended_at = COALESCE(?11, ended_at),
            last_seq = COALESCE(?12, last_seq)
         WHERE id = ?1",
        params![
            id,
            p.state.map(|s| s.as_str()),
            outcome,
            p.answer,
            p.steps.map(|s| s as i64),
            p.add_input_tokens as i64,
            p.add_output_tokens as i64,
            set_question,
            question,
            p.started_at,
            p.ended_at,
            last_seq.map(|s| s as i64)
        ],
    )
    .map_err(sql)?;
    Ok(())
}
