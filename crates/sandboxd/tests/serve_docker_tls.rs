//! A `serve` whose engine is `DOCKER_HOST=tcp://…` with `DOCKER_TLS_VERIFY`: the way replicas
//! on several hosts share one engine. The engine here is this machine's, behind a TLS front
//! nobody here wrote (stunnel, demanding a client certificate signed by a
//! test CA made with the openssl CLI). A session is created, runs a command and ends through
//! it; the front's log shows the connections were its; and a client without the right
//! certificate is refused with an error that names DOCKER_HOST and the certificates.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Method;

use crate::serve::{Api, Env, Serve, containers_of};

/// Runs the openssl CLI in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the openssl CLI (apt install openssl)");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, in docker's layout:
/// `client/` holds ca.pem, cert.pem, key.pem (DOCKER_CERT_PATH); the front gets
/// server-cert.pem and server-key.pem.
fn make_certs(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir.join("client")).unwrap();
    let subject = format!("/CN=sandboxd test CA {name}");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            "ca-key.pem",
            "-out",
            "client/ca.pem",
        ],
    );
    let leaf = |who: &str, key: &str, cert: &str, ext: &str| {
        let csr = format!("{who}.csr");
        let extfile = format!("{who}.ext");
        std::fs::write(dir.join(&extfile), ext).unwrap();
        let subject = format!("/CN={who}");
        openssl(
            dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-subj", &subject, "-keyout", key, "-out",
                &csr,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "client/ca.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &extfile,
                "-out",
                cert,
            ],
        );
    };
    leaf(
        "server",
        "server-key.pem",
        "server-cert.pem",
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    leaf(
        "client",
        "client/key.pem",
        "client/cert.pem",
        "extendedKeyUsage=clientAuth\n",
    );
}

/// The TLS front: stunnel on a free loopback port, forwarding each client that shows a
/// certificate of the test CA to the engine's socket. Its log collects what stunnel says.
/// (socat's OpenSSL listener would do, but refuses a resumed TLS session when it verifies
/// clients, and rustls resumes.)
struct Front {
    child: Child,
    port: u16,
    log: Arc<Mutex<String>>,
}

impl Front {
    fn start(dir: &Path) -> Front {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let conf = dir.join("stunnel.conf");
        let text = format!(
            "foreground = yes\npid =\ndebug = notice\n[docker]\naccept = 127.0.0.1:{port}\n\
             connect = /var/run/docker.sock\ncert = {}\nkey = {}\nCAfile = {}\nverifyChain = yes\n",
            dir.join("server-cert.pem").display(),
            dir.join("server-key.pem").display(),
            dir.join("client/ca.pem").display(),
        );
        std::fs::write(&conf, text).unwrap();
        let mut child = Command::new("stunnel4")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("stunnel4 (apt install stunnel4; scripts/host-deps.sh installs it)");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let front = Front { child, port, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "stunnel did not listen: {}",
                front.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        front
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Client connections stunnel accepted.
    fn accepted(&self) -> usize {
        self.log().matches("accepted connection from").count()
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sandboxd doctor` with this DOCKER_HOST and certificate directory: (passed, output).
fn doctor(env: &Env, host: &str, certs: &Path) -> (bool, String) {
    let out = env
        .cmd()
        .env("DOCKER_HOST", host)
        .env("DOCKER_TLS_VERIFY", "1")
        .env("DOCKER_CERT_PATH", certs)
        .arg("doctor")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let engine_ok = text
        .lines()
        .any(|l| l.trim_start().starts_with("ok") && l.contains("Docker engine reachable"));
    (engine_ok, text)
}

#[tokio::test]
async fn serve_drives_an_engine_over_mutual_tls_and_a_stranger_is_refused() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path(), "front");
    let stranger = tempfile::tempdir().unwrap();
    make_certs(stranger.path(), "stranger");
    let front = Front::start(certs.path());
    let host = format!("tcp://127.0.0.1:{}", front.port);
    let client = certs.path().join("client");

    let env = Env::new("").await;
    let key = env.add_user("ann", &[]);
    let mut cmd = env.cmd();
    cmd.env("DOCKER_HOST", &host)
        .env("DOCKER_TLS_VERIFY", "1")
        .env("DOCKER_CERT_PATH", &client)
        .args(["serve", "--listen", "127.0.0.1:0"]);
    let serve = Serve::spawn(cmd);
    let api = Api::new(&serve, &key);
    let id = api.session().await;
    let out = api.exec(&id, "echo over-tls; id -u").await;
    assert_eq!(out["stdout"], "over-tls\n1000\n", "{out}");
    let runtime = env.runtime_id(&id).await;
    assert!(
        crate::serve::container_of(&runtime, true),
        "the session's container runs on the engine behind the front"
    );
    let accepted = front.accepted();
    assert!(
        accepted > 0,
        "serve reached the engine through the front: {}",
        front.log()
    );
    let (s, v) = api
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), None)
        .await;
    assert!((200..300).contains(&s), "{s} {v}");
    assert!(
        !crate::serve::container_of(&runtime, false),
        "removed through the front"
    );
    drop(serve);
    assert!(containers_of(&format!("serve:{}", env.user_ids()[0])).is_empty());

    // doctor with the right certificates passes; with certificates of another CA the
    // front refuses the handshake (and this client refuses the front's certificate), and the
    // error names the engine and the certificate directory.
    let (ok, text) = doctor(&env, &host, &client);
    assert!(ok, "{text}");
    let (ok, text) = doctor(&env, &host, &stranger.path().join("client"));
    assert!(!ok, "{text}");
    assert!(
        text.contains(&host)
            && text.contains(&stranger.path().join("client").display().to_string()),
        "the error names DOCKER_HOST and the certificates: {text}"
    );
}
