//! The runtime conformance suite: what the session manager, the tools and the service rely on
//! from a sandbox backend, through the `Runtime` and `Sandbox` traits only, so a Kubernetes
//! backend runs it unchanged.
//!
//! Cases: create with limits and labels (and the warm pool's), find and list give back what
//! was recorded, attach to a found sandbox, exec (stdin, env, cwd, exit codes, stderr,
//! timeouts), spawn with attached stdin and stdout, files, the persistent shell, the
//! memory limit, the tunnel, liveness and readiness, and remove (after which the sandbox is
//! gone from find and list, and calls on it fail as `SandboxGone`).
//!
//! Tests of other binaries share the engine, so the suite makes its own session ids, only
//! ever looks at those in a listing, and removes every sandbox it made when a case ends,
//! whether it passed, failed or panicked.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use futures::{FutureExt, StreamExt};
use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::runtime::{FoundSandbox, Runtime, SandboxSpec};
use sandboxd_core::sandbox::tunnel::Tunnel;
use sandboxd_core::sandbox::{
    ExecRequest, FileKind, OutputChunk, Owner, Sandbox, SandboxError, SandboxState, ShellOptions,
    SpawnRequest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::run_case;

/// What a backend honestly cannot do; the cases that need it are skipped (and say so on
/// stderr). Keep these few: each is a promise the backend does not keep.
#[derive(Debug, Clone)]
pub struct RuntimeCaps {
    /// Processes really run: exec and spawn give their output and exit codes, so the shell,
    /// files and the tunnel work. The fake runtime's processes exit at once with status 0
    /// and no output (it exists for the manager's logic, not for running code).
    pub runs_processes: bool,
    /// The memory limit is enforced: a process allocating past it fails (or the sandbox
    /// stops, as under gVisor). The fake enforces nothing.
    pub enforces_memory: bool,
}

impl RuntimeCaps {
    /// Everything: what a real backend (Docker, Kubernetes) must pass.
    pub fn full() -> Self {
        Self {
            runs_processes: true,
            enforces_memory: true,
        }
    }
}

/// The owner of the suite's sandboxes.
const OWNER: &str = "conformance";

/// Runs every case in order against `rt`; the first failure is returned, naming its case.
pub async fn runtime_conformance(rt: Arc<dyn Runtime>, caps: RuntimeCaps) -> Result<()> {
    const S: &str = "runtime";
    let cx = Cx { rt, caps };
    cx.case(S, "case_readiness", case_readiness).await?;
    cx.case(
        S,
        "case_create_labels_find_list",
        case_create_labels_find_list,
    )
    .await?;
    cx.case(S, "case_attach", case_attach).await?;
    cx.case(S, "case_exec", case_exec).await?;
    cx.case(S, "case_spawn_stdin_stdout", case_spawn_stdin_stdout)
        .await?;
    cx.case(S, "case_files", case_files).await?;
    cx.case(S, "case_shell", case_shell).await?;
    cx.case(S, "case_memory_limit", case_memory_limit).await?;
    cx.case(S, "case_tunnel", case_tunnel).await?;
    cx.case(S, "case_liveness_and_remove", case_liveness_and_remove)
        .await?;
    Ok(())
}

struct Cx {
    rt: Arc<dyn Runtime>,
    caps: RuntimeCaps,
}

/// The sandboxes one case made, removed when it ends.
#[derive(Clone, Default)]
struct Made(Arc<Mutex<Vec<String>>>);

impl Cx {
    /// Runs a case with its own `Made` list, then removes every sandbox in it, also when the
    /// case failed or panicked (the panic goes on afterwards).
    async fn case<'a, F, Fut>(&'a self, suite: &str, name: &str, f: F) -> Result<()>
    where
        F: FnOnce(&'a Cx, Made) -> Fut,
        Fut: std::future::Future<Output = Result<()>> + 'a,
    {
        let made = Made::default();
        let outcome = std::panic::AssertUnwindSafe(run_case(suite, name, f(self, made.clone())))
            .catch_unwind()
            .await;
        let handles = std::mem::take(&mut *made.0.lock().unwrap_or_else(|e| e.into_inner()));
        for handle in handles {
            if let Err(e) = self.rt.remove(&handle).await {
                eprintln!("[{suite}] {name}: could not remove {handle}: {e}");
            }
        }
        match outcome {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    fn skip(&self, needs: &str) -> bool {
        eprintln!("[runtime]   skipped: the backend declares it cannot {needs}");
        true
    }
}

/// A session id no other test uses: letters and digits only (what the labels accept).
fn unique_id(what: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!(
        "conf{what}{}x{nanos:x}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn small_limits() -> Limits {
    Limits {
        memory_mb: 256,
        cpus: 0.5,
        pids: 128,
        workspace_mb: 64,
        tmp_mb: 32,
        max_timeout_secs: 60,
        ..Limits::default()
    }
}

fn spec(what: &str, limits: Limits) -> Result<SandboxSpec> {
    Ok(SandboxSpec {
        session_id: unique_id(what),
        owner: Some(Owner::new(OWNER)?),
        pooled: false,
        limits,
        keep: false,
        replica: None,
        image: None,
        restore_bytes: None,
    })
}

async fn create(cx: &Cx, made: &Made, spec: &SandboxSpec) -> Result<(String, Arc<dyn Sandbox>)> {
    let (handle, sandbox) = cx
        .rt
        .create(spec)
        .await
        .with_context(|| format!("create the sandbox of {}", spec.session_id))?;
    made.0
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(handle.clone());
    Ok((handle, sandbox))
}

async fn found(cx: &Cx, session_id: &str) -> Result<FoundSandbox> {
    cx.rt
        .find(session_id)
        .await?
        .ok_or_else(|| anyhow!("find({session_id}) finds nothing"))
}

async fn exec(sb: &dyn Sandbox, line: &str) -> Result<sandboxd_core::sandbox::ExecOutput> {
    sb.exec(ExecRequest::shell_line(line).timeout(Duration::from_secs(30)))
        .await
        .with_context(|| format!("exec {line:?}"))
}

async fn case_readiness(cx: &Cx, _made: Made) -> Result<()> {
    for (check, result) in cx.rt.readiness().await {
        ensure!(
            result.is_ok(),
            "readiness check {check:?} fails on a working backend: {result:?}"
        );
    }
    Ok(())
}

async fn case_create_labels_find_list(cx: &Cx, made: Made) -> Result<()> {
    let mut s = spec("labels", small_limits())?;
    s.keep = true;
    let (handle, sandbox) = create(cx, &made, &s).await?;
    ensure!(!handle.is_empty(), "create returns a handle");
    ensure!(
        sandbox.session_id() == s.session_id,
        "the sandbox knows its session"
    );
    let f = found(cx, &s.session_id).await?;
    ensure!(f.handle == handle, "find gives the handle create gave");
    ensure!(
        f.session_id == s.session_id,
        "the session label round-trips"
    );
    ensure!(
        f.owner.as_ref().map(|o| o.to_string()).as_deref() == Some(OWNER),
        "the owner label round-trips: {:?}",
        f.owner
    );
    ensure!(f.keep, "the keep label round-trips");
    ensure!(!f.pooled, "not a pool sandbox");
    ensure!(
        f.limits.as_ref() == Some(&s.limits),
        "the limits it was created with are recorded: {:?}",
        f.limits
    );
    ensure!(
        f.state == SandboxState::Running,
        "a created sandbox runs: {}",
        f.state
    );
    let creator = f.creator.clone().context("the creator is recorded")?;
    ensure!(
        cx.rt.creator_alive(&creator).await,
        "the creator of a sandbox this process made is alive ({creator})"
    );

    // A warm-pool sandbox: no owner, the pool label, not kept.
    let pool = SandboxSpec {
        session_id: unique_id("pool"),
        owner: None,
        pooled: true,
        limits: Limits::default(),
        keep: false,
        replica: None,
        image: None,
        restore_bytes: None,
    };
    let (pool_handle, _) = create(cx, &made, &pool).await?;
    let p = found(cx, &pool.session_id).await?;
    ensure!(
        p.handle == pool_handle && p.pooled && p.owner.is_none() && !p.keep,
        "a pool sandbox is found as one: {p:?}"
    );

    // The listing holds both, as find gave them (only our own ids are looked at).
    let listed = cx.rt.list().await?;
    for (id, h) in [(&s.session_id, &handle), (&pool.session_id, &pool_handle)] {
        let mine: Vec<&FoundSandbox> = listed.iter().filter(|f| &f.session_id == id).collect();
        ensure!(
            mine.len() == 1 && &mine[0].handle == h,
            "list holds {id} once with its handle: {mine:?}"
        );
    }
    let l = listed
        .iter()
        .find(|f| f.session_id == s.session_id)
        .context("listed")?;
    ensure!(
        l.limits == f.limits && l.owner == f.owner && l.keep == f.keep,
        "list and find agree"
    );
    ensure!(
        cx.rt.find(&unique_id("none")).await?.is_none(),
        "find of an id never made finds nothing"
    );
    Ok(())
}

async fn case_attach(cx: &Cx, made: Made) -> Result<()> {
    let s = spec("attach", small_limits())?;
    let (_, first) = create(cx, &made, &s).await?;
    let f = found(cx, &s.session_id).await?;
    let again = cx
        .rt
        .attach(&f, &s.limits)
        .await
        .context("attach to a found running sandbox")?;
    ensure!(
        again.session_id() == s.session_id,
        "the attached sandbox knows its session"
    );
    ensure!(again.is_alive().await, "the attached sandbox is alive");
    if !cx.caps.runs_processes && cx.skip("run processes (same sandbox check)") {
        return Ok(());
    }
    first.write_file("attach.txt", b"one sandbox").await?;
    let data = again.read_file("/workspace/attach.txt").await?;
    ensure!(
        data == b"one sandbox",
        "the attached sandbox is the same sandbox"
    );
    Ok(())
}

async fn case_exec(cx: &Cx, made: Made) -> Result<()> {
    let s = spec("exec", small_limits())?;
    let (_, sb) = create(cx, &made, &s).await?;
    if !cx.caps.runs_processes {
        // What the fake promises instead: a process that ends at once, successfully.
        let out = exec(&*sb, "true").await?;
        ensure!(out.success(), "exec succeeds: {out:?}");
        cx.skip("run processes");
        return Ok(());
    }
    let out = sb
        .exec(
            ExecRequest::new([
                "bash",
                "-c",
                "read line; echo \"in:$line env:$CONF_X cwd:$(pwd) uid:$(id -u)\"; echo err >&2; exit 3",
            ])
            .stdin(b"hello\n".to_vec())
            .env("CONF_X", "42")
            .timeout(Duration::from_secs(30)),
        )
        .await?;
    ensure!(
        out.exit_code == Some(3),
        "the exit code comes back: {out:?}"
    );
    ensure!(
        out.stdout_lossy() == "in:hello env:42 cwd:/workspace uid:1000\n",
        "stdin, env, the default cwd /workspace and the sandbox user: {:?}",
        out.stdout_lossy()
    );
    ensure!(out.stderr_lossy() == "err\n", "stderr is kept apart");
    ensure!(!out.timed_out, "not timed out");

    let out = sb.exec(ExecRequest::new(["pwd"]).cwd("/tmp")).await?;
    ensure!(out.stdout_lossy() == "/tmp\n", "cwd is honoured");

    let started = std::time::Instant::now();
    let out = sb
        .exec(ExecRequest::shell_line("sleep 30").timeout(Duration::from_secs(1)))
        .await?;
    ensure!(
        out.timed_out && out.exit_code.is_none(),
        "a command over its timeout is cut: {out:?}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(15),
        "the timeout returns promptly ({:?})",
        started.elapsed()
    );
    let out = sb
        .exec(ExecRequest::shell_line("head -c 100000 /dev/zero").output_cap(1000))
        .await?;
    // The kept head and tail are at most the cap; a short note of what was cut joins them.
    ensure!(
        out.stdout.len() <= 1000 + 200 && out.stdout_truncated,
        "output is capped: {} bytes",
        out.stdout.len()
    );
    Ok(())
}

async fn case_spawn_stdin_stdout(cx: &Cx, made: Made) -> Result<()> {
    let s = spec("spawn", small_limits())?;
    let (_, sb) = create(cx, &made, &s).await?;
    let mut p = sb
        .spawn(SpawnRequest::new([
            "bash",
            "-c",
            "tr a-z A-Z; echo done >&2",
        ]))
        .await
        .context("spawn")?;
    p.stdin.write_all(b"hello spawn\n").await?;
    p.stdin.flush().await?;
    // Shutting stdin down closes it: the process sees EOF and ends.
    p.stdin.shutdown().await?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let collect = async {
        while let Some(chunk) = p.output.next().await {
            match chunk? {
                OutputChunk::Stdout(b) => out.extend_from_slice(&b),
                OutputChunk::Stderr(b) => err.extend_from_slice(&b),
            }
        }
        Ok::<_, SandboxError>(())
    };
    tokio::time::timeout(Duration::from_secs(30), collect)
        .await
        .context("the output ends once stdin is closed")??;
    let code = (p.exit_code)().await;
    if !cx.caps.runs_processes {
        ensure!(code == Some(0), "the fake's process ends with 0: {code:?}");
        cx.skip("run processes");
        return Ok(());
    }
    ensure!(
        out == b"HELLO SPAWN\n",
        "stdin reaches the process and its stdout comes back: {:?}",
        String::from_utf8_lossy(&out)
    );
    ensure!(err == b"done\n", "stderr comes apart");
    ensure!(
        code == Some(0),
        "the exit code is known after the end: {code:?}"
    );
    let empty = sb.spawn(SpawnRequest::new(Vec::<String>::new())).await;
    ensure!(empty.is_err(), "an empty command is refused");
    Ok(())
}

async fn case_files(cx: &Cx, made: Made) -> Result<()> {
    if !cx.caps.runs_processes && cx.skip("run processes (files go through a helper)") {
        return Ok(());
    }
    let s = spec("files", small_limits())?;
    let (_, sb) = create(cx, &made, &s).await?;
    sb.mkdir("conf").await.context("mkdir")?;
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    sb.write_file("conf/a.bin", &data).await.context("write")?;
    ensure!(
        sb.read_file("/workspace/conf/a.bin").await? == data,
        "a file reads back byte for byte (relative paths are under /workspace)"
    );
    let (head, size) = sb.read_head("conf/a.bin", 10).await?;
    ensure!(head == data[..10] && size == 70_000, "read_head");
    let st = sb.stat("conf/a.bin").await?;
    ensure!(
        st.kind == FileKind::File && st.size == 70_000,
        "stat: {st:?}"
    );
    ensure!(
        sb.stat("conf").await?.kind == FileKind::Dir,
        "a directory stats as one"
    );
    let names: Vec<String> = sb
        .list_dir("conf")
        .await?
        .into_iter()
        .map(|e| e.name)
        .collect();
    ensure!(names == ["a.bin"], "list_dir: {names:?}");
    let out = exec(&*sb, "cat /workspace/conf/a.bin | wc -c").await?;
    ensure!(
        out.stdout_lossy().trim() == "70000",
        "a written file is what processes see"
    );
    let missing = sb.read_file("conf/missing").await;
    ensure!(
        matches!(missing, Err(SandboxError::NotFound { .. })),
        "a missing file is NotFound: {missing:?}"
    );
    sb.remove("conf", true).await.context("remove -r")?;
    ensure!(
        matches!(sb.stat("conf").await, Err(SandboxError::NotFound { .. })),
        "a removed directory is gone"
    );
    Ok(())
}

async fn case_shell(cx: &Cx, made: Made) -> Result<()> {
    if !cx.caps.runs_processes && cx.skip("run processes (the shell)") {
        return Ok(());
    }
    let s = spec("shell", small_limits())?;
    let (_, sb) = create(cx, &made, &s).await?;
    let opts = ShellOptions {
        timeout: Duration::from_secs(30),
        ..ShellOptions::default()
    };
    let out = sb.shell("cd /tmp && export CONF_Y=7", opts.clone()).await?;
    ensure!(out.exit_code == Some(0), "shell: {out:?}");
    let out = sb.shell("echo \"$(pwd) $CONF_Y\"", opts.clone()).await?;
    ensure!(
        out.stdout_lossy() == "/tmp 7\n",
        "cwd and exports persist across shell calls: {:?}",
        out.stdout_lossy()
    );
    let out = sb.shell("echo oops >&2; false", opts.clone()).await?;
    ensure!(
        out.exit_code == Some(1) && out.stderr_lossy() == "oops\n",
        "exit codes and stderr of the shell: {out:?}"
    );
    let out = sb
        .shell(
            "sleep 30",
            ShellOptions {
                timeout: Duration::from_secs(1),
                ..opts.clone()
            },
        )
        .await?;
    ensure!(out.timed_out, "a shell command over its timeout is cut");
    let out = sb.shell("echo after", opts.clone()).await?;
    ensure!(
        out.stdout_lossy() == "after\n",
        "the shell answers after a timeout: {out:?}"
    );
    sb.restart_shell().await?;
    let out = sb.shell("pwd", opts).await?;
    ensure!(
        out.exit_code == Some(0) && out.stdout_lossy() == "/workspace\n",
        "a restarted shell starts fresh in /workspace: {:?}",
        out.stdout_lossy()
    );
    Ok(())
}

async fn case_memory_limit(cx: &Cx, made: Made) -> Result<()> {
    if !(cx.caps.runs_processes && cx.caps.enforces_memory) && cx.skip("enforce the memory limit") {
        return Ok(());
    }
    let limits = Limits {
        memory_mb: 128,
        ..small_limits()
    };
    let s = spec("memory", limits)?;
    let (_, sb) = create(cx, &made, &s).await?;
    // Touches every page of 512 MiB, four times the limit.
    let r = sb
        .exec(
            ExecRequest::new(["python3", "-c", "b = b'x' * (512 << 20); print(len(b))"])
                .timeout(Duration::from_secs(60)),
        )
        .await;
    match r {
        Ok(out) => ensure!(
            !out.success() && out.stdout.is_empty(),
            "a process allocating 4x the memory limit is stopped: {out:?}"
        ),
        // gVisor stops the whole sandbox on an out-of-memory kill.
        Err(SandboxError::SandboxGone { .. }) => {}
        Err(e) => return Err(anyhow!("the allocation failed otherwise: {e}")),
    }
    Ok(())
}

async fn case_tunnel(cx: &Cx, made: Made) -> Result<()> {
    if !cx.caps.runs_processes && cx.skip("run processes (the tunnel's relay)") {
        return Ok(());
    }
    let s = spec("tunnel", small_limits())?;
    let (_, sb) = create(cx, &made, &s).await?;
    sb.write_file("site/index.html", b"conformance page")
        .await?;
    let out = sb
        .shell(
            "cd /workspace/site && (SANDBOXD_TAG=confhttp python3 -m http.server 8011 --bind 127.0.0.1 > /tmp/http.log 2>&1 &) && \
             for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8011) 2>/dev/null && break; sleep 0.1; done; \
             (exec 3<>/dev/tcp/127.0.0.1/8011) 2>/dev/null",
            ShellOptions {
                timeout: Duration::from_secs(30),
                ..ShellOptions::default()
            },
        )
        .await?;
    ensure!(
        out.exit_code == Some(0),
        "the server in the sandbox is up: {out:?}"
    );
    let tunnel = Tunnel::open(sb.clone(), 8011, "conftunnel")
        .await
        .context("open a tunnel")?;
    let mut conn = tokio::net::TcpStream::connect(tunnel.addr()).await?;
    conn.write_all(b"GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut body = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut body))
        .await
        .context("the tunnelled reply ends")??;
    let body = String::from_utf8_lossy(&body);
    ensure!(
        body.starts_with("HTTP/1.0 200") && body.ends_with("conformance page"),
        "a tunnel reaches the sandbox's loopback: {body:?}"
    );
    drop(tunnel);
    sb.kill_tagged("confhttp").await.context("kill_tagged")?;
    let out = exec(&*sb, "(exec 3<>/dev/tcp/127.0.0.1/8011) 2>/dev/null").await?;
    ensure!(
        !out.success(),
        "kill_tagged stops the tagged server: it still answers"
    );
    Ok(())
}

async fn case_liveness_and_remove(cx: &Cx, made: Made) -> Result<()> {
    let s = spec("remove", small_limits())?;
    let (handle, sb) = create(cx, &made, &s).await?;
    ensure!(sb.is_alive().await, "a created sandbox is alive");
    sb.check_alive()
        .await
        .context("check_alive of a live one")?;
    cx.rt
        .memory_usage(&handle)
        .await
        .context("memory_usage of a live sandbox is not an error")?;
    // One reading of both agrees with the separate ones on what the backend can tell.
    let usage = cx
        .rt
        .usage(&handle)
        .await
        .context("usage of a live sandbox is not an error")?;
    let memory = cx.rt.memory_usage(&handle).await?;
    let cpu = cx.rt.cpu_usage_usec(&handle).await?;
    ensure!(
        usage.memory_bytes.is_some() == memory.is_some()
            && usage.cpu_usec.is_some() == cpu.is_some(),
        "usage tells what memory_usage and cpu_usage_usec tell: {usage:?} vs {memory:?}, {cpu:?}"
    );
    cx.rt.remove(&handle).await.context("remove")?;
    ensure!(!sb.is_alive().await, "a removed sandbox is not alive");
    ensure!(
        matches!(
            sb.check_alive().await,
            Err(SandboxError::SandboxGone { .. })
        ),
        "check_alive of a removed sandbox is SandboxGone"
    );
    ensure!(
        cx.rt.find(&s.session_id).await?.is_none(),
        "a removed sandbox is gone from find"
    );
    ensure!(
        !cx.rt
            .list()
            .await?
            .iter()
            .any(|f| f.session_id == s.session_id),
        "a removed sandbox is gone from list"
    );
    let r = sb.exec(ExecRequest::new(["true"])).await;
    ensure!(
        matches!(r, Err(SandboxError::SandboxGone { .. })),
        "exec in a removed sandbox is SandboxGone: {r:?}"
    );
    cx.rt
        .remove(&handle)
        .await
        .context("removing a removed sandbox is not an error")?;
    Ok(())
}
