//! One client connection: hyper's HTTP/1 server over the socket, the router as its service,
//! and a watchdog that closes the connection when it goes too long without a request.
//!
//! The rules are those of Go's `ReadHeaderTimeout` and `IdleTimeout`:
//! - a new connection has `header` to deliver its first complete request head;
//! - between requests (none in flight) it may stay silent for `idle`; once a byte of the next
//!   request arrives, it has `header` from then to finish that head;
//! - while a request is in flight — from its complete head until its response body has ended
//!   or been dropped — no timer runs: an event stream or a long exec is bounded by its route
//!   (deadline layers, the run's end, shutdown), not by the connection.
//!
//! Why not hyper's own `header_read_timeout` (with a timer): its clock also runs while a
//! kept-alive connection waits for its next request, so the idle wait could never be longer
//! than the header timeout; and the accept loop needs to know which connections carry no
//! request (the ones it may close at the cap), which hyper does not say.
//!
//! A connection hyper is done with is closed the way RFC 9112 §9.6 asks ("lingering close"):
//! our side is shut down for writing first, and what the client still sends is read and
//! thrown away for up to `LINGER` before the socket is closed. Without it, a request answered
//! before its body was read (a 413 for an upload over the limit) is closed with unread bytes,
//! the kernel answers with a reset, and a reset can destroy the response the client has not
//! read yet: it sees "connection reset" instead of the 413 that says what to do.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::Service as _;

/// The connection timeouts (see the module's rules).
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header: Duration,
    pub idle: Duration,
}

/// What one connection is doing, shared by its service, its socket and the accept loop.
pub(super) struct Activity {
    state: Mutex<State>,
    changed: Notify,
    /// Cancelled to close the connection at once (the accept loop needs its slot).
    pub(super) evict: CancellationToken,
}

struct State {
    in_flight: usize,
    /// When the last request ended (or the connection was accepted).
    waiting_since: Instant,
    /// The first byte read since then, if any; a new connection counts as heard at accept.
    heard_at: Option<Instant>,
}

impl Activity {
    pub(super) fn new() -> Arc<Activity> {
        let now = Instant::now();
        Arc::new(Activity {
            state: Mutex::new(State {
                in_flight: 0,
                waiting_since: now,
                heard_at: Some(now),
            }),
            changed: Notify::new(),
            evict: CancellationToken::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a few plain fields, consistent after any panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When the connection is closed unless a request arrives first; `None` while one is in
    /// flight.
    fn deadline(&self, t: Timeouts) -> Option<Instant> {
        let s = self.lock();
        if s.in_flight > 0 {
            return None;
        }
        Some(match s.heard_at {
            Some(heard) => heard + t.header,
            None => s.waiting_since + t.idle,
        })
    }

    /// Since when the connection has carried no request (`None` while one is in flight).
    pub(super) fn waiting_since(&self) -> Option<Instant> {
        let s = self.lock();
        (s.in_flight == 0).then_some(s.waiting_since)
    }

    pub(super) fn begin(self: &Arc<Self>) -> InFlight {
        let mut s = self.lock();
        s.in_flight += 1;
        s.heard_at = None;
        drop(s);
        self.changed.notify_one();
        InFlight(self.clone())
    }

    /// Bytes arrived: between requests, the header clock starts now.
    fn heard(&self) {
        let mut s = self.lock();
        if s.in_flight == 0 && s.heard_at.is_none() {
            s.heard_at = Some(Instant::now());
            drop(s);
            // The header deadline may be sooner than the idle one the watchdog sleeps on.
            self.changed.notify_one();
        }
    }
}

/// A request in flight; dropped with its response body (ended, or the client gone).
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
        if s.in_flight == 0 {
            s.waiting_since = Instant::now();
            s.heard_at = None;
        }
        drop(s);
        self.0.changed.notify_one();
    }
}

/// Resolves when the connection has waited past its deadline with no request in flight.
async fn watchdog(activity: &Activity, t: Timeouts) {
    loop {
        // `notify_one` keeps a permit when nobody waits, so a change between reading the
        // deadline and waiting is not lost.
        match activity.deadline(t) {
            None => activity.changed.notified().await,
            Some(at) if at <= Instant::now() => return,
            Some(at) => {
                tokio::select! {
                    _ = activity.changed.notified() => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
        }
    }
}

/// The socket, telling the activity when bytes arrive.
struct Watched {
    io: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.heard();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A response body that keeps its request in flight until it ends or is dropped.
struct Guarded {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// The client closed it, or hyper did (an error, `Connection: close`, shutdown).
    Done,
    /// No request in time (the header or idle timeout).
    TimedOut,
    /// Closed to make room for a new connection at the cap.
    Evicted,
}

/// Serves one connection until it ends; `shutdown` lets its request in flight finish, then
/// closes it.
pub(super) async fn serve(
    tcp: TcpStream,
    peer: SocketAddr,
    router: Router,
    activity: Arc<Activity>,
    timeouts: Timeouts,
    shutdown: CancellationToken,
) -> Ended {
    let io = TokioIo::new(Watched {
        io: tcp,
        activity: activity.clone(),
    });
    let tracked = activity.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        // What `into_make_service_with_connect_info` did: the peer for the throttle and logs.
        req.extensions_mut().insert(ConnectInfo(peer));
        let in_flight = tracked.begin();
        let call = router.clone().call(req);
        // Boxed: polling the connection "without shutdown" needs an `Unpin` future.
        Box::pin(async move {
            let response = call.await?;
            Ok::<_, Infallible>(response.map(|body| Guarded {
                body,
                _in_flight: in_flight,
            }))
        })
    });
    // hyper's own header timer stays off (it is inert without a timer anyway): the watchdog
    // below keeps both clocks.
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.header_read_timeout(None);
    // Polled "without shutdown" so that the socket comes back when hyper is done with it,
    // for the lingering close.
    let mut conn = builder.serve_connection(io, service);
    let mut expired = pin!(watchdog(&activity, timeouts));
    let mut draining = false;
    loop {
        tokio::select! {
            r = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                break;
            }
            _ = &mut expired => return Ended::TimedOut,
            _ = activity.evict.cancelled() => return Ended::Evicted,
            _ = shutdown.cancelled(), if !draining => {
                // Idle: closed now; a request in flight: closed after its response.
                draining = true;
                Pin::new(&mut conn).graceful_shutdown();
            }
        }
    }
    let tcp = conn.into_parts().io.into_inner().io;
    tokio::select! {
        _ = linger(tcp) => {}
        _ = activity.evict.cancelled() => return Ended::Evicted,
    }
    Ended::Done
}

/// How long a closing connection's unread input is read and thrown away (nginx's
/// `lingering_time` is 30 s; a client still sending after this much is cut with a reset).
const LINGER: Duration = Duration::from_secs(5);

/// Closes `tcp` without a reset: the response (already flushed by hyper) is followed by our
/// FIN, then input is discarded until the client closes its side or `LINGER` has passed.
async fn linger(mut tcp: TcpStream) {
    if tcp.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 16 * 1024];
    let drain = async {
        while let Ok(n) = tcp.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        header: Duration::from_secs(10),
        idle: Duration::from_secs(60),
    };

    #[tokio::test(start_paused = true)]
    async fn the_header_clock_runs_from_accept_and_from_the_first_byte_after_idling() {
        let a = Activity::new();
        let start = Instant::now();
        assert_eq!(a.deadline(T), Some(start + T.header), "a new connection");
        let request = a.begin();
        assert_eq!(a.deadline(T), None, "a request in flight has no deadline");
        assert_eq!(a.waiting_since(), None);
        tokio::time::advance(Duration::from_secs(1000)).await;
        drop(request);
        let idle_from = Instant::now();
        assert_eq!(
            a.deadline(T),
            Some(idle_from + T.idle),
            "idle between requests"
        );
        assert_eq!(a.waiting_since(), Some(idle_from));
        tokio::time::advance(Duration::from_secs(50)).await;
        a.heard();
        assert_eq!(
            a.deadline(T),
            Some(Instant::now() + T.header),
            "a byte of the next request starts the header clock"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_fires_only_without_a_request_in_flight() {
        let a = Activity::new();
        let request = a.begin();
        let watch = tokio::spawn({
            let a = a.clone();
            async move { watchdog(&a, T).await }
        });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        tokio::task::yield_now().await;
        assert!(!watch.is_finished(), "a long request is never idle");
        drop(request);
        tokio::time::sleep(T.idle - Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        assert!(!watch.is_finished(), "not before the idle timeout");
        tokio::time::timeout(Duration::from_secs(2), watch)
            .await
            .expect("closed at the idle timeout")
            .unwrap();
    }

    /// A request refused before its body is read (as a 413 is): the client that sends all of
    /// its body and only then reads still gets the answer, not a reset.
    #[tokio::test]
    async fn an_answer_sent_before_the_body_was_read_reaches_the_client() {
        let router = Router::new().route(
            "/up",
            axum::routing::put(|| async { (axum::http::StatusCode::PAYLOAD_TOO_LARGE, "too big") }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (tcp, peer) = listener.accept().await.unwrap();
            serve(
                tcp,
                peer,
                router,
                Activity::new(),
                T,
                CancellationToken::new(),
            )
            .await
        });
        // Far more than the socket buffers of both ends hold: without the lingering close the
        // server's close resets the connection while this is still being written.
        let body = vec![7u8; 32 << 20];
        let mut client = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "PUT /up HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        client.write_all(head.as_bytes()).await.unwrap();
        client
            .write_all(&body)
            .await
            .expect("the whole body is accepted (read and thrown away)");
        let mut answer = Vec::new();
        client
            .read_to_end(&mut answer)
            .await
            .expect("the answer, then the server's FIN");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.ends_with("too big"), "{answer}");
        drop(client);
        assert!(matches!(server.await.unwrap(), Ended::Done));
    }
}
