//! The session CA's trust material inside the real sandbox: the image's OpenSSL (through
//! python's ssl, what python programs use) reads the bundle sandboxd writes, takes it as its
//! default through `SSL_CERT_FILE`, and finds both the public roots and the session CA in it.
//! A TLS handshake with a leaf of the CA is not driven from here (the sandbox has no network,
//! and the leaf key never leaves the host): the relay tests in crates/core do that with
//! rustls, and the proxy's own tests through the in-sandbox helper.

use crate::support;

use sandboxd_core::egress::ca::SessionCa;
use sandboxd_core::egress::mitm_trust::{BUNDLE_PATH, sandbox_trust, trust_dir};
use sandboxd_core::sandbox::ShellOptions;

const CHECK: &str = r#"python3 - <<'EOF'
import ssl
ctx = ssl.create_default_context()
ours = [c for c in ctx.get_ca_certs() if ("organizationName", "sandboxd") in sum(c["subject"], ())]
print("cafile", ssl.get_default_verify_paths().cafile)
print("roots", ctx.cert_store_stats()["x509_ca"] > 100)
print("session", len(ours), ours[0]["subject"] if ours else None)
EOF"#;

#[tokio::test]
async fn the_sandbox_trusts_the_session_ca_through_ssl_cert_file() {
    let m = support::manager().await;
    let (s, _g) = support::session(&m).await;
    let sb = &s.sandbox;
    let ca = SessionCa::new("trust-test", &["api.mitm.test".to_string()]).unwrap();
    let trust = sandbox_trust(&ca);
    sb.shell(
        &format!("mkdir -p {}", trust_dir()),
        ShellOptions::default(),
    )
    .await
    .unwrap();
    for (path, data) in &trust.files {
        sb.write_file(path, data).await.unwrap();
    }
    let exports: String = trust
        .env
        .iter()
        .map(|(k, v)| format!("export {k}={v}; "))
        .collect();
    // Without the environment, the image has no default bundle at all.
    let before = sb.shell(CHECK, ShellOptions::default()).await.unwrap();
    let before = before.stdout_lossy();
    assert!(before.contains("session 0 None"), "{before}");
    let out = sb
        .shell(&format!("{exports}{CHECK}"), ShellOptions::default())
        .await
        .unwrap();
    let text = out.stdout_lossy();
    assert!(
        text.contains(&format!("cafile {BUNDLE_PATH}")),
        "{text}\n{}",
        out.stderr_lossy()
    );
    assert!(text.contains("roots True"), "{text}");
    assert!(text.contains("session 1 "), "{text}");
    assert!(text.contains("sandboxd egress CA trust-test"), "{text}");
}
