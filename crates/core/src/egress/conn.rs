//! One connection through the proxy: read the head, decide, connect, relay, record.
//!
//! Every connection ends in exactly one `EgressRecord` (to the session's `EgressAudit`, and a
//! `tracing` event under `TRACE_TARGET`), whether it was refused, failed to connect, was cut
//! by a cap or ended normally. Bytes are counted as they are relayed, and the byte caps cut a
//! connection at the exact byte where it reaches one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::channel::{ConnCtl, ConnIo, Inbound};
use super::decide::{Refused, decide, refused};
use super::frame;
use super::http::{self, BadRequest, Request};
use super::idle::Idle;
use super::proxy::Shared;
use super::{EgressRecord, TRACE_TARGET};

/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one address may take to accept the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The interceptor's in-memory pipe holds `CHUNK * 4` bytes.
const CHUNK: usize = 16 * 1024;

/// What the record will say, filled in as the connection goes.
#[derive(Default)]
struct Tally {
    method: String,
    host: String,
    port: u16,
    allowed: bool,
    rule: String,
    reason: Option<String>,
    up: AtomicU64,
    down: AtomicU64,
}

/// Serves one connection to its end and records it.
pub(crate) async fn serve(shared: Arc<Shared>, mut io: ConnIo) {
    let started = Instant::now();
    let started_ms = chrono::Utc::now().timestamp_millis();
    shared.total.fetch_add(1, Ordering::AcqRel);
    let open = shared.open.fetch_add(1, Ordering::AcqRel) + 1;
    let over_cap = open > u64::from(shared.deps.config.connections);
    let mut tally = Tally::default();
    let finished = tokio::select! {
        _ = run(&shared, &mut io, over_cap, &mut tally) => true,
        _ = shared.stop.cancelled() => false,
    };
    if !finished {
        tally
            .reason
            .get_or_insert_with(|| "the proxy stopped".into());
    }
    drop(io);
    shared.open.fetch_sub(1, Ordering::AcqRel);
    record(&shared, tally, started_ms, started.elapsed()).await;
}

/// A connection the helper refused itself, at its `--max`.
pub(crate) async fn refused_by_helper(shared: &Shared) {
    shared.total.fetch_add(1, Ordering::AcqRel);
    let tally = Tally {
        rule: "connections".into(),
        reason: Some(over_cap_reason(shared)),
        ..Tally::default()
    };
    record(
        shared,
        tally,
        chrono::Utc::now().timestamp_millis(),
        Duration::ZERO,
    )
    .await;
}

fn over_cap_reason(shared: &Shared) -> String {
    format!(
        "this session may hold {} connections open at once through its proxy ([egress] connections)",
        shared.deps.config.connections
    )
}

async fn run(shared: &Shared, io: &mut ConnIo, over_cap: bool, tally: &mut Tally) {
    let (req, leftover, received) = match read_head(&mut io.rx).await {
        Ok(head) => head,
        Err(HeadEnd::Bad(b)) => {
            tally.method = b.method;
            tally.rule = "bad-request".into();
            tally.reason = Some(b.reason.clone());
            io.ctl.send(&http::bad_request(&b.reason)).await;
            return;
        }
        Err(HeadEnd::Gone(why)) => {
            tally.rule = "no-request".into();
            tally.reason = Some(why.into());
            return;
        }
    };
    let url = req.url();
    tally.method = req.method().to_string();
    tally.host = url.host_str().unwrap_or_default().to_string();
    tally.port = url.port_or_known_default().unwrap_or(0);
    let decided = if over_cap {
        Err(refused("connections", over_cap_reason(shared)))
    } else {
        decide(&shared.deps, &shared.caps, url).await
    };
    let allowed = match decided {
        Ok(a) => a,
        Err(r) => return refuse(&io.ctl, &req, tally, r).await,
    };
    // A plain-HTTP request to a credential host the interceptor will not serve in
    // cleartext: refused before any connection, so it goes neither with nor without it.
    if let (Request::Forward { .. }, Some(i)) = (&req, &shared.intercept)
        && let super::Plain::Refuse(rule, reason) = i.plain(&tally.host, tally.port)
    {
        return refuse(&io.ctl, &req, tally, refused(&rule, reason)).await;
    }
    tally.allowed = true;
    tally.rule = allowed.rule;
    let upstream = match connect(&allowed.addrs).await {
        Ok(s) => s,
        Err(why) => {
            tally.reason = Some(format!("could not connect: {why}"));
            io.ctl.send(&http::bad_gateway(&why)).await;
            return;
        }
    };
    let head = Head {
        req,
        leftover,
        received,
    };
    if let Some(end) = carry(shared, io, tally, head, upstream).await {
        finish(tally, end);
    }
}

/// A parsed request head, the bytes that came after it, and all the bytes read for it.
struct Head {
    req: Request,
    leftover: Bytes,
    received: usize,
}

/// Carries an allowed, connected request: tunneled, forwarded or handed to the interceptor.
async fn carry(
    shared: &Shared,
    io: &mut ConnIo,
    tally: &Tally,
    head: Head,
    upstream: TcpStream,
) -> Option<Refused> {
    let handed = shared.intercept.as_ref().filter(|i| match &head.req {
        Request::Connect { .. } => i.wants(&tally.host, tally.port),
        Request::Forward { .. } => i.plain(&tally.host, tally.port) == super::Plain::Inject,
    });
    if let Some(intercept) = handed {
        return handover(shared, io, tally, intercept.as_ref(), upstream, head).await;
    }
    let Head {
        req,
        leftover,
        received,
    } = head;
    let (r, mut w) = upstream.into_split();
    let first = match &req {
        Request::Connect { .. } => {
            if !io.ctl.send(http::ESTABLISHED).await {
                return None;
            }
            leftover
        }
        Request::Forward { head, .. } => {
            let mut first = BytesMut::from(head.as_slice());
            first.extend_from_slice(&leftover);
            first.freeze()
        }
    };
    let cut = match forward_up(shared, tally, &mut w, &first).await {
        Ok(cut) => cut,
        Err(e) => Some(refused("", format!("the destination failed: {e}"))),
    };
    io.ctl.grant(received);
    match cut {
        Some(end) => Some(end),
        None => relay(shared, io, tally, r, w).await,
    }
}

/// A cut or failure ends the record: its rule (when it has one) and why.
fn finish(tally: &mut Tally, end: Refused) {
    if !end.rule.is_empty() {
        tally.rule = end.rule;
    }
    tally.reason = Some(end.reason);
}

/// Hands an allowed CONNECT (or a plain-HTTP request) to the interceptor: the relay
/// (counted, capped) runs between the sandbox and one end of an in-memory pipe, the
/// interceptor serves the other end (a forwarded request's rewritten head first).
async fn handover(
    shared: &Shared,
    io: &mut ConnIo,
    tally: &Tally,
    intercept: &dyn super::Intercept,
    upstream: TcpStream,
    head: Head,
) -> Option<Refused> {
    let Head {
        req,
        leftover,
        received,
    } = head;
    let (near, far) = tokio::io::duplex(CHUNK * 4);
    let (r, mut w) = tokio::io::split(near);
    let (served, leftover) = match req {
        Request::Connect { .. } => {
            if !io.ctl.send(http::ESTABLISHED).await {
                return None;
            }
            (intercept.serve(far, upstream, &tally.host), leftover)
        }
        Request::Forward { head, .. } => {
            let mut first = BytesMut::from(head.as_slice());
            first.extend_from_slice(&leftover);
            let first = first.freeze();
            (intercept.serve_plain(far, upstream, &tally.host), first)
        }
    };
    let relayed = async {
        let cut = match forward_up(shared, tally, &mut w, &leftover).await {
            Ok(cut) => cut,
            Err(e) => Some(refused("", format!("the interceptor failed: {e}"))),
        };
        io.ctl.grant(received);
        match cut {
            Some(cut) => Some(cut),
            None => relay(shared, io, tally, r, w).await,
        }
    };
    let (served, relayed) = futures::future::join(served, relayed).await;
    match (relayed, served) {
        (Some(end), _) => Some(end),
        (None, Err(e)) => Some(refused("", format!("the interceptor failed: {e}"))),
        (None, Ok(())) => None,
    }
}

async fn refuse(ctl: &ConnCtl, req: &Request, tally: &mut Tally, r: Refused) {
    ctl.send(&http::refusal(Some(req), &r.rule, &r.reason))
        .await;
    tally.rule = r.rule;
    tally.reason = Some(r.reason);
}

enum HeadEnd {
    Bad(BadRequest),
    Gone(&'static str),
}

/// The head, the bytes after it, and how many bytes were read in all.
async fn read_head(
    rx: &mut mpsc::UnboundedReceiver<Inbound>,
) -> Result<(Request, Bytes, usize), HeadEnd> {
    let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    let mut buf = BytesMut::new();
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(Inbound::Data(b))) => {
                buf.extend_from_slice(&b);
                // Parsed again only when a line may have ended: a head trickled in byte by
                // byte costs no more than one parse per line.
                if !b.contains(&b'\n') && buf.len() < http::MAX_HEAD {
                    continue;
                }
            }
            Ok(Some(Inbound::Eof)) | Ok(None) => {
                return Err(HeadEnd::Gone("the client closed before sending a request"));
            }
            Err(_) => return Err(HeadEnd::Gone("the client sent no request in time")),
        }
        if let Some((req, used)) = http::parse_head(&buf).map_err(HeadEnd::Bad)? {
            let received = buf.len();
            let leftover = buf.split_off(used).freeze();
            return Ok((req, leftover, received));
        }
    }
}

async fn connect(addrs: &[std::net::SocketAddr]) -> Result<TcpStream, String> {
    let mut last = "no address".to_string();
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = format!("{addr}: {e}"),
            Err(_) => last = format!("{addr}: no answer within {CONNECT_TIMEOUT:?}"),
        }
    }
    Err(last)
}

/// How much of `n` more bytes the caps let through, and the cut when not all of them.
fn budget(shared: &Shared, tally: &Tally, n: usize) -> (usize, Option<Refused>) {
    let caps = &shared.caps;
    let used = tally.up.load(Ordering::Acquire) + tally.down.load(Ordering::Acquire);
    let conn_room = caps.connection_cap.saturating_sub(used);
    let mut take = (n as u64).min(conn_room);
    let mut cut = (take < n as u64).then(|| {
        refused(
            "connection-bytes",
            format!(
                "cut after {} MiB, the most one connection may carry ([egress] connection_mb)",
                caps.connection_cap >> 20
            ),
        )
    });
    // Taken from the session's budget atomically, so two connections cannot both spend
    // its last bytes.
    let got = caps
        .session_bytes
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            Some(s + take.min(caps.session_cap.saturating_sub(s)))
        })
        .unwrap_or_else(|s| s);
    let session_take = take.min(caps.session_cap.saturating_sub(got));
    if session_take < take {
        take = session_take;
        cut = Some(refused(
            "session-bytes",
            format!(
                "cut after the session moved {} MiB through its proxy ([egress] session_mb)",
                caps.session_cap >> 20
            ),
        ));
    }
    (take as usize, cut)
}

/// Writes bytes from the client to the destination, within the caps.
async fn forward_up<W: AsyncWrite + Unpin>(
    shared: &Shared,
    tally: &Tally,
    w: &mut W,
    data: &[u8],
) -> std::io::Result<Option<Refused>> {
    let (take, cut) = budget(shared, tally, data.len());
    if take > 0 {
        w.write_all(&data[..take]).await?;
        tally.up.fetch_add(take as u64, Ordering::AcqRel);
        shared.up.fetch_add(take as u64, Ordering::AcqRel);
    }
    Ok(cut)
}

/// How one direction of the relay ended.
enum Half {
    /// This side finished (EOF passed on); the other may go on.
    Done,
    /// The whole connection is over, with the reason when it did not simply close.
    Over(Option<Refused>),
}

/// Copies both ways until both sides are done, either side aborts, a cap cuts or nothing
/// moved for `[egress] idle_secs`; the reason when it did not end normally.
async fn relay<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    shared: &Shared,
    io: &mut ConnIo,
    tally: &Tally,
    mut r: R,
    mut w: W,
) -> Option<Refused> {
    let (rx, ctl) = (&mut io.rx, &io.ctl);
    let idle = Idle::new(shared.deps.config.idle_secs);
    let failed =
        |e: std::io::Error| Half::Over(Some(refused("", format!("the destination failed: {e}"))));
    let up = async {
        loop {
            match rx.recv().await {
                Some(Inbound::Data(b)) => {
                    idle.touch();
                    let cut = forward_up(shared, tally, &mut w, &b).await;
                    ctl.grant(b.len());
                    match cut {
                        Ok(None) => {}
                        Ok(Some(cut)) => return Half::Over(Some(cut)),
                        Err(e) => return failed(e),
                    }
                }
                Some(Inbound::Eof) => {
                    let _ = w.shutdown().await;
                    return Half::Done;
                }
                // The client went away (or the channel ended): nothing more to relay.
                None => return Half::Over(None),
            }
        }
    };
    let down = async {
        loop {
            // Read in place into the frame that carries the bytes on (one copy).
            let mut buf = frame::data_buf();
            let n = match r.read_buf(&mut buf).await {
                Ok(0) => {
                    ctl.send_eof();
                    return Half::Done;
                }
                Ok(_) => frame::payload_len(&buf),
                Err(e) => return failed(e),
            };
            idle.touch();
            let (take, cut) = budget(shared, tally, n);
            if take > 0 {
                frame::truncate_payload(&mut buf, take);
                if !ctl.send_data(buf).await {
                    return Half::Over(None);
                }
                tally.down.fetch_add(take as u64, Ordering::AcqRel);
                shared.down.fetch_add(take as u64, Ordering::AcqRel);
            }
            if cut.is_some() {
                return Half::Over(cut);
            }
        }
    };
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        let half = tokio::select! {
            h = &mut up, if !up_done => { up_done = true; h }
            h = &mut down, if !down_done => { down_done = true; h }
            cut = idle.expired() => return Some(cut),
        };
        if let Half::Over(why) = half {
            return why;
        }
    }
    None
}

async fn record(shared: &Shared, tally: Tally, started_ms: i64, took: Duration) {
    if !tally.allowed {
        shared.refused.fetch_add(1, Ordering::AcqRel);
    }
    let record = EgressRecord {
        session: shared.deps.session.clone(),
        owner: shared.deps.owner.clone(),
        method: tally.method,
        host: tally.host,
        port: tally.port,
        allowed: tally.allowed,
        rule: tally.rule,
        reason: tally.reason,
        bytes_up: tally.up.into_inner(),
        bytes_down: tally.down.into_inner(),
        started_ms,
        duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
    };
    tracing::info!(
        target: TRACE_TARGET,
        session = %record.session,
        owner = %record.owner,
        host = %record.host,
        port = record.port,
        allowed = record.allowed,
        rule = %record.rule,
        reason = record.reason.as_deref().unwrap_or(""),
        bytes_up = record.bytes_up,
        bytes_down = record.bytes_down,
        "egress: {record}"
    );
    shared.deps.audit.record(record).await;
}
