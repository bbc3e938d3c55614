//! The warm pool on the real engine and image: a claim answers its first command at once,
//! runs under the limits asked for (lowered by `docker update`) with an empty /workspace;
//! claims never share a container and an ended session's container is gone; nothing one
//! session was given (env, files, processes) reaches the next; a rebuilt image under the
//! same tag replaces the pool; `kill -9` of a process holding a pool leaves nothing once the
//! reconciler runs; 30 concurrent cold creates and 30 concurrent claims all succeed,
//! distinct and isolated.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandboxd_core::config::{LimitRequest, Limits, PoolConfig, SessionsConfig};
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::sandbox::{CreateOptions, ExecRequest, SessionManager, ShellOptions, Viewer};
use sandboxd_docker::DockerRuntime;

fn pooled(runtime: DockerRuntime, size: usize, max: usize) -> Arc<SessionManager> {
    SessionManager::with_pool(
        Arc::new(runtime),
        support::test_limits(),
        SessionsConfig {
            max,
            max_per_owner: max,
            ..SessionsConfig::default()
        },
        PoolConfig {
            size,
            ..PoolConfig::default()
        },
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    )
}

fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI")
}

fn exists(container: &str) -> bool {
    docker(&["inspect", container]).status.success()
}

/// Every container the test saw (warm or claimed), by session id, with the handle the
/// manager knows it by; all removed on drop, even after a panic.
#[derive(Default, Clone)]
struct Seen(Arc<Mutex<HashMap<String, String>>>);

impl Seen {
    /// The pool's warm sandboxes, as the manager lists them.
    async fn pool(&self, m: &SessionManager) {
        let warm = m.pool_sessions();
        let listed = m.list(&Viewer::Admin).await.expect("list the sandboxes");
        let mut seen = self.0.lock().unwrap();
        for info in listed.into_iter().filter(|i| warm.contains(&i.session_id)) {
            seen.insert(info.session_id, info.handle);
        }
    }
    fn session(&self, s: &Session) {
        self.0
            .lock()
            .unwrap()
            .insert(s.id.clone(), s.handle.clone());
    }
    /// The container of a session seen before.
    fn container(&self, id: &str) -> String {
        self.0
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .unwrap_or_else(|| panic!("session {id} was never seen"))
    }
}

impl Drop for Seen {
    fn drop(&mut self) {
        if Arc::strong_count(&self.0) == 1 {
            for container in self.0.lock().unwrap().values() {
                let _ = docker(&["rm", "-f", container]);
            }
        }
    }
}

async fn sh(s: &Session, command: &str) -> String {
    let out = s
        .sandbox
        .shell(command, ShellOptions::default())
        .await
        .expect("shell");
    assert_eq!(
        out.exit_code,
        Some(0),
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

async fn claim(m: &SessionManager, req: &LimitRequest, seen: &Seen) -> Arc<Session> {
    let s = m
        .create(&support::owner(), req, CreateOptions::default())
        .await
        .expect("create a session");
    seen.session(&s);
    s
}

#[tokio::test]
async fn a_claim_answers_at_once_under_the_limits_asked_for_with_an_empty_workspace() {
    let seen = Seen::default();
    let m = pooled(support::runtime().await, 2, 16);
    let report = m.refill_pool().await;
    assert_eq!(report.added, 2, "{report:?}");
    seen.pool(&m).await;
    let warm = m.pool_sessions();
    let req = LimitRequest {
        memory_mb: Some(256),
        cpus: Some(0.5),
        pids: Some(64),
        ..LimitRequest::default()
    };
    let s = claim(&m, &req, &seen).await;
    if support::under_gvisor() {
        // gVisor's runsc cannot lower a running sandbox's limits (it has no `update`), so a
        // claim that asks for less is created cold, with what it asked for.
        assert!(!warm.contains(&s.id), "runsc cannot lower a warm sandbox");
        assert_eq!(s.limits.memory_mb, 256);
        return;
    }
    assert!(warm.contains(&s.id), "the session must come from the pool");
    let started = Instant::now();
    let first = sh(&s, "echo ready").await;
    assert_eq!(first.trim(), "ready");
    // Not a timing assertion: a shell already up answers without starting one (a cold
    // shell start is an exec create + start, tens of ms); the bench measures it.
    eprintln!(
        "first command of a claimed session: {:?}",
        started.elapsed()
    );
    // What the engine enforces, and what the container's cgroup says (v1 or v2).
    let inspect = docker(&[
        "inspect",
        "-f",
        "{{.HostConfig.Memory}} {{.HostConfig.MemorySwap}} {{.HostConfig.NanoCpus}} {{.HostConfig.PidsLimit}}",
        &s.handle,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&inspect.stdout).trim(),
        format!("{} {} 500000000 64", 256u64 << 20, 256u64 << 20),
        "the claim's limits"
    );
    let cgroup = sh(
        &s,
        "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max",
    )
    .await;
    assert_eq!(
        cgroup.lines().collect::<Vec<_>>(),
        vec![(256u64 << 20).to_string().as_str(), "64"]
    );
    assert_eq!(sh(&s, "ls -A /workspace").await, "");
    assert_eq!(s.limits.memory_mb, 256);
    m.remove_all().await;
}

#[tokio::test]
async fn claims_never_share_a_container_and_an_ended_session_is_gone() {
    let seen = Seen::default();
    let m = pooled(support::runtime().await, 2, 16);
    m.refill_pool().await;
    seen.pool(&m).await;
    let a = claim(&m, &LimitRequest::default(), &seen).await;
    let b = claim(&m, &LimitRequest::default(), &seen).await;
    assert_ne!(a.id, b.id);
    let host_a = sh(&a, "cat /proc/sys/kernel/hostname").await;
    let host_b = sh(&b, "cat /proc/sys/kernel/hostname").await;
    assert_ne!(host_a, host_b, "two claims, two containers");
    m.remove(&a.owner, &a.id).await.unwrap();
    assert!(
        !exists(&a.handle),
        "an ended session's container is destroyed"
    );
    m.refill_pool().await;
    seen.pool(&m).await;
    assert!(!m.pool_sessions().contains(&a.id), "never back in the pool");
    assert_eq!(m.pool_ready(), 2);
    let c = claim(&m, &LimitRequest::default(), &seen).await;
    assert!(c.id != a.id && c.id != b.id);
    m.remove_all().await;
    for container in [&b.handle, &c.handle] {
        assert!(!exists(container));
    }
    assert!(seen.0.lock().unwrap().values().all(|c| !exists(c)));
}

#[tokio::test]
async fn nothing_one_session_was_given_reaches_the_next() {
    let seen = Seen::default();
    let m = pooled(support::runtime().await, 1, 16);
    m.refill_pool().await;
    seen.pool(&m).await;
    let first = claim(&m, &LimitRequest::default(), &seen).await;
    const SECRET: &str = "s3cr3t-value-7f1c";
    sh(
        &first,
        &format!(
            "export API_TOKEN={SECRET}; echo {SECRET} > /workspace/secret; echo {SECRET} > /tmp/secret; (API_TOKEN={SECRET} sleep 600 &)"
        ),
    )
    .await;
    let out = first
        .sandbox
        .exec(ExecRequest::new(["sh", "-c", "echo $OTHER"]).env("OTHER", SECRET))
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(SECRET));
    m.remove(&first.owner, &first.id).await.unwrap();
    m.refill_pool().await;
    seen.pool(&m).await;
    let next = claim(&m, &LimitRequest::default(), &seen).await;
    assert_ne!(next.id, first.id);
    let looked = sh(
        &next,
        "env; cat /workspace/* /tmp/secret 2>/dev/null; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; ps -eo args; true",
    )
    .await;
    assert!(
        !looked.contains(SECRET),
        "the next session saw the last one's secret:\n{looked}"
    );
    m.remove_all().await;
}

#[tokio::test]
async fn a_rebuilt_image_under_the_same_tag_replaces_the_pool() {
    let seen = Seen::default();
    let base = support::runtime().await;
    let tag = format!("sandboxd/pooltest:{}", std::process::id());
    assert!(docker(&["tag", base.image(), &tag]).status.success());
    struct Untag(String);
    impl Drop for Untag {
        fn drop(&mut self) {
            let _ = docker(&["rmi", &self.0]);
        }
    }
    let _untag = Untag(tag.clone());
    let engine = sandboxd_docker::connect().await.unwrap();
    let m = pooled(
        DockerRuntime::new(engine, tag.clone(), support::oci_runtime()),
        2,
        16,
    );
    m.refill_pool().await;
    seen.pool(&m).await;
    let old = m.pool_sessions();
    assert_eq!(old.len(), 2);
    // Rebuild under the same tag (a derived image: a new id, no registry needed).
    let mut build = Command::new("docker")
        .args(["build", "-q", "-t", &tag, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    build
        .stdin
        .take()
        .unwrap()
        .write_all(format!("FROM {}\nLABEL sandboxd.test=rebuilt\n", base.image()).as_bytes())
        .unwrap();
    assert!(build.wait().unwrap().success());
    let report = m.refill_pool().await;
    seen.pool(&m).await;
    assert_eq!((report.retired, report.added), (2, 2), "{report:?}");
    for id in &old {
        assert!(
            !exists(&seen.container(id)),
            "the old-image sandbox {id} must be removed"
        );
    }
    let new_id =
        String::from_utf8_lossy(&docker(&["image", "inspect", "-f", "{{.Id}}", &tag]).stdout)
            .trim()
            .to_string();
    for id in m.pool_sessions() {
        let image = docker(&["inspect", "-f", "{{.Image}}", &seen.container(&id)]);
        assert_eq!(String::from_utf8_lossy(&image.stdout).trim(), new_id);
    }
    m.remove_all().await;
}

/// Reads JSON-RPC lines from the server until the response with `id`.
fn response(lines: &mut impl Iterator<Item = std::io::Result<String>>, id: u64) -> String {
    for line in lines {
        let line = line.expect("read the server's stdout");
        if line.contains(&format!("\"id\":{id}")) {
            return line;
        }
    }
    panic!("the server closed its stdout before answering {id}");
}

fn containers_of(pid: u32) -> Vec<String> {
    let all = docker(&[
        "ps",
        "-a",
        "--format",
        "{{.Names}} {{.Label \"sandboxd.creator\"}}",
        "--filter",
        "label=sandboxd.managed=true",
    ]);
    String::from_utf8_lossy(&all.stdout)
        .lines()
        .filter_map(|l| {
            let (name, creator) = l.split_once(' ')?;
            creator
                .starts_with(&format!("{pid}:"))
                .then(|| name.to_string())
        })
        .collect()
}

/// Whether the container runs its shell and file helper (a warm-up is done).
fn warmed(container: &str) -> bool {
    // ps inside, not `docker top`: under gVisor the host sees the Sentry, not these processes.
    let top = String::from_utf8_lossy(&docker(&["exec", container, "ps", "-eo", "args"]).stdout)
        .to_string();
    top.contains("sandboxd_fs.py") && top.contains("bash --noprofile")
}

#[test]
fn kill_9_of_a_process_holding_a_pool_leaves_nothing_after_the_reconciler() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .arg("mcp")
        .env("SANDBOXD_POOL_SIZE", "2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    struct Reap(u32);
    impl Drop for Reap {
        fn drop(&mut self) {
            for name in containers_of(self.0) {
                let _ = docker(&["rm", "-f", &name]);
            }
        }
    }
    let _reap = Reap(pid);
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Wait for the pool to fill before the first call, so the call claims a warm sandbox.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(containers_of(pid).len() == 2 && containers_of(pid).iter().all(|c| warmed(c))) {
        assert!(Instant::now() < deadline, "the pool never filled");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Warmed up means in the pool a moment later: the pool registers a sandbox after its
    // warm-up round trip returns. Nothing outside the process shows the registration, so give
    // it a margin (an early claim would create cold and fail the check below).
    std::thread::sleep(Duration::from_secs(2));
    let send = |stdin: &mut std::process::ChildStdin, v: serde_json::Value| {
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    };
    send(
        &mut stdin,
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "pool-test", "version": "0"}}}),
    );
    response(&mut lines, 1);
    send(
        &mut stdin,
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    send(
        &mut stdin,
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "bash", "arguments": {"command": "echo claimed-$((6*7))"}}}),
    );
    let answer = response(&mut lines, 2);
    assert!(answer.contains("claimed-42"), "{answer}");
    // One claimed and two warm (the refill after the claim).
    let deadline = Instant::now() + Duration::from_secs(120);
    while containers_of(pid).len() < 3 {
        assert!(Instant::now() < deadline, "the pool never refilled");
        std::thread::sleep(Duration::from_millis(200));
    }
    // `-a`: the refill's container may still be being created (not yet running) here.
    let pooled = docker(&[
        "ps",
        "-a",
        "--filter",
        "label=sandboxd.pool=true",
        "--format",
        "{{.Names}}",
    ]);
    let pooled = String::from_utf8_lossy(&pooled.stdout).to_string();
    assert!(
        containers_of(pid)
            .iter()
            .all(|n| pooled.contains(n.as_str())),
        "the claimed one is a pooled container too: {:?} vs {pooled}",
        containers_of(pid)
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(containers_of(pid).len(), 3, "SIGKILL runs no cleanup");
    let gc = Command::new(env!("CARGO_BIN_EXE_sandboxd"))
        .args(["sessions", "gc"])
        .output()
        .unwrap();
    assert!(
        gc.status.success(),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
    assert!(
        containers_of(pid).is_empty(),
        "the reconciler must remove the dead process's warm and claimed containers"
    );
}

/// Each session writes its own id and reads back only its own.
async fn isolated(s: Arc<Session>) -> Arc<Session> {
    let before = sh(&s, "ls -A /workspace").await;
    assert_eq!(before, "", "a fresh /workspace");
    sh(&s, &format!("echo {} > /workspace/me", s.id)).await;
    assert_eq!(sh(&s, "cat /workspace/me").await.trim(), s.id);
    s
}

async fn concurrently(m: &Arc<SessionManager>, n: usize, seen: &Seen) -> Vec<Arc<Session>> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (m, seen) = (m.clone(), seen.clone());
            tokio::spawn(async move {
                let s = claim(&m, &LimitRequest::default(), &seen).await;
                isolated(s).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("a create task"));
    }
    let ids: HashSet<&String> = out.iter().map(|s| &s.id).collect();
    assert_eq!(ids.len(), n, "every session its own container");
    let hosts: HashSet<String> =
        futures::future::join_all(out.iter().map(|s| sh(s, "cat /proc/sys/kernel/hostname")))
            .await
            .into_iter()
            .collect();
    assert_eq!(hosts.len(), n);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_concurrent_cold_creates_and_thirty_concurrent_claims_all_succeed() {
    let seen = Seen::default();
    let small = Limits {
        memory_mb: 256,
        ..support::test_limits()
    };
    let cold = SessionManager::new(
        Arc::new(support::runtime().await),
        small.clone(),
        SessionsConfig {
            max: 64,
            max_per_owner: 64,
            ..SessionsConfig::default()
        },
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    let sessions = concurrently(&cold, 30, &seen).await;
    cold.remove_all().await;
    assert!(sessions.iter().all(|s| !exists(&s.handle)));

    let warm = SessionManager::with_pool(
        Arc::new(support::runtime().await),
        small,
        SessionsConfig {
            max: 64,
            max_per_owner: 64,
            ..SessionsConfig::default()
        },
        PoolConfig {
            size: 30,
            ..PoolConfig::default()
        },
        std::sync::Arc::new(sandboxd_core::sandbox::records::NoRecords),
    );
    let report = warm.refill_pool().await;
    seen.pool(&warm).await;
    assert_eq!(report.added, 30, "{report:?}");
    let pool: HashSet<String> = warm.pool_sessions().into_iter().collect();
    let claimed = concurrently(&warm, 30, &seen).await;
    assert!(
        claimed.iter().all(|s| pool.contains(&s.id)),
        "all thirty claimed from the pool"
    );
    warm.remove_all().await;
    assert!(claimed.iter().all(|s| !exists(&s.handle)));
}
