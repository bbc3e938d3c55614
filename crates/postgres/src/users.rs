//! The `users` table: one row-mapping helper (`select`) and the statements of the user
//! methods. Each function runs on the connection or inside the transaction it is given.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::{col, corrupt, execute, query, query_opt, to_json};
use sandboxd_core::store::{NewUser, QuotaOverride, StoreError, StoredKey, User};

/// The columns `from_row` reads, in order; `u.` so a join can use them too.
pub(crate) const COLS: &str = "u.id, u.name, u.admin, u.key_prefix, u.created_at, u.key_created_at, u.last_used_at, u.expires_at, u.quota";

/// A user from a row that starts with `COLS`; its quota JSON decoded.
pub(crate) fn from_row(r: &Row) -> Result<User, StoreError> {
    let quota: String = col(r, 8)?;
    Ok(User {
        id: col(r, 0)?,
        name: col(r, 1)?,
        admin: col(r, 2)?,
        key_prefix: col(r, 3)?,
        created_at: col(r, 4)?,
        key_created_at: col(r, 5)?,
        last_used_at: col(r, 6)?,
        expires_at: col(r, 7)?,
        quota: serde_json::from_str::<QuotaOverride>(&quota)
            .map_err(|e| corrupt("user quota", e))?,
    })
}

/// The users matching `tail` (a WHERE/ORDER clause over `users u`).
pub(crate) async fn select(
    c: &impl GenericClient,
    tail: &str,
    args: &[&(dyn ToSql + Sync)],
) -> Result<Vec<User>, StoreError> {
    let rows = query(c, &format!("SELECT {COLS} FROM users u {tail}"), args).await?;
    rows.iter().map(from_row).collect()
}

pub(crate) async fn one(
    c: &impl GenericClient,
    tail: &str,
    args: &[&(dyn ToSql + Sync)],
) -> Result<Option<User>, StoreError> {
    Ok(select(c, tail, args).await?.into_iter().next())
}

/// Inserts the user; a taken name is `UserExists` (also when another writer took it first).
pub(crate) async fn insert(
    c: &impl GenericClient,
    id: &str,
    user: NewUser,
    now: i64,
) -> Result<(), StoreError> {
    let n = execute(
        c,
        "INSERT INTO users (id, name, admin, key_hash, key_prefix, created_at, key_created_at, expires_at, quota)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (name) DO NOTHING",
        &[
            &id,
            &user.name,
            &user.admin,
            &user.key.hash.as_slice(),
            &user.key.prefix,
            &now,
            &user.key.created_at,
            &user.key.expires_at,
            &to_json(&user.quota)?,
        ],
    )
    .await?;
    if n == 0 {
        return Err(StoreError::UserExists { name: user.name });
    }
    Ok(())
}

pub(crate) async fn count(c: &impl GenericClient) -> Result<u64, StoreError> {
    let rows = query(c, "SELECT COUNT(*) FROM users", &[]).await?;
    let n: i64 = match rows.first() {
        Some(r) => col(r, 0)?,
        None => 0,
    };
    Ok(crate::unsigned(n))
}

/// Removes the user and ends their sessions; false when there is no such user.
pub(crate) async fn remove(
    c: &impl GenericClient,
    name: &str,
    now: i64,
) -> Result<bool, StoreError> {
    let row = query_opt(
        c,
        "SELECT id FROM users WHERE name = $1 FOR UPDATE",
        &[&name],
    )
    .await?;
    let Some(row) = row else { return Ok(false) };
    let id: String = col(&row, 0)?;
    execute(
        c,
        "UPDATE sessions SET state = 'ended', env = NULL, ended_at = $2, end_reason = 'its user was removed'
         WHERE owner = $1 AND state != 'ended'",
        &[&id, &now],
    )
    .await?;
    execute(c, "DELETE FROM users WHERE id = $1", &[&id]).await?;
    Ok(true)
}

pub(crate) async fn replace_key(
    c: &impl GenericClient,
    name: &str,
    key: StoredKey,
) -> Result<bool, StoreError> {
    let n = execute(
        c,
        "UPDATE users SET key_hash = $2, key_prefix = $3, key_created_at = $4, expires_at = $5, last_used_at = NULL
         WHERE name = $1",
        &[&name, &key.hash.as_slice(), &key.prefix, &key.created_at, &key.expires_at],
    )
    .await?;
    Ok(n > 0)
}

pub(crate) async fn set_quota(
    c: &impl GenericClient,
    name: &str,
    quota: &QuotaOverride,
) -> Result<bool, StoreError> {
    let n = execute(
        c,
        "UPDATE users SET quota = $2 WHERE name = $1",
        &[&name, &to_json(quota)?],
    )
    .await?;
    Ok(n > 0)
}

pub(crate) async fn touch(c: &impl GenericClient, id: &str, now: i64) -> Result<(), StoreError> {
    execute(
        c,
        "UPDATE users SET last_used_at = $2 WHERE id = $1",
        &[&id, &now],
    )
    .await?;
    Ok(())
}
