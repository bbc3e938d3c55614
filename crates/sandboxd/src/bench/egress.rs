//! The egress benchmark for `sandboxd bench egress`: what a session's proxy adds to a
//! connection. One small python client (the same file) runs twice against one local server in
//! the same run: inside the sandbox through its proxy (127.0.0.1:3128 → the exec channel →
//! the host's checks → the server), and on the host straight to the server. Measured: time to
//! the first byte of a 1 KiB answer (a new connection each time, as a browser's first request
//! to a host) and the throughput of one large download. The server is on the host's loopback,
//! opened to the proxy by a bench-only `[research] allow` and a name only the bench resolves.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use sandboxd_core::config::EgressConfig;
use sandboxd_core::egress::{EgressDeps, EgressPolicy, EgressProxy, FixedPolicy, LogOnly};
use sandboxd_core::research::ResearchConfig;
use sandboxd_core::research::resolver::StaticResolver;
use sandboxd_core::research::ssrf::Policy;
use sandboxd_core::sandbox::{Sandbox, ShellOptions};

use super::egress_ceiling::{ExecStream, HostRun, exec_stream, host_run};

/// The name the sandbox asks the proxy for; only the bench's resolver knows it.
pub(crate) const NAME: &str = "egress-bench.test";
/// Where the client script goes in the sandbox (/tmp is writable there).
const SCRIPT: &str = "/tmp/sandboxd-egress-bench.py";

/// The client: `ttfb HOST PORT PATH N PROXY` prints the N times to first byte (ms) as JSON;
/// `bulk …` prints the seconds one download took and its bytes. With PROXY=1 it connects to
/// the proxy and asks for an absolute URL, as any HTTP client configured with a proxy does;
/// an optional 7th argument is the proxy's port (3128 without it).
const CLIENT: &str = r#"
import json, socket, sys, time
mode, host, port, path, n, proxy = sys.argv[1:7]
port, n, proxy = int(port), int(n), proxy == "1"
proxy_port = int(sys.argv[7]) if len(sys.argv) > 7 else 3128
def request():
    if proxy:
        s = socket.create_connection(("127.0.0.1", proxy_port))
        s.sendall(f"GET http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    else:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    return s
def drain(s):
    total = 0
    while True:
        b = s.recv(1 << 16)
        if not b:
            return total
        total += len(b)
if mode == "ttfb":
    out = []
    for _ in range(n):
        t = time.perf_counter()
        s = request()
        first = s.recv(1)
        out.append((time.perf_counter() - t) * 1000)
        drain(s)
        s.close()
    print(json.dumps({"ms": out}))
else:
    t = time.perf_counter()
    s = request()
    got = drain(s)
    print(json.dumps({"secs": time.perf_counter() - t, "bytes": got}))
"#;

#[derive(Debug, Clone)]
pub struct EgressBench {
    /// Time to first byte of a 1 KiB answer through the proxy, from inside the sandbox.
    pub ttfb_proxy: Vec<Duration>,
    /// The same from the host, straight to the server.
    pub ttfb_direct: Vec<Duration>,
    /// MiB/s of one download through the proxy, and straight.
    pub mib_s_proxy: f64,
    pub mib_s_direct: f64,
    pub download_mib: usize,
    /// The raw exec stream the proxy rides on, `CEILING_MIB` each way.
    pub exec: ExecStream,
    /// The same download through the proxy with its helper on the host (no engine).
    pub host: HostRun,
}

/// MiB moved each way through the raw exec stream.
pub const CEILING_MIB: usize = 1024;

#[derive(Deserialize)]
struct Times {
    ms: Vec<f64>,
}

#[derive(Deserialize)]
pub(crate) struct Bulk {
    secs: f64,
    pub(crate) bytes: u64,
}

impl Bulk {
    pub(crate) fn mib_s(&self) -> f64 {
        (self.bytes as f64 / (1u64 << 20) as f64) / self.secs.max(1e-9)
    }
}

/// Measures `n` small requests and one `mib` MiB download each way.
pub async fn bench_egress(
    sandbox: Arc<dyn Sandbox>,
    n: usize,
    mib: usize,
) -> Result<EgressBench, String> {
    let (port, server) = serve(mib).await?;
    let proxy = start_proxy(sandbox.clone(), NAME, port, n, mib).await?;
    sandbox
        .write_file(SCRIPT, CLIENT.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let host_script = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
    std::fs::write(host_script.path(), CLIENT).map_err(|e| e.to_string())?;
    let host_script = host_script.path().to_string_lossy().to_string();

    let args = |mode: &str, path: &str, proxy: bool| {
        let p = if proxy { "1" } else { "0" };
        vec![
            mode.to_string(),
            NAME.to_string(),
            port.to_string(),
            path.to_string(),
            n.to_string(),
            p.to_string(),
        ]
    };
    let inside: Times = in_sandbox(&sandbox, &args("ttfb", "/small", true)).await?;
    let outside: Times = on_host(&host_script, &args("ttfb", "/small", false))?;
    let big_in: Bulk = in_sandbox(&sandbox, &args("bulk", "/big", true)).await?;
    let big_out: Bulk = on_host(&host_script, &args("bulk", "/big", false))?;
    proxy.stop().await;
    let host = host_run(port, mib, &host_script).await;
    let exec = exec_stream(&sandbox, CEILING_MIB).await;
    server.abort();
    let (host, exec) = (host?, exec?);
    let expected = (mib as u64) << 20;
    for (side, b) in [("through the proxy", &big_in), ("straight", &big_out)] {
        if b.bytes < expected {
            return Err(format!(
                "the download {side} got {} of {expected} bytes",
                b.bytes
            ));
        }
    }
    let ms = |v: Vec<f64>| {
        v.into_iter()
            .map(|m| Duration::from_secs_f64(m / 1e3))
            .collect()
    };
    Ok(EgressBench {
        ttfb_proxy: ms(inside.ms),
        ttfb_direct: ms(outside.ms),
        mib_s_proxy: big_in.mib_s(),
        mib_s_direct: big_out.mib_s(),
        download_mib: mib,
        exec,
        host,
    })
}

/// The session's proxy, its caps raised past what the bench moves (`n` requests, `mib` MiB),
/// its policy `name`, which only its resolver knows (as 127.0.0.1), on `port`.
pub(crate) async fn start_proxy(
    sandbox: Arc<dyn Sandbox>,
    name: &str,
    port: u16,
    n: usize,
    mib: usize,
) -> Result<EgressProxy, String> {
    EgressProxy::start(sandbox, proxy_deps(name, port, n, mib)?)
        .await
        .map_err(|e| e.to_string())
}

/// What `start_proxy` starts the proxy with.
pub(crate) fn proxy_deps(
    name: &str,
    port: u16,
    n: usize,
    mib: usize,
) -> Result<EgressDeps, String> {
    let mut research = ResearchConfig {
        allow: vec![name.into(), "127.0.0.1/32".into()],
        ..ResearchConfig::default()
    };
    research.ports.push(port);
    let local: IpAddr = [127, 0, 0, 1].into();
    let config = EgressConfig {
        connection_mb: (mib as u64) * 2 + 16,
        session_mb: (mib as u64) * 4 + 64,
        requests_per_minute: u32::try_from(n * 4 + 100).unwrap_or(u32::MAX),
        ..EgressConfig::default()
    };
    Ok(EgressDeps {
        config,
        ssrf: Arc::new(Policy::from_config(&research)?),
        resolver: Arc::new(StaticResolver(vec![(name.to_string(), vec![local])])),
        policy: Arc::new(FixedPolicy(EgressPolicy::parse(name)?)),
        audit: Arc::new(LogOnly),
        session: "bench".into(),
        owner: "bench".into(),
    })
}

async fn in_sandbox<T: for<'de> Deserialize<'de>>(
    sandbox: &Arc<dyn Sandbox>,
    args: &[String],
) -> Result<T, String> {
    let line = format!("python3 {SCRIPT} {}", args.join(" "));
    let opts = ShellOptions {
        timeout: Duration::from_secs(600),
        ..ShellOptions::default()
    };
    let out = sandbox
        .shell(&line, opts)
        .await
        .map_err(|e| e.to_string())?;
    parse(&out.stdout, &out.stderr)
}

pub(crate) fn on_host<T: for<'de> Deserialize<'de>>(
    script: &str,
    args: &[String],
) -> Result<T, String> {
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .map_err(|e| format!("python3 on the host: {e}"))?;
    parse(&out.stdout, &out.stderr)
}

fn parse<T: for<'de> Deserialize<'de>>(stdout: &[u8], stderr: &[u8]) -> Result<T, String> {
    serde_json::from_slice(stdout).map_err(|e| {
        format!(
            "the bench client said {:?} ({e}); stderr: {}",
            String::from_utf8_lossy(stdout),
            String::from_utf8_lossy(stderr)
        )
    })
}

/// `/small`: 1 KiB; `/big`: `mib` MiB. One request per connection.
async fn serve(mib: usize) -> Result<(u16, tokio::task::JoinHandle<()>), String> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let big = head.starts_with(b"GET /big");
                let total = if big { mib << 20 } else { 1024 };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {total}\r\nConnection: close\r\n\r\n"
                );
                if s.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; total.min(64 * 1024)];
                let mut left = total;
                while left > 0 {
                    let k = left.min(chunk.len());
                    if s.write_all(&chunk[..k]).await.is_err() {
                        return;
                    }
                    left -= k;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    Ok((port, task))
}
