//! Tunnel: one TCP connection from the host into a port on the sandbox's own loopback.
//!
//! The container has no network, so the host cannot dial into it. Instead a host listener on
//! 127.0.0.1:<ephemeral> accepts exactly ONE connection and bridges it to an exec-attached
//! `socat STDIO TCP:127.0.0.1:<port>` inside the container. A loopback listener is reachable
//! by every local process, so the listener is closed right after the first accept and, on
//! Linux, the accepted connection must come from a socket this very process owns; anything
//! else is dropped and the tunnel fails. The tunnel uses only the `Sandbox` trait, so it
//! works for any backend.
//!
//! `open_websocket` also runs both directions through a `WsGuard`: the far end runs as the
//! sandbox user, so its frames are hostile, and a frame or message over the caps cuts the
//! connection before the host client buffers it (see ws_guard.rs).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ws_guard::{WsGuard, WsLimits};
use super::{OutputChunk, Sandbox, SandboxError, SpawnRequest};

/// How long the listener waits for the one connection it exists for.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);

/// A host address that leads to `127.0.0.1:<port>` inside one sandbox, for one connection.
/// Dropping it tears the bridge down (the in-container socat sees EOF and exits).
pub struct Tunnel {
    addr: SocketAddr,
    task: JoinHandle<()>,
    closed: CancellationToken,
    /// Why the guard cut the connection, if it did.
    refused: Arc<Mutex<Option<String>>>,
}

impl Tunnel {
    /// Opens the host listener and starts the in-container relay. `tag` is put into the
    /// relay's environment as SANDBOXD_TAG so `Sandbox::kill_tagged` can clean it up.
    pub async fn open(
        sandbox: Arc<dyn Sandbox>,
        port: u16,
        tag: &str,
    ) -> Result<Tunnel, SandboxError> {
        Self::start(sandbox, port, tag, None).await
    }

    /// Like `open`, for a websocket: every frame and message in either direction is checked
    /// against `limits`, and the first violation closes the tunnel (see `refusal`).
    pub async fn open_websocket(
        sandbox: Arc<dyn Sandbox>,
        port: u16,
        tag: &str,
        limits: WsLimits,
    ) -> Result<Tunnel, SandboxError> {
        Self::start(sandbox, port, tag, Some(limits)).await
    }

    async fn start(
        sandbox: Arc<dyn Sandbox>,
        port: u16,
        tag: &str,
        limits: Option<WsLimits>,
    ) -> Result<Tunnel, SandboxError> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| io_err("bind a host loopback listener", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| io_err("read the listener address", e))?;
        let process = sandbox
            .spawn(
                SpawnRequest::new(["socat", "STDIO", &format!("TCP:127.0.0.1:{port}")])
                    .env("SANDBOXD_TAG", tag),
            )
            .await?;
        let closed = CancellationToken::new();
        let on_end = closed.clone().drop_guard();
        let refused = Arc::new(Mutex::new(None));
        let refusal = refused.clone();
        let task = tokio::spawn(async move {
            // Cancelled however the task ends: finished, failed or aborted.
            let _on_end = on_end;
            let accepted = tokio::time::timeout(ACCEPT_TIMEOUT, listener.accept()).await;
            // One connection only: the listener goes away before a single byte is relayed.
            drop(listener);
            let stream = match accepted {
                Ok(Ok((stream, peer))) => {
                    if !peer_is_own_socket(peer, addr) {
                        tracing::warn!(%peer, "tunnel: a connection from another process was refused");
                        return;
                    }
                    stream
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "tunnel: accept failed");
                    return;
                }
                Err(_) => return,
            };
            let guards =
                limits.map(|l| (WsGuard::client_to_server(l), WsGuard::server_to_client(l)));
            bridge(stream, process, guards, &refusal).await;
        });
        Ok(Tunnel {
            addr,
            task,
            closed,
            refused,
        })
    }

    /// Where the one connection must go.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the bridge is over (the connection closed, or nobody came).
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// A token cancelled when the bridge is over, for callers that must stop waiting then.
    pub fn closed_token(&self) -> CancellationToken {
        self.closed.clone()
    }

    /// Why the websocket guard cut the connection, if it did.
    pub fn refusal(&self) -> Option<String> {
        self.refused.lock().ok().and_then(|r| r.clone())
    }

    /// A handle that reads the refusal later, after the tunnel itself is gone.
    pub fn refusal_slot(&self) -> Arc<Mutex<Option<String>>> {
        self.refused.clone()
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies bytes both ways until either side closes. With guards (client → server,
/// server → client), every chunk is checked before it is forwarded; a violation ends the
/// bridge, its reason stored in `refused` before either side is closed (so whoever sees the
/// close can already read why).
async fn bridge(
    stream: TcpStream,
    process: super::AttachedProcess,
    guards: Option<(WsGuard, WsGuard)>,
    refused: &Mutex<Option<String>>,
) {
    let refuse = |why: String| {
        tracing::warn!(%why, "tunnel: the connection was cut");
        if let Ok(mut slot) = refused.lock() {
            *slot = Some(why);
        }
    };
    let _ = stream.set_nodelay(true);
    let (mut tcp_read, mut tcp_write) = stream.into_split();
    let mut stdin = process.stdin;
    let mut output = process.output;
    let (mut up_guard, mut down_guard) = match guards {
        Some((up, down)) => (Some(up), Some(down)),
        None => (None, None),
    };
    let upstream = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match tcp_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Some(guard) = up_guard.as_mut()
                        && let Err(v) = guard.check(&buf[..n])
                    {
                        break refuse(v.to_string());
                    }
                    if stdin.write_all(&buf[..n]).await.is_err() || stdin.flush().await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = stdin.shutdown().await;
    };
    let downstream = async {
        loop {
            match output.next().await {
                Some(Ok(OutputChunk::Stdout(bytes))) => {
                    if let Some(guard) = down_guard.as_mut()
                        && let Err(v) = guard.check(&bytes)
                    {
                        break refuse(v.to_string());
                    }
                    if tcp_write.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                Some(Ok(OutputChunk::Stderr(bytes))) => {
                    // Capped: the relay's stderr is the sandbox's to fill.
                    let shown: String = String::from_utf8_lossy(&bytes).chars().take(300).collect();
                    tracing::debug!(stderr = %shown, "tunnel relay");
                }
                Some(Err(_)) | None => break,
            }
        }
        let _ = tcp_write.shutdown().await;
    };
    // Either side ending ends the tunnel: a half-open CDP connection is of no use.
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}

fn io_err(what: &str, e: std::io::Error) -> SandboxError {
    SandboxError::InvalidRequest(format!("tunnel: cannot {what}: {e}"))
}

/// True when the connecting socket (`peer` → `listener`) is one of this process's own fds.
/// /proc/net/tcp maps the connection to a socket inode; /proc/self/fd says whether we hold it.
#[cfg(target_os = "linux")]
fn peer_is_own_socket(peer: SocketAddr, listener: SocketAddr) -> bool {
    let (table, local, remote) = match (peer, listener) {
        (SocketAddr::V4(p), SocketAddr::V4(l)) => ("/proc/self/net/tcp", hex_v4(p), hex_v4(l)),
        _ => return false,
    };
    let Ok(text) = std::fs::read_to_string(table) else {
        return false;
    };
    let inode = text.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        (cols.len() > 9 && cols[1] == local && cols[2] == remote).then(|| cols[9].to_string())
    });
    let Some(inode) = inode else {
        return false;
    };
    let wanted = format!("socket:[{inode}]");
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == wanted.as_str())
    })
}

/// Other systems have no cheap way to tell; the accept-once listener is the only guard there.
#[cfg(not(target_os = "linux"))]
fn peer_is_own_socket(_peer: SocketAddr, _listener: SocketAddr) -> bool {
    true
}

/// The `0100007F:1F90` form /proc/net/tcp uses: the address in host byte order, then the port.
#[cfg(target_os = "linux")]
fn hex_v4(addr: std::net::SocketAddrV4) -> String {
    let ip = u32::from_ne_bytes(addr.ip().octets());
    format!("{ip:08X}:{:04X}", addr.port())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn own_sockets_are_recognised() {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (_server, peer) = listener.accept().await.unwrap();
        assert!(peer_is_own_socket(peer, addr));
        drop(client);
        // A port pair that no socket of ours has.
        let stranger: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(!peer_is_own_socket(stranger, addr));
    }
}
