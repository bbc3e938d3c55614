//! SqliteStore: the embedded store, one SQLite file in the data directory. This file opens
//! it, applies the migrations and runs calls on its two connections; the tables' statements
//! and row mapping live beside it, one file per table (users.rs, sessions.rs, runs.rs, events.rs,
//! usage.rs, logins.rs, records.rs, edges.rs, egress.rs).
//!
//! Why rusqlite (+ tokio-rusqlite) and not sqlx: sqlx would give PostgreSQL from the same
//! crate, but on this project's 2-core builders it adds ~105 crates and ~137 s to a cold build
//! against ~17 crates and ~25 s, its 0.9 line needs rust-version 1.94 (the project pins 1.88),
//! and its libsqlite3-sys range cannot coexist with rusqlite's. A PostgreSQL store would be a
//! second implementation of the `Store` trait (with its own crate), so nothing outside this
//! file depends on the choice. rusqlite_migration needs rust-version 1.95, so the migrations
//! are a short list applied under `PRAGMA user_version` here.
//!
//! Locking: WAL, one writer connection whose writes start with `BEGIN IMMEDIATE` (a deferred
//! transaction that reads then writes fails with SQLITE_BUSY and ignores busy_timeout), and a
//! separate reader connection, so reads never wait behind a write. tokio-rusqlite queues calls
//! to each connection's thread without a bound, so a semaphore bounds the calls in flight.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::{TransactionBehavior, params};
use tokio::sync::Semaphore;

mod audit;
mod contexts;
mod credentials;
mod edges;
mod egress;
mod events;
mod logins;
mod metering;
mod records;
mod replicas;
mod runs;
mod sessions;
mod usage;
mod users;

use sandboxd_core::store::{
    Appended, NewUser, QuotaOverride, RunPage, RunPatch, RunQuery, RunRow, RunWakes, SessionCaps,
    SessionPage, SessionQuery, SessionRow, Store, StoreError, StoredEvent, StoredKey, Usage, User,
    control_wake,
};

/// Migrations in order; the index + 1 is the schema version it produces.
const MIGRATIONS: &[&str] = &[
    include_str!("schema_v1.sql"),
    include_str!("schema_v2.sql"),
    include_str!("schema_v3.sql"),
    include_str!("schema_v4.sql"),
    include_str!("schema_v5.sql"),
    include_str!("schema_v6.sql"),
    include_str!("schema_v7.sql"),
    include_str!("schema_v8.sql"),
    include_str!("schema_v9.sql"),
    include_str!("schema_v10.sql"),
    include_str!("schema_v11.sql"),
    include_str!("schema_v12.sql"),
    include_str!("schema_v13.sql"),
    include_str!("schema_v14.sql"),
    include_str!("schema_v15.sql"),
    include_str!("schema_v16.sql"),
    include_str!("schema_v17.sql"),
    include_str!("schema_v18.sql"),
];

/// Store calls queued at once; more wait for a permit.
const MAX_IN_FLIGHT: usize = 256;

pub struct SqliteStore {
    writer: tokio_rusqlite::Connection,
    reader: tokio_rusqlite::Connection,
    permits: Arc<Semaphore>,
    /// Wake-ups about runs, in this process only: SQLite is the one-process store (another
    /// process on the same file, or a second `open` of it, is not woken and finds new events
    /// on its waiters' re-read timeout).
    wakes: RunWakes,
}

fn sql(e: impl std::fmt::Display) -> StoreError {
    StoreError::Sql(e.to_string())
}

fn call_err(e: tokio_rusqlite::Error<StoreError>) -> StoreError {
    match e {
        tokio_rusqlite::Error::Error(e) => e,
        other => sql(other),
    }
}

fn pragmas(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

fn migrate(conn: &mut rusqlite::Connection) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql)?;
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sql)?;
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(StoreError::TooNew {
            found: version,
            known,
        });
    }
    for (i, step) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(step).map_err(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)
            .map_err(sql)?;
    }
    tx.commit().map_err(sql)
}

impl SqliteStore {
    /// Opens (creating it if needed) `path`, applies the migrations and sets WAL mode.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let open_err = |message: String| StoreError::Open {
            path: path.display().to_string(),
            message,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| open_err(e.to_string()))?;
        }
        let writer = tokio_rusqlite::Connection::open(path)
            .await
            .map_err(|e| open_err(e.to_string()))?;
        writer
            .call(|c| {
                pragmas(c).map_err(sql)?;
                migrate(c)
            })
            .await
            .map_err(call_err)?;
        let reader = tokio_rusqlite::Connection::open(path)
            .await
            .map_err(|e| open_err(e.to_string()))?;
        reader
            .call(|c| pragmas(c).map_err(sql))
            .await
            .map_err(call_err)?;
        // The key hashes are the credentials' stand-ins: keep the file private.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
        Ok(Self {
            writer,
            reader,
            permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            wakes: RunWakes::new(),
        })
    }

    async fn write<R: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let _permit = self.permits.acquire().await.map_err(sql)?;
        self.writer
            .call(move |c| {
                let tx = c
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(sql)?;
                let r = f(&tx)?;
                tx.commit().map_err(sql)?;
                Ok(r)
            })
            .await
            .map_err(call_err)
    }

    async fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let _permit = self.permits.acquire().await.map_err(sql)?;
        self.reader.call(move |c| f(c)).await.map_err(call_err)
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(sql)
}

type SqlArgs = rusqlite::ParamsFromIter<Vec<rusqlite::types::Value>>;

/// One page of a newest-first listing (sessions, runs): `select` gets the `WHERE` clauses and
/// their arguments with a limit one over the page size, so whether a next page exists is known
/// without a second query; the cursor of the next page is the last row's rowid.
fn page<T>(
    c: &rusqlite::Connection,
    where_: &[String],
    mut args: Vec<rusqlite::types::Value>,
    limit: u32,
    select: impl FnOnce(&rusqlite::Connection, &str, SqlArgs) -> Result<Vec<(i64, T)>, StoreError>,
) -> Result<(Vec<T>, Option<i64>), StoreError> {
    let limit = limit.clamp(1, 100) as usize;
    args.push(((limit + 1) as i64).into());
    let tail = format!(
        "WHERE {} ORDER BY rowid DESC LIMIT ?{}",
        where_.join(" AND "),
        args.len()
    );
    let mut rows = select(c, &tail, rusqlite::params_from_iter(args))?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next = if more {
        rows.last().map(|(id, _)| *id)
    } else {
        None
    };
    Ok((rows.into_iter().map(|(_, r)| r).collect(), next))
}

fn utc_day(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%d")
        .to_string()
}

#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> Result<(), StoreError> {
        let now = sandboxd_core::store::now_ms();
        self.write(move |tx| {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES ('last_ping', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![now.to_string()],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn add_user(&self, user: NewUser) -> Result<User, StoreError> {
        // No `_`: the id becomes part of a session owner, which allows only letters, digits, `._@:-`.
        let id = format!("usr-{}", uuid::Uuid::new_v4().simple());
        let now = sandboxd_core::store::now_ms();
        let name = user.name.clone();
        let id2 = id.clone();
        self.write(move |tx| users::insert(tx, &id2, user, now))
            .await?;
        self.user_by_name(&name)
            .await?
            .ok_or_else(|| StoreError::Sql(format!("user {id} vanished after insert")))
    }

    async fn user_by_key(&self, hash: [u8; 32]) -> Result<Option<User>, StoreError> {
        self.read(move |c| users::one(c, "WHERE key_hash = ?1", [hash.to_vec()]))
            .await
    }

    async fn user_by_name(&self, name: &str) -> Result<Option<User>, StoreError> {
        let name = name.to_string();
        self.read(move |c| users::one(c, "WHERE name = ?1", [name]))
            .await
    }

    async fn user_by_id(&self, id: &str) -> Result<Option<User>, StoreError> {
        let id = id.to_string();
        self.read(move |c| users::one(c, "WHERE id = ?1", [id]))
            .await
    }

    async fn users(&self) -> Result<Vec<User>, StoreError> {
        self.read(|c| users::select(c, "ORDER BY name", [])).await
    }

    async fn user_count(&self) -> Result<u64, StoreError> {
        self.read(users::count).await
    }

    async fn remove_user(&self, name: &str, now: i64) -> Result<bool, StoreError> {
        let name = name.to_string();
        self.write(move |tx| users::remove(tx, &name, now)).await
    }

    async fn replace_key(&self, name: &str, key: StoredKey) -> Result<bool, StoreError> {
        let name = name.to_string();
        self.write(move |tx| users::replace_key(tx, &name, key))
            .await
    }

    async fn set_quota(&self, name: &str, quota: QuotaOverride) -> Result<bool, StoreError> {
        let name = name.to_string();
        self.write(move |tx| users::set_quota(tx, &name, &quota))
            .await
    }

    async fn set_admin(&self, name: &str, admin: bool) -> Result<bool, StoreError> {
        let name = name.to_string();
        self.write(move |tx| {
            let n = tx
                .execute(
                    "UPDATE users SET admin = ?2 WHERE name = ?1",
                    rusqlite::params![name, admin],
                )
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }

    async fn touch_user(&self, id: &str, now: i64) -> Result<(), StoreError> {
        let id = id.to_string();
        self.write(move |tx| users::touch(tx, &id, now)).await
    }

    async fn reserve_session_within(
        &self,
        row: SessionRow,
        caps: SessionCaps,
    ) -> Result<(), StoreError> {
        // One writer connection and BEGIN IMMEDIATE: the counts and the insert are one
        // transaction no other writer (of any process on this file) interleaves with.
        self.write(move |tx| sessions::reserve(tx, &row, &caps))
            .await
    }

    async fn end_idle_session(
        &self,
        runtime_id: &str,
        reason: &str,
        now: i64,
    ) -> Result<Option<String>, StoreError> {
        let (runtime_id, reason) = (runtime_id.to_string(), reason.to_string());
        self.write(move |tx| sessions::end_idle(tx, &runtime_id, &reason, now))
            .await
    }

    async fn add_session_holder(
        &self,
        session_id: &str,
        replica_id: &str,
    ) -> Result<(), StoreError> {
        let (session_id, replica_id) = (session_id.to_string(), replica_id.to_string());
        self.write(move |tx| sessions::add_holder(tx, &session_id, &replica_id))
            .await
    }

    async fn remove_session_holders(
        &self,
        session_id: &str,
        replica_ids: &[String],
    ) -> Result<(), StoreError> {
        let (session_id, replica_ids) = (session_id.to_string(), replica_ids.to_vec());
        self.write(move |tx| sessions::remove_holders(tx, &session_id, &replica_ids))
            .await
    }

    async fn session_holders(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.read(sessions::holders).await
    }

    async fn session_started(
        &self,
        id: &str,
        runtime_id: &str,
        container_id: &str,
    ) -> Result<(), StoreError> {
        let (id, runtime_id, container_id) = (
            id.to_string(),
            runtime_id.to_string(),
            container_id.to_string(),
        );
        self.write(move |tx| sessions::started(tx, &id, &runtime_id, &container_id))
            .await
    }

    async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        let id = id.to_string();
        self.read(move |c| sessions::one(c, &id)).await
    }

    async fn list_sessions(&self, q: &SessionQuery) -> Result<SessionPage, StoreError> {
        let q = q.clone();
        self.read(move |c| sessions::list(c, &q)).await
    }

    async fn active_sessions(&self) -> Result<Vec<SessionRow>, StoreError> {
        self.read(|c| {
            let rows = sessions::select(c, "WHERE state != 'ended' ORDER BY rowid", [])?;
            Ok(rows.into_iter().map(|(_, r)| r).collect())
        })
        .await
    }

    async fn touch_session(&self, id: &str, now: i64) -> Result<(), StoreError> {
        let id = id.to_string();
        self.write(move |tx| sessions::touch(tx, &id, now)).await
    }

    async fn set_idle_timeout(&self, id: &str, secs: u64, now: i64) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |tx| sessions::set_idle_timeout(tx, &id, secs, now))
            .await
    }

    async fn end_session(&self, id: &str, reason: &str, now: i64) -> Result<bool, StoreError> {
        let (id, reason) = (id.to_string(), reason.to_string());
        self.write(move |tx| sessions::end(tx, &id, &reason, now))
            .await
    }

    async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |tx| sessions::delete(tx, &id)).await
    }

    async fn owner_ids(&self) -> Result<Vec<String>, StoreError> {
        self.read(sessions::owner_ids).await
    }

    async fn usage(&self, owner: &str, now: i64) -> Result<Usage, StoreError> {
        let owner = owner.to_string();
        self.read(move |c| usage::usage(c, &owner, now)).await
    }

    async fn purge_before(&self, cutoff: i64) -> Result<u64, StoreError> {
        self.write(move |tx| usage::purge_before(tx, cutoff)).await
    }

    async fn insert_run(&self, row: RunRow, max_active: u32) -> Result<(), StoreError> {
        self.write(move |tx| runs::insert(tx, &row, max_active))
            .await
    }

    async fn run(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        let id = id.to_string();
        self.read(move |c| runs::one(c, &id)).await
    }

    async fn list_runs(&self, q: &RunQuery) -> Result<RunPage, StoreError> {
        let q = q.clone();
        self.read(move |c| runs::list(c, &q)).await
    }

    async fn runs_in_flight(&self) -> Result<Vec<RunRow>, StoreError> {
        self.read(runs::in_flight).await
    }

    async fn patch_run(&self, id: &str, patch: RunPatch) -> Result<(), StoreError> {
        let id = id.to_string();
        self.write(move |tx| runs::patch(tx, &id, None, &patch))
            .await
    }

    async fn append_event(
        &self,
        run_id: &str,
        driver: &str,
        event: StoredEvent,
        patch: RunPatch,
    ) -> Result<Appended, StoreError> {
        let (id, driver) = (run_id.to_string(), driver.to_string());
        let appended = self
            .write(move |tx| events::append(tx, &id, &driver, &event, &patch))
            .await?;
        // After the commit: a woken reader finds the event.
        self.wakes.send(run_id);
        Ok(appended)
    }

    fn run_wakes(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.wakes.subscribe()
    }

    async fn wake_run(&self, run_id: &str) -> Result<(), StoreError> {
        self.wakes.send(&control_wake(run_id));
        Ok(())
    }

    async fn events_after(
        &self,
        run_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let run_id = run_id.to_string();
        self.read(move |c| events::after(c, &run_id, after, limit))
            .await
    }

    async fn put_image(
        &self,
        run_id: &str,
        id: &str,
        media_type: &str,
        data: Vec<u8>,
    ) -> Result<(), StoreError> {
        let (run_id, id, media_type) = (run_id.to_string(), id.to_string(), media_type.to_string());
        self.write(move |tx| events::put_image(tx, &run_id, &id, &media_type, &data))
            .await
    }

    async fn image(&self, run_id: &str, id: &str) -> Result<Option<(String, Vec<u8>)>, StoreError> {
        let (run_id, id) = (run_id.to_string(), id.to_string());
        self.read(move |c| events::image(c, &run_id, &id)).await
    }

    async fn conversation(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let id = session_id.to_string();
        self.read(move |c| events::conversation(c, &id)).await
    }

    async fn set_conversation(
        &self,
        session_id: &str,
        messages: String,
        now: i64,
    ) -> Result<(), StoreError> {
        let id = session_id.to_string();
        self.write(move |tx| events::set_conversation(tx, &id, &messages, now))
            .await
    }

    async fn add_input_tokens(
        &self,
        owner: &str,
        tokens: u64,
        now: i64,
    ) -> Result<u64, StoreError> {
        let owner = owner.to_string();
        self.write(move |tx| events::add_input_tokens(tx, &owner, tokens, now))
            .await
    }
}

#[cfg(test)]
mod tests;
