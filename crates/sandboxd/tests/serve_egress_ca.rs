//! A session's CA exists only while it has a credential that applies (issue 24, item 5),
//! through a real `serve` with `[egress] credential_key_file`, the real engine and image: a
//! session without a credential has no CA files, no trust variables and no Chromium pin, and
//! the certificate its sandbox sees is the server's own (tunneled, not intercepted); a
//! credential attached while it runs (here with `sandboxd egress credentials set`, on the
//! store, which serve's upkeep follows) brings the files, the variables, the header and the
//! pin (the browser started before it is started again); a session whose policy cannot reach
//! the host gets none of it; once the credential is removed the files and variables go.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::egress::support::echo_https;
use crate::serve::{Api, Env};
use crate::serve_egress_inject::{exec, fingerprint};
use crate::serve_egress_user_creds::key_file;

/// What the sandbox trusts: the CA directory's files and the trust variables.
const TRUST: &str = "ls /tmp/sandboxd-egress 2>&1; echo \"[$SSL_CERT_FILE|$REQUESTS_CA_BUNDLE|$NODE_EXTRA_CA_CERTS]\"";
const PIN: &str = "--ignore-certificate-errors-spki-list=";

/// Chromium's command lines in the session (after a browser action started it).
async fn chromium(api: &Api, id: &str) -> String {
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/tools/browser_use"),
            Some(json!({"action": "go_to_url", "url": "about:blank"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let list = "for p in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $p 2>/dev/null; echo; done | grep -i chrom | grep -v grep || true";
    exec(api, id, list).await
}

/// Runs `sandboxd egress credentials ARGS` with `stdin`; its output.
fn cli(env: &Env, args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = env
        .cmd()
        .args(["egress", "credentials"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Waits (the upkeep runs every second) until `check` holds of the session's TRUST output.
async fn until(api: &Api, id: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = exec(api, id, TRUST).await;
        if check(&out) {
            return out;
        }
        assert!(Instant::now() < deadline, "{what}: {out}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_has_a_ca_only_while_a_credential_applies() {
    let secret = format!("sk-ca-{:032x}", rand::random::<u128>());
    let api_srv = echo_https("127.0.0.1".parse().unwrap(), vec!["localhost".into()]).await;
    let port = api_srv.port;
    let own = hex::encode(Sha256::digest(&api_srv.cert_der));
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("roots.pem");
    std::fs::write(&roots, &api_srv.root_pem).unwrap();
    let key = key_file(dir.path());
    let env = Env::new(&format!(
        "[research]\nallow = [\"localhost\"]\nports = [80, 443, {port}]\n\
         [egress]\nwidest = \"any\"\nextra_roots_pem = {:?}\ncredential_key_file = {:?}\n",
        roots.display().to_string(),
        key.display().to_string(),
    ))
    .await;
    let ann_key = env.add_user("ann", &[]);
    let serve = env.start();
    let ann = Api::new(&serve, &ann_key);
    let (s, v) = ann
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"egress": "localhost"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let (s, v) = ann
        .json(
            Method::POST,
            "/v1/sessions",
            Some(json!({"egress": "a.test"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let elsewhere = v["id"].as_str().unwrap().to_string();

    // No credential: no files, no variables, no pin; the server's own certificate.
    let out = exec(&ann, &id, TRUST).await;
    assert!(
        out.contains("No such file") && out.contains("[||]"),
        "{out}"
    );
    let out = exec(&ann, &id, &fingerprint("localhost", port)).await;
    assert!(
        out.contains(&format!("fp {own}")),
        "tunneled untouched: {out}"
    );
    let procs = chromium(&ann, &id).await;
    assert!(
        procs.contains("--proxy-server") && !procs.contains(PIN),
        "{procs}"
    );

    // Attached on the host, never in argv: the upkeep brings the CA in.
    let set = cli(
        &env,
        &[
            "set",
            "localhost",
            "--user",
            "ann",
            "--header",
            "Authorization",
            "--prefix",
            "Bearer ",
        ],
        &format!("{secret}\n"),
    );
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let out = until(&ann, &id, "the CA arrives", |o| {
        o.contains("ca-bundle.pem") && o.contains("[/tmp/sandboxd-egress/ca-bundle.pem|")
    })
    .await;
    assert!(out.contains("ca.pem"), "{out}");
    let out = exec(&ann, &id, &fingerprint("localhost", port)).await;
    assert!(
        out.contains("fp ") && !out.contains(&own),
        "intercepted now: {out}"
    );
    let out = exec(
        &ann,
        &id,
        &format!(
            "env -u NO_PROXY -u no_proxy curl -sS --max-time 30 https://localhost:{port}/with"
        ),
    )
    .await;
    assert!(out.contains("Authorization: Bearer ****"), "{out}");
    let bearer = format!("Authorization: Bearer {secret}\r\n");
    assert!(
        api_srv
            .heads
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.contains("/with") && h.contains(&bearer))
    );
    let procs = chromium(&ann, &id).await;
    assert!(
        procs.contains(PIN),
        "the browser is started again with the pin: {procs}"
    );
    // A session whose policy cannot reach the host: no CA for it.
    let out = exec(&ann, &elsewhere, TRUST).await;
    assert!(
        out.contains("No such file") && out.contains("[||]"),
        "{out}"
    );

    // Removed: the files and variables go, the server's own certificate again.
    let rm = cli(&env, &["remove", "localhost", "--user", "ann"], "");
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    until(&ann, &id, "the CA goes", |o| {
        o.contains("No such file") && o.contains("[||]")
    })
    .await;
    let out = exec(&ann, &id, &fingerprint("localhost", port)).await;
    assert!(out.contains(&format!("fp {own}")), "{out}");
    let log = serve.log.lock().unwrap().clone();
    assert!(!log.contains(&secret), "the secret is in serve's log");
}
