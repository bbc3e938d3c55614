//! Request heads the proxy serves, refuses or waits for; the answers it writes.

use super::*;

fn parse(raw: &str) -> Result<Option<(Request, usize)>, BadRequest> {
    parse_head(raw.as_bytes())
}

#[test]
fn connect_names_an_https_url_and_leaves_the_tunnel_bytes() {
    let raw = "CONNECT Example.ORG:8443 HTTP/1.1\r\nHost: example.org:8443\r\n\r\n\x16\x03\x01";
    let (req, used) = parse(raw).unwrap().unwrap();
    assert_eq!(req.url().as_str(), "https://example.org:8443/");
    assert_eq!(req.method(), "CONNECT");
    assert_eq!(&raw.as_bytes()[used..], b"\x16\x03\x01");
    // Odd IPv4 spellings become the address they mean, for the SSRF rules.
    let (req, _) = parse("CONNECT 0x7f.1:443 HTTP/1.1\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!(req.url().host_str(), Some("127.0.0.1"));
}

#[test]
fn a_forwarded_request_is_rewritten_to_origin_form() {
    let raw = "GET http://a.example:8080/p/q?x=1 HTTP/1.1\r\nHost: a.example:8080\r\n\
               Proxy-Connection: keep-alive\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\n\
               Proxy-Authorization: Basic abc\r\nAccept: */*\r\n\r\n";
    let (req, used) = parse(raw).unwrap().unwrap();
    assert_eq!(used, raw.len());
    let Request::Forward { head, url, method } = req else {
        panic!("not forwarded")
    };
    assert_eq!((method.as_str(), url.port()), ("GET", Some(8080)));
    let head = String::from_utf8(head).unwrap();
    assert_eq!(
        head,
        "GET /p/q?x=1 HTTP/1.1\r\nHost: a.example:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    // No Host header: the URL's is added.
    let (req, _) = parse("GET http://b.example/ HTTP/1.0\r\n\r\n")
        .unwrap()
        .unwrap();
    let Request::Forward { head, .. } = req else {
        panic!("not forwarded")
    };
    assert_eq!(
        String::from_utf8(head).unwrap(),
        "GET / HTTP/1.0\r\nHost: b.example\r\nConnection: close\r\n\r\n"
    );
}

#[test]
fn incomplete_heads_wait_and_bad_ones_are_refused_with_a_reason() {
    assert_eq!(parse("CONNECT a.org:443 HTTP/1.1\r\n").unwrap(), None);
    for (raw, says) in [
        ("GET /index.html HTTP/1.1\r\n\r\n", "absolute http:// URL"),
        ("GET https://a.org/ HTTP/1.1\r\n\r\n", "CONNECT"),
        ("CONNECT a.org HTTP/1.1\r\n\r\n", "no port"),
        ("CONNECT a.org:99999 HTTP/1.1\r\n\r\n", "not a number"),
        ("CONNECT u@a.org:443 HTTP/1.1\r\n\r\n", "not a host"),
        ("\x00\x01garbage\r\n\r\n", "not HTTP"),
    ] {
        let err = parse(raw).unwrap_err();
        assert!(err.reason.contains(says), "{raw:?}: {}", err.reason);
    }
    let huge = format!(
        "GET http://a.org/ HTTP/1.1\r\nX: {}\r\n",
        "a".repeat(MAX_HEAD)
    );
    assert!(parse(&huge).unwrap_err().reason.contains("over"));
}

#[test]
fn refusals_name_the_rule_and_escape_what_the_sandbox_wrote() {
    let (req, _) = parse("GET http://a.org/<script> HTTP/1.1\r\n\r\n")
        .unwrap()
        .unwrap();
    let page = String::from_utf8(refusal(Some(&req), "not in the allowlist", "a.org <b>")).unwrap();
    assert!(page.starts_with("HTTP/1.1 403 Forbidden\r\n"));
    assert!(page.contains("X-Sandboxd-Refused: not in the allowlist\r\n"));
    assert!(page.contains("a.org &lt;b&gt;"));
    assert!(!page.contains("<b>") && !page.contains("<script>"));
    let text = String::from_utf8(refusal(None, "port\r\nX: y", "why")).unwrap();
    assert!(text.contains("X-Sandboxd-Refused: port??X: y\r\n"));
    let body_len: usize = text
        .split("Content-Length: ")
        .nth(1)
        .and_then(|s| s.split("\r\n").next())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(text.split("\r\n\r\n").nth(1).unwrap().len(), body_len);
}
