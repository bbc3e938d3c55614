//! The Fetcher's SSRF rules, each refusal naming its rule: literal addresses in every
//! spelling, names resolving to a private address, redirects to loopback, userinfo,
//! schemes, ports, oversized and binary bodies, redirect chains. Servers are local
//! (127.0.0.1), admitted by an explicit test allow-list where a test needs to reach them;
//! names are answered by a scripted resolver, so nothing here touches DNS or the internet.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::net::IpAddr;
use std::sync::Arc;

use sandboxd_core::research::ResearchConfig;
use sandboxd_core::research::fetcher::{FetchError, FetchRequest, FetchResponse, Fetcher};
use sandboxd_core::research::resolver::StaticResolver;
use sandboxd_core::research::ssrf::Origin;
use support::fake_web::FakeWeb;
use url::Url;

fn config(web: Option<&FakeWeb>, allow: &[&str]) -> ResearchConfig {
    let mut c = ResearchConfig {
        allow: allow.iter().map(|s| s.to_string()).collect(),
        timeout_secs: 5,
        ..ResearchConfig::default()
    };
    if let Some(w) = web {
        c.ports.push(w.port());
    }
    c
}

fn names() -> Arc<StaticResolver> {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    Arc::new(StaticResolver(vec![
        // One public and one private answer: the name must be refused as a whole.
        (
            "mixed.test".into(),
            vec![ip("93.184.216.34"), ip("10.0.0.7")],
        ),
        (
            "v6private.test".into(),
            vec![ip("2606:4700::1"), ip("fd00:ec2::254")],
        ),
        ("wiki.test".into(), vec![ip("127.0.0.1")]),
        ("public.test".into(), vec![ip("93.184.216.34")]),
        ("proxy.test".into(), vec![ip("127.0.0.1")]),
    ]))
}

async fn fetch(c: &ResearchConfig, url: &str) -> Result<FetchResponse, FetchError> {
    fetch_as(c, url, Origin::Model).await
}

async fn fetch_as(
    c: &ResearchConfig,
    url: &str,
    origin: Origin,
) -> Result<FetchResponse, FetchError> {
    let fetcher = Fetcher::with_resolver(c, names()).expect("fetcher");
    fetcher
        .fetch(FetchRequest::get(
            Url::parse(url).expect("test URL parses"),
            origin,
        ))
        .await
}

/// Asserts a refusal by `rule`, whose text names the rule and says what could be done.
async fn refused(c: &ResearchConfig, url: &str, rule: &str) -> String {
    match fetch(c, url).await {
        Err(FetchError::Refused(r)) => {
            assert_eq!(r.rule, rule, "{url}: {r}");
            let text = FetchError::Refused(r).to_string();
            assert!(text.contains(&format!("`{rule}` rule")), "{text}");
            text
        }
        other => panic!("{url}: expected a refusal by {rule}, got {other:?}"),
    }
}

#[tokio::test]
async fn literal_addresses_in_every_spelling_are_refused() {
    let c = config(None, &[]);
    for url in [
        "http://127.0.0.1/",
        "http://0x7f.1/",
        "http://2130706433/",
        "http://017700000001/",
        "http://127.1/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::1]/",
        "http://0.0.0.0/",
        "http://[64:ff9b::7f00:1]/",
        "http://10.1.2.3/",
        "http://100.100.100.200/",
    ] {
        refused(&c, url, "denied-address").await;
    }
    let text = refused(
        &c,
        "http://169.254.169.254/latest/meta-data/",
        "denied-address",
    )
    .await;
    assert!(
        text.contains("metadata") && text.contains("[research] allow"),
        "{text}"
    );
    let text = refused(&c, "http://[fd00:ec2::254]/", "denied-address").await;
    assert!(text.contains("fc00::/7"), "{text}");
    let text = refused(&c, "http://172.17.0.1/", "denied-address").await;
    assert!(text.contains("Docker") || text.contains("bridge"), "{text}");
}

#[tokio::test]
async fn a_name_with_any_private_address_is_refused_whole() {
    let c = config(None, &[]);
    let text = refused(&c, "http://mixed.test/", "resolves-to-denied").await;
    assert!(text.contains("mixed.test resolves to 10.0.0.7"), "{text}");
    refused(&c, "http://v6private.test/", "resolves-to-denied").await;
    refused(&c, "http://localhost/", "denied-name").await;
    refused(&c, "http://metadata.google.internal/", "denied-name").await;
}

#[tokio::test]
async fn userinfo_schemes_and_ports_are_refused() {
    let c = config(None, &[]);
    refused(&c, "http://user:pw@public.test/", "userinfo").await;
    refused(&c, "http://user:pw@example.com@public.test/", "userinfo").await;
    refused(&c, "ftp://public.test/file", "scheme").await;
    refused(&c, "file:///etc/passwd", "scheme").await;
    let text = refused(&c, "http://public.test:8080/", "port").await;
    assert!(text.contains("[research] ports"), "{text}");
}

#[tokio::test]
async fn the_allow_list_admits_the_test_server_and_nothing_else() {
    let web = FakeWeb::start().await;
    // Without the allow-list the loopback server is out of reach, by address or by name.
    let closed = config(Some(&web), &[]);
    refused(&closed, &web.url("/article/a"), "denied-address").await;
    let by_name = format!("http://wiki.test:{}/article/a", web.port());
    refused(&closed, &by_name, "resolves-to-denied").await;
    // With it, both work; the name entry admits the name only.
    let open = config(Some(&web), &["127.0.0.1/32"]);
    let ok = fetch(&open, &web.url("/article/a")).await.expect("allowed");
    assert_eq!(ok.status.as_u16(), 200);
    assert_eq!(ok.content_type, "text/html");
    let named = config(Some(&web), &["wiki.test"]);
    let ok = fetch(&named, &by_name).await.expect("allowed by name");
    assert_eq!(
        ok.remote_addr.map(|a| a.ip().to_string()).as_deref(),
        Some("127.0.0.1")
    );
    refused(&named, &web.url("/article/a"), "denied-address").await;
}

#[tokio::test]
async fn a_redirect_from_an_allowed_host_to_loopback_is_refused() {
    let web = FakeWeb::start().await;
    let c = config(Some(&web), &["wiki.test"]);
    let port = web.port();
    for target in [
        format!("http://127.0.0.1:{port}/article/secret"),
        format!("http://0x7f.1:{port}/article/secret"),
        format!("http://[::ffff:127.0.0.1]:{port}/article/secret"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
    ] {
        let url = format!(
            "http://wiki.test:{port}/to?target={}",
            url::form_urlencoded::byte_serialize(target.as_bytes()).collect::<String>()
        );
        refused(&c, &url, "denied-address").await;
    }
    assert!(
        !web.hits().iter().any(|(p, _)| p.contains("secret")),
        "the redirect target was reached: {:?}",
        web.hits()
    );
}

#[tokio::test]
async fn redirect_chains_are_cut_after_five_hops() {
    let web = FakeWeb::start().await;
    let c = config(Some(&web), &["127.0.0.1"]);
    let five = fetch(&c, &web.url("/redirect/5"))
        .await
        .expect("5 hops are followed");
    assert!(
        five.final_url.path().ends_with("/redirect/0"),
        "{}",
        five.final_url
    );
    let text = refused(&c, &web.url("/redirect/6"), "redirects").await;
    assert!(text.contains("more than 5 redirects"), "{text}");
}

#[tokio::test]
async fn oversized_and_binary_bodies_are_refused() {
    let web = FakeWeb::start().await;
    let c = config(Some(&web), &["127.0.0.1"]);
    let text = refused(&c, &web.url("/big"), "body-size").await;
    assert!(text.contains("max_body_kb"), "{text}");
    // Without a Content-Length the stream is cut at the cap.
    refused(&c, &web.url("/stream-big"), "body-size").await;
    refused(&c, &web.url("/binary"), "content-type").await;
    refused(&c, &web.url("/png"), "content-type").await;
    let pdf = fetch(&c, &web.url("/paper.pdf"))
        .await
        .expect("PDF is allowed");
    assert_eq!(pdf.content_type, "application/pdf");
    assert_eq!(pdf.body, support::fake_web::PDF);
}

#[tokio::test]
async fn only_restricts_the_model_but_not_the_admins_endpoints() {
    let web = FakeWeb::start().await;
    let mut c = config(Some(&web), &["127.0.0.1"]);
    c.only = vec!["docs.example".into()];
    let text = refused(&c, &web.url("/article/a"), "only").await;
    assert!(text.contains("[research] only"), "{text}");
    fetch_as(&c, &web.url("/article/a"), Origin::Admin)
        .await
        .expect("an engine endpoint is not restricted by `only`");
}

#[tokio::test]
async fn a_silent_server_times_out_within_the_deadline() {
    let web = FakeWeb::start().await;
    let mut c = config(Some(&web), &["127.0.0.1"]);
    c.timeout_secs = 1;
    let started = std::time::Instant::now();
    let err = fetch(&c, &web.url("/slow")).await.unwrap_err();
    assert!(matches!(err, FetchError::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[tokio::test]
async fn a_configured_proxy_is_used_and_the_url_rules_still_apply() {
    // The fake web plays the proxy: reqwest sends it absolute-form requests.
    let proxy = FakeWeb::start().await;
    let mut c = config(None, &[]);
    c.proxy = format!("http://127.0.0.1:{}", proxy.port());
    let ok = fetch(&c, "http://public.test/article/viaproxy")
        .await
        .expect("through the proxy");
    assert!(String::from_utf8_lossy(&ok.body).contains("Article viaproxy"));
    assert!(proxy.hits().iter().any(|(p, _)| p == "/article/viaproxy"));
    refused(&c, "http://127.0.0.1/", "denied-address").await;
    refused(&c, "http://mixed.test/", "resolves-to-denied").await;
    // A proxy named by a private name is reached; the name's exemption covers the proxy only.
    c.proxy = format!("http://proxy.test:{}", proxy.port());
    fetch(&c, "http://public.test/article/named")
        .await
        .expect("through the named proxy");
    refused(&c, "http://proxy.test/", "resolves-to-denied").await;
    refused(&c, "http://127.0.0.1/", "denied-address").await;
}
