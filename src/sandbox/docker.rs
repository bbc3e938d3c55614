//! The Docker backend: DockerRuntime creates hardened session containers, DockerSandbox
//! implements the Sandbox trait on one of them. This file and docker_image.rs are the only
//! places that import bollard.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, ExecConfig, HostConfig, HostConfigLogConfig, ResourcesUlimits, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StartContainerOptions,
};
use futures::StreamExt;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use super::framed::FramedProcess;
use super::fs_client;
use super::output::CappedBuffer;
use super::shell::PersistentShell;
use super::tar_safety::{self, TarLimits};
use super::{
    AttachedProcess, DirEntry, ExecOutput, ExecRequest, FileStat, OutputChunk, Sandbox, SandboxError, ShellOptions,
    ShellOutput, SpawnRequest, resolve_path,
};
use crate::config::Limits;

pub const LABEL_MANAGED: &str = "sandboxd.managed";
pub const LABEL_SESSION: &str = "sandboxd.session";
pub const LABEL_OWNER: &str = "sandboxd.owner";
pub const LABEL_KEEP: &str = "sandboxd.keep";
pub const LABEL_CREATOR: &str = "sandboxd.creator";
const SANDBOX_USER: &str = "1000:1000";

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
    let docker = Docker::connect_with_local_defaults().map_err(|e| SandboxError::EngineUnavailable {
        message: e.to_string(),
    })?;
    docker
        .with_timeout(Duration::from_secs(120))
        .negotiate_version()
        .await
        .map_err(|e| SandboxError::EngineUnavailable { message: e.to_string() })
}

impl DockerRuntime {
    pub fn new(docker: Docker, image: String, oci_runtime: Option<String>) -> Self {
        Self {
            docker,
            image,
            oci_runtime,
        }
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
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
            .create_container(Some(CreateContainerOptionsBuilder::default().name(&name).build()), body)
            .await
            .map_err(|e| match &e {
                bollard::errors::Error::DockerResponseServerError { status_code: 404, .. } => SandboxError::ImageMissing {
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
            return Err(docker_err("start the session container", &spec.session_id, e));
        }
        Ok(Arc::new(DockerSandbox {
            docker: self.docker.clone(),
            container_id: created.id,
            session_id: spec.session_id.clone(),
            limits: spec.limits.clone(),
            shell: PersistentShell::new(),
            fs: Mutex::new(None),
        }))
    }

    /// Wraps the running container of an existing (kept) session.
    pub async fn attach(&self, session_id: &str, limits: &Limits) -> Result<Arc<DockerSandbox>, SandboxError> {
        let found = self
            .list_managed()
            .await?
            .into_iter()
            .find(|c| c.session_id == session_id)
            .ok_or_else(|| SandboxError::SessionNotFound { id: session_id.into() })?;
        if found.state != "running" {
            return Err(SandboxError::ContainerGone {
                session: session_id.into(),
                message: format!("its container is {}", found.state),
            });
        }
        Ok(Arc::new(DockerSandbox {
            docker: self.docker.clone(),
            container_id: found.container_id,
            session_id: session_id.into(),
            limits: limits.clone(),
            shell: PersistentShell::new(),
            fs: Mutex::new(None),
        }))
    }

    /// Every container carrying `sandboxd.managed=true`, running or not.
    pub async fn list_managed(&self) -> Result<Vec<ManagedContainer>, SandboxError> {
        let filters = HashMap::from([("label", vec![format!("{LABEL_MANAGED}=true")])]);
        let list = self
            .docker
            .list_containers(Some(ListContainersOptionsBuilder::default().all(true).filters(&filters).build()))
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
                    creator: labels.get(LABEL_CREATOR).and_then(|v| super::manager::parse_creator(v)),
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
                Some(RemoveContainerOptionsBuilder::default().force(true).v(true).build()),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, message })
                if message.contains("already in progress") =>
            {
                Ok(())
            }
            Err(e) => Err(docker_err("remove the container", container_id, e)),
        }
    }
}

fn container_body(image: &str, oci_runtime: Option<&str>, spec: &SessionSpec) -> ContainerCreateBody {
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
            format!("rw,exec,nosuid,nodev,size={}m,uid=1000,gid=1000,mode=0755", l.workspace_mb),
        ),
        ("/tmp".to_string(), format!("rw,noexec,nosuid,nodev,size={}m,mode=1777", l.tmp_mb)),
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
        cmd: Some(vec!["sleep".into(), "infinity".into()]),
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

/// One session container, reached only through exec and attached streams.
pub struct DockerSandbox {
    docker: Docker,
    container_id: String,
    session_id: String,
    limits: Limits,
    shell: PersistentShell,
    fs: Mutex<Option<FramedProcess>>,
}

impl DockerSandbox {
    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    pub fn shell_handle(&self) -> &PersistentShell {
        &self.shell
    }

    async fn start_exec(&self, argv: &[String], cwd: Option<&str>, env: &[(String, String)], stdin: bool) -> Result<(String, AttachedProcess), SandboxError> {
        if argv.is_empty() {
            return Err(SandboxError::InvalidRequest("empty command".into()));
        }
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let exec = self
            .docker
            .create_exec(
                &self.container_id,
                ExecConfig {
                    attach_stdin: Some(stdin),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(false),
                    cmd: Some(argv.to_vec()),
                    env: Some(env),
                    working_dir: Some(cwd.unwrap_or(super::WORKSPACE).to_string()),
                    user: Some(SANDBOX_USER.into()),
                    privileged: Some(false),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| docker_err("start a process", &self.session_id, e))?;
        let started = self
            .docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: Some(64 * 1024),
                }),
            )
            .await
            .map_err(|e| docker_err("attach to a process", &self.session_id, e))?;
        let StartExecResults::Attached { output, input } = started else {
            return Err(SandboxError::Docker {
                operation: "attach to a process".into(),
                message: "the engine started it detached".into(),
            });
        };
        let session = self.session_id.clone();
        let output = output
            .filter_map(move |item| {
                let mapped = match item {
                    Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => Some(Ok(OutputChunk::Stdout(message))),
                    Ok(LogOutput::StdErr { message }) => Some(Ok(OutputChunk::Stderr(message))),
                    Ok(LogOutput::StdIn { .. }) => None,
                    Err(e) => Some(Err(docker_err("read process output", &session, e))),
                };
                futures::future::ready(mapped)
            })
            .boxed();
        let docker = self.docker.clone();
        let exec_id = exec.id.clone();
        let exit_code: super::ExitProbe = Box::new(move || Box::pin(exec_exit_code(docker, exec_id)));
        Ok((exec.id, AttachedProcess { stdin: input, output, exit_code }))
    }

    async fn fs_call(&self, op: serde_json::Value, body: &[u8]) -> Result<(serde_json::Value, bytes::Bytes), SandboxError> {
        let max_body = self.limits.max_file_bytes() as usize + 4096;
        let mut guard = self.fs.lock().await;
        for attempt in 0..2 {
            if guard.as_ref().is_none_or(|f| !f.is_usable()) {
                let (_, process) = self
                    .start_exec(
                        &["python3".into(), format!("{}/sandboxd_fs.py", super::HELPERS_DIR)],
                        None,
                        &[],
                        true,
                    )
                    .await?;
                let mut framed = FramedProcess::new("sandboxd_fs", process, max_body);
                framed.recv().await?;
                *guard = Some(framed);
            }
            let Some(framed) = guard.as_mut() else { continue };
            match framed.call(&op, body).await {
                Ok(resp) => return Ok(resp),
                Err(e) if attempt == 0 && !framed.is_usable() => {
                    tracing::warn!(session = %self.session_id, error = %e, "file helper failed; restarting it");
                    *guard = None;
                }
                Err(e) => return Err(e),
            }
        }
        Err(SandboxError::Protocol {
            helper: "sandboxd_fs".into(),
            message: "the file helper failed twice in a row".into(),
        })
    }

    async fn collect(&self, req: &ExecRequest, tag: &str) -> Result<ExecOutput, SandboxError> {
        let started = Instant::now();
        let mut env = req.env.clone();
        env.push(("SANDBOXD_TAG".into(), tag.into()));
        let (_, mut process) = self
            .start_exec(&req.argv, req.cwd.as_deref(), &env, req.stdin.is_some())
            .await?;
        let writer = req.stdin.clone().map(|data| {
            let mut stdin = process.stdin;
            tokio::spawn(async move {
                let _ = stdin.write_all(&data).await;
                let _ = stdin.shutdown().await;
            })
        });
        let mut out = CappedBuffer::new(req.output_cap);
        let mut err = CappedBuffer::new(req.output_cap);
        let read = async {
            while let Some(chunk) = process.output.next().await {
                match chunk? {
                    OutputChunk::Stdout(b) => out.push(&b),
                    OutputChunk::Stderr(b) => err.push(&b),
                }
            }
            Ok::<(), SandboxError>(())
        };
        let timed_out = match tokio::time::timeout(req.timeout, read).await {
            Ok(res) => {
                res?;
                false
            }
            Err(_) => true,
        };
        if let Some(w) = writer {
            w.abort();
        }
        if timed_out {
            self.kill_tagged(tag).await?;
        }
        let exit_code = if timed_out { None } else { (process.exit_code)().await };
        let (stdout, stdout_truncated) = out.finish();
        let (stderr, stderr_truncated) = err.finish();
        Ok(ExecOutput {
            exit_code,
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            timed_out,
            duration: started.elapsed(),
        })
    }
}

fn fs_error(op: &'static str, path: &str, resp: &serde_json::Value, limit: u64) -> SandboxError {
    let message = resp["message"].as_str().unwrap_or("failed").to_string();
    match resp["kind"].as_str() {
        Some("not_found") => SandboxError::NotFound { path: path.into() },
        Some("too_large") => SandboxError::FileTooLarge {
            path: path.into(),
            size: resp["size"].as_u64().unwrap_or(0),
            limit,
        },
        _ => SandboxError::FileOp {
            operation: op,
            path: path.into(),
            message,
        },
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    fn session_id(&self) -> &str {
        &self.session_id
    }

    async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, SandboxError> {
        let tag = format!("{:032x}", rand::random::<u128>());
        let mut req = req;
        req.timeout = req.timeout.min(Duration::from_secs(self.limits.max_timeout_secs));
        self.collect(&req, &tag).await
    }

    async fn spawn(&self, req: SpawnRequest) -> Result<AttachedProcess, SandboxError> {
        let (_, process) = self.start_exec(&req.argv, req.cwd.as_deref(), &req.env, true).await?;
        Ok(process)
    }

    async fn shell(&self, command: &str, opts: ShellOptions) -> Result<ShellOutput, SandboxError> {
        let mut opts = opts;
        opts.timeout = opts.timeout.min(Duration::from_secs(self.limits.max_timeout_secs));
        self.shell.run(self, command, &opts).await
    }

    async fn restart_shell(&self) -> Result<(), SandboxError> {
        self.shell.restart(self).await;
        Ok(())
    }

    async fn read_file(&self, path: &str) -> Result<Vec<u8>, SandboxError> {
        let path = resolve_path(path)?;
        let limit = self.limits.max_file_bytes();
        let (resp, body) = self.fs_call(json!({"op": "read", "path": path, "limit": limit}), &[]).await?;
        if resp["ok"] == true {
            Ok(body.to_vec())
        } else {
            Err(fs_error("read", &path, &resp, limit))
        }
    }

    async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), SandboxError> {
        let path = resolve_path(path)?;
        let limit = self.limits.max_file_bytes();
        if data.len() as u64 > limit {
            return Err(SandboxError::FileTooLarge {
                path,
                size: data.len() as u64,
                limit,
            });
        }
        let (resp, _) = self.fs_call(json!({"op": "write", "path": path}), data).await?;
        if resp["ok"] == true {
            Ok(())
        } else {
            Err(fs_error("write", &path, &resp, limit))
        }
    }

    async fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, SandboxError> {
        let path = resolve_path(path)?;
        let (resp, _) = self.fs_call(json!({"op": "list", "path": path}), &[]).await?;
        if resp["ok"] != true {
            return Err(fs_error("list", &path, &resp, 0));
        }
        serde_json::from_value(resp["entries"].clone()).map_err(|e| SandboxError::Protocol {
            helper: "sandboxd_fs".into(),
            message: e.to_string(),
        })
    }

    async fn stat(&self, path: &str) -> Result<FileStat, SandboxError> {
        let path = resolve_path(path)?;
        let (resp, _) = self.fs_call(json!({"op": "stat", "path": path}), &[]).await?;
        fs_client::parse_stat(&path, &resp).ok_or_else(|| fs_error("stat", &path, &resp, 0))
    }

    async fn mkdir(&self, path: &str) -> Result<(), SandboxError> {
        let path = resolve_path(path)?;
        let (resp, _) = self.fs_call(json!({"op": "mkdir", "path": path}), &[]).await?;
        if resp["ok"] == true { Ok(()) } else { Err(fs_error("mkdir", &path, &resp, 0)) }
    }

    async fn remove(&self, path: &str, recursive: bool) -> Result<(), SandboxError> {
        let path = resolve_path(path)?;
        let (resp, _) = self
            .fs_call(json!({"op": "remove", "path": path, "recursive": recursive}), &[])
            .await?;
        if resp["ok"] == true { Ok(()) } else { Err(fs_error("remove", &path, &resp, 0)) }
    }

    async fn upload_tar(&self, dir: &str, archive: &[u8]) -> Result<(), SandboxError> {
        let dir = resolve_path(dir)?;
        let limits = TarLimits {
            max_total_bytes: (self.limits.workspace_mb).saturating_mul(1 << 20),
            ..TarLimits::default()
        };
        tar_safety::validate_archive(archive, &limits)?;
        let out = self
            .exec(
                ExecRequest::new([
                    "bash",
                    "-c",
                    "mkdir -p -- \"$1\" && exec tar -C \"$1\" -xf - --no-same-owner --no-same-permissions",
                    "upload",
                    &dir,
                ])
                .stdin(archive.to_vec())
                .timeout(Duration::from_secs(self.limits.max_timeout_secs)),
            )
            .await?;
        if out.success() {
            Ok(())
        } else {
            Err(SandboxError::FileOp {
                operation: "upload",
                path: dir,
                message: out.stderr_lossy().trim().to_string(),
            })
        }
    }

    async fn download_tar(&self, dir: &str) -> Result<Vec<u8>, SandboxError> {
        let dir = resolve_path(dir)?;
        let cap = (self.limits.workspace_mb as usize).saturating_mul(1 << 20).saturating_add(1 << 20);
        let out = self
            .exec(
                ExecRequest::new(["tar", "-C", &dir, "-cf", "-", "."])
                    .output_cap(cap)
                    .timeout(Duration::from_secs(self.limits.max_timeout_secs)),
            )
            .await?;
        if out.stdout_truncated {
            return Err(SandboxError::FileTooLarge {
                path: dir,
                size: out.stdout.len() as u64,
                limit: cap as u64,
            });
        }
        if !out.success() {
            return Err(SandboxError::FileOp {
                operation: "download",
                path: dir,
                message: out.stderr_lossy().trim().to_string(),
            });
        }
        Ok(out.stdout)
    }

    async fn kill_tagged(&self, tag: &str) -> Result<(), SandboxError> {
        let argv = vec![
            "python3".to_string(),
            format!("{}/killtree.py", super::HELPERS_DIR),
            "--tag".into(),
            tag.into(),
        ];
        let (_, mut process) = self.start_exec(&argv, None, &[], false).await?;
        let drain = async { while process.output.next().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_secs(10), drain).await;
        Ok(())
    }

    async fn is_alive(&self) -> bool {
        matches!(
            self.docker
                .inspect_container(&self.container_id, None::<InspectContainerOptions>)
                .await,
            Ok(info) if info.state.as_ref().and_then(|s| s.running) == Some(true)
        )
    }
}

async fn exec_exit_code(docker: Docker, exec_id: String) -> Option<i64> {
    // The output can end a moment before the engine marks the exec finished.
    for _ in 0..100 {
        match docker.inspect_exec(&exec_id).await {
            Ok(info) if info.running == Some(false) => return info.exit_code,
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(_) => return None,
        }
    }
    None
}

fn engine_err(e: bollard::errors::Error) -> SandboxError {
    SandboxError::EngineUnavailable { message: e.to_string() }
}

/// Sorts a bollard error into gone-container, unreachable-engine or a plain refusal.
fn docker_err(operation: &str, session: &str, e: bollard::errors::Error) -> SandboxError {
    use bollard::errors::Error as E;
    match e {
        E::DockerResponseServerError { status_code: 404, message } => SandboxError::ContainerGone {
            session: session.into(),
            message,
        },
        E::DockerResponseServerError { status_code: 409, message } if message.contains("not running") || message.contains("paused") => {
            SandboxError::ContainerGone {
                session: session.into(),
                message,
            }
        }
        E::DockerResponseServerError { message, .. } => SandboxError::Docker {
            operation: operation.into(),
            message,
        },
        E::IOError { .. } | E::HyperResponseError { .. } | E::HttpClientError { .. } | E::SocketNotFoundError(_) => {
            SandboxError::EngineUnavailable { message: e.to_string() }
        }
        other => SandboxError::Docker {
            operation: operation.into(),
            message: other.to_string(),
        },
    }
}
