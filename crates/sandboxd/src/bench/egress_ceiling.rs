//! What bounds the egress proxy's download (`sandboxd bench egress`), measured in the same run
//! as the proxy itself: the raw exec stream of the backend (one attached process, the very
//! call the proxy's channel is made of: `Sandbox::spawn`) in both directions, and the whole
//! proxy with its helper run as a process on the host (the same python file, no engine in
//! between), with the CPU each side used. The proxy's download cannot beat the exec stream
//! it rides on; the host run says what the proxy's own two ends cost.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio_util::codec::{BytesCodec, FramedRead};

use sandboxd_core::config::Limits;
use sandboxd_core::egress::EgressProxy;
use sandboxd_core::sandbox::exec_sandbox::{ExecBackend, ExecSandbox};
use sandboxd_core::sandbox::{AttachedProcess, OutputChunk, Sandbox, SandboxError, SpawnRequest};

use super::egress::{Bulk, NAME, on_host, proxy_deps};

/// The helper and its protocol module, as the image carries them.
const HELPER: &str = include_str!("../../../../images/sandbox/helpers/sandboxd_egress.py");
const PROTO: &str = include_str!("../../../../images/sandbox/helpers/sandboxd_proto.py");
/// The host run's proxy port (the sandbox's 3128 may be taken on a host by a real proxy).
const LOCAL_PORT: u16 = 13128;
/// The size of each write into the exec stream's stdin (the proxy's writer batches as much).
const WRITE: usize = 256 * 1024;

/// MiB/s through one attached exec, each way.
#[derive(Debug, Clone, Copy)]
pub struct ExecStream {
    /// Into the process's stdin (`cat >/dev/null`): the direction of a download.
    pub into_mib_s: f64,
    /// Out of its stdout (`head -c N /dev/zero`): the direction of an upload.
    pub out_mib_s: f64,
}

/// One download through the proxy whose helper runs on the host.
#[derive(Debug, Clone, Copy)]
pub struct HostRun {
    pub mib_s: f64,
    /// CPU seconds of the helper (python) for the download.
    pub helper_cpu_s: f64,
    /// CPU seconds of this process: the proxy's host side and the local server.
    pub host_cpu_s: f64,
}

/// `mib` MiB into and out of one attached process of `sandbox`.
pub async fn exec_stream(sandbox: &Arc<dyn Sandbox>, mib: usize) -> Result<ExecStream, String> {
    let total = mib << 20;
    let argv = ["head", "-c", &total.to_string(), "/dev/zero"];
    let mut p = sandbox
        .spawn(SpawnRequest::new(argv))
        .await
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    let got = drain(&mut p).await?;
    let out_mib_s = rate(got, t);
    if got < total as u64 {
        return Err(format!(
            "the exec stream carried {got} of {total} bytes out"
        ));
    }
    let mut p = sandbox
        .spawn(SpawnRequest::new(["sh", "-c", "cat >/dev/null"]))
        .await
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    let zeros = vec![0u8; WRITE];
    let mut left = total;
    while left > 0 {
        let n = left.min(WRITE);
        p.stdin
            .write_all(&zeros[..n])
            .await
            .map_err(|e| format!("writing into the exec stream: {e}"))?;
        left -= n;
    }
    p.stdin.shutdown().await.map_err(|e| e.to_string())?;
    drain(&mut p).await?;
    Ok(ExecStream {
        into_mib_s: rate(total as u64, t),
        out_mib_s,
    })
}

/// Stdout bytes until the process's output ends.
async fn drain(p: &mut AttachedProcess) -> Result<u64, String> {
    let mut got = 0u64;
    while let Some(chunk) = p.output.next().await {
        if let OutputChunk::Stdout(b) = chunk.map_err(|e| e.to_string())? {
            got += b.len() as u64;
        }
    }
    Ok(got)
}

fn rate(bytes: u64, since: Instant) -> f64 {
    (bytes as f64 / f64::from(1u32 << 20)) / since.elapsed().as_secs_f64().max(1e-9)
}

/// One `mib` MiB download from the server on `port` through a proxy whose helper runs on this
/// host; `script` is the bench client (a file on the host).
pub(crate) async fn host_run(port: u16, mib: usize, script: &str) -> Result<HostRun, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let helper = dir.path().join("sandboxd_egress.py");
    std::fs::write(&helper, HELPER).map_err(|e| e.to_string())?;
    std::fs::write(dir.path().join("sandboxd_proto.py"), PROTO).map_err(|e| e.to_string())?;
    let pid = Arc::new(Mutex::new(None));
    let sandbox: Arc<dyn Sandbox> = Arc::new(ExecSandbox::new(
        HostExec { pid: pid.clone() },
        "bench-host".into(),
        Limits::default(),
    ));
    let argv = vec![
        "python3".to_string(),
        "-I".to_string(),
        helper.to_string_lossy().to_string(),
        "--port".to_string(),
        LOCAL_PORT.to_string(),
        "--max".to_string(),
        "96".to_string(),
    ];
    let deps = proxy_deps(NAME, port, 1, mib)?;
    let proxy = EgressProxy::start_command(sandbox, deps, argv)
        .await
        .map_err(|e| e.to_string())?;
    let helper_pid = pid.lock().map_err(|_| "poisoned")?.unwrap_or(0);
    let (helper0, host0) = (cpu_secs(helper_pid), cpu_secs(std::process::id()));
    let args: Vec<String> = ["bulk", NAME, &port.to_string(), "/big", "1", "1"]
        .iter()
        .map(|s| s.to_string())
        .chain([LOCAL_PORT.to_string()])
        .collect();
    let script = script.to_string();
    let bulk = tokio::task::spawn_blocking(move || on_host::<Bulk>(&script, &args))
        .await
        .map_err(|e| e.to_string())??;
    let (helper1, host1) = (cpu_secs(helper_pid), cpu_secs(std::process::id()));
    proxy.stop().await;
    if bulk.bytes < (mib as u64) << 20 {
        return Err(format!("the host run got {} bytes", bulk.bytes));
    }
    Ok(HostRun {
        mib_s: bulk.mib_s(),
        helper_cpu_s: helper1 - helper0,
        host_cpu_s: host1 - host0,
    })
}

/// User and system CPU seconds of a process so far (0 when it cannot be read).
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command's closing parenthesis; utime and stime are 14th and 15th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // The kernel's USER_HZ, 100 on every Linux this runs on.
    (ticks(11) + ticks(12)) / 100.0
}

/// An exec backend that runs processes on this host: the proxy without an engine.
struct HostExec {
    /// The last process started (the helper), for its CPU time.
    pid: Arc<Mutex<Option<u32>>>,
}

#[async_trait]
impl ExecBackend for HostExec {
    async fn spawn(
        &self,
        req: &SpawnRequest,
        _attach_stdin: bool,
    ) -> Result<AttachedProcess, SandboxError> {
        let failed = |e: std::io::Error| SandboxError::Backend {
            backend: "host",
            operation: "start a process".into(),
            message: e.to_string(),
        };
        let (program, args) = req.argv.split_first().ok_or_else(|| {
            failed(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no argv",
            ))
        })?;
        let mut child = Command::new(program)
            .args(args)
            .envs(req.env.iter().cloned())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            // Not killed when dropped: the proxy keeps only the pipes once the helper said
            // hello; the helper exits when the proxy closes its stdin.
            .spawn()
            .map_err(failed)?;
        if let Ok(mut pid) = self.pid.lock() {
            *pid = child.id();
        }
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(failed(std::io::Error::other("no pipes")));
        };
        let out = FramedRead::new(stdout, BytesCodec::new())
            .map(|b| Ok(OutputChunk::Stdout(b.map_err(io_err)?.freeze())));
        let err = FramedRead::new(stderr, BytesCodec::new())
            .map(|b| Ok(OutputChunk::Stderr(b.map_err(io_err)?.freeze())));
        Ok(AttachedProcess {
            stdin: Box::pin(stdin),
            output: futures::stream::select(out, err).boxed(),
            exit_code: Box::new(move || {
                Box::pin(async move {
                    child
                        .wait()
                        .await
                        .ok()
                        .and_then(|s| s.code())
                        .map(i64::from)
                })
            }),
        })
    }

    async fn is_alive(&self) -> bool {
        true
    }
}

fn io_err(e: std::io::Error) -> SandboxError {
    SandboxError::Backend {
        backend: "host",
        operation: "read process output".into(),
        message: e.to_string(),
    }
}
