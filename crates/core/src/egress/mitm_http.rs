//! The HTTP/1.1 relay inside an intercepted connection: one request at a time, its head
//! checked and rewritten, its body streamed up, the response streamed back with the secret
//! masked.
//!
//! Every request head from the sandbox is hostile. It must be at most `MAX_HEAD` bytes and
//! parse (httparse); it may only address the credential's host (a `Host` or absolute target
//! naming another would let a shared front end route the secret to someone else's site);
//! framing must be unambiguous (both Transfer-Encoding and Content-Length, or a coding other
//! than chunked, is refused: request smuggling); no upgrades (a WebSocket's frames could not
//! be masked). The credential header replaces any the sandbox sent, and `Accept-Encoding:
//! identity` any it asked for, so the response can be masked; a response that is compressed
//! anyway is refused rather than passed on unread. The mask covers the value verbatim: a
//! server that echoes it transformed (encoded, split, truncated) is outside what a relay can
//! see, which is why credentials go only to hosts the admin names.

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use super::mitm::{MitmCounters, MitmError};
use super::mitm_body::{
    self, Framing, HeadError, MAX_HEAD, copy_body, mask, read_head, refuse, send,
};
use crate::config::egress::EgressCredential;

const MAX_HEADERS: usize = 100;
/// Interim (1xx) responses passed on before the final one.
const MAX_INTERIM: usize = 8;
const BUF: usize = 16 * 1024;
/// How long the relay waits for the sandbox's next request head: the keep-alive idle
/// timeout, and the bound on a head sent a byte at a time.
const HEAD_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Headers never forwarded from the sandbox: hop-by-hop ones, and those the relay sets.
const DROPPED: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "expect",
    "accept-encoding",
    "content-length",
    "transfer-encoding",
];

fn bad(status: u16, reason: impl Into<String>) -> MitmError {
    MitmError::BadRequest {
        status,
        reason: reason.into(),
    }
}

/// A request head, checked and rewritten for the upstream.
struct Outgoing {
    head: Vec<u8>,
    framing: Framing,
    head_method: bool,
    expect_continue: bool,
    close: bool,
}

/// `host[:port]` names `host`.
fn names_host(authority: &str, host: &str) -> bool {
    let (name, port) = match authority.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (authority, None),
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    port_ok && name.trim_end_matches('.').eq_ignore_ascii_case(host)
}

/// The origin-form target of `target`, if it addresses `host`.
fn origin_target(target: &str, host: &str) -> Result<String, MitmError> {
    if target.starts_with('/') || target == "*" {
        return Ok(target.to_string());
    }
    let lower = target.to_ascii_lowercase();
    let rest = match ["https://", "http://"]
        .iter()
        .find(|s| lower.starts_with(**s))
    {
        Some(scheme) => &target[scheme.len()..],
        None => {
            return Err(bad(
                400,
                "the request target is not a path or an absolute URL",
            ));
        }
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if !names_host(&rest[..end], host) {
        return Err(bad(
            421,
            format!("this connection carries requests for {host} only"),
        ));
    }
    let path = &rest[end..];
    Ok(match path.chars().next() {
        Some('/') => path.to_string(),
        Some(_) => format!("/{path}"),
        None => "/".to_string(),
    })
}

fn framing_of(te: &[String], cl: &[String]) -> Result<Framing, String> {
    if !te.is_empty() && !cl.is_empty() {
        return Err("both Transfer-Encoding and Content-Length".into());
    }
    if !te.is_empty() {
        let codings = te.join(",");
        if codings.trim().eq_ignore_ascii_case("chunked") {
            return Ok(Framing::Chunked);
        }
        return Err("a transfer coding other than chunked".into());
    }
    match cl.first() {
        None => Ok(Framing::None),
        Some(first) => {
            let n = first
                .trim()
                .parse::<u64>()
                .map_err(|_| "a malformed Content-Length")?;
            if cl.iter().any(|v| v.trim() != first.trim()) {
                return Err("conflicting Content-Length values".into());
            }
            Ok(Framing::Length(n))
        }
    }
}

/// Checks the sandbox's request head and writes the upstream's.
fn rewrite(head: &[u8], host: &str, cred: &EgressCredential) -> Result<Outgoing, MitmError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(bad(400, "an incomplete request head")),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(bad(431, format!("more than {MAX_HEADERS} headers")));
        }
        Err(e) => return Err(bad(400, format!("a malformed request head ({e})"))),
    }
    if req.version != Some(1) {
        return Err(bad(505, "only HTTP/1.1 is relayed to a credential host"));
    }
    let method = req.method.unwrap_or("");
    if method.eq_ignore_ascii_case("CONNECT") {
        return Err(bad(405, "CONNECT inside an intercepted connection"));
    }
    let target = origin_target(req.path.unwrap_or(""), host)?;
    let (mut te, mut cl, mut hosts) = (Vec::new(), Vec::new(), Vec::new());
    let (mut expect_continue, mut close) = (false, false);
    let mut out = format!("{method} {target} HTTP/1.1\r\n").into_bytes();
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        let value = String::from_utf8_lossy(h.value).into_owned();
        match name.as_str() {
            "transfer-encoding" => te.push(value),
            "content-length" => cl.push(value),
            "host" => hosts.push(value),
            "upgrade" => return Err(bad(501, "protocol upgrades to a credential host")),
            "connection" => close |= value.to_ascii_lowercase().contains("close"),
            "expect" if value.trim().eq_ignore_ascii_case("100-continue") => expect_continue = true,
            "expect" => return Err(bad(417, "an expectation other than 100-continue")),
            _ => {}
        }
        if DROPPED.contains(&name.as_str()) || name.eq_ignore_ascii_case(&cred.header) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    let host_line = match hosts.as_slice() {
        [] => host.to_string(),
        [one] if names_host(one.trim(), host) => one.trim().to_string(),
        [_] => {
            return Err(bad(
                421,
                format!("the Host header names another host than {host}"),
            ));
        }
        _ => return Err(bad(400, "more than one Host header")),
    };
    let framing = framing_of(&te, &cl).map_err(|m| bad(400, format!("ambiguous body: {m}")))?;
    out.extend_from_slice(format!("Host: {host_line}\r\n").as_bytes());
    out.extend_from_slice(format!("{}: {}", cred.header, cred.prefix).as_bytes());
    out.extend_from_slice(cred.value.expose().as_bytes());
    out.extend_from_slice(b"\r\nAccept-Encoding: identity\r\n");
    match framing {
        Framing::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        Framing::Length(n) => out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes()),
        _ => {}
    }
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Outgoing {
        head: out,
        framing,
        head_method: method.eq_ignore_ascii_case("HEAD"),
        expect_continue: expect_continue && framing != Framing::None,
        close,
    })
}

/// A response head parsed: status, body framing, whether the connection ends after it.
fn response_framing(head: &[u8], head_method: bool) -> Result<(u16, Framing, bool), String> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut slots);
    match resp.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err("an incomplete response head".into()),
        Err(e) => return Err(format!("a malformed response head ({e})")),
    }
    let status = resp.code.unwrap_or(0);
    let (mut te, mut cl, mut close) = (Vec::new(), Vec::new(), resp.version == Some(0));
    for h in resp.headers.iter() {
        let value = String::from_utf8_lossy(h.value).into_owned();
        match h.name.to_ascii_lowercase().as_str() {
            "transfer-encoding" => te.push(value),
            "content-length" => cl.push(value),
            "connection" => close |= value.to_ascii_lowercase().contains("close"),
            "content-encoding" if !value.trim().eq_ignore_ascii_case("identity") => {
                return Err("it is compressed, so the credential could not be masked in it".into());
            }
            _ => {}
        }
    }
    if head_method || status < 200 || status == 204 || status == 304 {
        return Ok((status, Framing::None, close));
    }
    let framing = match framing_of(&te, &cl)? {
        Framing::None => Framing::UntilClose,
        f => f,
    };
    Ok((status, framing, close || framing == Framing::UntilClose))
}

fn head_err(e: HeadError, what: &str) -> (u16, String) {
    match e {
        HeadError::TooLarge => (431, format!("the {what} head is over {MAX_HEAD} bytes")),
        HeadError::Truncated => (400, format!("the {what} head ended early")),
        HeadError::Io(e) => (502, format!("reading the {what} head failed: {e}")),
    }
}

/// Relays requests from `client` to `upstream` until either closes.
pub(crate) async fn relay<C, U>(
    client: C,
    upstream: U,
    host: &str,
    cred: &EgressCredential,
    counters: &MitmCounters,
) -> Result<(), MitmError>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let secret = cred.value.expose().as_bytes();
    let mut client = BufReader::with_capacity(BUF, client);
    let mut upstream = BufReader::with_capacity(BUF, upstream);
    loop {
        let head = match tokio::time::timeout(HEAD_WAIT, read_head(&mut client)).await {
            // Idle between requests, or a head trickled in too slowly: close, as servers do.
            Err(_) | Ok(Ok(None)) => break,
            Ok(Ok(Some(h))) => h,
            Ok(Err(e)) => {
                let (status, reason) = head_err(e, "request");
                refuse(&mut client, status, &reason, counters).await;
                return Err(bad(status, reason));
            }
        };
        let out = match rewrite(&head, host, cred) {
            Ok(o) => o,
            Err(e) => {
                if let MitmError::BadRequest { status, reason } = &e {
                    refuse(&mut client, *status, reason, counters).await;
                }
                return Err(e);
            }
        };
        send(&mut upstream, &out.head, true, counters).await?;
        counters
            .requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if out.expect_continue {
            send(
                &mut client,
                b"HTTP/1.1 100 Continue\r\n\r\n",
                false,
                counters,
            )
            .await?;
        }
        copy_body(&mut client, &mut upstream, out.framing, b"", true, counters).await?;
        let close =
            relay_response(&mut upstream, &mut client, host, &out, secret, counters).await?;
        if close || out.close {
            break;
        }
    }
    let _ = client.shutdown().await;
    let _ = upstream.shutdown().await;
    Ok(())
}

/// Passes interim responses and then the final one back; true when the connection ends.
async fn relay_response<U, C>(
    upstream: &mut BufReader<U>,
    client: &mut BufReader<C>,
    host: &str,
    out: &Outgoing,
    secret: &[u8],
    counters: &MitmCounters,
) -> Result<bool, MitmError>
where
    U: AsyncRead + AsyncWrite + Unpin,
    C: AsyncRead + AsyncWrite + Unpin,
{
    let refused = |reason: String| MitmError::BadResponse {
        host: host.to_string(),
        reason,
    };
    for _ in 0..=MAX_INTERIM {
        let read = match read_head(upstream).await {
            Ok(Some(h)) => Ok(h),
            Ok(None) => Err("it closed without an answer".to_string()),
            Err(e) => Err(head_err(e, "response").1),
        };
        let mut head = match read {
            Ok(h) => h,
            Err(reason) => {
                refuse(
                    client,
                    502,
                    &format!("{host} did not answer: {reason}"),
                    counters,
                )
                .await;
                return Err(refused(reason));
            }
        };
        let (status, framing, close) = match response_framing(&head, out.head_method) {
            Ok(f) => f,
            Err(reason) => {
                refuse(
                    client,
                    502,
                    &format!("the response of {host} is refused: {reason}"),
                    counters,
                )
                .await;
                return Err(refused(reason));
            }
        };
        if status == 101 {
            refuse(client, 502, "an upgrade nobody asked for", counters).await;
            return Err(refused("101 without an upgrade request".into()));
        }
        mask(&mut head, secret);
        send(client, &head, false, counters).await?;
        if status >= 200 {
            mitm_body::copy_body(upstream, client, framing, secret, false, counters).await?;
            return Ok(close);
        }
    }
    Err(refused(format!(
        "more than {MAX_INTERIM} interim responses"
    )))
}
