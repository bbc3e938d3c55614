//! The `runs` table: one row-mapping helper (`select`), the quota-checked insert, the
//! listing, the patch an event's commit applies to its run, and `RunControl` (which replica
//! drives a run, the session's order, takeovers, cancel requests and replies).
//!
//! A session's order is the rowid: every write is one `BEGIN IMMEDIATE` transaction on the
//! one file, so inserts commit one at a time in rowid order, whichever process makes them.
//! The store's clock, for leases, is this host's (`now_ms`).

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Params, Transaction, params};

use crate::{SqliteStore, page, sql, to_json};
use sandboxd_core::store::{
    RunControl, RunPage, RunPatch, RunQuery, RunRow, RunScope, RunState, StoreError, Turn, now_ms,
};

const COLS: &str = "rowid, id, session_id, owner, task, mode, max_steps, state, outcome, answer, steps, input_tokens, output_tokens, question, created_at, started_at, ended_at, last_seq, driver, cancel, reply, agent";

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
                    driver: r.get(18)?,
                    cancel: r.get(19)?,
                    reply: r.get(20)?,
                    agent: r.get(21)?,
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
        "INSERT INTO runs (id, session_id, owner, task, mode, max_steps, state, created_at, driver, agent)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            row.id,
            row.session_id,
            row.owner,
            row.task,
            row.mode,
            row.max_steps.map(|v| v as i64),
            row.state.as_str(),
            row.created_at,
            row.driver,
            row.agent
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
            reply = CASE WHEN ?8 THEN NULL ELSE reply END,
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

/// Whether replica `id`'s lease is live now.
pub(super) fn live_replica(c: &Connection, id: &str, now: i64) -> Result<bool, StoreError> {
    c.query_row(
        "SELECT 1 FROM replicas WHERE id = ?1 AND expires_at > ?2",
        params![id, now],
        |_| Ok(()),
    )
    .optional()
    .map(|found| found.is_some())
    .map_err(sql)
}

/// Refuses (`Fenced`) unless run `run_id` is in flight, driven by `driver`, and `driver`'s
/// lease is live; the caller's transaction holds the write lock, so it stays so until commit.
pub(super) fn fence(c: &Connection, run_id: &str, driver: &str) -> Result<(), StoreError> {
    let driven = c
        .query_row(
            &format!("SELECT 1 FROM runs WHERE id = ?1 AND driver = ?2 AND state IN {IN_FLIGHT}"),
            params![run_id, driver],
            |_| Ok(()),
        )
        .optional()
        .map_err(sql)?
        .is_some();
    if driven && live_replica(c, driver, now_ms())? {
        Ok(())
    } else {
        Err(StoreError::Fenced {
            run_id: run_id.to_string(),
            driver: driver.to_string(),
        })
    }
}

fn turn(c: &Connection, run_id: &str, driver: &str) -> Result<Turn, StoreError> {
    let me: Option<(String, i64)> = c
        .query_row(
            &format!(
                "SELECT session_id, rowid FROM runs
                 WHERE id = ?1 AND driver = ?2 AND state IN {IN_FLIGHT}"
            ),
            params![run_id, driver],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(sql)?;
    let Some((session, rowid)) = me else {
        return Ok(Turn::Lost);
    };
    let before: Option<String> = c
        .query_row(
            &format!(
                "SELECT id FROM runs WHERE session_id = ?1 AND rowid < ?2 AND state IN {IN_FLIGHT}
                 ORDER BY rowid LIMIT 1"
            ),
            params![session, rowid],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql)?;
    Ok(before.map_or(Turn::Go, Turn::After))
}

/// The ids of the runs matching `filter` (a WHERE clause), in rowid order.
fn ids(c: &Connection, filter: &str, args: impl Params) -> Result<Vec<String>, StoreError> {
    let mut st = c
        .prepare(&format!(
            "SELECT id FROM runs WHERE {filter} ORDER BY rowid"
        ))
        .map_err(sql)?;
    let rows = st.query_map(args, |r| r.get(0)).map_err(sql)?;
    rows.collect::<Result<_, _>>().map_err(sql)
}

fn take_over(tx: &Transaction<'_>, me: &str) -> Result<Vec<RunRow>, StoreError> {
    let now = now_ms();
    if !live_replica(tx, me, now)? {
        return Ok(Vec::new());
    }
    let orphaned = format!(
        "state IN {IN_FLIGHT} AND (driver IS NULL OR driver NOT IN
            (SELECT id FROM replicas WHERE expires_at > ?1))"
    );
    let taken = ids(tx, &orphaned, params![now])?;
    let mut out = Vec::with_capacity(taken.len());
    for id in taken {
        tx.execute("UPDATE runs SET driver = ?2 WHERE id = ?1", params![id, me])
            .map_err(sql)?;
        out.extend(one(tx, &id)?);
    }
    Ok(out)
}

fn cancel(tx: &Transaction<'_>, scope: &RunScope, reason: &str) -> Result<Vec<String>, StoreError> {
    let (column, key) = match scope {
        RunScope::Run(id) => ("id", id),
        RunScope::Session(id) => ("session_id", id),
        RunScope::Owner(id) => ("owner", id),
    };
    let filter = format!("{column} = ?1 AND state IN {IN_FLIGHT}");
    let found = ids(tx, &filter, params![key])?;
    tx.execute(
        &format!("UPDATE runs SET cancel = COALESCE(cancel, ?2) WHERE {filter}"),
        params![key, reason],
    )
    .map_err(sql)?;
    Ok(found)
}

fn post_reply(tx: &Transaction<'_>, id: &str, answer: &str) -> Result<Option<u64>, StoreError> {
    let changed = tx
        .execute(
            "UPDATE runs SET reply = ?2 WHERE id = ?1 AND state = 'waiting_for_human'
             AND question IS NOT NULL AND reply IS NULL",
            params![id, answer],
        )
        .map_err(sql)?;
    if changed == 0 {
        return Ok(None);
    }
    let last: i64 = tx
        .query_row("SELECT last_seq FROM runs WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .map_err(sql)?;
    Ok(Some(last.max(0) as u64))
}

#[async_trait]
impl RunControl for SqliteStore {
    async fn run_turn(&self, run_id: &str, driver: &str) -> Result<Turn, StoreError> {
        let (run_id, driver) = (run_id.to_string(), driver.to_string());
        self.read(move |c| turn(c, &run_id, &driver)).await
    }

    async fn runs_driven_by(&self, driver: &str) -> Result<Vec<RunRow>, StoreError> {
        let driver = driver.to_string();
        self.read(move |c| {
            let tail = format!("WHERE driver = ?1 AND state IN {IN_FLIGHT} ORDER BY rowid");
            let rows = select(c, &tail, [driver])?;
            Ok(rows.into_iter().map(|(_, r)| r).collect())
        })
        .await
    }

    async fn take_over_orphans(&self, me: &str) -> Result<Vec<RunRow>, StoreError> {
        let me = me.to_string();
        self.write(move |tx| take_over(tx, &me)).await
    }

    async fn request_cancel(
        &self,
        scope: RunScope,
        reason: &str,
    ) -> Result<Vec<String>, StoreError> {
        let reason = reason.to_string();
        self.write(move |tx| cancel(tx, &scope, &reason)).await
    }

    async fn post_reply(&self, run_id: &str, answer: &str) -> Result<Option<u64>, StoreError> {
        let (id, answer) = (run_id.to_string(), answer.to_string());
        self.write(move |tx| post_reply(tx, &id, &answer)).await
    }

    async fn withdraw_reply(&self, run_id: &str, answer: &str) -> Result<bool, StoreError> {
        let (id, answer) = (run_id.to_string(), answer.to_string());
        self.write(move |tx| {
            let n = tx
                .execute(
                    "UPDATE runs SET reply = NULL WHERE id = ?1 AND reply = ?2",
                    params![id, answer],
                )
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }
}
