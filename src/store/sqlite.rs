//! SqliteStore: the embedded store, one SQLite file in the data directory.
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
use rusqlite::{OptionalExtension, TransactionBehavior, params};
use tokio::sync::Semaphore;

use super::{
    NewUser, QuotaOverride, SessionPage, SessionQuery, SessionRow, SessionState, Store, StoreError,
    StoredKey, Usage, User,
};

/// Migrations in order; the index + 1 is the schema version it produces.
const MIGRATIONS: &[&str] = &[include_str!("schema_v1.sql")];

/// Store calls queued at once; more wait for a permit.
const MAX_IN_FLIGHT: usize = 256;

pub struct SqliteStore {
    writer: tokio_rusqlite::Connection,
    reader: tokio_rusqlite::Connection,
    permits: Arc<Semaphore>,
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

const USER_COLS: &str =
    "id, name, admin, key_prefix, created_at, key_created_at, last_used_at, expires_at, quota";

fn user_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(User, String)> {
    Ok((
        User {
            id: r.get(0)?,
            name: r.get(1)?,
            admin: r.get(2)?,
            key_prefix: r.get(3)?,
            created_at: r.get(4)?,
            key_created_at: r.get(5)?,
            last_used_at: r.get(6)?,
            expires_at: r.get(7)?,
            quota: QuotaOverride::default(),
        },
        r.get(8)?,
    ))
}

fn finish_user((mut u, quota): (User, String)) -> Result<User, StoreError> {
    u.quota = serde_json::from_str(&quota).map_err(|e| StoreError::Corrupt {
        what: "user quota",
        message: e.to_string(),
    })?;
    Ok(u)
}

const SESSION_COLS: &str = "rowid, id, owner, state, limits, metadata, idle_timeout_secs, runtime_id, container_id, created_at, last_used_at, ended_at, end_reason";

struct RawSession {
    rowid: i64,
    row: SessionRow,
    state: String,
    limits: String,
    metadata: String,
}

fn session_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawSession> {
    Ok(RawSession {
        rowid: r.get(0)?,
        state: r.get(3)?,
        limits: r.get(4)?,
        metadata: r.get(5)?,
        row: SessionRow {
            id: r.get(1)?,
            owner: r.get(2)?,
            state: SessionState::Ended,
            limits: Default::default(),
            metadata: Default::default(),
            idle_timeout_secs: r.get::<_, i64>(6)?.max(0) as u64,
            runtime_id: r.get(7)?,
            container_id: r.get(8)?,
            created_at: r.get(9)?,
            last_used_at: r.get(10)?,
            ended_at: r.get(11)?,
            end_reason: r.get(12)?,
        },
    })
}

fn finish_session(raw: RawSession) -> Result<SessionRow, StoreError> {
    let corrupt = |what, message: String| StoreError::Corrupt { what, message };
    let mut row = raw.row;
    row.state = SessionState::parse(&raw.state)
        .ok_or_else(|| corrupt("session state", raw.state.clone()))?;
    row.limits =
        serde_json::from_str(&raw.limits).map_err(|e| corrupt("session limits", e.to_string()))?;
    row.metadata = serde_json::from_str(&raw.metadata)
        .map_err(|e| corrupt("session metadata", e.to_string()))?;
    Ok(row)
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(sql)
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
        let now = super::now_ms();
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
        let quota = to_json(&user.quota)?;
        let now = super::now_ms();
        let name = user.name.clone();
        let id2 = id.clone();
        self.write(move |tx| {
            let exists: Option<String> = tx
                .query_row("SELECT id FROM users WHERE name = ?1", [&user.name], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(sql)?;
            if exists.is_some() {
                return Err(StoreError::UserExists { name: user.name });
            }
            tx.execute(
                "INSERT INTO users (id, name, admin, key_hash, key_prefix, created_at, key_created_at, expires_at, quota)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    id2,
                    user.name,
                    user.admin,
                    user.key.hash.to_vec(),
                    user.key.prefix,
                    now,
                    user.key.created_at,
                    user.key.expires_at,
                    quota
                ],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await?;
        self.user_by_name(&name)
            .await?
            .ok_or_else(|| StoreError::Sql(format!("user {id} vanished after insert")))
    }

    async fn user_by_key(&self, hash: [u8; 32]) -> Result<Option<User>, StoreError> {
        self.read(move |c| {
            c.query_row(
                &format!("SELECT {USER_COLS} FROM users WHERE key_hash = ?1"),
                [hash.to_vec()],
                user_row,
            )
            .optional()
            .map_err(sql)?
            .map(finish_user)
            .transpose()
        })
        .await
    }

    async fn user_by_name(&self, name: &str) -> Result<Option<User>, StoreError> {
        let name = name.to_string();
        self.read(move |c| {
            c.query_row(
                &format!("SELECT {USER_COLS} FROM users WHERE name = ?1"),
                [name],
                user_row,
            )
            .optional()
            .map_err(sql)?
            .map(finish_user)
            .transpose()
        })
        .await
    }

    async fn users(&self) -> Result<Vec<User>, StoreError> {
        self.read(|c| {
            let mut st = c
                .prepare(&format!("SELECT {USER_COLS} FROM users ORDER BY name"))
                .map_err(sql)?;
            let rows = st.query_map([], user_row).map_err(sql)?;
            rows.map(|r| r.map_err(sql).and_then(finish_user)).collect()
        })
        .await
    }

    async fn user_count(&self) -> Result<u64, StoreError> {
        self.read(|c| {
            c.query_row("SELECT COUNT(*) FROM users", [], |r| r.get::<_, i64>(0))
                .map(|n| n.max(0) as u64)
                .map_err(sql)
        })
        .await
    }

    async fn remove_user(&self, name: &str, now: i64) -> Result<bool, StoreError> {
        let name = name.to_string();
        self.write(move |tx| {
            let id: Option<String> = tx
                .query_row("SELECT id FROM users WHERE name = ?1", [&name], |r| r.get(0))
                .optional()
                .map_err(sql)?;
            let Some(id) = id else { return Ok(false) };
            tx.execute(
                "UPDATE sessions SET state = 'ended', ended_at = ?2, end_reason = 'its user was removed'
                 WHERE owner = ?1 AND state != 'ended'",
                params![id, now],
            )
            .map_err(sql)?;
            tx.execute("DELETE FROM users WHERE id = ?1", [&id])
                .map_err(sql)?;
            Ok(true)
        })
        .await
    }

    async fn replace_key(&self, name: &str, key: StoredKey) -> Result<bool, StoreError> {
        let name = name.to_string();
        self.write(move |tx| {
            let n = tx
                .execute(
                    "UPDATE users SET key_hash = ?2, key_prefix = ?3, key_created_at = ?4, expires_at = ?5, last_used_at = NULL
                     WHERE name = ?1",
                    params![name, key.hash.to_vec(), key.prefix, key.created_at, key.expires_at],
                )
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }

    async fn set_quota(&self, name: &str, quota: QuotaOverride) -> Result<bool, StoreError> {
        let name = name.to_string();
        let quota = to_json(&quota)?;
        self.write(move |tx| {
            let n = tx
                .execute(
                    "UPDATE users SET quota = ?2 WHERE name = ?1",
                    params![name, quota],
                )
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }

    async fn touch_user(&self, id: &str, now: i64) -> Result<(), StoreError> {
        let id = id.to_string();
        self.write(move |tx| {
            tx.execute(
                "UPDATE users SET last_used_at = ?2 WHERE id = ?1",
                params![id, now],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn reserve_session(&self, row: SessionRow, max_active: u32) -> Result<(), StoreError> {
        let limits = to_json(&row.limits)?;
        let metadata = to_json(&row.metadata)?;
        self.write(move |tx| {
            let active: i64 = tx
                .query_row(
                    "SELECT COUNT(*) FROM sessions WHERE owner = ?1 AND state != 'ended'",
                    [&row.owner],
                    |r| r.get(0),
                )
                .map_err(sql)?;
            if active >= max_active as i64 {
                return Err(StoreError::SessionQuota {
                    limit: max_active,
                    active: active as u32,
                });
            }
            tx.execute(
                "INSERT INTO sessions (id, owner, state, limits, metadata, idle_timeout_secs, created_at, last_used_at)
                 VALUES (?1, ?2, 'creating', ?3, ?4, ?5, ?6, ?6)",
                params![row.id, row.owner, limits, metadata, row.idle_timeout_secs as i64, row.created_at],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
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
        self.write(move |tx| {
            tx.execute(
                "UPDATE sessions SET state = 'running', runtime_id = ?2, container_id = ?3
                 WHERE id = ?1 AND state = 'creating'",
                params![id, runtime_id, container_id],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        let id = id.to_string();
        self.read(move |c| {
            c.query_row(
                &format!("SELECT {SESSION_COLS} FROM sessions WHERE id = ?1"),
                [id],
                session_row,
            )
            .optional()
            .map_err(sql)?
            .map(finish_session)
            .transpose()
        })
        .await
    }

    async fn list_sessions(&self, q: &SessionQuery) -> Result<SessionPage, StoreError> {
        let q = q.clone();
        self.read(move |c| {
            let mut where_ = vec!["1 = 1".to_string()];
            let mut args: Vec<rusqlite::types::Value> = Vec::new();
            if let Some(owner) = &q.owner {
                args.push(owner.clone().into());
                where_.push(format!("owner = ?{}", args.len()));
            }
            if !q.include_ended {
                where_.push("state != 'ended'".into());
            }
            if let Some(before) = q.before {
                args.push(before.into());
                where_.push(format!("rowid < ?{}", args.len()));
            }
            for (k, v) in &q.metadata {
                // The JSON path is a bound parameter; keys are checked to be plain names.
                args.push(format!("$.\"{k}\"").into());
                let path = args.len();
                args.push(v.clone().into());
                where_.push(format!("json_extract(metadata, ?{path}) = ?{}", args.len()));
            }
            let limit = q.limit.clamp(1, 100) as i64;
            args.push((limit + 1).into());
            let text = format!(
                "SELECT {SESSION_COLS} FROM sessions WHERE {} ORDER BY rowid DESC LIMIT ?{}",
                where_.join(" AND "),
                args.len()
            );
            let mut st = c.prepare(&text).map_err(sql)?;
            let raws: Vec<RawSession> = st
                .query_map(rusqlite::params_from_iter(args), session_row)
                .map_err(sql)?
                .collect::<Result<_, _>>()
                .map_err(sql)?;
            let more = raws.len() as i64 > limit;
            let mut sessions = Vec::new();
            let mut next = None;
            for raw in raws.into_iter().take(limit as usize) {
                next = Some(raw.rowid);
                sessions.push(finish_session(raw)?);
            }
            Ok(SessionPage {
                sessions,
                next: if more { next } else { None },
            })
        })
        .await
    }

    async fn active_sessions(&self) -> Result<Vec<SessionRow>, StoreError> {
        self.read(|c| {
            let mut st = c
                .prepare(&format!(
                    "SELECT {SESSION_COLS} FROM sessions WHERE state != 'ended' ORDER BY rowid"
                ))
                .map_err(sql)?;
            let rows = st.query_map([], session_row).map_err(sql)?;
            rows.map(|r| r.map_err(sql).and_then(finish_session))
                .collect()
        })
        .await
    }

    async fn touch_session(&self, id: &str, now: i64) -> Result<(), StoreError> {
        let id = id.to_string();
        self.write(move |tx| {
            tx.execute(
                "UPDATE sessions SET last_used_at = ?2 WHERE id = ?1 AND last_used_at < ?2",
                params![id, now],
            )
            .map_err(sql)?;
            Ok(())
        })
        .await
    }

    async fn end_session(&self, id: &str, reason: &str, now: i64) -> Result<bool, StoreError> {
        let (id, reason) = (id.to_string(), reason.to_string());
        self.write(move |tx| {
            let n = tx
                .execute(
                    "UPDATE sessions SET state = 'ended', ended_at = ?2, end_reason = ?3
                     WHERE id = ?1 AND state != 'ended'",
                    params![id, now, reason],
                )
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }

    async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |tx| {
            let n = tx
                .execute("DELETE FROM sessions WHERE id = ?1", [id])
                .map_err(sql)?;
            Ok(n > 0)
        })
        .await
    }

    async fn owner_ids(&self) -> Result<Vec<String>, StoreError> {
        self.read(|c| {
            let mut st = c
                .prepare("SELECT id FROM users UNION SELECT DISTINCT owner FROM sessions")
                .map_err(sql)?;
            let rows = st.query_map([], |r| r.get::<_, String>(0)).map_err(sql)?;
            rows.collect::<Result<_, _>>().map_err(sql)
        })
        .await
    }

    async fn usage(&self, owner: &str, now: i64) -> Result<Usage, StoreError> {
        let owner = owner.to_string();
        let day = utc_day(now);
        self.read(move |c| {
            let count = |q: &str| -> Result<u32, StoreError> {
                c.query_row(q, [&owner], |r| r.get::<_, i64>(0))
                    .map(|n| n.max(0) as u32)
                    .map_err(sql)
            };
            let active_sessions =
                count("SELECT COUNT(*) FROM sessions WHERE owner = ?1 AND state != 'ended'")?;
            let active_runs = count(
                "SELECT COUNT(*) FROM runs WHERE owner = ?1 AND state IN ('queued', 'running', 'waiting_for_human')",
            )?;
            let tokens: Option<i64> = c
                .query_row(
                    "SELECT input_tokens FROM token_usage WHERE owner = ?1 AND day = ?2",
                    params![owner, day],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql)?;
            Ok(Usage {
                active_sessions,
                active_runs,
                input_tokens_today: tokens.unwrap_or(0).max(0) as u64,
            })
        })
        .await
    }

    async fn purge_before(&self, cutoff: i64) -> Result<u64, StoreError> {
        self.write(move |tx| {
            let runs = tx
                .execute(
                    "DELETE FROM runs WHERE ended_at IS NOT NULL AND ended_at < ?1",
                    [cutoff],
                )
                .map_err(sql)?;
            let sessions = tx
                .execute(
                    "DELETE FROM sessions WHERE state = 'ended' AND ended_at < ?1",
                    [cutoff],
                )
                .map_err(sql)?;
            Ok((runs + sessions) as u64)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::now_ms;

    fn key(b: u8) -> StoredKey {
        StoredKey {
            hash: [b; 32],
            prefix: format!("sbx_{b}"),
            created_at: now_ms(),
            expires_at: None,
        }
    }

    fn session(id: &str, owner: &str) -> SessionRow {
        SessionRow {
            id: id.into(),
            owner: owner.into(),
            state: SessionState::Creating,
            limits: Default::default(),
            metadata: [("app".to_string(), "x".to_string())].into(),
            idle_timeout_secs: 60,
            runtime_id: None,
            container_id: None,
            created_at: now_ms(),
            last_used_at: now_ms(),
            ended_at: None,
            end_reason: None,
        }
    }

    #[tokio::test]
    async fn users_sessions_quota_paging_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = SqliteStore::open(&path).await.unwrap();
        let alice = store
            .add_user(NewUser {
                name: "alice".into(),
                admin: false,
                key: key(1),
                quota: Default::default(),
            })
            .await
            .unwrap();
        let dup = store
            .add_user(NewUser {
                name: "alice".into(),
                admin: true,
                key: key(2),
                quota: Default::default(),
            })
            .await;
        assert!(matches!(dup, Err(StoreError::UserExists { .. })));
        assert_eq!(
            store.user_by_key([1; 32]).await.unwrap().unwrap().name,
            "alice"
        );
        assert!(store.user_by_key([2; 32]).await.unwrap().is_none());

        for i in 0..3 {
            store
                .reserve_session(session(&format!("s{i}"), &alice.id), 3)
                .await
                .unwrap();
        }
        let over = store.reserve_session(session("s9", &alice.id), 3).await;
        assert!(matches!(
            over,
            Err(StoreError::SessionQuota {
                limit: 3,
                active: 3
            })
        ));
        store.session_started("s0", "r0", "c0").await.unwrap();
        let s0 = store.session("s0").await.unwrap().unwrap();
        assert_eq!(s0.state, SessionState::Running);
        assert_eq!(s0.runtime_id.as_deref(), Some("r0"));

        let mut q = SessionQuery {
            owner: Some(alice.id.clone()),
            limit: 2,
            metadata: vec![("app".into(), "x".into())],
            ..Default::default()
        };
        let p1 = store.list_sessions(&q).await.unwrap();
        assert_eq!(p1.sessions.len(), 2);
        assert_eq!(p1.sessions[0].id, "s2", "newest first");
        q.before = p1.next;
        let p2 = store.list_sessions(&q).await.unwrap();
        assert_eq!(p2.sessions.len(), 1);
        assert!(p2.next.is_none());
        q.before = None;
        q.metadata = vec![("app".into(), "y".into())];
        assert!(store.list_sessions(&q).await.unwrap().sessions.is_empty());

        assert!(store.end_session("s1", "deleted", now_ms()).await.unwrap());
        assert!(!store.end_session("s1", "deleted", now_ms()).await.unwrap());
        assert_eq!(
            store
                .usage(&alice.id, now_ms())
                .await
                .unwrap()
                .active_sessions,
            2
        );
        drop(store);

        // Reopening applies no migration twice and keeps the rows.
        let store = SqliteStore::open(&path).await.unwrap();
        assert_eq!(store.active_sessions().await.unwrap().len(), 2);
        assert!(store.remove_user("alice", now_ms()).await.unwrap());
        assert!(store.active_sessions().await.unwrap().is_empty());
        assert_eq!(store.purge_before(now_ms() + 1).await.unwrap(), 3);
        store.ping().await.unwrap();
    }
}
