//! The embedded, versioned migrations and how they are applied: each step in its own
//! transaction that first takes a transaction-scoped advisory lock, then reads the
//! `schema_migrations` table, so of two replicas starting at once one applies a step and the
//! other, waiting on the lock, finds it applied and goes on. A database whose newest applied
//! version is above what this build knows is refused (`StoreError::TooNew`), as SQLite's is.

use deadpool_postgres::GenericClient;
use sandboxd_core::store::StoreError;

use crate::sql;

/// Migrations in order; the index + 1 is the version it produces. Never edit a released one:
/// add a step.
pub(crate) const MIGRATIONS: &[&str] = &[
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
];

/// The advisory lock key every migrating process takes (the first 8 bytes of
/// "sandboxd" read as a big-endian integer, so no other application is likely to share it).
const LOCK_KEY: i64 = 0x7361_6e64_626f_7864;

const TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version BIGINT PRIMARY KEY,
    applied_at BIGINT NOT NULL
)";

/// The newest applied version (0 for an empty database); reads only, creates nothing.
pub(crate) async fn version(c: &impl GenericClient) -> Result<i64, StoreError> {
    let exists = c
        .query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[])
        .await
        .map_err(sql)?;
    if !exists.get::<_, bool>(0) {
        return Ok(0);
    }
    let row = c
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .await
        .map_err(sql)?;
    Ok(row.get(0))
}

/// Applies every step not applied yet, each once, in order.
pub(crate) async fn migrate(client: &mut deadpool_postgres::Client) -> Result<(), StoreError> {
    let known = MIGRATIONS.len() as i64;
    for (i, step) in MIGRATIONS.iter().enumerate() {
        let target = i as i64 + 1;
        let tx = client.transaction().await.map_err(sql)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
            .await
            .map_err(sql)?;
        tx.batch_execute(TABLE).await.map_err(sql)?;
        let found = version(&tx).await?;
        if found > known {
            return Err(StoreError::TooNew { found, known });
        }
        if found >= target {
            tx.commit().await.map_err(sql)?;
            continue;
        }
        tx.batch_execute(step).await.map_err(sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
            &[&target, &sandboxd_core::store::now_ms()],
        )
        .await
        .map_err(sql)?;
        tx.commit().await.map_err(sql)?;
        tracing::info!(version = target, "postgres store: migration applied");
    }
    Ok(())
}
