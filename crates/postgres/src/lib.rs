//! PgStore: the `Store` on PostgreSQL, for several `serve` replicas on one database. This file
//! opens the pool, applies the migrations (migrate.rs) and holds the helpers the tables share;
//! store.rs maps the trait onto the tables' statements, which live one file per area like the
//! SQLite store's (users.rs, sessions.rs, runs.rs, events.rs, logins.rs, usage.rs, edges.rs);
//! wakes.rs is its run wake-ups across replicas (NOTIFY in the append, a LISTEN connection of
//! its own); scratch.rs makes and drops throw-away databases (the bench's replicas).
//!
//! Why tokio-postgres + deadpool-postgres and not sqlx: sqlx's `sqlite` feature links a
//! libsqlite3-sys that cannot coexist with rusqlite's (cargo refuses two `links = "sqlite3"`),
//! so sqlx could only be used with its `postgres` feature beside rusqlite, and then it brings
//! its own runtime layer, macros and ~100 crates for one store, and its 0.9 line needs
//! rust-version 1.94 while the workspace pins 1.88. tokio-postgres (rust-version 1.85) is the
//! plain protocol client sqlx's ideas came from, with notifications (`LISTEN/NOTIFY`, which the
//! replicas will need) on its connection; deadpool-postgres is a small pool over it with a
//! per-connection statement cache. Neither touches SQLite, so both stores link in one binary.
//!
//! Semantics are the SQLite store's, where the conformance suite and the server rely on them:
//! the caps (`reserve_session`, `insert_run`) count and insert under a transaction-scoped
//! advisory lock per owner, so concurrent writers on any connection of any replica never both
//! pass a cap (and a run's insert also takes its session's, so a session's rowids are its run
//! order); an event's append locks its run row (`SELECT … FOR UPDATE`) and checks that the
//! appending replica drives the run with a live lease, so each seq is committed exactly once,
//! in order, with its patch, by the run's one driver: one statement, a plpgsql function
//! (schema_v9.sql), so one round trip per event. Everything else is one statement or one
//! READ COMMITTED transaction. TLS is not offered yet: use a loopback or private network.

use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use sandboxd_core::store::StoreError;
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;

mod audit;
mod contexts;
mod credentials;
mod edges;
mod egress;
mod events;
mod logins;
mod metering;
mod migrate;
mod records;
mod replicas;
mod runs;
mod scratch;
mod sessions;
mod store;
mod usage;
mod users;
mod wakes;

pub use scratch::{ScratchDatabase, create_scratch_database};
pub use wakes::APPLICATION_NAME as WAKES_APPLICATION_NAME;

/// Connections one process keeps to the database at most.
const POOL_SIZE: usize = 16;
/// How long a call waits for a free connection, or for a new one to be made, before failing.
const POOL_WAIT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub struct PgStore {
    pool: Pool,
    /// Run wake-ups of every replica, as the listener (wakes.rs) hears them.
    wakes: sandboxd_core::store::RunWakes,
    /// Dropped with the store: stops the listener.
    _listener: tokio::sync::oneshot::Sender<()>,
}

/// What `probe` finds, for `sandboxd doctor`: the server and the schema, migrating nothing.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The server's `server_version`, e.g. "15.18 (Debian 15.18-0+deb12u1)".
    pub server_version: String,
    /// The newest migration applied (0 for an empty database).
    pub schema_version: i64,
    /// The newest migration this build knows.
    pub known_version: i64,
}

/// The error of a failed statement or connection, with its causes (the server's message):
/// `Unavailable` when the database could not be reached or went away (the request may work
/// when retried), `Sql` for everything else.
pub(crate) fn sql(e: impl std::error::Error + 'static) -> StoreError {
    if unreachable(&e) {
        StoreError::Unavailable(chain(&e))
    } else {
        StoreError::Sql(chain(&e))
    }
}

/// Whether `e` says the database is out of reach rather than that a statement failed: the
/// connection is closed or failed on I/O, or the server refused or dropped it (SQLSTATE
/// class 08 "connection exception", 57P01-57P03 shutting down or starting up, 53300 too
/// many connections).
fn unreachable(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.is::<std::io::Error>() {
            return true;
        }
        if let Some(pg) = c.downcast_ref::<tokio_postgres::Error>() {
            if pg.is_closed() {
                return true;
            }
            if let Some(code) = pg.code() {
                let code = code.code();
                return code.starts_with("08")
                    || matches!(code, "57P01" | "57P02" | "57P03" | "53300");
            }
        }
        cause = c.source();
    }
    false
}

/// An error's message and its causes', each once (pool errors repeat their cause's text).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    message
}

pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Sql(e.to_string()))
}

pub(crate) fn corrupt(what: &'static str, message: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what,
        message: message.to_string(),
    }
}

/// Column `i` of a row, typed; a type the row does not hold is an error, never a panic.
pub(crate) fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    r: &'a tokio_postgres::Row,
    i: usize,
) -> Result<T, StoreError> {
    r.try_get(i).map_err(sql)
}

/// Runs a statement (prepared once per connection) and returns its rows.
pub(crate) async fn query(
    c: &impl GenericClient,
    statement: &str,
    args: &[&(dyn ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, StoreError> {
    let st = c.prepare_cached(statement).await.map_err(sql)?;
    c.query(&st, args).await.map_err(sql)
}

/// Runs a statement that returns at most one row.
pub(crate) async fn query_opt(
    c: &impl GenericClient,
    statement: &str,
    args: &[&(dyn ToSql + Sync)],
) -> Result<Option<tokio_postgres::Row>, StoreError> {
    let st = c.prepare_cached(statement).await.map_err(sql)?;
    c.query_opt(&st, args).await.map_err(sql)
}

/// Runs a statement and returns how many rows it changed.
pub(crate) async fn execute(
    c: &impl GenericClient,
    statement: &str,
    args: &[&(dyn ToSql + Sync)],
) -> Result<u64, StoreError> {
    let st = c.prepare_cached(statement).await.map_err(sql)?;
    c.execute(&st, args).await.map_err(sql)
}

/// A store count or counter (BIGINT) as the unsigned number the rows carry.
pub(crate) fn unsigned(v: i64) -> u64 {
    v.max(0) as u64
}

/// Arguments of a statement built at run time (the listings' filters).
pub(crate) type Args = Vec<Box<dyn ToSql + Sync + Send>>;

pub(crate) fn arg_refs(args: &Args) -> Vec<&(dyn ToSql + Sync)> {
    args.iter()
        .map(|a| a.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

/// The tail of one page of a newest-first listing (sessions, runs): the `WHERE` clauses, and
/// a limit one over the page size so whether a next page exists is known without a second
/// query. Returns the tail and the page size.
pub(crate) fn page_tail(where_: &[String], args: &mut Args, limit: u32) -> (String, usize) {
    let limit = limit.clamp(1, 100) as usize;
    args.push(Box::new((limit + 1) as i64));
    let tail = format!(
        "WHERE {} ORDER BY rowid DESC LIMIT ${}",
        where_.join(" AND "),
        args.len()
    );
    (tail, limit)
}

/// The page's rows and the cursor of the next page (the last row's rowid), if there is one.
pub(crate) fn page_split<T>(mut rows: Vec<(i64, T)>, limit: usize) -> (Vec<T>, Option<i64>) {
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next = if more {
        rows.last().map(|(id, _)| *id)
    } else {
        None
    };
    (rows.into_iter().map(|(_, r)| r).collect(), next)
}

pub(crate) fn utc_day(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%d")
        .to_string()
}

fn parse_url(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    let open_err = |message: String| StoreError::Open {
        path: redacted(url),
        message,
    };
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(open_err("not a postgres:// URL".into()));
    }
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| open_err(chain(&e)))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("sandboxd");
    }
    Ok(config)
}

/// The URL without its password, for messages and logs.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(a value that is not a URL)".to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    // A password may also come as a query parameter.
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => p.to_string(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_string(),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        _ => format!("{scheme}://{authority}{tail}"),
    }
}

/// A pool of connections to `url`; it connects on first use.
fn pool(url: &str, size: usize) -> Result<Pool, StoreError> {
    let manager = Manager::from_config(
        parse_url(url)?,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(POOL_WAIT))
        .build()
        .map_err(|e| StoreError::Open {
            path: redacted(url),
            message: e.to_string(),
        })
}

impl PgStore {
    /// Connects to `url` (`postgres://user:password@host:port/database`), applies the
    /// migrations not applied yet and keeps a pool of connections.
    /// Its run wake-up listener starts once the schema is in place.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let pool = pool(url, POOL_SIZE)?;
        let mut client = pool.get().await.map_err(|e| StoreError::Open {
            path: redacted(url),
            message: chain(&e),
        })?;
        migrate::migrate(&mut client).await?;
        drop(client);
        let wakes = sandboxd_core::store::RunWakes::new();
        let (listener, listening) = wakes::spawn(parse_url(url)?, wakes.clone());
        // Listening before the store is used, so a replica hears every commit from its
        // start; if LISTEN is slow, the store works anyway (waiters re-read on a timeout).
        if tokio::time::timeout(CONNECT_TIMEOUT, listening)
            .await
            .is_err()
        {
            tracing::warn!(store = %redacted(url), "the run wake-up listener is not listening yet; followers re-read on a timeout until it is");
        }
        Ok(Self {
            pool,
            wakes,
            _listener: listener,
        })
    }

    /// Sends a run's wake-up (`payload`: its id, or `control_wake` of it) to every replica:
    /// delivered when `c`'s transaction commits (at once outside one), never if it rolls back.
    pub(crate) async fn notify(c: &impl GenericClient, payload: &str) -> Result<(), StoreError> {
        execute(c, "SELECT pg_notify($1, $2)", &[&wakes::CHANNEL, &payload]).await?;
        Ok(())
    }

    /// A connection from the pool.
    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        // Whatever kept the pool from handing out a connection (none free within
        // POOL_WAIT, or none could be made) is the database out of reach, for now.
        self.pool.get().await.map_err(|e| {
            StoreError::Unavailable(format!("the postgres store is unreachable: {}", chain(&e)))
        })
    }
}

/// Connects once to `url` and reads the server's version and the schema's, applying nothing.
pub async fn probe(url: &str) -> Result<Probe, StoreError> {
    let client = pool(url, 1)?.get().await.map_err(|e| StoreError::Open {
        path: redacted(url),
        message: chain(&e),
    })?;
    let row = client
        .query_one("SHOW server_version", &[])
        .await
        .map_err(sql)?;
    Ok(Probe {
        server_version: col(&row, 0)?,
        schema_version: migrate::version(&client).await?,
        known_version: migrate::MIGRATIONS.len() as i64,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn redacted_hides_every_password() {
        for (url, shown) in [
            (
                "postgres://u:p%40ss@db:5432/x",
                "postgres://u:***@db:5432/x",
            ),
            ("postgres://u:p@ss@db/x", "postgres://u:***@db/x"),
            (
                "postgresql://db/x?user=u&password=secret&sslmode=disable",
                "postgresql://db/x?user=u&password=***&sslmode=disable",
            ),
            ("postgres://u@db/x", "postgres://u@db/x"),
            ("secret", "(a value that is not a URL)"),
        ] {
            assert_eq!(super::redacted(url), shown);
        }
    }
}
