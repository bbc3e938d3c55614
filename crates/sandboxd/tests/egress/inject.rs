//! Credential injection in the real sandbox with the proxy started as serve and the CLI
//! start it (`Injector`, `start_intercepting`, `install`): curl from the shell and the
//! in-sandbox Chromium (its leaf pin from `Egress::chromium_args`) both reach an HTTPS API
//! whose name the test resolver maps to this host; the API sees the header, the sandbox sees
//! it masked. The full search for the secret is serve_egress_inject.rs.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use std::sync::Arc;

use sandboxd_core::config::EgressConfig;
use sandboxd_core::config::egress::{CredentialValue, EgressCredential};
use sandboxd_core::egress::inject::{self, Injector};
use sandboxd_core::egress::{EgressPolicy, EgressProxy, FixedPolicy};
use sandboxd_core::tools::browser::{BrowserUse, Egress};
use serde_json::json;

use super::support::{Collect, Switch, deps, echo_http, echo_https, opts};
use crate::browser_support::{ok, page_text};
use crate::support;

const SECRET: &str = "sk-browser-inject-5b0e2c9d7a61";

fn credential(host: &str, allow_http: bool) -> EgressCredential {
    EgressCredential {
        host: host.into(),
        header: "Authorization".into(),
        value_env: "UNUSED".into(),
        prefix: "Bearer ".into(),
        allow_http,
        value: CredentialValue::new(SECRET),
    }
}

/// `allow_http`: a plain `http://` request to its host gets the header (in cleartext, as the
/// admin chose) and the sandbox sees the echo masked; a credential without it refuses the
/// request (`credential-needs-https`) before any connection.
#[tokio::test(flavor = "multi_thread")]
async fn allow_http_adds_the_credential_to_plain_http_and_masks_it() {
    let api = echo_http("127.0.0.1".parse().unwrap()).await;
    let config = EgressConfig {
        credentials: vec![
            credential("good.test", true),
            credential("other.test", false),
        ],
        ..EgressConfig::default()
    };
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let injector = Arc::new(Injector::for_config(&s.id, &config).unwrap().unwrap());
    let (policy, audit) = (
        Switch::new("good.test,other.test"),
        Arc::new(Collect::default()),
    );
    let d = deps(config, &[api.port], policy, audit.clone());
    let proxy = EgressProxy::start_intercepting(s.sandbox.clone(), d, injector.clone())
        .await
        .unwrap();
    s.sandbox.set_proxy_env(true);
    inject::install(s.sandbox.as_ref(), &injector)
        .await
        .unwrap();
    let get = |host: &str, path: &str| {
        format!(
            "curl -sS -i --max-time 60 -H 'Authorization: Bearer forged' http://{host}:{}{path}",
            api.port
        )
    };
    let out = s
        .sandbox
        .shell(&get("good.test", "/plain"), opts())
        .await
        .unwrap();
    let text = out.stdout_lossy();
    assert!(
        text.contains("api saw:\nGET /plain"),
        "{text}\n{}",
        out.stderr_lossy()
    );
    assert!(
        text.contains("Authorization: Bearer ****") && !text.contains(SECRET),
        "{text}"
    );
    let heads = api.heads.lock().unwrap().clone();
    let bearer = format!("Authorization: Bearer {SECRET}\r\n");
    assert!(
        heads.len() == 1 && heads[0].contains(&bearer) && !heads[0].contains("forged"),
        "{heads:?}"
    );

    let out = s
        .sandbox
        .shell(&get("other.test", "/refused"), opts())
        .await
        .unwrap();
    let text = out.stdout_lossy();
    assert!(
        text.contains("403") && text.contains("credential-needs-https"),
        "{text}"
    );
    assert_eq!(
        api.heads.lock().unwrap().len(),
        1,
        "the refused request never reached the API"
    );
    let refused = audit.of("other.test", 0).await;
    assert!(
        !refused.allowed && refused.rule == "credential-needs-https",
        "{refused:?}"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn curl_and_chromium_reach_a_credential_host_through_the_session_ca() {
    let api = echo_https("127.0.0.1".parse().unwrap(), vec!["good.test".into()]).await;
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("roots.pem");
    std::fs::write(&roots, &api.root_pem).unwrap();
    let config = EgressConfig {
        credentials: vec![credential("good.test", false)],
        extra_roots_pem: roots.display().to_string(),
        ..EgressConfig::default()
    };
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let injector = Arc::new(Injector::for_config(&s.id, &config).unwrap().unwrap());
    let (policy, audit) = (Switch::new("good.test"), Arc::new(Collect::default()));
    let d = deps(config, &[api.port], policy, audit.clone());
    let proxy = EgressProxy::start_intercepting(s.sandbox.clone(), d, injector.clone())
        .await
        .unwrap();
    s.sandbox.set_proxy_env(true);
    inject::install(s.sandbox.as_ref(), &injector)
        .await
        .unwrap();

    // curl reads the bundle through CURL_CA_BUNDLE/SSL_CERT_FILE, with no flag of its own.
    let url = format!("https://good.test:{}/from-curl", api.port);
    let out = s
        .sandbox
        .shell(&format!("curl -sS --max-time 60 {url}"), opts())
        .await
        .unwrap();
    let text = out.stdout_lossy();
    assert!(
        text.contains("api saw:\nGET /from-curl"),
        "{text}\n{}",
        out.stderr_lossy()
    );
    assert!(text.contains("Authorization: Bearer ****"), "{text}");
    assert!(!text.contains(SECRET), "{text}");

    let policy = EgressPolicy::parse("good.test").unwrap();
    let tool = BrowserUse::new(s.sandbox.clone()).with_egress(Egress {
        source: Arc::new(FixedPolicy(policy.clone())),
        at_start: policy,
        chromium_args: inject::chromium_args(Some(&injector)),
    });
    let page = format!("https://good.test:{}/from-chromium", api.port);
    ok(&tool, json!({"action": "go_to_url", "url": page})).await;
    let text = page_text(&tool, "the page").await;
    assert!(text.contains("GET /from-chromium"), "{text}");
    assert!(!text.contains(SECRET), "{text}");

    let heads = api.heads.lock().unwrap().clone();
    let bearer = format!("Authorization: Bearer {SECRET}\r\n");
    assert!(
        heads
            .iter()
            .any(|h| h.contains("/from-curl") && h.contains(&bearer)),
        "{heads:?}"
    );
    assert!(
        heads
            .iter()
            .any(|h| h.contains("/from-chromium") && h.contains(&bearer)),
        "{heads:?}"
    );
    drop(tool);
    proxy.stop().await;
}
