//! Test plumbing for `sandboxd serve`: a data directory and config per test, users made with
//! the real `sandboxd users` command, and the server as a real process on a loopback port
//! (the process and the API client are testkit's `serve` module; what is here knows this
//! binary, its image, its store and the engine's containers). Dropping the environment
//! removes every container its users' sessions and its serve's warm pool made. A session's
//! container is found through the store (its runtime id): one that came from the pool carries
//! the pool's scope as owner label, not the user.
#![allow(dead_code)]

pub use sandboxd_testkit::serve::{Api, Serve, code, runs};

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_sandboxd");

pub struct Env {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    user_ids: Mutex<Vec<String>>,
}

impl Env {
    /// A fresh data directory and a config with quick upkeep and small limits; `extra` is
    /// appended (TOML tables).
    pub async fn new(extra: &str) -> Env {
        let engine = sandboxd_docker::connect()
            .await
            .expect("these tests need a running Docker engine");
        let image = crate::support::image(&engine).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("sandboxd.toml");
        let text = format!(
            "data_dir = {:?}\n[docker]\nimage = {image:?}\n[sessions]\nreap_interval_secs = 1\n{extra}\n",
            dir.path().join("data").display().to_string()
        );
        let text = if extra.contains("[server]") {
            text
        } else {
            format!(
                "{text}[server]\ndrain_secs = 2\nbody_limit_kb = 64\nupload_limit_mb = 4\nauth_failures_per_minute = 10000\n"
            )
        };
        std::fs::write(&config, text).expect("write config");
        Env {
            dir,
            config,
            user_ids: Mutex::new(Vec::new()),
        }
    }

    pub fn db(&self) -> PathBuf {
        self.dir.path().join("data/sandboxd.db")
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("SANDBOXD_CONFIG", &self.config)
            .env_remove("SANDBOXD_DOCKER_IMAGE")
            .env("SANDBOXD_LOG", "warn,sandboxd::access=info");
        c
    }

    /// `sandboxd users add NAME ARGS…`; returns the key it printed.
    pub fn add_user(&self, name: &str, args: &[&str]) -> String {
        let out = self
            .cmd()
            .args(["users", "add", name])
            .args(args)
            .output()
            .expect("run users add");
        assert!(
            out.status.success(),
            "users add: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        if let Some(id) = err.split('(').nth(1).and_then(|s| s.split(')').next()) {
            self.user_ids.lock().unwrap().push(id.to_string());
        }
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// Starts `sandboxd serve` on a free loopback port and waits until it listens.
    pub fn start(&self) -> Serve {
        self.start_logging("warn,sandboxd::access=info")
    }

    /// `start` with another SANDBOXD_LOG filter (what `Serve::log` collects).
    pub fn start_logging(&self, filter: &str) -> Serve {
        let mut cmd = self.cmd();
        cmd.env("SANDBOXD_LOG", filter)
            .args(["serve", "--listen", "127.0.0.1:0"]);
        Serve::spawn(cmd)
    }

    /// Counts a user made another way (through the API) as this environment's: its drop
    /// removes their containers too.
    pub fn track_user(&self, id: &str) {
        self.user_ids.lock().unwrap().push(id.to_string());
    }

    pub fn user_ids(&self) -> Vec<String> {
        self.user_ids.lock().unwrap().clone()
    }

    /// The owner label of this environment's serve's warm sandboxes: of its data directory,
    /// or, with a `[store] url`, of the store it shares with other replicas.
    pub fn pool_owner(&self) -> String {
        let config = sandboxd_core::config::Config::load(Some(&self.config)).unwrap();
        sandboxd_server::pool_owner_for(&config)
            .unwrap()
            .to_string()
    }

    /// The runtime id (the `sandboxd.session` label) the store recorded for an API session.
    pub async fn runtime_id(&self, id: &str) -> String {
        self.row(id).await.runtime_id.unwrap()
    }

    /// The container (the backend's handle) the store recorded for an API session.
    pub async fn container(&self, id: &str) -> String {
        self.row(id).await.container_id.unwrap()
    }

    async fn row(&self, id: &str) -> sandboxd_core::store::SessionRow {
        use sandboxd_core::store::Store as _;
        let store = sandboxd_sqlite::SqliteStore::open(&self.db())
            .await
            .unwrap();
        store.session(id).await.unwrap().unwrap()
    }

    /// The store serve keeps its data in, opened beside it (as `users` does).
    pub async fn store(&self) -> sandboxd_sqlite::SqliteStore {
        sandboxd_sqlite::SqliteStore::open(&self.db())
            .await
            .unwrap()
    }

    /// The kinds of tool record serve's store holds for runtime session `id`, sorted.
    pub async fn stored_records(&self, id: &str) -> Vec<String> {
        use sandboxd_core::store::ToolRecords as _;
        let store = self.store().await;
        let mut kinds = Vec::new();
        for kind in ["browser", "plans", "undo"] {
            if store.record(id, kind).await.unwrap().is_some() {
                kinds.push(kind.to_string());
            }
        }
        let listed = store
            .record_sessions()
            .await
            .unwrap()
            .contains(&id.to_string());
        assert_eq!(
            listed,
            !kinds.is_empty(),
            "{id} has records of another kind"
        );
        kinds
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for id in self.user_ids() {
            for owner in [format!("serve:{id}"), format!("serve-mcp:{id}")] {
                for c in containers_of(&owner) {
                    let _ = Command::new("docker").args(["rm", "-f", &c]).output();
                }
            }
        }
        for c in containers_of(&self.pool_owner()) {
            let _ = Command::new("docker").args(["rm", "-f", &c]).output();
        }
    }
}

/// Container ids (running or not) whose owner label is `owner`.
pub fn containers_of(owner: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=sandboxd.owner={owner}"),
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Whether a container with this `sandboxd.session` label exists (`running`: and runs).
pub fn container_of(runtime_id: &str, running: bool) -> bool {
    let out = Command::new("docker")
        .args([
            "ps",
            if running { "-q" } else { "-aq" },
            "--filter",
            &format!("label=sandboxd.session={runtime_id}"),
        ])
        .output()
        .expect("docker ps");
    !String::from_utf8_lossy(&out.stdout).trim().is_empty()
}

/// The `sandboxd.session` labels of the containers (running or not) with owner label `owner`
/// that the process `pid` created.
pub fn sessions_created_by(owner: &str, pid: u32) -> Vec<String> {
    ps_of_owner(
        owner,
        "{{.Label \"sandboxd.creator\"}} {{.Label \"sandboxd.session\"}}",
    )
    .lines()
    .filter_map(|l| l.split_once(' '))
    .filter(|(creator, _)| creator.split(':').next() == Some(pid.to_string().as_str()))
    .map(|(_, session)| session.to_string())
    .collect()
}

/// `docker ps -a --format FORMAT` of the containers with owner label `owner`.
fn ps_of_owner(owner: &str, format: &str) -> String {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            &format!("label=sandboxd.owner={owner}"),
            "--format",
            format,
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits (bounded) until, of the containers with one of `owners` that process `pid` created,
/// exactly those of the sessions in `expected` are left. A create the engine finished after
/// the process was killed shows up late and goes at the next upkeep tick, so this does not
/// look only once.
pub async fn wait_for_leftovers(owners: &[String], pid: u32, expected: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut left: Vec<String> = owners
            .iter()
            .flat_map(|o| sessions_created_by(o, pid))
            .collect();
        left.sort();
        let mut want = expected.to_vec();
        want.sort();
        if left == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the killed serve left orphans: {left:?} (expected {want:?}): {}",
            owners
                .iter()
                .map(|o| describe_containers(o))
                .collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `docker ps -a` of the containers with owner label `owner` (for failure messages).
pub fn describe_containers(owner: &str) -> String {
    ps_of_owner(
        owner,
        "{{.Names}} {{.Status}} created {{.CreatedAt}} creator {{.Label \"sandboxd.creator\"}}",
    )
}

/// Polls the API session `id` until it has ended (a bound, not a pause); returns it.
pub async fn ended_session(api: &Api, id: &str) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let (s, v) = api
            .json(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
            .await;
        assert_eq!(s, 200, "{v}");
        if v["state"] == "ended" {
            return v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the session did not end: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts that run `id` ended `failed` saying `reason`: its stream's last state and its
/// `run_finished` event, and its row.
pub async fn assert_run_failed_with(api: &Api, id: &str, reason: &str) {
    let evs = runs::follow_all(api, id).await;
    let last = evs.last().expect("the run's events");
    assert_eq!(last.data["state"], "failed", "{evs:?}");
    let finished = evs
        .iter()
        .find(|e| e.event == "run_finished")
        .expect("a run_finished event");
    assert!(
        finished.data.to_string().contains(reason),
        "{}",
        finished.data
    );
    let v = runs::get_run(api, id).await;
    assert_eq!(v["state"], "failed", "{v}");
    assert!(v.to_string().contains(reason), "{v}");
}
