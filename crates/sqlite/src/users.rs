//! The `users` table: one row-mapping helper (`select`) and the statements of the user
//! methods. Each function runs inside the transaction or on the connection it is given.

use rusqlite::{Connection, OptionalExtension, Params, Transaction, params};

use crate::{sql, to_json};
use sandboxd_core::store::{NewUser, QuotaOverride, StoreError, StoredKey, User};

const COLS: &str =
    "id, name, admin, key_prefix, created_at, key_created_at, last_used_at, expires_at, quota";

/// The users matching `tail` (a WHERE/ORDER clause), mapped and their JSON decoded.
pub(super) fn select(
    c: &Connection,
    tail: &str,
    args: impl Params,
) -> Result<Vec<User>, StoreError> {
    let mut st = c
        .prepare(&format!("SELECT {COLS} FROM users {tail}"))
        .map_err(sql)?;
    let rows = st
        .query_map(args, |r| {
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
                r.get::<_, String>(8)?,
            ))
        })
        .map_err(sql)?;
    rows.map(|row| {
        let (mut u, quota) = row.map_err(sql)?;
        u.quota = serde_json::from_str(&quota).map_err(|e| StoreError::Corrupt {
            what: "user quota",
            message: e.to_string(),
        })?;
        Ok(u)
    })
    .collect()
}

pub(super) fn one(
    c: &Connection,
    tail: &str,
    args: impl Params,
) -> Result<Option<User>, StoreError> {
    Ok(select(c, tail, args)?.into_iter().next())
}

pub(super) fn insert(
    tx: &Transaction<'_>,
    id: &str,
    user: NewUser,
    now: i64,
) -> Result<(), StoreError> {
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
            id,
            user.name,
            user.admin,
            user.key.hash.to_vec(),
            user.key.prefix,
            now,
            user.key.created_at,
            user.key.expires_at,
            to_json(&user.quota)?
        ],
    )
    .map_err(sql)?;
    Ok(())
}

pub(super) fn count(c: &Connection) -> Result<u64, StoreError> {
    c.query_row("SELECT COUNT(*) FROM users", [], |r| r.get::<_, i64>(0))
        .map(|n| n.max(0) as u64)
        .map_err(sql)
}

/// Removes the user and ends their sessions; false when there is no such user.
pub(super) fn remove(tx: &Transaction<'_>, name: &str, now: i64) -> Result<bool, StoreError> {
    let id: Option<String> = tx
        .query_row("SELECT id FROM users WHERE name = ?1", [name], |r| r.get(0))
        .optional()
        .map_err(sql)?;
    let Some(id) = id else { return Ok(false) };
    tx.execute(
        "UPDATE sessions SET state = 'ended', env = NULL, ended_at = ?2, end_reason = 'its user was removed'
         WHERE owner = ?1 AND state != 'ended'",
        params![id, now],
    )
    .map_err(sql)?;
    tx.execute("DELETE FROM users WHERE id = ?1", [&id])
        .map_err(sql)?;
    Ok(true)
}

pub(super) fn replace_key(
    tx: &Transaction<'_>,
    name: &str,
    key: StoredKey,
) -> Result<bool, StoreError> {
    let n = tx
        .execute(
            "UPDATE users SET key_hash = ?2, key_prefix = ?3, key_created_at = ?4, expires_at = ?5, last_used_at = NULL
             WHERE name = ?1",
            params![name, key.hash.to_vec(), key.prefix, key.created_at, key.expires_at],
        )
        .map_err(sql)?;
    Ok(n > 0)
}

pub(super) fn set_quota(
    tx: &Transaction<'_>,
    name: &str,
    quota: &QuotaOverride,
) -> Result<bool, StoreError> {
    let n = tx
        .execute(
            "UPDATE users SET quota = ?2 WHERE name = ?1",
            params![name, to_json(quota)?],
        )
        .map_err(sql)?;
    Ok(n > 0)
}

pub(super) fn touch(tx: &Transaction<'_>, id: &str, now: i64) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE users SET last_used_at = ?2 WHERE id = ?1",
        params![id, now],
    )
    .map_err(sql)?;
    Ok(())
}
