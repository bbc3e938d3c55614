//! Making the rootfs: the recipe's script run by bash in a private build directory, its
//! output streamed line by line as progress and its last lines kept for the error.
//!
//! The script (mmdebstrap over the host's apt sources) runs as root, so the directory it runs
//! from is created fresh with mode 0700 and removed when the build ends, failed or not.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

use super::recipe::BUILD_SCRIPT;
use super::{BuildProgress, ImageError};

/// How many lines of build output an error carries: enough for apt's or dpkg's complaint and
/// the mmdebstrap line that gave up.
const LOG_TAIL_LINES: usize = 40;

/// Runs the recipe's build script, streaming its output lines to `progress` as they come.
pub(super) async fn run_recipe(
    recipe_dir: &Path,
    rootfs: &Path,
    cwd: &Path,
    progress: &(dyn Fn(BuildProgress) + Send + Sync),
) -> Result<(), ImageError> {
    let script = recipe_dir.join(BUILD_SCRIPT);
    let mut child = Command::new("bash")
        .arg(&script)
        .arg(rootfs)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ImageError::RecipeSpawn {
            script: script.clone(),
            source,
        })?;

    // Two readers feed one channel so lines reach `progress` (which is not 'static and so
    // cannot move into a task) in the order they arrive.
    let (lines_tx, mut lines_rx) = mpsc::unbounded_channel();
    if let Some(stdout) = child.stdout.take() {
        tokio::spawn(forward_lines(stdout, lines_tx.clone()));
    }
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(forward_lines(stderr, lines_tx.clone()));
    }
    drop(lines_tx);

    let mut tail = VecDeque::with_capacity(LOG_TAIL_LINES);
    while let Some(line) = lines_rx.recv().await {
        if tail.len() == LOG_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line.clone());
        match line.strip_prefix("I: ") {
            Some(step) => progress(BuildProgress::Step(step.to_owned())),
            None => progress(BuildProgress::Log(line)),
        }
    }

    let status = child
        .wait()
        .await
        .map_err(|source| ImageError::RecipeSpawn { script, source })?;
    if status.success() && rootfs.is_file() {
        return Ok(());
    }
    Err(ImageError::BuildFailed {
        status: describe_status(status, rootfs),
        log_tail: Vec::from(tail).join("\n"),
    })
}

fn describe_status(status: ExitStatus, rootfs: &Path) -> String {
    if status.success() {
        format!("the recipe exited 0 but wrote no {}", rootfs.display())
    } else {
        status.to_string()
    }
}

/// Sends each line of `reader` (lossily decoded; progress bars' `\r` redraws reduced to their
/// final state) until EOF or the receiver goes away.
async fn forward_lines(reader: impl AsyncRead + Unpin, lines: mpsc::UnboundedSender<String>) {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&buf);
        let line = text
            .trim_end()
            .rsplit('\r')
            .find(|part| !part.trim().is_empty())
            .unwrap_or("");
        if !line.trim().is_empty() && lines.send(line.to_owned()).is_err() {
            return;
        }
    }
}

pub(super) fn find_program(program: &str, search_path: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(search_path)
        .map(|dir| dir.join(program))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// A private build directory, removed when dropped (also when a build fails half way).
///
/// The recipe is executed as root from here, so the directory is created fresh with mode
/// 0700: nobody else on the host can swap a script in between writing and running it.
pub(super) struct TempDir(PathBuf);

impl TempDir {
    pub(super) fn create() -> Result<Self, ImageError> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!(
            "sandboxd-image-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| ImageError::Workspace {
                path: path.clone(),
                source,
            })?;
        Ok(TempDir(path))
    }

    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(path = %self.0.display(), error = %e, "could not remove the image build directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_only_where_the_search_path_says() {
        let system = std::ffi::OsStr::new("/usr/bin:/bin");
        assert!(find_program("sh", system).is_some());
        assert!(find_program("sh", std::ffi::OsStr::new("/nonexistent")).is_none());
        assert!(find_program("no-such-program-here", system).is_none());
    }

    fn fake_recipe(script: &str) -> (TempDir, PathBuf) {
        let dir = TempDir::create().expect("temp dir");
        let recipe = dir.path().join("recipe");
        std::fs::create_dir(&recipe).expect("recipe dir");
        std::fs::write(recipe.join(BUILD_SCRIPT), script).expect("script");
        (dir, recipe)
    }

    #[tokio::test]
    async fn a_failing_recipe_reports_its_exit_status_and_last_lines() {
        let (dir, recipe) = fake_recipe(
            "for i in $(seq 1 50); do echo \"line $i\" >&2; done\n\
             printf 'I: a step\\n'\n\
             exit 3\n",
        );
        let seen = std::sync::Mutex::new(Vec::new());
        let record = |p: BuildProgress| seen.lock().expect("lock").push(p);
        let rootfs = dir.path().join("rootfs.tar");
        let err = run_recipe(&recipe, &rootfs, dir.path(), &record)
            .await
            .expect_err("the recipe fails");
        let ImageError::BuildFailed { status, log_tail } = err else {
            panic!("unexpected error: {err}");
        };
        assert!(status.contains('3'), "{status}");
        let tail: Vec<&str> = log_tail.lines().collect();
        assert_eq!(tail.len(), LOG_TAIL_LINES);
        assert!(tail.contains(&"line 50") && tail.contains(&"I: a step"));
        assert!(!tail.contains(&"line 1"));
        let seen = seen.into_inner().expect("lock");
        assert_eq!(seen.len(), 51);
        assert!(seen.contains(&BuildProgress::Step("a step".to_owned())));
        assert!(seen.contains(&BuildProgress::Log("line 1".to_owned())));
    }

    #[tokio::test]
    async fn a_recipe_that_exits_0_without_output_is_a_failure() {
        let (dir, recipe) = fake_recipe("exit 0\n");
        let rootfs = dir.path().join("rootfs.tar");
        let err = run_recipe(&recipe, &rootfs, dir.path(), &|_| {})
            .await
            .expect_err("no rootfs was written");
        assert!(matches!(err, ImageError::BuildFailed { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_recipe_that_writes_the_rootfs_succeeds() {
        let (dir, recipe) = fake_recipe("echo 'progress bar 10%\rprogress bar 100%'\n: > \"$1\"\n");
        let rootfs = dir.path().join("rootfs.tar");
        let seen = std::sync::Mutex::new(Vec::new());
        let record = |p: BuildProgress| seen.lock().expect("lock").push(p);
        run_recipe(&recipe, &rootfs, dir.path(), &record)
            .await
            .expect("recipe succeeds");
        assert!(rootfs.is_file());
        assert_eq!(
            seen.into_inner().expect("lock"),
            vec![BuildProgress::Log("progress bar 100%".to_owned())]
        );
    }
}
