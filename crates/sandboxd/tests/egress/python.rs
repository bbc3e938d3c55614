//! Python's usual HTTP library through the proxy: `requests` (Debian's python3-requests, in
//! the image) reads `HTTP_PROXY`/`HTTPS_PROXY` from the environment the session's processes
//! get while the policy is not `off`, so a plain `requests.get` reaches an allowed local
//! server over HTTP and over HTTPS (CONNECT), and another host gets the proxy's 403 with the
//! rule that refused it.

use std::sync::Arc;

use sandboxd_core::config::EgressConfig;
use sandboxd_core::egress::EgressProxy;

use super::support::{self, Collect, Switch, opts};
use crate::support as base;

#[tokio::test]
async fn requests_reaches_an_allowed_host_through_the_proxy_and_is_refused_elsewhere() {
    let web = support::http_server("plain").await;
    let (tls, pem) = support::https_server("tls").await;
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let sb = &s.sandbox;
    sb.write_file("/workspace/ca.pem", pem.as_bytes())
        .await
        .unwrap();
    let audit = Arc::new(Collect::default());
    let deps = support::deps(
        EgressConfig::default(),
        &[web.port, tls.port],
        Switch::new("good.test"),
        audit.clone(),
    );
    let proxy = EgressProxy::start(sb.clone(), deps).await.unwrap();
    sb.set_proxy_env(true);
    let script = format!(
        "python3 - <<'EOF'\n\
import requests\n\
print(requests.get('http://good.test:{web}/req', timeout=60).text, end='')\n\
print(requests.get('https://good.test:{tls}/sec', verify='/workspace/ca.pem', timeout=60).text, end='')\n\
r = requests.get('http://other.test:{web}/no', timeout=60)\n\
print('other', r.status_code, r.headers.get('X-Sandboxd-Refused'))\n\
EOF",
        web = web.port,
        tls = tls.port
    );
    let out = sb.shell(&script, opts()).await.unwrap();
    let text = out.stdout_lossy();
    assert_eq!(
        text,
        "hello plain /req\nhello tls /sec\nother 403 not in the allowlist\n",
        "{}",
        out.stderr_lossy()
    );
    let get = audit.of("good.test", 0).await;
    assert!(get.allowed && get.method == "GET", "{get:?}");
    let connect = audit.of("good.test", 1).await;
    assert!(
        connect.allowed && connect.method == "CONNECT",
        "{connect:?}"
    );
    assert_eq!((web.hits(), tls.hits()), (1, 1));
    proxy.stop().await;
}
