//! `sandboxd run` with a workspace that holds things the copy-out refuses (an absolute venv
//! symlink, a hard link, a FIFO) beside real deliverables: the real binary, the real engine
//! and image, the LLM faked at the HTTP boundary. Every real file arrives, the skipped entries
//! are listed with their reasons, and the exit status says the copy was partial.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::process::{Command, Stdio};

use serde_json::json;
use support::fake_llm::{FakeLlm, Reply};

#[tokio::test]
async fn a_partial_copy_is_listed_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "bash",
            json!({"command": "cd /workspace && mkdir -p .venv/bin && ln -s /usr/bin/python3 .venv/bin/python3 && \
                   echo '# Findings' > report.md && echo 1 > a.txt && ln a.txt b.txt && mkfifo pipe && echo done"}),
        ),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "report.md is written"}),
        ),
    ])
    .await;
    let out_dir = dir.path().join("out");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxd"));
    cmd.current_dir(dir.path());
    for (k, _) in std::env::vars() {
        if k.starts_with("OPENAI_") || k.starts_with("SANDBOXD_") || k.starts_with("AZURE_OPENAI_")
        {
            cmd.env_remove(k);
        }
    }
    if let Ok(image) = std::env::var("SANDBOXD_DOCKER_IMAGE") {
        cmd.env("SANDBOXD_DOCKER_IMAGE", image);
    }
    cmd.env("SANDBOXD_DATA_DIR", dir.path().join("data"))
        .env("SANDBOXD_LLM_BASE_URL", llm.base_url())
        .env("SANDBOXD_LLM_MODEL", "fake-model")
        .args(["run", "--no-input", "--output"])
        .arg(&out_dir)
        .args(["--prompt", "Write the findings"]);
    let out = tokio::process::Command::from(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(out_dir.join("report.md")).unwrap(),
        "# Findings\n",
        "{stderr}"
    );
    // Of two hard-linked names, tar stores the first it meets as the file.
    let kept = ["a.txt", "b.txt"].map(|n| out_dir.join(n).is_file());
    assert_eq!(kept.iter().filter(|k| **k).count(), 1, "{stderr}");
    assert!(
        stderr.contains("the copy is INCOMPLETE: 3 entries were skipped"),
        "{stderr}"
    );
    for line in [
        "./.venv/bin/python3: symlink target `/usr/bin/python3` is absolute",
        ".txt: hard links are not allowed (target `./",
        "./pipe: FIFOs are not allowed",
    ] {
        assert!(stderr.contains(line), "{line} missing:\n{stderr}");
    }
    for gone in [".venv/bin/python3", "pipe"] {
        assert!(
            std::fs::symlink_metadata(out_dir.join(gone)).is_err(),
            "{gone} was written"
        );
    }
}
