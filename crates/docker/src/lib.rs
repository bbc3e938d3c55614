//! The Docker backend's runtime: DockerRuntime creates, lists and removes hardened session
//! containers and implements the `Runtime` seam. The Sandbox on one container is an
//! `ExecSandbox` over `DockerExec` (exec.rs); these files and image/ are the
//! only places that import bollard.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, ContainerSummaryStateEnum, ContainerUpdateBody, HostConfig,
    HostConfigLogConfig, ResourcesUlimits, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StartContainerOptions,
};

use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::runtime::{FoundSandbox, Runtime, SandboxSpec, meta_key};
use sandboxd_core::sandbox::{Sandbox, SandboxError, SandboxState, Usage, host};

mod cgroup;
mod exec;
pub mod image;
mod labels;
mod restore;
mod usage;
mod watch;

pub use exec::{DockerExec, DockerSandbox};
pub use usage::{UsageReading, UsageSource};

/// How the Docker backend names itself in errors.
pub(crate) const BACKEND: &str = "Docker";
pub(crate) const SANDBOX_USER: &str = "1000:1000";

#[derive(Clone)]
pub struct DockerRuntime {
    docker: Docker,
    image: String,
    oci_runtime: Option<String>,
    /// Containers that end outside sandboxd, from the engine's events (watch.rs).
    watch: Arc<watch::Watch>,
    /// Where this host keeps the containers' cgroup files, learned once (usage.rs).
    cgroups: Arc<tokio::sync::OnceCell<Option<cgroup::Host>>>,
}

/// The engine client, named so that callers outside this module need not import bollard.
pub type Engine = Docker;

/// Connects to the engine `DOCKER_HOST` names, as the docker CLI would: the default socket
/// when it is unset, `unix://PATH`, `tcp://HOST:PORT` (with `DOCKER_TLS_VERIFY` set: mutual
/// TLS with `ca.pem`, `cert.pem` and `key.pem` from `DOCKER_CERT_PATH`, else `~/.docker`), or
/// `https://`. Then negotiates the API version: Debian 12's engine speaks 1.41, bollard
/// defaults to 1.53. Replicas on several hosts share one engine this way.
pub async fn connect() -> Result<Docker, SandboxError> {
    // bollard's TLS takes the process's default rustls provider, and the workspace links two
    // (ring and aws-lc-rs, through different HTTP clients), so none is chosen by itself.
    // Installing one that is already installed is refused, and harmless.
    let _ =
        rustls::crypto::CryptoProvider::install_default(rustls::crypto::ring::default_provider());
    let host = std::env::var("DOCKER_HOST").unwrap_or_default();
    let tls = std::env::var_os("DOCKER_TLS_VERIFY").is_some_and(|v| !v.is_empty());
    let docker = if host.is_empty() {
        Docker::connect_with_local_defaults()
    } else {
        Docker::connect_with_defaults()
    };
    docker
        .map_err(|e| engine_err_at(e, &host, tls))?
        .with_timeout(Duration::from_secs(120))
        .negotiate_version()
        .await
        .map_err(|e| engine_err_at(e, &host, tls))
}

/// An engine error that says which engine was tried, and with which certificates.
fn engine_err_at(e: bollard::errors::Error, host: &str, tls: bool) -> SandboxError {
    if host.is_empty() {
        return engine_err(e);
    }
    let certs = std::env::var("DOCKER_CERT_PATH").unwrap_or_else(|_| "~/.docker".into());
    let how = if tls {
        format!("over TLS with the certificates in {certs} (ca.pem, cert.pem, key.pem)")
    } else {
        "without TLS (set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH for a TLS engine)".into()
    };
    SandboxError::BackendUnavailable {
        backend: ENGINE,
        message: format!("DOCKER_HOST={host} {how}: {e}"),
        fix: ENGINE_FIX,
    }
}

impl DockerRuntime {
    pub fn new(docker: Docker, image: String, oci_runtime: Option<String>) -> Self {
        Self {
            docker,
            image,
            oci_runtime,
            watch: Arc::default(),
            cgroups: Arc::default(),
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

    /// Whether the engine has the image sessions are created from.
    pub async fn image_present(&self) -> Result<bool, SandboxError> {
        match self.docker.inspect_image(&self.image).await {
            Ok(_) => Ok(true),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(false),
            Err(e) => Err(engine_err(e)),
        }
    }

    /// The OCI runtimes registered with the engine (`runc`, and `runsc` once gVisor is
    /// installed and listed in /etc/docker/daemon.json).
    pub async fn registered_runtimes(&self) -> Result<Vec<String>, SandboxError> {
        let info = self.docker.info().await.map_err(engine_err)?;
        let mut names: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
        names.sort();
        Ok(names)
    }

    /// Creates and starts a session container with every hardening default in place.
    pub async fn create(&self, spec: &SandboxSpec) -> Result<Arc<DockerSandbox>, SandboxError> {
        // A template's image, or this runtime's own.
        let image = spec.image.as_deref().unwrap_or(&self.image);
        let body = container_body(image, self.oci_runtime.as_deref(), spec);
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
                    tag: image.to_string(),
                },
                bollard::errors::Error::DockerResponseServerError { message, .. }
                    if message.to_lowercase().contains("unknown runtime")
                        || message.contains("invalid runtime") =>
                {
                    SandboxError::Backend {
                        backend: BACKEND,
                        operation: "create the session container".into(),
                        message: format!(
                            "{message}: the OCI runtime {:?} set in [docker] runtime is not registered with Docker; install it (gVisor: apt-get install runsc, then add it to \"runtimes\" in /etc/docker/daemon.json and reload dockerd), or set [docker] runtime = \"\"",
                            self.oci_runtime.as_deref().unwrap_or_default()
                        ),
                    }
                }
                _ => docker_err("create the session container", &spec.session_id, e),
            })?;
        let main_stdin = match spec.restore_bytes {
            Some(_) => {
                match restore::attach_stdin(&self.docker, &created.id, &spec.session_id).await {
                    Ok(w) => Some(w),
                    Err(e) => {
                        let _ = self.remove_container(&created.id).await;
                        return Err(e);
                    }
                }
            }
            None => None,
        };
        if let Err(e) = self
            .docker
            .start_container(&created.id, None::<StartContainerOptions>)
            .await
        {
            let _ = self.remove_container(&created.id).await;
            return Err(match &e {
                // Debian's runsc (2022) on Linux >= 6.11 (gVisor issue 10704).
                bollard::errors::Error::DockerResponseServerError { message, .. }
                    if message
                        .contains("cannot run with network enabled in root network namespace") =>
                {
                    SandboxError::Backend {
                        backend: BACKEND,
                        operation: "start the session container".into(),
                        message: format!(
                            "{message}: this runsc cannot set up a network on this kernel; sessions need none, so register it with \"runtimeArgs\": [\"--network=none\"] (scripts/gvisor.sh does), or set [docker] runtime = \"\""
                        ),
                    }
                }
                _ => docker_err("start the session container", &spec.session_id, e),
            });
        }
        let sandbox = self.sandbox(created.id, &spec.session_id, &spec.limits);
        *sandbox
            .backend()
            .main_stdin
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = main_stdin;
        Ok(Arc::new(sandbox))
    }

    fn sandbox(&self, container_id: String, session_id: &str, limits: &Limits) -> DockerSandbox {
        let exec = DockerExec {
            docker: self.docker.clone(),
            container_id,
            session_id: session_id.to_string(),
            main_stdin: Default::default(),
        };
        DockerSandbox::new(exec, session_id.to_string(), limits.clone())
    }

    /// Wraps the running container of an existing (kept) session.
    pub fn attach(
        &self,
        found: &FoundSandbox,
        limits: &Limits,
    ) -> Result<Arc<DockerSandbox>, SandboxError> {
        if found.state != SandboxState::Running {
            return Err(SandboxError::SandboxGone {
                session: found.session_id.clone(),
                message: format!("its container is {}", found.state),
            });
        }
        Ok(Arc::new(self.sandbox(
            found.handle.clone(),
            &found.session_id,
            limits,
        )))
    }

    /// Containers carrying `sandboxd.managed=true` (and the extra label filter, if any),
    /// running or not: one labelled list call.
    async fn list_labelled(
        &self,
        extra: Option<String>,
    ) -> Result<Vec<FoundSandbox>, SandboxError> {
        let mut labels = vec![labels::filter(meta_key::MANAGED, "true")];
        labels.extend(extra);
        let filters = HashMap::from([("label", labels)]);
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
                let meta = labels::decode(&c.labels.unwrap_or_default());
                FoundSandbox::new(c.id.unwrap_or_default(), state_of(c.state), meta)
            })
            .collect())
    }

    /// Removes a container by id, with its anonymous volumes; a missing one is not an error.
    pub async fn remove_container(&self, container_id: &str) -> Result<(), SandboxError> {
        // Its end is ours, not news (watch.rs); unless the removal fails: then it is not.
        self.watch.own.mark(container_id);
        let removed = match self
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
            }) if message.contains("already in progress") => self.wait_removed(container_id).await,
            Err(e) => Err(docker_err("remove the container", container_id, e)),
        };
        if removed.is_err() {
            self.watch.own.unmark(container_id);
        }
        removed
    }

    /// Waits (bounded) until another caller's removal of the container has finished: a
    /// removal that answered at "already in progress" would let its caller say the
    /// container is gone while it is still there (serve's DELETE racing the upkeep, which
    /// removes a session whose row ended).
    async fn wait_removed(&self, container_id: &str) -> Result<(), SandboxError> {
        let deadline = tokio::time::Instant::now() + REMOVAL_WAIT;
        loop {
            match self
                .docker
                .inspect_container(container_id, None::<InspectContainerOptions>)
                .await
            {
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => return Ok(()),
                Err(e) => {
                    return Err(docker_err(
                        "wait for the container's removal",
                        container_id,
                        e,
                    ));
                }
                Ok(_) if tokio::time::Instant::now() >= deadline => {
                    return Err(SandboxError::Timeout {
                        what: format!(
                            "the removal of container {container_id} (begun by another caller)"
                        ),
                        after: REMOVAL_WAIT,
                    });
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

#[async_trait]
impl Runtime for DockerRuntime {
    async fn create(&self, spec: &SandboxSpec) -> Result<(String, Arc<dyn Sandbox>), SandboxError> {
        let sandbox = DockerRuntime::create(self, spec).await?;
        Ok((sandbox.backend().container_id().to_string(), sandbox))
    }

    async fn attach(
        &self,
        found: &FoundSandbox,
        limits: &Limits,
    ) -> Result<Arc<dyn Sandbox>, SandboxError> {
        Ok(DockerRuntime::attach(self, found, limits)?)
    }

    async fn list(&self) -> Result<Vec<FoundSandbox>, SandboxError> {
        self.list_labelled(None).await
    }

    async fn find(&self, session_id: &str) -> Result<Option<FoundSandbox>, SandboxError> {
        let filter = labels::filter(meta_key::SESSION, session_id);
        Ok(self.list_labelled(Some(filter)).await?.into_iter().next())
    }

    async fn remove(&self, handle: &str) -> Result<(), SandboxError> {
        self.remove_container(handle).await
    }

    fn vanished(
        &self,
    ) -> tokio::sync::broadcast::Receiver<sandboxd_core::sandbox::vanished::Vanished> {
        self.watch.subscribe(&self.docker)
    }

    /// `docker update`: memory with swap equal to it (no swap, as at creation), the CPU
    /// quota and the pids limit can change on a running container; tmpfs sizes cannot.
    async fn update_limits(&self, handle: &str, limits: &Limits) -> Result<bool, SandboxError> {
        // runsc 0.0~20240729 has no `update` command, so the engine's update fails after a
        // round trip: decline at once and let the claim create a sandbox with the limits.
        if self.oci_runtime.as_deref().is_some_and(is_gvisor) {
            return Ok(false);
        }
        let memory = (limits.memory_mb as i64).saturating_mul(1 << 20);
        let body = ContainerUpdateBody {
            memory: Some(memory),
            memory_swap: Some(memory),
            nano_cpus: Some((limits.cpus * 1e9) as i64),
            pids_limit: Some(host_pids(limits.pids, self.oci_runtime.as_deref())),
            ..Default::default()
        };
        self.docker
            .update_container(handle, body)
            .await
            .map_err(|e| docker_err("lower the container's limits", handle, e))?;
        Ok(true)
    }

    /// The id of the image the tag names now: a rebuilt image under the same tag differs.
    async fn image_revision(&self) -> Result<Option<String>, SandboxError> {
        match self.docker.inspect_image(&self.image).await {
            Ok(info) => Ok(info.id),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Err(SandboxError::ImageMissing {
                tag: self.image.clone(),
            }),
            Err(e) => Err(engine_err(e)),
        }
    }

    /// The cgroup's memory use without the reclaimable page cache, as `docker stats` shows
    /// (usage.rs: from the host's cgroup files, else the engine's stats).
    async fn memory_usage(&self, handle: &str) -> Result<Option<u64>, SandboxError> {
        self.memory_reading(handle).await
    }

    /// The cgroup's CPU time in microseconds.
    async fn cpu_usage_usec(&self, handle: &str) -> Result<Option<u64>, SandboxError> {
        self.cpu_reading(handle).await
    }

    /// Both from one reading.
    async fn usage(&self, handle: &str) -> Result<Usage, SandboxError> {
        Ok(self.usage_reading(handle).await?.usage)
    }

    async fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        let engine = self
            .engine_version()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
        let image = match self.image_present().await {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "the sandbox image {} is missing; build the image",
                self.image()
            )),
            Err(e) => Err(e.to_string()),
        };
        vec![("engine", engine), ("image", image)]
    }

    /// The engine is on this host (a local socket), so its creators are local processes.
    async fn creator_alive(&self, creator: &str) -> bool {
        host::creator_alive(creator)
    }
}

/// Docker's container states in the seam's words.
fn state_of(state: Option<ContainerSummaryStateEnum>) -> SandboxState {
    use ContainerSummaryStateEnum as S;
    match state {
        Some(S::RUNNING) => SandboxState::Running,
        Some(S::PAUSED) => SandboxState::Paused,
        Some(S::REMOVING | S::STOPPING) => SandboxState::Removing,
        Some(S::EXITED | S::DEAD) => SandboxState::Stopped,
        // Unknown counts as starting: removed only once its creator is gone.
        Some(S::CREATED | S::RESTARTING | S::EMPTY) | None => SandboxState::Starting,
    }
}

/// Host tasks gVisor spends per sandbox process (its stub and the Sentry threads serving it),
/// with headroom: measured 2.2 per idle process under runsc 0.0~20240729's systrap platform
/// (and 7.8 under the ptrace platform of the older 0.0~20221219), while a thread of an
/// existing process costs almost none.
const GVISOR_TASKS_PER_PROCESS: i64 = 4;
/// What the Sentry and the gofer need before the sandbox runs anything (about 60 measured).
const GVISOR_BASE_TASKS: i64 = 128;

/// The pids limit to give the engine for a sandbox limited to `pids` processes. Under runc the
/// cgroup counts the sandbox's own tasks, so it is `pids`. Under gVisor it counts the host
/// tasks of the Sentry, the gofer and the stubs of the sandbox's processes instead: the same
/// number would kill the whole sandbox (runsc exits) once a few dozen processes run, which
/// Chromium alone reaches. Scaling keeps the meaning, about `pids` sandbox processes, and a
/// fork bomb still meets the limit.
fn host_pids(pids: i64, oci_runtime: Option<&str>) -> i64 {
    if oci_runtime.is_some_and(is_gvisor) {
        pids.saturating_mul(GVISOR_TASKS_PER_PROCESS)
            .saturating_add(GVISOR_BASE_TASKS)
    } else {
        pids
    }
}

/// Whether an OCI runtime name is gVisor's: `runsc`, as scripts/gvisor.sh registers it, or a
/// name an admin gave it that says so.
pub fn is_gvisor(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.contains("runsc") || name.contains("gvisor")
}

fn container_body(
    image: &str,
    oci_runtime: Option<&str>,
    spec: &SandboxSpec,
) -> ContainerCreateBody {
    let l = &spec.limits;
    let labels = labels::encode(&spec.meta(&host::creator_label()));
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
        pids_limit: Some(host_pids(l.pids, oci_runtime)),
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
        cmd: Some(restore::main_command(spec.restore_bytes)),
        // A resume's archive comes on the main process's stdin, for one attach (restore.rs).
        open_stdin: spec.restore_bytes.map(|_| true),
        stdin_once: spec.restore_bytes.map(|_| true),
        attach_stdin: spec.restore_bytes.map(|_| true),
        working_dir: Some(sandboxd_core::sandbox::WORKSPACE.into()),
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

/// How long a removal waits for another caller's removal of the same container to finish.
const REMOVAL_WAIT: Duration = Duration::from_secs(30);

const ENGINE: &str = "the Docker engine";
const ENGINE_FIX: &str = "start it (systemctl start docker) or point DOCKER_HOST at it, then retry";

pub(crate) fn engine_err(e: bollard::errors::Error) -> SandboxError {
    SandboxError::BackendUnavailable {
        backend: ENGINE,
        message: e.to_string(),
        fix: ENGINE_FIX,
    }
}

/// Whether an engine message means the container stopped, or is being removed, under the
/// call. Docker 20.10 answers an exec that races a removal with a 409 ("is not running"), a
/// 404, or a 500 from the OCI runtime ("cannot exec in a stopped state", "... in a deleted
/// state"); all of them mean the sandbox is gone, not that sandboxd failed.
pub(crate) fn says_gone(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "not running",
        "paused",
        "removal in progress",
        "is being removed",
        "marked for removal",
        "cannot exec in a stopped",
        "cannot exec in a deleted",
        "no such container",
        "is dead",
    ]
    .iter()
    .any(|p| m.contains(p))
}

/// Sorts a bollard error into gone-container, unreachable-engine or a plain refusal.
pub(crate) fn docker_err(
    operation: &str,
    session: &str,
    e: bollard::errors::Error,
) -> SandboxError {
    use bollard::errors::Error as E;
    match e {
        E::DockerResponseServerError {
            status_code: 404,
            message,
        } => SandboxError::SandboxGone {
            session: session.into(),
            message,
        },
        E::DockerResponseServerError {
            status_code: 409 | 500,
            message,
        } if says_gone(&message) => SandboxError::SandboxGone {
            session: session.into(),
            message,
        },
        E::DockerResponseServerError { message, .. } => SandboxError::Backend {
            backend: BACKEND,
            operation: operation.into(),
            message,
        },
        E::IOError { .. }
        | E::HyperResponseError { .. }
        | E::HttpClientError { .. }
        | E::SocketNotFoundError(_) => engine_err(e),
        other => SandboxError::Backend {
            backend: BACKEND,
            operation: operation.into(),
            message: other.to_string(),
        },
    }
}
