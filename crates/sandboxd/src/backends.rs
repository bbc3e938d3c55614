//! The one place that turns config into a runtime and a store: the only code of the binary's
//! commands that names a backend (`DockerRuntime`, `KubeRuntime` by `[runtime] backend`) or a store (`SqliteStore`, `PgStore`,
//! chosen by `[store] url`). Everything
//! above takes `Arc<dyn Runtime>` and `Arc<dyn Store>`; a new backend or store is a new crate
//! plus a branch here. (The Docker-only commands — `image`, `doctor`'s engine checks and the
//! docker-CLI baselines of `bench` — talk to the Docker crate directly by design.)

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;
use sandboxd_core::config::{BackendKind, Config, PoolConfig, StoreKind};
use sandboxd_core::sandbox::Runtime;
use sandboxd_core::sandbox::records::{FileRecords, SessionRecords};
use sandboxd_core::sandbox::templates::Templates;
use sandboxd_core::store::{Store, StoreRecords};
use sandboxd_docker::image as docker_image;
use sandboxd_docker::{self as docker, DockerRuntime};
use sandboxd_kubernetes::{AgentSandboxRuntime, agent_sandbox};
use sandboxd_postgres::PgStore;
use sandboxd_sqlite::SqliteStore;

/// The runtime sessions are made on, ready to create them: for Docker, the engine connected
/// and the sandbox image present (built, with progress on stderr, when it is missing).
pub(crate) async fn runtime(config: &Config) -> anyhow::Result<Arc<dyn Runtime>> {
    if config.runtime.kind() == BackendKind::Kubernetes {
        let rt = kube_runtime(config).await?;
        // The network probe starts now, not at the first session: its verdict is in the
        // log at start-up, and a create waits for it (probe.rs).
        let probe = rt.clone();
        tokio::spawn(async move {
            if let Err(e) = probe.ensure_isolated().await {
                tracing::error!(error = %e, "no session can start on this cluster");
            }
        });
        // This process's Lease, which its pods name as their creator: written now and
        // renewed until `release_leases` (a create that finds it missing writes it first).
        let lease = rt.clone();
        tokio::spawn(async move {
            if let Err(e) = lease.hold_lease().await {
                tracing::error!(error = %e, "cannot hold this replica's Lease; a session create retries");
            }
        });
        HOLDERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(rt.clone());
        let sessions = session_runtime(config, rt).await?;
        if let Some(claims) = &sessions.1 {
            // The SandboxTemplate and SandboxWarmPool are written now, so the cluster's
            // controller warms the pool before the first session (a create writes them too).
            let claims = claims.clone();
            tokio::spawn(async move {
                if let Err(e) = claims.write_defaults().await {
                    tracing::error!(error = %e, "cannot write the agent-sandbox template and warm pool; a session create retries");
                }
            });
        }
        return Ok(sessions.0);
    }
    let engine = docker::connect().await?;
    let image = if config.docker.image.is_empty() {
        crate::cli::image::ensure(&engine).await?
    } else {
        config.docker.image.clone()
    };
    Ok(Arc::new(DockerRuntime::new(
        engine,
        image,
        oci_runtime(config),
    )))
}

/// The Kubernetes runtimes that may hold a Lease: `release_leases` deletes them.
static HOLDERS: std::sync::Mutex<Vec<sandboxd_kubernetes::KubeRuntime>> =
    std::sync::Mutex::new(Vec::new());

/// Deletes the Leases this process holds (a graceful end of any command): the other
/// replicas then need not wait for them to run out. Best-effort; nothing when none.
pub(crate) async fn release_leases() {
    let held = std::mem::take(&mut *HOLDERS.lock().unwrap_or_else(|e| e.into_inner()));
    for rt in held {
        rt.release_lease().await;
    }
}

/// The runtime for commands that only look at or remove sessions: it never builds anything.
pub(crate) async fn runtime_without_image(config: &Config) -> anyhow::Result<Arc<dyn Runtime>> {
    if config.runtime.kind() == BackendKind::Kubernetes {
        let rt = kube_runtime(config).await?;
        return Ok(session_runtime(config, rt).await?.0);
    }
    let engine = docker::connect().await?;
    let image = if config.docker.image.is_empty() {
        docker_image::image_tag()
    } else {
        config.docker.image.clone()
    };
    Ok(Arc::new(DockerRuntime::new(
        engine,
        image,
        oci_runtime(config),
    )))
}

/// The templates sessions may name, with the images they are made from: on Docker the
/// default image and each `[[templates]]` entry's tag (`sandboxd image build --template`
/// builds it; a session of one not built yet fails with the image missing). Kubernetes runs
/// only its configured image, so there only `default` is known.
pub(crate) fn templates(config: &Config) -> anyhow::Result<Templates> {
    if config.runtime.kind() == BackendKind::Kubernetes {
        if !config.templates.is_empty() {
            tracing::warn!(
                "[[templates]] are built for the Docker backend only; Kubernetes sessions use the default image"
            );
        }
        return Ok(Templates::new(
            Some(config.kubernetes.image.clone()),
            BTreeMap::new(),
        ));
    }
    let default = if config.docker.image.is_empty() {
        docker_image::image_tag()
    } else {
        config.docker.image.clone()
    };
    let mut named = BTreeMap::new();
    for t in &config.templates {
        let tag = docker_image::template_tag(t)
            .with_context(|| format!("template {:?} in [[templates]]", t.name))?;
        named.insert(t.name.clone(), tag);
    }
    Ok(Templates::new(Some(default), named))
}

/// Pods in `[kubernetes] namespace` of the cluster KUBECONFIG names (or the in-cluster
/// service account); the image is the configured one, never built here. (`doctor` asks it
/// for the cluster's checks too.)
pub(crate) async fn kube_runtime(
    config: &Config,
) -> anyhow::Result<sandboxd_kubernetes::KubeRuntime> {
    kube_runtime_at(config, None, None).await
}

/// `kube_runtime` from the cluster a kubeconfig file names (None: as `kube_runtime`), its
/// API requests counted in `calls` when given (`sandboxd bench kubernetes`).
pub(crate) async fn kube_runtime_at(
    config: &Config,
    kubeconfig: Option<&std::path::Path>,
    calls: Option<sandboxd_kubernetes::ApiCalls>,
) -> anyhow::Result<sandboxd_kubernetes::KubeRuntime> {
    let settings: sandboxd_kubernetes::PodSettings = config.kubernetes.clone();
    let client = sandboxd_kubernetes::connect_to(kubeconfig, calls).await?;
    Ok(sandboxd_kubernetes::KubeRuntime::new(client, settings))
}

/// Whether sessions are agent-sandbox claims in this process: then the cluster's
/// SandboxWarmPool is the warm pool, and the manager's is off (`pool`).
static CLUSTER_POOL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The runtime sessions are made on over the cluster, by `[kubernetes] mode` ("auto" asks
/// discovery; "agent-sandbox" without the CRDs is an error saying so), and in agent-sandbox
/// mode the claims' runtime too.
async fn session_runtime(
    config: &Config,
    rt: sandboxd_kubernetes::KubeRuntime,
) -> anyhow::Result<(Arc<dyn Runtime>, Option<AgentSandboxRuntime>)> {
    let (limits, size) = (config.limits.clone(), config.pool.size);
    let made =
        agent_sandbox::session_runtime(rt, config.kubernetes.kube_mode(), limits, size).await?;
    if made.1.is_some() {
        CLUSTER_POOL.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    Ok(made)
}

/// The manager's warm pool: `[pool]`, except in agent-sandbox mode, where `[pool] size` is
/// the SandboxWarmPool's replicas and the manager keeps none of its own (claims of claims
/// would hold twice the pods). Call it after the runtime is made.
pub(crate) fn pool(config: &Config) -> PoolConfig {
    let mut pool = config.pool.clone();
    if CLUSTER_POOL.load(std::sync::atomic::Ordering::SeqCst) {
        pool.size = 0;
    }
    pool
}

/// Where the CLI's kept sessions' tool records live: private files in the data directory.
pub(crate) fn records(config: &Config) -> Arc<dyn SessionRecords> {
    Arc::new(FileRecords::new(&config.data_dir()))
}

/// Where serve's live: rows of its store, which every serve on that store shares.
pub(crate) fn store_records(store: &Arc<dyn Store>) -> Arc<dyn SessionRecords> {
    Arc::new(StoreRecords::new(store.clone()))
}

fn oci_runtime(config: &Config) -> Option<String> {
    Some(config.docker.runtime.clone()).filter(|r| !r.is_empty())
}

/// Where the store lives, for messages: the SQLite file in the data directory, or the
/// Postgres URL without its password.
pub(crate) fn store_location(config: &Config) -> String {
    match config.store.kind() {
        StoreKind::Sqlite => sqlite_path(config).display().to_string(),
        StoreKind::Postgres(url) => sandboxd_postgres::redacted(url),
    }
}

fn sqlite_path(config: &Config) -> std::path::PathBuf {
    config.data_dir().join("sandboxd.db")
}

/// The store `serve` and `users` share: the one `[store] url` names, its migrations applied.
pub(crate) async fn store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let location = store_location(config);
    Ok(match config.store.kind() {
        StoreKind::Sqlite => Arc::new(
            SqliteStore::open(&sqlite_path(config))
                .await
                .with_context(|| format!("cannot open the store {location}"))?,
        ),
        StoreKind::Postgres(url) => Arc::new(
            PgStore::open(url)
                .await
                .with_context(|| format!("cannot open the store {location}"))?,
        ),
    })
}

/// The store, if one was made already (an SQLite file that exists, or a Postgres URL):
/// for commands that only look, and must not make one.
pub(crate) async fn existing_store(config: &Config) -> anyhow::Result<Option<Arc<dyn Store>>> {
    if matches!(config.store.kind(), StoreKind::Sqlite) && !sqlite_path(config).exists() {
        return Ok(None);
    }
    store(config).await.map(Some)
}

/// `sandboxd doctor`'s look at the configured store: what it is and whether it answers,
/// making nothing: a missing SQLite file is not made and a Postgres schema is not migrated
/// (an existing SQLite file is opened as every command opens it, which migrates it).
pub(crate) async fn check_store(config: &Config) -> Result<String, String> {
    let location = store_location(config);
    match config.store.kind() {
        StoreKind::Sqlite => {
            let path = sqlite_path(config);
            if !path.exists() {
                return Ok(format!(
                    "store: SQLite {location} (made on first use by `serve` or `users`)"
                ));
            }
            let store = SqliteStore::open(&path)
                .await
                .map_err(|e| format!("store: SQLite {location}: {e}"))?;
            store
                .ping()
                .await
                .map_err(|e| format!("store: SQLite {location} is not writable: {e}"))?;
            Ok(format!("store: SQLite {location}, writable"))
        }
        StoreKind::Postgres(url) => {
            let p = sandboxd_postgres::probe(url)
                .await
                .map_err(|e| format!("store: PostgreSQL {location}: {e}"))?;
            if p.schema_version > p.known_version {
                return Err(format!(
                    "store: PostgreSQL {location} has schema version {}, newer than this sandboxd knows ({})",
                    p.schema_version, p.known_version
                ));
            }
            Ok(format!(
                "store: PostgreSQL {} at {location}, schema version {} of {}{}",
                p.server_version,
                p.schema_version,
                p.known_version,
                if p.schema_version < p.known_version {
                    " (the rest is applied at the next start)"
                } else {
                    ""
                }
            ))
        }
    }
}
