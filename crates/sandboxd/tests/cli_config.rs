//! `sandboxd config import-openmanus` on OpenManus's own example files (copied into
//! crates/core/tests/fixtures/openmanus, credited there): the report names every key, the
//! written files load, an existing file is never overwritten without --force.

use std::path::PathBuf;
use std::process::Command;

use sandboxd_core::config::Config;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../core/tests/fixtures/openmanus")
        .join(name)
}

fn import(out: &std::path::Path, force: bool) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandboxd"));
    cmd.args(["config", "import-openmanus"])
        .arg(fixture("config.example.toml"))
        .arg(fixture("mcp.example.json"))
        .arg("--out-dir")
        .arg(out);
    if force {
        cmd.arg("--force");
    }
    cmd.output().expect("run sandboxd")
}

#[test]
fn openmanus_example_files_import_with_a_full_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("config");
    let run = import(&out, false);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for key in [
        "llm.model",
        "llm.base_url",
        "llm.api_key",
        "llm.max_tokens",
        "llm.temperature",
        "llm.vision.model",
        "llm.vision.base_url",
        "llm.vision.api_key",
        "llm.vision.max_tokens",
        "llm.vision.temperature",
        "mcp.server_reference",
    ] {
        assert!(
            stdout.contains(&format!("  mapped   {key} "))
                || stdout.contains(&format!("  dropped  {key}: ")),
            "{key} is not reported:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("server   server1: legacy SSE at http://localhost:8000/sse"),
        "{stdout}"
    );
    assert!(stdout.contains("server   bourdon: stdio"), "{stdout}");

    let toml = out.join("sandboxd.toml");
    let config = Config::load(Some(&toml)).expect("the written sandboxd.toml loads");
    assert_eq!(config.llm.model, "claude-3-7-sonnet-20250219");
    assert_eq!(
        config.mcp.servers_file,
        out.join("mcp.json").display().to_string()
    );
    let (servers, bad) = sandboxd_core::mcp::config::load(&out.join("mcp.json")).unwrap();
    assert_eq!((servers.len(), bad.len()), (2, 0));
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&toml).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the file may hold an API key");

    // A second import refuses to overwrite, and changes nothing; --force replaces.
    std::fs::write(&toml, "# mine\n").unwrap();
    let again = import(&out, false);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("--force"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(std::fs::read_to_string(&toml).unwrap(), "# mine\n");
    assert!(import(&out, true).status.success());
    assert!(
        std::fs::read_to_string(&toml)
            .unwrap()
            .contains("claude-3-7-sonnet")
    );
}

#[test]
fn a_broken_openmanus_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("config.toml");
    std::fs::write(&bad, "[sandbox]\nmemory_limit = 'lots'\n").unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["config", "import-openmanus"])
        .arg(&bad)
        .arg("--out-dir")
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("sandbox.memory_limit") && stderr.contains("512m"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("out").exists(),
        "nothing is written on error"
    );
}
