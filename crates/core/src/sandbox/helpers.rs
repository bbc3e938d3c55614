//! How the host starts the in-container helpers (killtree, the file helper, the python
//! driver): isolated from everything sandboxed code can write.
//!
//! HOME is /workspace, so a `usercustomize.py` or a `.pth` file under
//! `~/.local/lib/python3.*/site-packages` would run inside every plain `python3` — enough to
//! turn killtree into a no-op or to replace the file helper's protocol. So every helper runs
//! as `/usr/bin/python3 -I` (no user site, no PYTHON* variables, no script directory on
//! sys.path; the helpers add their own directory, which is root-owned and read-only), with an
//! absolute interpreter path and a fixed PATH that names only root-owned directories.

use super::HELPERS_DIR;

/// The image's interpreter, by absolute path: no PATH lookup the sandbox could redirect.
pub const PYTHON: &str = "/usr/bin/python3";

/// The PATH every helper gets; only root-owned, read-only directories of the image.
pub const FIXED_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `python3 -I <HELPERS_DIR>/<script> <args…>`.
pub fn argv(script: &str, args: &[&str]) -> Vec<String> {
    let mut argv = vec![
        PYTHON.to_string(),
        "-I".to_string(),
        format!("{HELPERS_DIR}/{script}"),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv
}

/// The environment a helper adds to the container's: the fixed PATH.
pub fn env() -> Vec<(String, String)> {
    vec![("PATH".to_string(), FIXED_PATH.to_string())]
}

/// What killtree's exit status says: 0 only when a final scan found no live target, 3 when
/// some survived (their pids on stderr). Anything else means it did not run properly.
pub fn kill_confirmed(exit_code: Option<i64>) -> bool {
    exit_code == Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_start_isolated() {
        let argv = argv("killtree.py", &["--tag", "x"]);
        assert_eq!(argv[0], "/usr/bin/python3");
        assert_eq!(argv[1], "-I");
        assert!(argv[2].ends_with("/killtree.py"));
        assert_eq!(&argv[3..], ["--tag", "x"]);
        assert!(
            env()
                .iter()
                .any(|(k, v)| k == "PATH" && !v.contains("workspace"))
        );
    }
}
