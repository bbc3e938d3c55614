//! The egress benchmark's page load (issue 24's third number): a page with 30 sub-resources
//! in the in-sandbox Chromium, straight from a server on the sandbox's own loopback (which
//! Chromium never proxies) against the same page from the same server program on the host,
//! through the session's egress proxy. The server is python's `http.server` with HTTP/1.1
//! keep-alive and `Cache-Control: no-store` on both sides, so every load fetches all 31
//! files. The page measures itself: at its load event it puts the navigation's
//! `loadEventStart` (ms from the navigation's start, every sub-resource loaded) and the number
//! of resources it fetched into its title, which `go_to_url` reports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use sandboxd_core::egress::{EgressPolicy, FixedPolicy};
use sandboxd_core::sandbox::{Sandbox, ShellOptions};
use sandboxd_core::tools::browser::{BrowserUse, Egress};
use sandboxd_core::tools::{Tool, ToolContext};

/// The name the browser asks the proxy for; only the bench's resolver knows it.
const NAME: &str = "page-bench.test";
/// The sub-resources of the page: a third each stylesheets, deferred scripts, images.
pub const SUB_RESOURCES: usize = 30;
/// Where the page lives in the sandbox, and the port of its server there.
const DIR: &str = "/tmp/sandboxd-page-bench";
const INNER_PORT: u16 = 18_080;

/// The server, on either side: `server.py ROOT PORT` prints the port it listens on.
const SERVER: &str = r#"
import functools, http.server, sys
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        super().end_headers()
    def log_message(self, *args):
        pass
root, port = sys.argv[1], int(sys.argv[2])
s = http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(H, directory=root))
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// One side's loads.
#[derive(Debug, Clone, Default)]
pub struct PageLoads {
    /// Navigation start → load event, as the page measured it.
    pub in_page: Vec<Duration>,
    /// The whole `go_to_url` action (the load, then the page's state for the model).
    pub action: Vec<Duration>,
}

#[derive(Debug, Clone)]
pub struct PageBench {
    pub proxy: PageLoads,
    pub direct: PageLoads,
}

/// The page and its sub-resources: (relative path, content).
fn files() -> Vec<(String, Vec<u8>)> {
    let third = SUB_RESOURCES / 3;
    let mut head = String::from(
        "<!doctype html><html><head><meta charset=utf-8><title>loading</title><script>\
         addEventListener('load', () => { const n = performance.getEntriesByType('navigation')[0]; \
         document.title = 'loaded ' + n.loadEventStart.toFixed(2) + ' ' + \
         performance.getEntriesByType('resource').length; });</script>",
    );
    let mut body = String::from("<body><h1>A page of 30 sub-resources</h1>");
    let mut out = Vec::new();
    for k in 0..third {
        head.push_str(&format!("<link rel=stylesheet href='r/s{k}.css'>"));
        head.push_str(&format!("<script defer src='r/j{k}.js'></script>"));
        body.push_str(&format!("<img width=32 height=32 src='r/i{k}.svg'>"));
        let css = format!(".c{k} {{ color: #{k:02}{k:02}{k:02}; }}\n").repeat(64);
        let js = format!("window.v{k} = {k}; // {}\n", "x".repeat(120)).repeat(64);
        let svg = format!(
            "<svg xmlns='http://www.w3.org/2000/svg' width='32' height='32'><!-- {} --><rect width='32' height='32' fill='#{k:02}80{k:02}'/></svg>",
            "y".repeat(4000)
        );
        out.push((format!("r/s{k}.css"), css.into_bytes()));
        out.push((format!("r/j{k}.js"), js.into_bytes()));
        out.push((format!("r/i{k}.svg"), svg.into_bytes()));
    }
    body.push_str("</body></html>");
    out.push((
        "index.html".into(),
        format!("{head}</head>{body}").into_bytes(),
    ));
    out
}

/// `n` loads of the page each way, after one warm-up each (Chromium's start, the server's).
pub async fn bench_page_load(sandbox: Arc<dyn Sandbox>, n: usize) -> Result<PageBench, String> {
    let host_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    for (path, content) in files() {
        let on_host = host_dir.path().join(&path);
        if let Some(parent) = on_host.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::write(&on_host, &content).map_err(|e| e.to_string())?;
        sandbox
            .write_file(&format!("{DIR}/{path}"), &content)
            .await
            .map_err(|e| e.to_string())?;
    }
    std::fs::write(host_dir.path().join("server.py"), SERVER).map_err(|e| e.to_string())?;
    sandbox
        .write_file(&format!("{DIR}/server.py"), SERVER.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let (_host_server, port) = host_server(host_dir.path()).await?;
    start_inner_server(&sandbox).await?;
    let proxy = super::egress::start_proxy(sandbox.clone(), NAME, port, n * 40, 64).await?;
    let policy = EgressPolicy::parse(NAME)?;
    let tool = BrowserUse::new(sandbox.clone()).with_egress(Egress {
        source: Arc::new(FixedPolicy(policy.clone())),
        at_start: policy,
        chromium_args: Default::default(),
    });
    let outcome = async {
        let through = format!("http://{NAME}:{port}/index.html");
        let straight = format!("http://127.0.0.1:{INNER_PORT}/index.html");
        let mut bench = PageBench {
            proxy: PageLoads::default(),
            direct: PageLoads::default(),
        };
        for i in 0..=n {
            // Alternated, so the machine's load falls on both sides alike; load 0 warms up.
            let p = load(&tool, &format!("{through}?{i}")).await?;
            let d = load(&tool, &format!("{straight}?{i}")).await?;
            if i > 0 {
                for (side, (in_page, action)) in [(&mut bench.proxy, p), (&mut bench.direct, d)] {
                    side.in_page.push(in_page);
                    side.action.push(action);
                }
            }
        }
        Ok(bench)
    }
    .await;
    tool.shutdown().await;
    proxy.stop().await;
    let _ = sandbox
        .shell(
            &format!("pkill -f '{DIR}/server.py' ; rm -rf {DIR}"),
            ShellOptions::default(),
        )
        .await;
    outcome
}

/// One load: what the page measured, and how long the action took.
async fn load(tool: &BrowserUse, url: &str) -> Result<(Duration, Duration), String> {
    let started = Instant::now();
    let r = tool
        .execute(
            json!({"action": "go_to_url", "url": url}),
            &ToolContext::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let action = started.elapsed();
    if let Some(e) = r.error {
        return Err(format!("{url}: {e}"));
    }
    let title = r
        .output
        .lines()
        .find_map(|l| l.strip_prefix("Title: \"loaded "))
        .ok_or_else(|| format!("{url} did not finish loading: {}", r.output))?;
    let mut words = title.trim_end_matches('"').split(' ');
    let ms: f64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(-1.0);
    let count: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    if count != SUB_RESOURCES || ms < 0.0 {
        return Err(format!(
            "{url} loaded {count} sub-resources in {ms} ms (expected {SUB_RESOURCES})"
        ));
    }
    Ok((Duration::from_secs_f64(ms / 1e3), action))
}

/// The server on the host's loopback, killed when the child is dropped.
async fn host_server(root: &std::path::Path) -> Result<(tokio::process::Child, u16), String> {
    let mut child = tokio::process::Command::new("python3")
        .arg(root.join("server.py"))
        .arg(root)
        .arg("0")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("python3 on the host: {e}"))?;
    let stdout = child.stdout.take().ok_or("the server's stdout")?;
    let line = tokio::time::timeout(
        Duration::from_secs(30),
        BufReader::new(stdout).lines().next_line(),
    )
    .await
    .map_err(|_| "the host's page server did not start")?
    .map_err(|e| e.to_string())?
    .unwrap_or_default();
    let port = line
        .trim()
        .parse()
        .map_err(|_| format!("the host's page server said {line:?}"))?;
    Ok((child, port))
}

/// The server on the sandbox's loopback, in the background; returns once it answers.
async fn start_inner_server(sandbox: &Arc<dyn Sandbox>) -> Result<(), String> {
    let line = format!(
        "(python3 {DIR}/server.py {DIR} {INNER_PORT} > {DIR}/server.log 2>&1 &) ; \
         for i in $(seq 100); do curl -sf -o /dev/null http://127.0.0.1:{INNER_PORT}/index.html && exit 0; sleep 0.1; done; \
         cat {DIR}/server.log; exit 1"
    );
    let opts = ShellOptions {
        timeout: Duration::from_secs(60),
        ..ShellOptions::default()
    };
    let out = sandbox
        .shell(&line, opts)
        .await
        .map_err(|e| e.to_string())?;
    if out.exit_code != Some(0) {
        return Err(format!(
            "the sandbox's page server did not start: {}",
            out.stdout_lossy()
        ));
    }
    Ok(())
}
