//! The request head a client in the sandbox sends its proxy, and the proxy's own answers.
//!
//! Only two forms are served: `CONNECT host:port` (a tunnel: HTTPS, WebSockets) and an
//! absolute-form `http://` request (forwarded: rewritten to origin-form, hop-by-hop headers
//! dropped, `Connection: close` so one request owns one upstream connection). The head is
//! parsed by httparse within `MAX_HEAD` bytes and `MAX_HEADERS` headers; everything in it is
//! the sandbox's and hostile, and what the proxy writes back (rules, reasons, host names) is
//! stripped to printable ASCII in headers and HTML-escaped in pages.

use url::Url;

/// The longest request head the proxy reads.
pub(crate) const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// `CONNECT host:port`: the URL is `https://host:port/`, for the SSRF rules.
    Connect { url: Url },
    /// An absolute-form request; `head` is the rewritten origin-form head to send upstream.
    Forward {
        method: String,
        url: Url,
        head: Vec<u8>,
    },
}

impl Request {
    pub(crate) fn url(&self) -> &Url {
        match self {
            Request::Connect { url } | Request::Forward { url, .. } => url,
        }
    }

    pub(crate) fn method(&self) -> &str {
        match self {
            Request::Connect { .. } => "CONNECT",
            Request::Forward { method, .. } => method,
        }
    }
}

/// A head the proxy does not serve: the method (when it got that far) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadRequest {
    pub(crate) method: String,
    pub(crate) reason: String,
}

fn bad(method: &str, reason: impl Into<String>) -> BadRequest {
    BadRequest {
        method: method.to_string(),
        reason: reason.into(),
    }
}

/// Parses the head at the start of `buf`: None while it is incomplete (and under
/// `MAX_HEAD`), else the request and how many bytes of `buf` it took.
pub(crate) fn parse_head(buf: &[u8]) -> Result<Option<(Request, usize)>, BadRequest> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let used = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Ok(None),
        Ok(httparse::Status::Partial) => {
            return Err(bad(
                "",
                format!("the request head is over {MAX_HEAD} bytes"),
            ));
        }
        Err(e) => return Err(bad("", format!("the request is not HTTP/1.x: {e}"))),
    };
    if used > MAX_HEAD {
        return Err(bad(
            "",
            format!("the request head is over {MAX_HEAD} bytes"),
        ));
    }
    let method = req.method.unwrap_or_default().to_string();
    let target = req.path.unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") {
        return Ok(Some((
            Request::Connect {
                url: authority(target)?,
            },
            used,
        )));
    }
    let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(bad(
            &method,
            "https:// through a proxy goes by CONNECT; use it",
        ));
    }
    if !lower.starts_with("http://") {
        return Err(bad(
            &method,
            "this is an HTTP proxy: send CONNECT host:port or an absolute http:// URL",
        ));
    }
    let url = Url::parse(target).map_err(|e| bad(&method, format!("bad URL: {e}")))?;
    let head = origin_form(&method, &url, req.version.unwrap_or(1), req.headers);
    Ok(Some((Request::Forward { method, url, head }, used)))
}

/// `host:port` of a CONNECT, with an explicit port, as an `https://` URL.
fn authority(target: &str) -> Result<Url, BadRequest> {
    let refuse = |why: &str| bad("CONNECT", format!("CONNECT {:?}: {why}", printable(target)));
    let (host, port) = target.rsplit_once(':').ok_or_else(|| refuse("no port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| refuse("the port is not a number"))?;
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']'));
    if !host_ok {
        return Err(refuse("not a host name or address"));
    }
    Url::parse(&format!("https://{host}:{port}/")).map_err(|e| refuse(&e.to_string()))
}

/// Hop-by-hop headers, never forwarded (RFC 9110 7.6.1), and the proxy's own.
const HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// The head to send upstream: origin-form target, the client's end-to-end headers,
/// `Host` when the client sent none, and `Connection: close`.
fn origin_form(method: &str, url: &Url, version: u8, headers: &[httparse::Header]) -> Vec<u8> {
    // Headers the client named in Connection are hop-by-hop too.
    let named: Vec<String> = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| {
            String::from_utf8_lossy(h.value)
                .split(',')
                .map(|s| s.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut path = url.path().to_string();
    if let Some(q) = url.query() {
        path.push('?');
        path.push_str(q);
    }
    let mut out = format!("{method} {path} HTTP/1.{version}\r\n").into_bytes();
    let mut has_host = false;
    for h in headers {
        let name = h.name.to_ascii_lowercase();
        if HOP.contains(&name.as_str()) || named.contains(&name) {
            continue;
        }
        has_host |= name == "host";
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    if !has_host {
        let host = url.host_str().unwrap_or_default();
        match url.port() {
            Some(p) => out.extend_from_slice(format!("Host: {host}:{p}\r\n").as_bytes()),
            None => out.extend_from_slice(format!("Host: {host}\r\n").as_bytes()),
        }
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// The answer to a CONNECT that was allowed.
pub(crate) const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection Established\r\n\r\n";

/// A refusal: 403 with `X-Sandboxd-Refused: <rule>`; a plain-text body for a CONNECT, a
/// small HTML page for a forwarded request (a browser shows it).
pub(crate) fn refusal(req: Option<&Request>, rule: &str, reason: &str) -> Vec<u8> {
    match req {
        Some(Request::Forward { url, .. }) => {
            let body = format!(
                "<!doctype html><html><head><meta charset=\"utf-8\"><title>Refused by the egress proxy</title></head>\
                 <body><h1>Refused by sandboxd's egress proxy</h1><p>{}</p><p>Rule: <code>{}</code></p>\
                 <p>Reason: {}</p></body></html>\n",
                escape(url.as_str()),
                escape(rule),
                escape(reason)
            );
            answer(
                403,
                "Forbidden",
                Some(rule),
                "text/html; charset=utf-8",
                &body,
            )
        }
        _ => {
            let body = format!(
                "refused by the egress proxy ({}): {}\n",
                printable(rule),
                printable(reason)
            );
            answer(
                403,
                "Forbidden",
                Some(rule),
                "text/plain; charset=utf-8",
                &body,
            )
        }
    }
}

/// A head the proxy cannot serve.
pub(crate) fn bad_request(reason: &str) -> Vec<u8> {
    let body = format!("bad request to the egress proxy: {}\n", printable(reason));
    answer(
        400,
        "Bad Request",
        Some("bad-request"),
        "text/plain; charset=utf-8",
        &body,
    )
}

/// An allowed destination that could not be reached.
pub(crate) fn bad_gateway(reason: &str) -> Vec<u8> {
    let body = format!(
        "the egress proxy could not reach the destination: {}\n",
        printable(reason)
    );
    answer(502, "Bad Gateway", None, "text/plain; charset=utf-8", &body)
}

fn answer(code: u16, text: &str, rule: Option<&str>, ctype: &str, body: &str) -> Vec<u8> {
    let mut head = format!("HTTP/1.1 {code} {text}\r\n");
    if let Some(rule) = rule {
        head.push_str(&format!("X-Sandboxd-Refused: {}\r\n", printable(rule)));
    }
    head.push_str(&format!(
        "Content-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// Printable ASCII only, at most 300 characters: safe in a header and a text body.
pub(crate) fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .take(300)
        .collect()
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars().take(1000) {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
