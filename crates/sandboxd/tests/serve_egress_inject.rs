//! Credentials that never enter the sandbox (issue 24, item 5), through a real `serve`, the
//! real engine and image, and an agent run with the fake LLM: an HTTPS "API" on this host
//! (`localhost`, its self-signed root given to the proxy through `[egress] extra_roots_pem`,
//! opened by the admin's `[research] allow`) gets `Authorization: Bearer <secret>` on every
//! request that curl and python's urllib (and requests, when the image has it) send from the
//! sandbox, the secret read from serve's own environment. The API echoes each request head,
//! so the sandbox would see the value if the relay did not mask it. Then the secret is looked
//! for everywhere it must not be: the shell's `env`, every `/proc/*/environ` and `cmdline`,
//! every file (grep over `/`, without /proc and /sys; device nodes skipped), the run's events, the session's
//! egress records and serve's log; each search is first shown to find a canary planted the
//! same way, so a search that cannot find anything fails the test. A plain-HTTP request to
//! the API is refused (`credential-needs-https`) and never reaches it; a second HTTPS host
//! without a credential is tunneled untouched: the certificate seen from inside is its own.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::serve;

use reqwest::Method;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::egress::support::{echo_https, host_address};
use crate::support::fake_llm::{FakeLlm, Reply};
use serve::runs::{SERVER, follow_all, llm_config, start_run};
use serve::{Api, Env};

const VAR: &str = "SANDBOXD_TEST_INJECT_SECRET";

/// Bash that counts, for the needle given reversed (so no command line, event or file of
/// the test holds it), its occurrences in the shell's `env`, in every process's environ and
/// cmdline, and the files under / holding it. The needle lives only in a pipe.
pub(crate) fn search(reversed: &str) -> String {
    format!(
        "needle() {{ python3 -c 'import sys; sys.stdout.write(sys.stdin.read().strip()[::-1])' <<< '{reversed}'; }}\n\
         echo \"env $(env | grep -cF -f <(needle))\"\n\
         echo \"proc $(cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -cF -f <(needle))\"\n\
         echo \"files $(grep -rlsF -D skip -f <(needle) --exclude-dir=proc --exclude-dir=sys / | wc -l)\"\n"
    )
}

/// The three counts `search` printed.
pub(crate) fn counts(out: &str) -> (u64, u64, u64) {
    let n = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {k} count in {out}"))
    };
    (n("env"), n("proc"), n("files"))
}

/// Python in the sandbox: the SHA-256 of the certificate `host:port` presents through the
/// proxy (not verified: only looked at).
pub(crate) fn fingerprint(host: &str, port: u16) -> String {
    format!(
        "python3 - <<'EOF'\n\
import hashlib, socket, ssl\n\
s = socket.create_connection(('127.0.0.1', 3128), timeout=30)\n\
s.sendall(b'CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n')\n\
head = b''\n\
while b'\\r\\n\\r\\n' not in head: head += s.recv(1)\n\
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)\n\
ctx.check_hostname = False\n\
ctx.verify_mode = ssl.CERT_NONE\n\
t = ctx.wrap_socket(s, server_hostname='{host}')\n\
print('fp', hashlib.sha256(t.getpeercert(True)).hexdigest())\n\
EOF"
    )
}

/// Runs `command` in the session (up to ten minutes: the file search reads the whole image)
/// and returns its stdout.
pub(crate) async fn exec(api: &Api, id: &str, command: &str) -> String {
    let (s, v) = api
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/exec"),
            Some(json!({ "command": command, "timeout": 600 })),
        )
        .await;
    assert_eq!(s, 200, "exec: {v}");
    format!(
        "{}\n[stderr] {}",
        v["stdout"].as_str().unwrap_or_default(),
        v["stderr"].as_str().unwrap_or_default()
    )
}

/// Asserts that `secret` is in no environment, command line or file of session `id`, after
/// the same searches found a canary planted in a process's environment and in a file (a
/// search that cannot find anything fails).
pub(crate) async fn assert_absent_from_sandbox(api: &Api, id: &str, secret: &str) {
    let canary = format!("canary-{:032x}", rand::random::<u128>());
    let rev = |s: &str| s.chars().rev().collect::<String>();
    // (a process that keeps it in its environment: `export` does not change the shell's own)
    let planted = format!(
        "export PLANTED=\"$(python3 -c 'import sys; print(sys.argv[1][::-1])' {})\"; (sleep 120 </dev/null >/dev/null 2>&1 &); printf %s \"$PLANTED\" > /workspace/planted.txt; {}",
        rev(&canary),
        search(&rev(&canary))
    );
    let (e, p, f) = counts(&exec(api, id, &planted).await);
    assert!(
        e >= 1 && p >= 1 && f >= 1,
        "the search must find the canary: {e} {p} {f}"
    );
    let (e, p, f) = counts(&exec(api, id, &search(&rev(secret))).await);
    assert_eq!((e, p, f), (0, 0, 0), "the secret is in the sandbox");
}

/// Puts the config back as `users add` read it (without the credential whose variable only
/// serve has) before the environment's drop reads it again.
struct Restore(std::path::PathBuf, String);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, &self.1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_credential_reaches_the_api_and_nothing_in_the_sandbox_events_or_logs() {
    let secret = format!("sk-inject-{:032x}", rand::random::<u128>());
    let api_srv = echo_https("127.0.0.1".parse().unwrap(), vec!["localhost".into()]).await;
    let addr = host_address();
    let other = echo_https(addr, vec![addr.to_string()]).await;
    let py = "import os, urllib.request\n\
        [os.environ.pop(k, None) for k in ('NO_PROXY', 'no_proxy')]\n\
        print(urllib.request.urlopen('https://localhost:PORT/urllib', timeout=30).read().decode())\n\
        try:\n    import requests\n    print(requests.get('https://localhost:PORT/requests', timeout=30).text)\n\
        except ImportError:\n    print('requests: not in the image')\n"
        .replace("PORT", &api_srv.port.to_string());
    let llm = FakeLlm::start(vec![
        Reply::tool(
            "bash",
            json!({"command": format!(
                "echo \"trust=$SSL_CERT_FILE\"; env -u NO_PROXY -u no_proxy curl -sS --max-time 30 -H 'Authorization: Bearer forged' https://localhost:{}/curl",
                api_srv.port
            )}),
        ),
        Reply::tool("python", json!({ "code": py })),
        Reply::tool("terminate", json!({"status": "success", "answer": "done"})),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("roots.pem");
    std::fs::write(&roots, &api_srv.root_pem).unwrap();
    let env = Env::new(&format!(
        "{}{SERVER}[research]\nallow = [\"localhost\", \"{addr}\"]\nports = [80, 443, {}, {}]\n\
         [egress]\nwidest = \"any\"\nextra_roots_pem = {:?}\n",
        llm_config(&llm),
        api_srv.port,
        other.port,
        roots.display().to_string()
    ))
    .await;
    let key = env.add_user("ann", &[]);
    // Added after `users add`, which loads the config without the secret in its environment.
    let creds = "[[egress.credentials]]\nhost = \"localhost\"\nheader = \"Authorization\"\n\
                 value_env = \"SANDBOXD_TEST_INJECT_SECRET\"\nprefix = \"Bearer \"\n";
    let text = std::fs::read_to_string(&env.config).unwrap();
    std::fs::write(&env.config, format!("{text}\n{creds}")).unwrap();
    let _restore = Restore(env.config.clone(), text);
    let mut cmd = env.cmd();
    cmd.env(VAR, &secret)
        .env(
            "SANDBOXD_LOG",
            "info,sandboxd=debug,sandboxd_core=debug,sandboxd_server=debug",
        )
        .args(["serve", "--listen", "127.0.0.1:0"]);
    let serve = serve::Serve::spawn(cmd);
    let api = Api::new(&serve, &key);

    let run = start_run(
        &api,
        json!({"task": "call the API", "session": {"egress": format!("localhost,{addr}")}}),
    )
    .await;
    let (run_id, id) = (
        run["id"].as_str().unwrap().to_string(),
        run["session_id"].as_str().unwrap().to_string(),
    );
    let events = serde_json::to_string(
        &follow_all(&api, &run_id)
            .await
            .iter()
            .map(|e| e.data.clone())
            .collect::<Vec<_>>(),
    )
    .unwrap();

    // The API got the header on every request, the sandbox's forged one replaced.
    let heads = api_srv.heads.lock().unwrap().clone();
    let bearer = format!("Authorization: Bearer {secret}\r\n");
    assert!(
        heads.len() >= 2,
        "curl and urllib reached the API: {heads:?}\n{events}"
    );
    for h in &heads {
        assert!(h.contains(&bearer) && !h.contains("forged"), "{h}");
    }
    // The sandbox got the answers (the echoed value masked), with the session CA trusted.
    assert!(
        events.contains("trust=/tmp/sandboxd-egress/ca-bundle.pem"),
        "{events}"
    );
    for path in ["GET /curl", "GET /urllib"] {
        assert!(
            events.contains(&format!("api saw:\\n{path}")),
            "{path}: {events}"
        );
    }
    assert!(events.contains("Authorization: Bearer ****"), "{events}");
    assert!(
        events.contains("\"egress\""),
        "the run's events carry the egress audit: {events}"
    );

    // Plain HTTP to the credential host: refused with the rule, the API never reached.
    let before = heads.len();
    let out = exec(
        &api,
        &id,
        &format!(
            "env -u NO_PROXY -u no_proxy curl -sS -i --max-time 30 http://localhost:{}/plain",
            api_srv.port
        ),
    )
    .await;
    assert!(
        out.contains("403") && out.contains("credential-needs-https"),
        "{out}"
    );
    assert_eq!(api_srv.heads.lock().unwrap().len(), before);

    // The host without a credential is tunneled: its own certificate; the API's is ours.
    let own = hex::encode(Sha256::digest(&other.cert_der));
    let out = exec(&api, &id, &fingerprint(&addr.to_string(), other.port)).await;
    assert!(out.contains(&format!("fp {own}")), "{out}");
    let api_own = hex::encode(Sha256::digest(&api_srv.cert_der));
    let out = exec(&api, &id, &fingerprint("localhost", api_srv.port)).await;
    assert!(
        out.contains("fp ") && !out.contains(&api_own),
        "intercepted: {out}"
    );

    assert_absent_from_sandbox(&api, &id, &secret).await;

    let (_, egress) = api
        .json(Method::GET, &format!("/v1/sessions/{id}/egress"), None)
        .await;
    let egress = egress.to_string();
    assert!(egress.contains("localhost"), "{egress}");
    let log = serve.log.lock().unwrap().clone();
    assert!(
        log.contains("CONNECT localhost:"),
        "the log has the egress records: {log}"
    );
    for (what, text) in [
        ("events", &events),
        ("egress records", &egress),
        ("log", &log),
    ] {
        assert!(!text.contains(&secret), "the secret is in the {what}");
    }
}

/// The CLI starts its proxy with the same injector: `sandboxd exec --egress` reaches the API
/// with the header added, and neither its output nor its log shows the value.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_injects_the_credential_too() {
    let secret = format!("sk-cli-{:032x}", rand::random::<u128>());
    let api_srv = echo_https("127.0.0.1".parse().unwrap(), vec!["localhost".into()]).await;
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("roots.pem");
    std::fs::write(&roots, &api_srv.root_pem).unwrap();
    let env = Env::new(&format!(
        "[research]\nallow = [\"localhost\"]\nports = [80, 443, {}]\n\
         [egress]\nwidest = \"any\"\nextra_roots_pem = {:?}\n",
        api_srv.port,
        roots.display().to_string()
    ))
    .await;
    let creds = "[[egress.credentials]]\nhost = \"localhost\"\nheader = \"Authorization\"\n\
                 value_env = \"SANDBOXD_TEST_INJECT_SECRET\"\nprefix = \"Bearer \"\n";
    let text = std::fs::read_to_string(&env.config).unwrap();
    std::fs::write(&env.config, format!("{text}\n{creds}")).unwrap();
    let _restore = Restore(env.config.clone(), text);
    let line = format!(
        "echo trust=$SSL_CERT_FILE; env -u NO_PROXY -u no_proxy curl -sS --max-time 30 https://localhost:{}/cli",
        api_srv.port
    );
    let out = tokio::task::spawn_blocking({
        let mut cmd = env.cmd();
        cmd.env(VAR, &secret).env("SANDBOXD_LOG", "info").args([
            "exec",
            "--egress",
            "localhost",
            "--",
            "sh",
            "-c",
            &line,
        ]);
        move || cmd.output().unwrap()
    })
    .await
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("trust=/tmp/sandboxd-egress/ca-bundle.pem"),
        "{stdout}"
    );
    assert!(stdout.contains("api saw:\nGET /cli"), "{stdout}\n{stderr}");
    assert!(stdout.contains("Authorization: Bearer ****"), "{stdout}");
    let heads = api_srv.heads.lock().unwrap().clone();
    let bearer = format!("Authorization: Bearer {secret}\r\n");
    assert!(heads.iter().any(|h| h.contains(&bearer)), "{heads:?}");
    assert!(!stdout.contains(&secret) && !stderr.contains(&secret));
}
