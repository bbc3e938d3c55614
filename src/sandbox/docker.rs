//! The Docker backend's runtime: DockerRuntime creates, lists and removes hardened session
//! containers. The Sandbox trait on one container is in docker_sandbox.rs, its exec plumbing in
//! docker_exec.rs; these files and docker_image.rs are the only places that import bollard.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StartContainerOptions,
};

use super::SandboxError;
use crate::config::Limits;

pub use super::docker_sandbox::DockerSandbox;

pub const LABEL_MANAGED: &str = "sandboxd.managed";
pub const LABEL_SESSION: &str = "sandboxd.session";
pub const LABEL_OWNER: &str = "sandboxd.owner";
pub const LABEL_KEEP: &str = "sandboxd.keep";
pub const LABEL_CREATOR: &str = "sandboxd.creator";
pub(super) const SANDBOX_USER: &str = "1000:1000";

/// What a new session container is made from.
#[derive(Debug, Clone)]
pub struct SessionSpec {
    pub session_id: String,
    pub owner: String,
    pub limits: Limits,
    /// Kept sessions outlive the process that made them (`--keep`).
    pub keep: bool,
}

/// A container labelled `sandboxd.managed`, as listed by the engine.
#[derive(Debug, Clone)]
pub struct ManagedContainer {
    pub container_id: String,
    pub session_id: String,
    pub owner: String,
    pub state: String,
    pub created: i64,
    pub keep: bool,
    /// The host process that created it: pid and start time.
    pub creator: Option<(u32, u64)>,
}

#[derive(Clone)]
pub struct DockerRuntime {
    docker: Docker,
    image: String,
    oci_runtime: Option<String>,
}

/// The engine client, named so that callers outside this module need not import bollard.
pub type Engine = Docker;

/// Connects to the local engine (DOCKER_HOST or the default socket) and negotiates the
/// API version: Debian 12's engine speaks 1.41, bollard defaults to 1.53.
pub async fn connect() -> Result<Docker, SandboxError> {
    let docker =
        Docker::connect_with_local_defaults().map_err(|e| SandboxError::EngineUnavailable {
            message: e.to_string(),
        })?;
    docker
        .with_timeout(Duration::from_secs(120))
        .negotiate_version()
        .await
        .map_err(|e| SandboxError::EngineUnavailable {
            message: e.to_string(),
        })
}

impl DockerRuntime {
    pub fn new(docker: Docker, image: String, oci_runtime: Option<String>) -> Self {
        Self {
            docker,
            image,
            oci_runtime,
        }
    }

    pub fn image(&self) -> &str {
        &self.image
    }

    /// The engine's version string, e.g. "20.10.24+dfsg1 (API 1.41)".
    pub async fn engine_version(&self) -> Result<String, SandboxError> {
        let v = self.docker.version().await.map_err(engine_err)?;
        Ok(format!(
            "{} (API {})",
            v.version.unwrap_or_default(),
            v.api_version.unwrap_or_default()
        ))
    }

    /// Creates and starts a session container with every hardening default in place.
    pub async fn create(&self, spec: &SessionSpec) -> Result<Arc<DockerSandbox>, SandboxError> {
        let body = container_body(&self.image, self.oci_runtime.as_deref(), spec);
        let name = format!("sandboxd-{}", spec.session_id);
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                body,
            )
            .await
            .map_err(|e| match &e {
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                } => SandboxError::ImageMissing {
                    tag: self.image.clone(),
                },
                _ => docker_err("create the session container", &spec.session_id, e),
            })?;
        if let Err(e) = self
            .docker
            .start_container(&created.id, None::<StartContainerOptions>)
            .await
        {
            let _ = self.remove_container(&created.id).await;
            return Err(docker_err(
                "start the session container",
                &spec.session_id,
                e,
            ));
        }
        Ok(Arc::new(DockerSandbox::new(
            self.docker.clone(),
            created.id,
            spec.session_id.clone(),
            spec.limits.clone(),
        )))
    }

    /// Wraps the running container of an existing (kept) session.
    pub fn attach(
        &self,
        found: &ManagedContainer,
        limits: &Limits,
    ) -> Result<Arc<DockerSandbox>, SandboxError> {
        if found.state != "running" {
            return Err(SandboxError::ContainerGone {
                session: found.session_id.clone(),
                message: format!("its container is {}", found.state),
            });
        }
        Ok(Arc::new(DockerSandbox::new(
            self.docker.clone(),
            found.container_id.clone(),
            found.session_id.clone(),
            limits.clone(),
        )))
    }

    /// Every container carrying `sandboxd.managed=true`, running or not.
    pub async fn list_managed(&self) -> Result<Vec<ManagedContainer>, SandboxError> {
        let filters = HashMap::from([("label", vec![format!("{LABEL_MANAGED}=true")])]);
        let list = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(engine_err)?;
        Ok(list
            .into_iter()
            .map(|c| {
                let labels = c.labels.unwrap_or_default();
                ManagedContainer {
                    container_id: c.id.unwrap_or_default(),
                    session_id: labels.get(LABEL_SESSION).cloned().unwrap_or_default(),
                    owner: labels.get(LABEL_OWNER).cloned().unwrap_or_default(),
                    state: c.state.map(|s| s.to_string()).unwrap_or_default(),
                    created: c.created.unwrap_or_default(),
                    keep: labels.get(LABEL_KEEP).is_some_and(|v| v == "true"),
                    creator: labels
                        .get(LABEL_CREATOR)
                        .and_then(|v| super::manager::parse_creator(v)),
                }
            })
            .collect())
    }

    /// Removes a container by id, with its anonymous volumes; a missing one is not an error.
    pub async fn remove_container(&self, container_id: &str) -> Result<(), SandboxError> {
        match self
            .docker
            .remove_container(
                container_id,
                Some(
                    RemoveContainerOptionsBuilder::default()
                        .force(true)
                        .v(true)
                        .build(),
                ),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                message,
            }) if message.contains("already in progress") => Ok(()),
            Err(e) => Err(docker_err("remove the container", container_id, e)),
        }
    }
}

fn container_body(
    image: &str,
    oci_runtime: Option<&str>,
    spec: &SessionSpec,
) -> ContainerCreateBody {
    let l = &spec.limits;
    let labels = HashMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_SESSION.to_string(), spec.session_id.clone()),
        (LABEL_OWNER.to_string(), spec.owner.clone()),
        (LABEL_KEEP.to_string(), spec.keep.to_string()),
        (LABEL_CREATOR.to_string(), super::manager::creator_label()),
    ]);
    let tmpfs = HashMap::from([
        (
            "/workspace".to_string(),
            format!(
                "rw,exec,nosuid,nodev,size={}m,uid=1000,gid=1000,mode=0755",
                l.workspace_mb
            ),
        ),
        (
            "/tmp".to_string(),
            format!("rw,noexec,nosuid,nodev,size={}m,mode=1777", l.tmp_mb),
        ),
    ]);
    let memory = (l.memory_mb as i64).saturating_mul(1 << 20);
    let fsize = (l.fsize_mb as i64).saturating_mul(1 << 20);
    let ulimit = |name: &str, v: i64| ResourcesUlimits {
        name: Some(name.into()),
        soft: Some(v),
        hard: Some(v),
    };
    let host_config = HostConfig {
        network_mode: Some("none".into()),
        readonly_rootfs: Some(true),
        tmpfs: Some(tmpfs),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        init: Some(true),
        pids_limit: Some(l.pids),
        memory: Some(memory),
        memory_swap: Some(memory),
        nano_cpus: Some((l.cpus * 1e9) as i64),
        ulimits: Some(vec![
            ulimit("nofile", l.nofile as i64),
            ulimit("fsize", fsize),
            ulimit("core", 0),
        ]),
        oom_score_adj: Some(1000),
        restart_policy: Some(RestartPolicy {
            name: Some(RestartPolicyNameEnum::NO),
            maximum_retry_count: None,
        }),
        log_config: Some(HostConfigLogConfig {
            typ: Some("json-file".into()),
            config: Some(HashMap::from([
                ("max-size".to_string(), "1m".to_string()),
                ("max-file".to_string(), "1".to_string()),
            ])),
        }),
        ipc_mode: Some("private".into()),
        auto_remove: Some(false),
        runtime: oci_runtime.filter(|r| !r.is_empty()).map(String::from),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(image.into()),
        user: Some(SANDBOX_USER.into()),
        labels: Some(labels),
        cmd: Some(vec![format!("{}/init.sh", super::HELPERS_DIR)]),
        working_dir: Some(super::WORKSPACE.into()),
        env: Some(vec![
            "HOME=/workspace".into(),
            "LANG=C.UTF-8".into(),
            "PYTHONUNBUFFERED=1".into(),
            "MPLBACKEND=Agg".into(),
        ]),
        network_disabled: Some(true),
        stop_timeout: Some(2),
        host_config: Some(host_config),
        ..Default::default()
    }
}

pub(super) fn engine_err(e: bollard::errors::Error) -> SandboxError {
    SandboxError::EngineUnavailable {
        message: e.to_string(),
    }
}

/// Sorts a bollard error into gone-container, unreachable-engine or a plain refusal.
pub(super) fn docker_err(
    operation: &str,
    session: &str,
    e: bollard::errors::Error,
) -> SandboxError {
    use bollard::errors::Error as E;
    match e {
        E::DockerResponseServerError {
            status_code: 404,
            message,
        } => SandboxError::ContainerGone {
            session: session.into(),
            message,
        },
        E::DockerResponseServerError {
            status_code: 409,
            message,
        } if message.contains("not running") || message.contains("paused") => {
            SandboxError::ContainerGone {
                session: session.into(),
                message,
            }
        }
        E::DockerResponseServerError { message, .. } => SandboxError::Docker {
            operation: operation.into(),
            message,
        },
        E::IOError { .. }
        | E::HyperResponseError { .. }
        | E::HttpClientError { .. }
        | E::SocketNotFoundError(_) => SandboxError::EngineUnavailable {
            message: e.to_string(),
        },
        other => SandboxError::Docker {
            operation: operation.into(),
            message: other.to_string(),
        },
    }
}
