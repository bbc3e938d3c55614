//! Chromium inside the session's container, and the chromiumoxide connection to it.
//!
//! Chromium runs as the sandbox user through `Sandbox::spawn` of sandboxd_detach.py, which
//! starts it in a session of its own and keeps draining its stderr after the host process is
//! gone, so Chromium of a kept session outlives the sandboxd process that started it. Remote
//! debugging is bound to the container's own 127.0.0.1 on a port the host picks at random
//! (tried again on another port when something of the sandbox holds it). The endpoint is
//! learnt from Chromium's own announcement (read by stderr_log.rs), "DevTools listening on
//! ws://127.0.0.1:<port>/devtools/browser/<id>", on the stderr of the exec the host started
//! (its port must be the one the host chose) — never from DevToolsActivePort, a file in /tmp
//! that sandboxed code can write first and point at a server of its own. We open a
//! one-connection websocket `Tunnel` to the port and hand chromiumoxide a ws:// URL on the
//! host side.
//!
//! The host records the endpoint (port and browser path) on the host (`Endpoint`, saved by
//! `BrowserUse` in a kept session), and a later process `adopt`s the running Chromium from
//! that record through the same guarded tunnel.
//!
//! Chromium itself runs as the sandbox user, so a hostile sandbox can still take it over (or
//! write into its stderr through /proc): the endpoint is defence in depth, not the guarantee.
//! The guarantee is the tunnel's `WsGuard`, which cuts any frame or message over
//! `DEVTOOLS_LIMITS` before chromiumoxide (which disables tungstenite's limits) buffers it.
//!
//! `--proxy-server`: the session's egress proxy on the sandbox's loopback (see net.rs); the
//! container has no network device, so nothing else could leave anyway.
//!
//! `--no-sandbox`: Chromium's own sandbox needs user namespaces or a setuid helper, which the
//! hardened container denies (no capabilities, no-new-privileges, Docker's seccomp profile).
//! The container IS the sandbox here: the browser has no network, a read-only root, no
//! capabilities, and runs as uid 1000 under the session's pids/memory/cpu limits, so a
//! compromised renderer gains nothing the model's own bash does not already have.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chromiumoxide::Browser;
use chromiumoxide::error::CdpError;
use chromiumoxide::handler::HandlerConfig;
use chromiumoxide::handler::viewport::Viewport;
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::stderr_log::{self, Announced, StderrWatch, parse_announcement};
use crate::egress::{PROXY_HOST, PROXY_PORT};
use crate::sandbox::tunnel::Tunnel;
use crate::sandbox::ws_guard::DEVTOOLS_LIMITS;
use crate::sandbox::{Sandbox, SandboxError, SpawnRequest, helpers};

/// The viewport every page is emulated at; screenshots and "pixels below" refer to it.
pub const VIEWPORT_WIDTH: u32 = 1280;
pub const VIEWPORT_HEIGHT: u32 = 720;

/// How long Chromium gets to announce its DevTools endpoint.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// What went wrong with the browser itself (not with what the model asked of it).
#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    #[error("Chromium did not start inside the sandbox: {0}")]
    Start(String),
    #[error("Chromium stopped (it crashed or was killed)")]
    Died,
    #[error("the browser did not answer within {0:?}")]
    Timeout(Duration),
    #[error("browser protocol error: {0}")]
    Cdp(String),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

impl From<CdpError> for BrowserError {
    fn from(e: CdpError) -> Self {
        BrowserError::Cdp(e.to_string())
    }
}

/// Where a running Chromium listens, as the host chose and recorded it: what a later
/// process needs to adopt it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Endpoint {
    /// The tool's browser number (its tag and profile directory are made from it).
    pub n: u32,
    pub port: u16,
    /// `/devtools/browser/<id>`, from Chromium's announcement.
    pub ws_path: String,
}

impl Endpoint {
    /// Only what `start` itself could have recorded: a real port and an announced path.
    pub fn is_plausible(&self) -> bool {
        self.port >= PORT_RANGE.0
            && parse_announcement(&format!(
                "DevTools listening on ws://127.0.0.1:{}{}",
                self.port, self.ws_path
            ))
            .is_some()
    }
}

/// The ports the host picks the DevTools port from.
const PORT_RANGE: (u16, u16) = (20000, 60000);
/// Tries at a port before giving up (something of the sandbox may listen on one).
const PORT_TRIES: usize = 3;

/// One running Chromium and the driver connected to it. Dropping it stops the driver and
/// the tunnel; `shutdown` also kills the processes inside the container.
pub struct Running {
    pub browser: Browser,
    /// Cancelled when Chromium exits or the tunnel closes: every wait on the browser races it.
    pub dead: CancellationToken,
    pub sandbox: Arc<dyn Sandbox>,
    pub tag: String,
    pub endpoint: Endpoint,
    user_data_dir: String,
    handler: JoinHandle<()>,
    /// Reads Chromium's stderr (dropping it stops the reader); None for a Chromium adopted
    /// from an earlier process.
    _drain: Option<AbortOnDropHandle<()>>,
    _tunnel: Tunnel,
}

impl Running {
    pub fn is_dead(&self) -> bool {
        self.dead.is_cancelled()
    }

    /// Why the host cut the DevTools connection (a frame or message over the caps), if it did.
    pub fn cut_reason(&self) -> Option<String> {
        self._tunnel.refusal()
    }

    /// The note for the model when this browser is found dead and replaced.
    pub fn restart_note(&self) -> String {
        match self.cut_reason() {
            Some(why) => format!(
                "sandboxd cut the connection to Chromium ({why}) and restarted it: tabs and page state were lost"
            ),
            None => "Chromium had stopped (it crashed or was killed) and was restarted: tabs and page state were lost".into(),
        }
    }

    /// Kills Chromium and its relay inside the container and frees its profile in /tmp.
    pub async fn shutdown(self) {
        let sandbox = self.sandbox.clone();
        let tag = self.tag.clone();
        let user_data_dir = self.user_data_dir.clone();
        drop(self);
        let _ = sandbox.kill_tagged(&tag).await;
        let _ = sandbox.remove(&user_data_dir, true).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.dead.cancel();
        self.handler.abort();
    }
}

/// The command line. Flags beyond the required ones keep Chromium from reaching for things the
/// container does not have (network services, a GPU, a writable home) and make screenshots
/// deterministic (sRGB colours, no scrollbars). `extra` (the session's egress flags) goes
/// before the first page.
pub fn chromium_argv(user_data_dir: &str, port: u16, extra: &[String]) -> Vec<String> {
    let mut argv: Vec<String> = vec![
        "chromium".into(),
        "--headless=new".into(),
        "--no-sandbox".into(),
        "--disable-dev-shm-usage".into(),
        format!("--user-data-dir={user_data_dir}"),
        format!("--disk-cache-dir={user_data_dir}/cache"),
        "--remote-debugging-address=127.0.0.1".into(),
        format!("--remote-debugging-port={port}"),
        format!("--window-size={VIEWPORT_WIDTH},{VIEWPORT_HEIGHT}"),
        // Everything that leaves the sandbox goes through the session's egress proxy, which
        // decides every connection; with egress off nothing listens there (or it refuses),
        // so pages of other hosts fail. Chromium never proxies loopback: the sandbox's own
        // servers stay direct.
        format!("--proxy-server=http://{PROXY_HOST}:{PROXY_PORT}"),
    ];
    argv.extend(extra.iter().cloned());
    for flag in [
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-breakpad",
        "--disable-crash-reporter",
        "--disable-domain-reliability",
        "--disable-client-side-phishing-detection",
        "--disable-features=Translate,MediaRouter,OptimizationHints,DialMediaRouteProvider",
        "--password-store=basic",
        "--use-mock-keychain",
        "--mute-audio",
        "--hide-scrollbars",
        "--force-color-profile=srgb",
        "--metrics-recording-only",
        "about:blank",
    ] {
        argv.push(flag.into());
    }
    argv
}

fn tag_of(sandbox: &dyn Sandbox, n: u32) -> String {
    format!("sandboxd-browser-{}-{n}", sandbox.session_id())
}

fn profile_of(n: u32) -> String {
    format!("/tmp/chromium-{n}")
}

/// A DevTools port the host picks: random, so nothing of the sandbox can be waiting on it.
fn pick_port() -> u16 {
    use rand::Rng;
    rand::rng().random_range(PORT_RANGE.0..PORT_RANGE.1)
}

/// Why one try at starting failed.
enum Attempt {
    /// The port was taken: try another.
    PortTaken,
    Failed(BrowserError),
}

/// Starts Chromium number `n` of this tool and connects the driver to it.
pub async fn start(
    sandbox: Arc<dyn Sandbox>,
    n: u32,
    extra: &[String],
) -> Result<Running, BrowserError> {
    for _ in 0..PORT_TRIES {
        match start_on(sandbox.clone(), n, pick_port(), extra).await {
            Ok(running) => return Ok(running),
            Err(Attempt::PortTaken) => continue,
            Err(Attempt::Failed(e)) => return Err(e),
        }
    }
    Err(BrowserError::Start(format!(
        "Chromium could not bind a DevTools port in {PORT_TRIES} tries (something in the sandbox listens on them)"
    )))
}

/// Connects to the Chromium an earlier process started and recorded as `endpoint`.
pub async fn adopt(
    sandbox: Arc<dyn Sandbox>,
    endpoint: &Endpoint,
) -> Result<Running, BrowserError> {
    if !endpoint.is_plausible() {
        return Err(BrowserError::Start(
            "the recorded DevTools endpoint is malformed".into(),
        ));
    }
    let tag = tag_of(&*sandbox, endpoint.n);
    let dead = CancellationToken::new();
    let (browser, handler, tunnel) = connect(
        sandbox.clone(),
        endpoint.port,
        &endpoint.ws_path,
        &tag,
        dead.clone(),
    )
    .await?;
    Ok(Running {
        browser,
        dead,
        sandbox,
        tag,
        endpoint: endpoint.clone(),
        user_data_dir: profile_of(endpoint.n),
        handler,
        _drain: None,
        _tunnel: tunnel,
    })
}

async fn start_on(
    sandbox: Arc<dyn Sandbox>,
    n: u32,
    port: u16,
    extra: &[String],
) -> Result<Running, Attempt> {
    let failed = |e: BrowserError| Attempt::Failed(e);
    let started = Instant::now();
    let tag = tag_of(&*sandbox, n);
    let user_data_dir = profile_of(n);
    // Caches and config go under the profile, not into /workspace (HOME), where the model
    // would find them among its files.
    // A profile left by an earlier Chromium (same number after a tool restart) would hold a
    // stale DevToolsActivePort and a SingletonLock.
    match sandbox.remove(&user_data_dir, true).await {
        Ok(()) | Err(SandboxError::NotFound { .. }) => {}
        Err(e) => return Err(failed(e.into())),
    }
    let req = chromium_request(&user_data_dir, port, &tag, extra);
    let process = sandbox.spawn(req).await.map_err(|e| failed(e.into()))?;
    let dead = CancellationToken::new();
    let StderrWatch {
        mut announced,
        log,
        drain,
    } = stderr_log::watch(process, dead.clone());
    // A start dropped half-way (its caller's watch found the sandbox gone, where the stream
    // never ends) must not leave the reader running.
    let drain = AbortOnDropHandle::new(drain);
    let fail = |why: String| start_failed(&log, why);
    let deadline = tokio::time::Instant::from_std(started + START_TIMEOUT);
    let found = tokio::select! {
        r = announced.wait_for(|a| a.is_some()) => r.ok().and_then(|a| a.clone()),
        _ = dead.cancelled() => {
            drain.abort();
            return Err(fail("Chromium exited during start".into()));
        }
        _ = tokio::time::sleep_until(deadline) => None,
    };
    let (got_port, ws_path) = match found {
        Some(Announced::Endpoint(p, path)) if p == port => (p, path),
        other => {
            drain.abort();
            let _ = sandbox.kill_tagged(&tag).await;
            return Err(match other {
                Some(Announced::PortTaken) => Attempt::PortTaken,
                Some(Announced::Endpoint(p, _)) => fail(format!(
                    "Chromium announced DevTools on port {p}, not on the port {port} sandboxd chose"
                )),
                None => fail(format!("no DevTools endpoint after {START_TIMEOUT:?}")),
            });
        }
    };
    tracing::debug!(elapsed = ?started.elapsed(), "chromium: DevTools endpoint is up");
    let connected = connect(sandbox.clone(), got_port, &ws_path, &tag, dead.clone()).await;
    match connected {
        Ok((browser, handler, tunnel)) => Ok(Running {
            browser,
            dead,
            sandbox,
            tag,
            endpoint: Endpoint {
                n,
                port: got_port,
                ws_path,
            },
            user_data_dir,
            handler,
            _drain: Some(drain),
            _tunnel: tunnel,
        }),
        Err(e) => {
            drain.abort();
            let _ = sandbox.kill_tagged(&tag).await;
            Err(failed(e))
        }
    }
}

/// A failed start, with the last lines Chromium printed when it printed any.
fn start_failed(log: &Mutex<String>, why: String) -> Attempt {
    let tail = stderr_log::tail(log, 12);
    Attempt::Failed(BrowserError::Start(if tail.is_empty() {
        why
    } else {
        format!("{why}; Chromium said:\n{tail}")
    }))
}

/// Chromium on `port` with its profile in `user_data_dir`, detached so it outlives the exec,
/// tagged for kill_tagged.
fn chromium_request(user_data_dir: &str, port: u16, tag: &str, extra: &[String]) -> SpawnRequest {
    let mut req = SpawnRequest::new(helpers::argv(
        "sandboxd_detach.py",
        &chromium_argv(user_data_dir, port, extra)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    ));
    for (k, v) in helpers::env() {
        req = req.env(k, v);
    }
    req.env("SANDBOXD_TAG", tag)
        .env("XDG_CONFIG_HOME", format!("{user_data_dir}/xdg-config"))
        .env("XDG_CACHE_HOME", format!("{user_data_dir}/xdg-cache"))
        .cwd("/tmp")
}

async fn connect(
    sandbox: Arc<dyn Sandbox>,
    port: u16,
    ws_path: &str,
    tag: &str,
    dead: CancellationToken,
) -> Result<(Browser, JoinHandle<()>, Tunnel), BrowserError> {
    let tunnel = Tunnel::open_websocket(sandbox, port, tag, DEVTOOLS_LIMITS).await?;
    let url = format!("ws://{}{}", tunnel.addr(), ws_path);
    let config = HandlerConfig {
        viewport: Some(Viewport {
            width: VIEWPORT_WIDTH,
            height: VIEWPORT_HEIGHT,
            device_scale_factor: Some(1.0),
            ..Viewport::default()
        }),
        ..HandlerConfig::default()
    };
    let (browser, mut handler) = tokio::time::timeout(
        Duration::from_secs(10),
        Browser::connect_with_config(url, config),
    )
    .await
    .map_err(|_| BrowserError::Start("the DevTools websocket did not open".into()))?
    .map_err(|e| BrowserError::Start(format!("cannot open the DevTools websocket: {e}")))?;
    // The handler must be polled for anything to happen. Messages it cannot parse (newer CDP
    // events) come back as errors and are skipped; only a broken websocket ends the loop.
    // chromiumoxide never ends the stream when the socket closes, so the tunnel's end
    // is what marks the browser dead.
    let closed = tunnel.closed_token();
    let handler = tokio::spawn(async move {
        let _on_end = dead.clone().drop_guard();
        loop {
            tokio::select! {
                ev = handler.next() => match ev {
                    None => break,
                    Some(Err(CdpError::Ws(e))) => {
                        tracing::debug!(error = %e, "browser websocket closed");
                        break;
                    }
                    Some(Err(e)) => tracing::debug!(error = %e, "browser handler"),
                    Some(Ok(())) => {}
                },
                _ = closed.cancelled() => break,
                _ = dead.cancelled() => break,
            }
        }
    });
    Ok((browser, handler, tunnel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_egress_flags_come_before_the_first_page() {
        let pin = "--ignore-certificate-errors-spki-list=abc=".to_string();
        let argv = chromium_argv("/tmp/chromium-3", 40000, std::slice::from_ref(&pin));
        let at = argv.iter().position(|a| *a == pin).unwrap();
        let page = argv.iter().position(|a| a == "about:blank").unwrap();
        assert!(at < page, "{argv:?}");
    }

    #[test]
    fn required_flags_are_there() {
        let argv = chromium_argv("/tmp/chromium-3", 40000, &[]);
        for flag in [
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--remote-debugging-address=127.0.0.1",
        ] {
            assert!(argv.iter().any(|a| a == flag), "{flag}");
        }
        assert!(argv.contains(&"--user-data-dir=/tmp/chromium-3".to_string()));
        assert!(argv.contains(&"--remote-debugging-port=40000".to_string()));
        for port in 0..5 {
            let p = pick_port();
            assert!((PORT_RANGE.0..PORT_RANGE.1).contains(&p), "{port}: {p}");
        }
    }
}
