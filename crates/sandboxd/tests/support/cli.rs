//! The real `sandboxd` binary as the CLI tests start it: a clean environment (no OPENAI_*,
//! AZURE_OPENAI_* or SANDBOXD_* from the caller, so neither the developer's keys nor their
//! config reach a test), run in `cwd` (so no config/sandboxd.toml is picked up), with its data
//! under `cwd/data`. Only the image the suite was told to use is passed on.

use std::path::Path;
use std::process::Command;

pub fn sandboxd(cwd: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxd"));
    cmd.current_dir(cwd);
    for (k, _) in std::env::vars() {
        if k.starts_with("OPENAI_") || k.starts_with("SANDBOXD_") || k.starts_with("AZURE_OPENAI_")
        {
            cmd.env_remove(k);
        }
    }
    if let Ok(image) = std::env::var("SANDBOXD_DOCKER_IMAGE") {
        cmd.env("SANDBOXD_DOCKER_IMAGE", image);
    }
    cmd.env("SANDBOXD_DATA_DIR", cwd.join("data"));
    cmd
}

/// The id in the "sandboxd: session ID kept …" line a `--keep` command writes on stderr.
pub fn kept_session_id(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("sandboxd: session ")
                .and_then(|r| r.split_once(" kept"))
                .map(|(id, _)| id.to_string())
        })
        .unwrap_or_else(|| panic!("no kept session id in:\n{stderr}"))
}

/// Every sandbox on the engine as `sandboxd sessions list --json` shows it (the admin's view:
/// `session_id`, `owner`, `handle`, `state`, `kept`, `creator`, `pooled`).
pub fn sessions_listed() -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = sandboxd(dir.path())
        .args(["sessions", "list", "--json"])
        .output()
        .expect("run sandboxd sessions list");
    assert!(
        out.status.success(),
        "sessions list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("sessions list --json is a JSON array")
}

/// The backend's handle of session `id` (its container), as `sessions list --json` shows it
/// to anyone who can run the CLI: tests never derive a container name from an id.
pub fn handle_of(id: &str) -> String {
    let list = sessions_listed();
    list.iter()
        .find(|s| s["session_id"] == id)
        .and_then(|s| s["handle"].as_str())
        .unwrap_or_else(|| panic!("session {id} is not in `sessions list --json`: {list:?}"))
        .to_string()
}

/// The guard that removes the CLI-made session `id` (its container, by `handle_of`).
pub fn cleanup(id: &str) -> super::Cleanup {
    super::Cleanup(handle_of(id))
}

/// `sandboxd run --keep` with `first`, then `sandboxd run --session ID` with `second` (two
/// processes, the LLM at `llm`, outputs under `dir/out1` and `dir/out2`), each asserted to
/// succeed. Returns the kept session's id, the guard that removes it, and the second run.
pub async fn keep_then_continue(
    dir: &Path,
    llm: &super::fake_llm::FakeLlm,
    first: &str,
    second: &str,
) -> (String, super::Cleanup, std::process::Output) {
    let run = |args: Vec<String>| {
        let mut cmd = sandboxd(dir);
        cmd.env("SANDBOXD_LLM_BASE_URL", llm.base_url())
            .env("SANDBOXD_LLM_MODEL", "fake-model");
        cmd.args(["run", "--json", "--no-input"]).args(args);
        tokio::process::Command::from(cmd).output()
    };
    let out = dir.join("out1").display().to_string();
    let kept = run(vec![
        "--keep".into(),
        "--output".into(),
        out,
        "--prompt".into(),
        first.into(),
    ])
    .await
    .expect("run sandboxd");
    let stderr = String::from_utf8_lossy(&kept.stderr);
    assert!(kept.status.success(), "{stderr}");
    let id = kept_session_id(&stderr);
    let cleanup = cleanup(&id);
    let out = dir.join("out2").display().to_string();
    let next = run(vec![
        "--session".into(),
        id.clone(),
        "--output".into(),
        out,
        "--prompt".into(),
        second.into(),
    ])
    .await
    .expect("run sandboxd");
    assert!(
        next.status.success(),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    (id, cleanup, next)
}
