//! A pod's state in the seam's words, and why a starting pod will not run: read from the
//! status the API server reports, every string from it cut and stripped of control
//! characters before it reaches an error.

use k8s_openapi::api::core::v1::Pod;

use sandboxd_core::sandbox::SandboxState;

use crate::exec;

/// Why a starting pod will not run, when it says so (the image cannot be pulled, the pod
/// failed, its container ended).
pub(crate) fn start_failure(pod: &Pod) -> Option<String> {
    if exec::stopped(pod) {
        return Some(exec::stop_reason(pod).unwrap_or_else(|| "the pod stopped".into()));
    }
    let waiting = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| c.state.as_ref()?.waiting.clone())?;
    let reason = waiting.reason.unwrap_or_default();
    let fatal = [
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    ];
    fatal.contains(&reason.as_str()).then(|| {
        let message: String = waiting
            .message
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_control())
            .take(300)
            .collect();
        format!("{reason}: {message} (is the sandbox image pushed to the cluster's registry? [kubernetes] image)")
    })
}

/// A pod's state in the seam's words.
pub(crate) fn state_of(pod: &Pod) -> SandboxState {
    if pod.metadata.deletion_timestamp.is_some() {
        return SandboxState::Removing;
    }
    if exec::stopped(pod) {
        return SandboxState::Stopped;
    }
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Running") => SandboxState::Running,
        _ => SandboxState::Starting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_of_pods() {
        let pod = |status: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": status}))
                .unwrap()
        };
        assert_eq!(
            state_of(&pod(serde_json::json!({"phase": "Pending"}))),
            SandboxState::Starting
        );
        assert_eq!(
            state_of(&pod(serde_json::json!({"phase": "Running"}))),
            SandboxState::Running
        );
        assert_eq!(
            state_of(&pod(serde_json::json!({"phase": "Failed"}))),
            SandboxState::Stopped
        );
        let pulling = pod(
            serde_json::json!({"phase": "Pending", "containerStatuses": [{
            "name": "sandbox", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}]}),
        );
        assert!(
            start_failure(&pulling)
                .unwrap()
                .contains("ImagePullBackOff")
        );
    }
}
