//! The Kubernetes exec backend: a process in a session pod as an `AttachedProcess` (the
//! pod's `exec` subresource over a WebSocket, channel.rs), and the pod's liveness read from
//! its status. Kubernetes' exec has no user, working directory or environment of its own:
//! the user is the container's (uid 1000, from the pod spec) and the rest is set by
//! `env --chdir=DIR NAME=VALUE… COMMAND…` in the sandbox, each an argv word (never a shell).

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams};
use kube::{Client, Resource};

use sandboxd_core::sandbox::exec_sandbox::{ExecBackend, ExecSandbox};
use sandboxd_core::sandbox::{AttachedProcess, SandboxError, SpawnRequest, WORKSPACE};

use crate::spec::CONTAINER;
use crate::{BACKEND, kube_err};

/// The Sandbox on one pod.
pub type KubeSandbox = ExecSandbox<KubeExec>;

/// One session pod, reached through exec.
pub struct KubeExec {
    pub(crate) client: Client,
    pub(crate) namespace: String,
    pub(crate) pod: String,
    /// For error messages: which session's pod failed.
    pub(crate) session_id: String,
}

impl KubeExec {
    pub fn pod_name(&self) -> &str {
        &self.pod
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The pod as the API server has it now; None when it no longer exists.
    async fn current(&self) -> Result<Option<Pod>, kube::Error> {
        self.pods().get_opt(&self.pod).await
    }
}

/// The argv Kubernetes runs for `req`.
pub(crate) fn wrapped_argv(req: &SpawnRequest) -> Vec<String> {
    let cwd = req.cwd.as_deref().unwrap_or(WORKSPACE);
    let mut argv = vec!["env".to_string(), format!("--chdir={cwd}")];
    argv.extend(req.env.iter().map(|(k, v)| format!("{k}={v}")));
    argv.extend(req.argv.iter().cloned());
    argv
}

#[async_trait]
impl ExecBackend for KubeExec {
    async fn spawn(
        &self,
        req: &SpawnRequest,
        attach_stdin: bool,
    ) -> Result<AttachedProcess, SandboxError> {
        // `env` with no command would print the environment: refuse as Docker does.
        if req.argv.is_empty() || req.argv[0].contains('=') {
            return Err(SandboxError::Backend {
                backend: BACKEND,
                operation: "start a process".into(),
                message: "no command (or a command word that reads as NAME=VALUE)".into(),
            });
        }
        let ap = AttachParams::default()
            .container(CONTAINER)
            .stdin(attach_stdin)
            .stdout(true)
            .stderr(true);
        let url = Pod::url_path(&(), Some(&self.namespace));
        let request = kube::core::Request::new(url)
            .exec(&self.pod, wrapped_argv(req), &ap)
            .map_err(|e| SandboxError::Backend {
                backend: BACKEND,
                operation: "start a process".into(),
                message: e.to_string(),
            })?;
        let conn = self
            .client
            .connect(request)
            .await
            .map_err(|e| kube_err("start a process", &self.session_id, e))?;
        Ok(crate::channel::attach(conn, self.session_id.clone()))
    }

    async fn is_alive(&self) -> bool {
        matches!(self.current().await, Ok(Some(pod)) if running(&pod))
    }

    async fn is_stopped(&self) -> bool {
        match self.current().await {
            Ok(None) => true,
            Ok(Some(pod)) => stopped(&pod),
            // The API server did not answer: that says nothing about the pod.
            Err(_) => false,
        }
    }

    /// Kubernetes says why a pod ended: evicted (node pressure), its container
    /// out-of-memory killed, deleted by someone else.
    async fn stop_reason(&self) -> Option<String> {
        match self.current().await {
            Ok(None) => Some("its pod was deleted".into()),
            Ok(Some(pod)) => stop_reason(&pod),
            Err(_) => None,
        }
    }
}

/// Running, not being deleted, and its container running.
pub(crate) fn running(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    pod.metadata.deletion_timestamp.is_none()
        && status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && !container_terminated(pod)
}

/// Definitely not running again: deleted, finished, or its container ended.
pub(crate) fn stopped(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_some()
        || matches!(phase, Some("Succeeded" | "Failed"))
        || container_terminated(pod)
}

fn container_terminated(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|st| st.terminated.is_some()))
        })
}

/// Why a pod stopped, in words for the model and the user; every string from the API
/// server is cut and stripped of control characters.
pub(crate) fn stop_reason(pod: &Pod) -> Option<String> {
    let clean = |s: &str| -> String { s.chars().filter(|c| !c.is_control()).take(300).collect() };
    let status = pod.status.as_ref()?;
    if status.reason.as_deref() == Some("Evicted") {
        return Some(format!(
            "its pod was evicted by the node ({})",
            clean(status.message.as_deref().unwrap_or("no message"))
        ));
    }
    let terminated = status
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| c.state.as_ref()?.terminated.clone())?;
    Some(match terminated.reason.as_deref() {
        Some("OOMKilled") => "its container ran out of memory and was killed (OOMKilled): start a new session with a higher memory limit".to_string(),
        other => format!(
            "its container ended ({}, exit code {})",
            clean(other.unwrap_or("no reason")),
            terminated.exit_code
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_and_cwd_are_argv_words() {
        let req = SpawnRequest::new(["bash", "-c", "echo $X"])
            .env("X", "a b; rm -rf /")
            .cwd("/tmp");
        assert_eq!(
            wrapped_argv(&req),
            [
                "env",
                "--chdir=/tmp",
                "X=a b; rm -rf /",
                "bash",
                "-c",
                "echo $X"
            ]
        );
        let plain = SpawnRequest::new(["true"]);
        assert_eq!(wrapped_argv(&plain), ["env", "--chdir=/workspace", "true"]);
    }

    #[test]
    fn stop_reasons_are_read_and_cleaned() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Failed", "reason": "Evicted",
                       "message": "The node was low on resource: memory.\u{1b}[2J"}
        }))
        .unwrap();
        assert!(stopped(&pod) && !running(&pod));
        let why = stop_reason(&pod).unwrap();
        assert!(why.contains("evicted") && !why.contains('\u{1b}'), "{why}");
        let oom: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "sandbox", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}
        }))
        .unwrap();
        assert!(stopped(&oom) && !running(&oom));
        assert!(stop_reason(&oom).unwrap().contains("OOMKilled"));
    }
}
