//! Shared plumbing of the CLI commands: config, the Docker connection, the image check.

pub mod bench;
pub mod doctor;
pub mod exec;
pub mod image;
pub mod mcp;
pub mod run;
pub mod sessions;
pub mod tool;

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use sandboxd::config::Config;
use sandboxd::sandbox::docker::{self, DockerRuntime};
use sandboxd::sandbox::SessionManager;

pub struct Ctx {
    pub config: Config,
}

impl Ctx {
    pub fn load(path: Option<&Path>) -> anyhow::Result<Ctx> {
        let config = Config::load(path)?;
        Ok(Ctx { config })
    }

    /// Connects to Docker and makes sure the sandbox image exists, building it (with
    /// progress on stderr) when it does not.
    pub async fn runtime(&self) -> anyhow::Result<DockerRuntime> {
        let docker = docker::connect().await?;
        let image = if self.config.docker.image.is_empty() {
            image::ensure(&docker).await?
        } else {
            self.config.docker.image.clone()
        };
        let oci = Some(self.config.docker.runtime.clone()).filter(|r| !r.is_empty());
        Ok(DockerRuntime::new(docker, image, oci))
    }

    pub async fn manager(&self) -> anyhow::Result<Arc<SessionManager>> {
        let runtime = self.runtime().await.context("cannot prepare the sandbox runtime")?;
        Ok(SessionManager::new(
            Arc::new(runtime),
            self.config.limits.clone(),
            self.config.sessions.clone(),
        ))
    }
}

pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SANDBOXD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
