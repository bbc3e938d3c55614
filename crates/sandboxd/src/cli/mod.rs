//! Shared plumbing of the CLI commands: config, the Docker connection, the image check,
//! the owner of the CLI's sessions, and the two ways to get a SessionManager: one that may
//! create sessions (the image is built if missing; orphans, and the tool records of sessions
//! whose container is gone, are reconciled first) and one
//! for commands that only look or remove (never builds anything). The libraries name a fix
//! in words any front end can act on; `hint` adds the command that does it here.

pub(crate) mod agents;
pub(crate) mod bench;
pub(crate) mod bench_e2b;
pub(crate) mod bench_kube;
pub(crate) mod bench_pool;
pub(crate) mod bench_replicas;
pub(crate) mod bench_stream;
pub(crate) mod config;
pub(crate) mod copy_out;
pub(crate) mod doctor;
pub(crate) mod egress;
pub(crate) mod egress_credentials;
pub(crate) mod exec;
pub(crate) mod image;
pub(crate) mod mcp;
pub(crate) mod plan;
pub(crate) mod render;
pub(crate) mod run;
pub(crate) mod serve;
pub(crate) mod serve_records;
pub(crate) mod sessions;
pub(crate) mod signals;
pub(crate) mod tool;
pub(crate) mod users;

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use sandboxd_core::config::Config;
use sandboxd_core::sandbox::records::SessionRecords;
use sandboxd_core::sandbox::{Owner, Runtime, SandboxError, SessionManager};
use sandboxd_docker::image::ImageError;

pub(crate) struct Ctx {
    pub config: Config,
}

impl Ctx {
    pub(crate) fn load(path: Option<&Path>) -> anyhow::Result<Ctx> {
        let config = Config::load(path)?;
        Ok(Ctx { config })
    }

    /// The runtime sessions are made on, the image built when missing (see backends.rs).
    pub(crate) async fn runtime(&self) -> anyhow::Result<Arc<dyn Runtime>> {
        crate::backends::runtime(&self.config).await
    }

    /// A manager for commands that create sessions. It runs the reconciler first (one
    /// labelled list), so the orphans of a process that crashed or was killed are gone
    /// before anything new is made.
    pub(crate) async fn manager(&self) -> anyhow::Result<Arc<SessionManager>> {
        let runtime = self
            .runtime()
            .await
            .context("cannot prepare the sandbox runtime")?;
        let manager = self.manager_over(runtime);
        manager.set_templates(crate::backends::templates(&self.config)?);
        match manager.reconcile().await {
            Ok(removed) if !removed.is_empty() => tracing::info!(
                removed = removed.len(),
                "removed sessions left behind by processes that are gone"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not reconcile orphaned sessions"),
        }
        // The local user's own records, swept whole: see forget_orphan_records.
        if let Err(e) = manager.forget_orphan_records().await {
            tracing::warn!(error = %e, "could not look for orphaned tool records");
        }
        Ok(manager)
    }

    /// A manager for commands that look at or remove sessions but never create one
    /// (`sessions list|rm|gc`): it never builds the image.
    pub(crate) async fn read_only_manager(&self) -> anyhow::Result<Arc<SessionManager>> {
        let runtime = crate::backends::runtime_without_image(&self.config).await?;
        Ok(self.manager_over(runtime))
    }

    fn manager_over(&self, runtime: Arc<dyn Runtime>) -> Arc<SessionManager> {
        // The pool only fills in processes that start it (`spawn_pool`: the MCP server and
        // `serve`); a one-shot command claims nothing and makes nothing ahead.
        SessionManager::with_pool(
            runtime,
            self.config.limits.clone(),
            self.config.sessions.clone(),
            crate::backends::pool(&self.config),
            self.records(),
        )
    }

    /// Where kept sessions' tool records live: the data directory's (see backends.rs).
    pub(crate) fn records(&self) -> Arc<dyn SessionRecords> {
        crate::backends::records(&self.config)
    }

    /// The owner recorded on sessions the CLI creates ([sessions] default_owner).
    pub(crate) fn owner(&self) -> anyhow::Result<Owner> {
        Owner::new(self.config.sessions.default_owner.clone())
            .context("[sessions] default_owner is not usable")
    }
}

/// `default` applies when SANDBOXD_LOG is unset (serve adds its access log).
pub(crate) fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDBOXD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The command line's way to the fix an error names, if it has one: the backends and the
/// manager say "build the image" or "list the live sessions" to every front end alike.
pub(crate) fn hint(e: &anyhow::Error) -> Option<&'static str> {
    e.chain().find_map(|cause| {
        if let Some(e) = cause.downcast_ref::<SandboxError>() {
            return match e {
                SandboxError::ImageMissing { .. } => Some("build it with `sandboxd image build`"),
                SandboxError::SessionNotFound { .. } => {
                    Some("`sandboxd sessions list` lists the live sessions")
                }
                SandboxError::BackendUnavailable { .. } => {
                    Some("`sandboxd doctor` checks the engine and the image")
                }
                _ => None,
            };
        }
        match cause.downcast_ref::<ImageError>()? {
            ImageError::BuildFailed { .. } | ImageError::ImportFailed { .. } => {
                Some("run `sandboxd image build` again")
            }
            _ => None,
        }
    })
}
