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
