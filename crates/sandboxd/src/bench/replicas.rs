//! `sandboxd bench serve` across replicas (issue 22): several servers in this process on one
//! PostgreSQL database (a throw-away one made in the cluster the caller names, dropped after),
//! each with its own store handle (its own pool and LISTEN connection, as separate processes
//! have) and its own session manager on the one Docker engine; beside them, in the same run,
//! one server on its own SQLite store as the baseline. All share one fake model.
//! - event latency: a run driven on replica A and followed on replica B, against the same run
//!   on the SQLite server (and, to tell the store's cost from the crossing's, on A alone),
//!   one run on each in turn so all three see the same machine load;
//! - load: 20 users at once, user i's run posted to replica i mod 3 and followed on the next
//!   one, against the same 20 users on the SQLite server, and on replica A alone (Postgres's
//!   own cost, told apart from the spread's); step latency and completions; two rounds of each
//!   (SQLite, replicas, A alone, A alone, replicas, SQLite), reported together;
//! - exec: the sync exec of `true` through replica A against the SQLite server, request by
//!   request in turn.
//!
//! Every replica is started before anything runs, so no replica's start-up (which marks runs
//! in flight interrupted and reconciles sessions) meets another's work.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sandboxd_core::config::Config;
use sandboxd_core::sandbox::{Runtime, SessionManager};
use sandboxd_core::store::{Store, StoreRecords};
use sandboxd_postgres::{PgStore, create_scratch_database};
use sandboxd_sqlite::SqliteStore;

use super::server::{BenchServer, add_users, exec_interleaved, tempfile_dir};
use super::server_runs::{
    EventLatency, FakeModel, Load, Model, Route, latency_interleaved, load_on,
};

/// How many replicas share the Postgres store.
pub const REPLICAS: usize = 3;

/// Everything `bench_replicas` measured; every sample sorted.
pub struct ReplicaBench {
    pub replicas: usize,
    /// The cluster's `server_version`.
    pub postgres: String,
    pub sqlite_latency: EventLatency,
    /// Run on replica A, followed on replica B.
    pub cross_latency: EventLatency,
    /// Run and follower on replica A.
    pub same_latency: EventLatency,
    pub sqlite_exec: Vec<Duration>,
    pub pg_exec: Vec<Duration>,
    pub sqlite_load: Load,
    pub pg_load: Load,
    /// The same load on replica A alone.
    pub pg_one_load: Load,
}

/// Measures the replicas on a fresh database in the cluster `admin_url` names (its user may
/// CREATE DATABASE) against one SQLite server: `samples` latency and exec samples per side,
/// `users` users' `steps`-step runs at once for the load.
pub async fn bench_replicas(
    runtime: Arc<dyn Runtime>,
    admin_url: &str,
    config: Config,
    samples: usize,
    users: usize,
    steps: usize,
) -> anyhow::Result<ReplicaBench> {
    let db = create_scratch_database(admin_url, "sandboxd_bench")
        .await
        .context("create the bench's database")?;
    let result = on_database(runtime, db.url(), config, samples, users, steps).await;
    let name = db.name().to_string();
    let dropped = db.drop_database().await;
    let out = result?;
    dropped.with_context(|| format!("drop the bench's database {name}"))?;
    Ok(out)
}

/// A manager of the kind `serve` makes (tool records in its store), without a warm pool so
/// that no replica's refills share the cores with the measurements.
fn manager_for(
    runtime: &Arc<dyn Runtime>,
    config: &Config,
    store: &Arc<dyn Store>,
) -> Arc<SessionManager> {
    SessionManager::new(
        runtime.clone(),
        config.limits.clone(),
        config.sessions.clone(),
        Arc::new(StoreRecords::new(store.clone())),
    )
}

async fn on_database(
    runtime: Arc<dyn Runtime>,
    url: &str,
    config: Config,
    samples: usize,
    users: usize,
    steps: usize,
) -> anyhow::Result<ReplicaBench> {
    let postgres = sandboxd_postgres::probe(url).await?.server_version;
    let model = FakeModel::start().await?;
    let mut config = model.config(config);
    config.sessions.max = config.sessions.max.max(users + 4);
    config.sessions.max_per_owner = config.sessions.max_per_owner.max(users + 4);
    let sqlite = Arc::new(start_sqlite(&runtime, &config, users).await?);
    let replicas = match start_replicas(&runtime, url, &config, users).await {
        Ok(r) => r,
        Err(e) => {
            stop(std::slice::from_ref(&sqlite)).await;
            return Err(e);
        }
    };
    let result = measure(&sqlite, &replicas, &model.model, samples, steps).await;
    stop(&replicas).await;
    stop(std::slice::from_ref(&sqlite)).await;
    let (latency, exec, [sqlite_load, pg_load, pg_one_load]) = result?;
    let [sqlite_latency, cross_latency, same_latency]: [EventLatency; 3] = latency
        .try_into()
        .map_err(|_| anyhow::anyhow!("three routes give three latencies"))?;
    let [sqlite_exec, pg_exec]: [Vec<Duration>; 2] = exec
        .try_into()
        .map_err(|_| anyhow::anyhow!("two servers give two exec samples"))?;
    Ok(ReplicaBench {
        replicas: replicas.len(),
        postgres,
        sqlite_latency,
        cross_latency,
        same_latency,
        sqlite_exec,
        pg_exec,
        sqlite_load,
        pg_load,
        pg_one_load,
    })
}

/// The baseline: one server on its own SQLite store with `users` users.
async fn start_sqlite(
    runtime: &Arc<dyn Runtime>,
    config: &Config,
    users: usize,
) -> anyhow::Result<BenchServer> {
    let dir = tempfile_dir()?;
    let opened = SqliteStore::open(&dir.join("sandboxd.db")).await;
    let store: Arc<dyn Store> = match opened {
        Ok(s) => Arc::new(s),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
    };
    let keys = add_users(store.as_ref(), users).await?;
    let manager = manager_for(runtime, config, &store);
    BenchServer::start_in(dir, store, manager, config.clone(), keys).await
}

/// `REPLICAS` servers on the database `url`, each with a store handle and a manager of its
/// own; the first adds the users, the others serve the same keys. On an error the ones
/// started are stopped.
async fn start_replicas(
    runtime: &Arc<dyn Runtime>,
    url: &str,
    config: &Config,
    users: usize,
) -> anyhow::Result<Vec<Arc<BenchServer>>> {
    let mut started: Vec<Arc<BenchServer>> = Vec::new();
    let mut keys: Option<Vec<String>> = None;
    for _ in 0..REPLICAS {
        match start_replica(runtime, url, config, users, &mut keys).await {
            Ok(s) => started.push(Arc::new(s)),
            Err(e) => {
                stop(&started).await;
                return Err(e);
            }
        }
    }
    Ok(started)
}

async fn start_replica(
    runtime: &Arc<dyn Runtime>,
    url: &str,
    config: &Config,
    users: usize,
    keys: &mut Option<Vec<String>>,
) -> anyhow::Result<BenchServer> {
    let store: Arc<dyn Store> = Arc::new(PgStore::open(url).await?);
    let keys = match keys {
        Some(k) => k.clone(),
        None => keys.insert(add_users(store.as_ref(), users).await?).clone(),
    };
    let manager = manager_for(runtime, config, &store);
    BenchServer::over(store, manager, config.clone(), keys).await
}

/// Stops the servers and removes whatever sessions their managers still hold.
async fn stop(servers: &[Arc<BenchServer>]) {
    for s in servers {
        s.stop().await;
        s.state.backend.manager().remove_all().await;
    }
}

/// Latencies, exec samples, and the loads on SQLite, across the replicas and on A alone.
type Measured = (Vec<EventLatency>, Vec<Vec<Duration>>, [Load; 3]);

async fn measure(
    sqlite: &Arc<BenchServer>,
    replicas: &[Arc<BenchServer>],
    model: &Arc<Model>,
    samples: usize,
    steps: usize,
) -> anyhow::Result<Measured> {
    let (a, b) = match replicas {
        [a, b, ..] => (a.as_ref(), b.as_ref()),
        _ => anyhow::bail!("the replica benchmarks need two replicas at least"),
    };
    let one = sqlite.as_ref();
    let routes = [
        Route {
            post: one,
            follow: one,
        },
        Route { post: a, follow: b },
        Route { post: a, follow: a },
    ];
    let latency = latency_interleaved(&routes, model, samples)
        .await
        .context("event latency")?;
    let exec = exec_interleaved(&[one, a], samples)
        .await
        .context("exec round trip")?;
    // Two rounds each, in the order SQLite, replicas, A alone, A alone, replicas, SQLite, so
    // that a drift of the machine's load over the six favours none.
    let load = |servers: &'static str, on: &[Arc<BenchServer>]| {
        let on = on.to_vec();
        async move {
            load_on(&on, model, steps)
                .await
                .with_context(|| format!("the load on {servers}"))
        }
    };
    let sqlite_first = load("SQLite", std::slice::from_ref(sqlite)).await?;
    let pg_first = load("the replicas", replicas).await?;
    let one = &replicas[..1];
    let pg_one = load("replica A alone", one).await?;
    let pg_one = pg_one.merge(load("replica A alone", one).await?);
    let pg_load = pg_first.merge(load("the replicas", replicas).await?);
    let sqlite_load = sqlite_first.merge(load("SQLite", std::slice::from_ref(sqlite)).await?);
    Ok((latency, exec, [sqlite_load, pg_load, pg_one]))
}
