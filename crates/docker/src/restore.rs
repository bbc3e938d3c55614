//! A resumed session's /workspace archive through its container's main process: a container
//! made for a resume (`SandboxSpec::restore_bytes`) runs `init.sh restore LEN` with its stdin
//! open for one attach, which this backend makes between the create and the start. The
//! writer is kept in the sandbox until the restore takes it (`ExecBackend::take_main_stdin`)
//! and feeds it while the session's shell is being started (core's shell_restore.rs): the
//! archive's trip through the engine no longer waits for the shell's exec to start.
//!
//! Only the attached stdin is asked for (the main process prints nothing sandboxd reads), and
//! `StdinOnce` closes the process's stdin when the writer is dropped, so init.sh never waits
//! for bytes that will not come.

use std::pin::Pin;

use bollard::Docker;
use bollard::query_parameters::AttachContainerOptionsBuilder;
use tokio::io::AsyncWrite;

use sandboxd_core::sandbox::{HELPERS_DIR, SandboxError};

use crate::docker_err;

/// The main process: init.sh, told to restore `restore_bytes` from its stdin first.
pub(crate) fn main_command(restore_bytes: Option<u64>) -> Vec<String> {
    let mut cmd = vec![format!("{HELPERS_DIR}/init.sh")];
    if let Some(len) = restore_bytes {
        cmd.extend(["restore".to_string(), len.to_string()]);
    }
    cmd
}

/// Attaches to the stdin of container `id` (made with `OpenStdin`, not yet started).
pub(crate) async fn attach_stdin(
    docker: &Docker,
    id: &str,
    session: &str,
) -> Result<Pin<Box<dyn AsyncWrite + Send>>, SandboxError> {
    let options = AttachContainerOptionsBuilder::default()
        .stdin(true)
        .stream(true)
        .build();
    let attached = docker
        .attach_container(id, Some(options))
        .await
        .map_err(|e| docker_err("attach to the main process's stdin", session, e))?;
    Ok(attached.input)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_resumes_container_has_an_open_stdin() {
        let mut spec = sandboxd_core::sandbox::runtime::SandboxSpec {
            session_id: "s1".into(),
            owner: None,
            pooled: false,
            limits: sandboxd_core::config::Limits::default(),
            keep: false,
            replica: None,
            image: None,
            restore_bytes: None,
        };
        let body = crate::container_body("image", None, &spec);
        assert_eq!(body.open_stdin, None);
        assert_eq!(body.cmd, Some(main_command(None)));
        spec.restore_bytes = Some(4096);
        let body = crate::container_body("image", None, &spec);
        assert_eq!(
            (body.open_stdin, body.stdin_once, body.attach_stdin),
            (Some(true), Some(true), Some(true))
        );
        assert_eq!(body.cmd, Some(main_command(Some(4096))));
        // Everything else is a cold create's.
        assert_eq!(body.host_config.and_then(|h| h.readonly_rootfs), Some(true));
    }

    #[test]
    fn only_a_resume_tells_init_to_restore() {
        assert_eq!(main_command(None), vec![format!("{HELPERS_DIR}/init.sh")]);
        assert_eq!(
            main_command(Some(10_485_760)),
            vec![
                format!("{HELPERS_DIR}/init.sh"),
                "restore".to_string(),
                "10485760".to_string()
            ]
        );
    }
}
