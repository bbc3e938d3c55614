//! The `runs` table: one row-mapping helper (`select`), the quota-checked insert, the
//! listing, the patch of a run (one SQL function, schema_v9.sql's `sandboxd_patch_run`, which
//! an event's append calls too, events.rs), and `RunControl` (which replica drives a run, the
//! session's order, takeovers, cancel requests and replies).
//!
//! A session's order is the rowid (an identity, drawn at insert): inserts into one session
//! take the session's advisory lock until they commit, so rowids of a session's runs are
//! committed in increasing order even when two owners (a user and an admin) insert at once.
//! Leases are measured by the database's clock (`NOW_MS`).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::sessions::lock_owner;
use crate::{
    Args, PgStore, arg_refs, col, corrupt, execute, page_split, page_tail, query, query_opt,
    to_json, unsigned,
};
use sandboxd_core::store::{
    RunControl, RunPage, RunPatch, RunQuery, RunRow, RunScope, RunState, StoreError, Turn,
};

const COLS: &str = "rowid, id, session_id, owner, task, mode, max_steps, state, outcome, answer, steps, input_tokens, output_tokens, question, created_at, started_at, ended_at, last_seq, driver, cancel, reply, agent";

/// The database's clock in unix milliseconds (the replica registry's).
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The advisory-lock class of a session's run order (the second key is the session's hash).
const RUN_ORDER_LOCK: i32 = 4;

/// The states of a run in flight; `sandboxd_append_event` (schema_v8.sql) spells the same list.
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
        driver: col(r, 18)?,
        cancel: col(r, 19)?,
        reply: col(r, 20)?,
        agent: col(r, 21)?,
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
    // Always after the owner's lock, so two inserts never wait on each other in a cycle.
    lock_owner(c, RUN_ORDER_LOCK, &row.session_id).await?;
    let active = active_of(c, &row.owner).await?;
    if active >= max_active {
        return Err(StoreError::RunQuota {
            limit: max_active,
            active,
        });
    }
    execute(
        c,
        "INSERT INTO runs (id, session_id, owner, task, mode, max_steps, state, created_at, driver, agent)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        &[
            &row.id,
            &row.session_id,
            &row.owner,
            &row.task,
            &row.mode,
            &row.max_steps.map(|v| v.min(i64::MAX as u64) as i64),
            &row.state.as_str(),
            &row.created_at,
            &row.driver,
            &row.agent,
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

pub(crate) fn big(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// A patch's fields as `sandboxd_patch_run` (schema_v9.sql) takes them, where they need
/// converting: the one place a `RunPatch` is spelled in SQL arguments.
pub(crate) struct PatchArgs {
    pub state: Option<&'static str>,
    pub outcome: Option<String>,
    pub steps: Option<i64>,
    pub add_input: i64,
    pub add_output: i64,
    /// Whether the question is set (or cleared, with `question` None).
    pub set_question: bool,
    pub question: Option<String>,
}

impl PatchArgs {
    pub(crate) fn of(p: &RunPatch) -> Result<Self, StoreError> {
        let (set_question, question) = match &p.question {
            None => (false, None),
            Some(q) => (true, q.as_ref().map(to_json).transpose()?),
        };
        Ok(Self {
            state: p.state.map(|s| s.as_str()),
            outcome: p.outcome.as_ref().map(to_json).transpose()?,
            steps: p.steps.map(big),
            add_input: big(p.add_input_tokens),
            add_output: big(p.add_output_tokens),
            set_question,
            question,
        })
    }
}

/// Applies `patch` to the run, outside an event: the same function an event's append
/// patches its run with (`sandboxd_patch_run`, schema_v9.sql), keeping its last seq.
pub(crate) async fn patch(
    c: &impl GenericClient,
    id: &str,
    p: &RunPatch,
) -> Result<(), StoreError> {
    let a = PatchArgs::of(p)?;
    let no_seq: Option<i64> = None;
    execute(
        c,
        "SELECT sandboxd_patch_run($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        &[
            &id,
            &a.state,
            &a.outcome,
            &p.answer,
            &a.steps,
            &a.add_input,
            &a.add_output,
            &a.set_question,
            &a.question,
            &p.started_at,
            &p.ended_at,
            &no_seq,
        ],
    )
    .await?;
    Ok(())
}

async fn turn(c: &impl GenericClient, run_id: &str, driver: &str) -> Result<Turn, StoreError> {
    let statement = format!(
        "SELECT session_id, rowid FROM runs WHERE id = $1 AND driver = $2 AND state IN {IN_FLIGHT}"
    );
    let Some(me) = query_opt(c, &statement, &[&run_id, &driver]).await? else {
        return Ok(Turn::Lost);
    };
    let (session, rowid): (String, i64) = (col(&me, 0)?, col(&me, 1)?);
    let statement = format!(
        "SELECT id FROM runs WHERE session_id = $1 AND rowid < $2 AND state IN {IN_FLIGHT}
         ORDER BY rowid LIMIT 1"
    );
    match query_opt(c, &statement, &[&session, &rowid]).await? {
        Some(r) => Ok(Turn::After(col(&r, 0)?)),
        None => Ok(Turn::Go),
    }
}

/// Every run whose driver is dead is moved to `me` by a compare-and-set on its old driver:
/// of two replicas taking over at once, the second's update waits for the first's row lock,
/// then finds the driver changed and updates nothing.
async fn take_over(c: &impl GenericClient, me: &str) -> Result<Vec<RunRow>, StoreError> {
    let statement = format!(
        "SELECT id, driver FROM runs r WHERE state IN {IN_FLIGHT} AND (driver IS NULL OR NOT EXISTS
            (SELECT 1 FROM replicas p WHERE p.id = r.driver AND p.expires_at > {NOW_MS}))
         ORDER BY rowid"
    );
    let candidates = query(c, &statement, &[]).await?;
    let take = format!(
        "UPDATE runs SET driver = $1
         WHERE id = $2 AND driver IS NOT DISTINCT FROM $3 AND state IN {IN_FLIGHT}
           AND EXISTS (SELECT 1 FROM replicas WHERE id = $1 AND expires_at > {NOW_MS})
           AND NOT EXISTS (SELECT 1 FROM replicas WHERE id = $3 AND expires_at > {NOW_MS})
         RETURNING {COLS}"
    );
    let mut out = Vec::new();
    for candidate in candidates {
        let (id, old): (String, Option<String>) = (col(&candidate, 0)?, col(&candidate, 1)?);
        if let Some(row) = query_opt(c, &take, &[&me, &id, &old]).await? {
            out.push(from_row(&row)?.1);
        }
    }
    Ok(out)
}

#[async_trait]
impl RunControl for PgStore {
    async fn run_turn(&self, run_id: &str, driver: &str) -> Result<Turn, StoreError> {
        turn(&self.client().await?, run_id, driver).await
    }

    async fn runs_driven_by(&self, driver: &str) -> Result<Vec<RunRow>, StoreError> {
        let tail = format!("WHERE driver = $1 AND state IN {IN_FLIGHT} ORDER BY rowid");
        let rows = select(&self.client().await?, &tail, &[&driver]).await?;
        Ok(rows.into_iter().map(|(_, r)| r).collect())
    }

    async fn take_over_orphans(&self, me: &str) -> Result<Vec<RunRow>, StoreError> {
        take_over(&self.client().await?, me).await
    }

    async fn request_cancel(
        &self,
        scope: RunScope,
        reason: &str,
    ) -> Result<Vec<String>, StoreError> {
        let (column, key) = match &scope {
            RunScope::Run(id) => ("id", id),
            RunScope::Session(id) => ("session_id", id),
            RunScope::Owner(id) => ("owner", id),
        };
        let statement = format!(
            "UPDATE runs SET cancel = COALESCE(cancel, $2)
             WHERE {column} = $1 AND state IN {IN_FLIGHT} RETURNING id"
        );
        let rows = query(&self.client().await?, &statement, &[key, &reason]).await?;
        rows.iter().map(|r| col(r, 0)).collect()
    }

    async fn post_reply(&self, run_id: &str, answer: &str) -> Result<Option<u64>, StoreError> {
        let row = query_opt(
            &self.client().await?,
            "UPDATE runs SET reply = $2 WHERE id = $1 AND state = 'waiting_for_human'
               AND question IS NOT NULL AND reply IS NULL
             RETURNING last_seq",
            &[&run_id, &answer],
        )
        .await?;
        row.map(|r| col::<i64>(&r, 0).map(unsigned)).transpose()
    }

    async fn withdraw_reply(&self, run_id: &str, answer: &str) -> Result<bool, StoreError> {
        let n = execute(
            &self.client().await?,
            "UPDATE runs SET reply = NULL WHERE id = $1 AND reply = $2",
            &[&run_id, &answer],
        )
        .await?;
        Ok(n > 0)
    }
}
