//! The fake Kubernetes API server of this crate's tests (tests/fake/, included unchanged),
//! runnable on its own, for `sandboxd bench kubernetes` and anything else that wants a
//! cluster on loopback: it starts the fake (its network plugin enforcing NetworkPolicy, v5
//! exec), writes a kubeconfig naming it to the path given, prints `ready <address>` on
//! stdout once it answers, and serves until SIGTERM or SIGINT; then it removes every pod
//! container it made (the fake's own cleanup) and the kubeconfig, and exits.
//!
//! ```text
//! cargo run -p sandboxd-kubernetes --example fake_apiserver -- /tmp/fake-kubeconfig
//! ```
//!
//! Its pods are Docker containers of the image each pod names, run by the docker CLI, so the
//! image must be on the local engine (`sandboxd image build`). A test binary's item, not a
//! product: no TLS, no authentication, loopback only.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub, dead_code)]

#[path = "../tests/fake/mod.rs"]
mod fake;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

/// A kubeconfig whose one context is the fake at `addr` (plain HTTP), namespace `sandboxd`.
fn kubeconfig(addr: std::net::SocketAddr) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: sandboxd-fake
  cluster:
    server: http://{addr}
contexts:
- name: sandboxd-fake
  context:
    cluster: sandboxd-fake
    user: sandboxd-fake
    namespace: sandboxd
current-context: sandboxd-fake
users:
- name: sandboxd-fake
  user: {{}}
"
    )
}

/// Writes the file whole or not at all (a reader never sees half of it).
fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("write {}", path.display()))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let path: PathBuf = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .context("usage: fake_apiserver KUBECONFIG_PATH (the kubeconfig to write)")?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let api = fake::FakeApi::start(false).await?;
    // Answers before it is announced: the readiness line means a client can connect.
    api.client()?
        .apiserver_version()
        .await
        .context("the fake does not answer")?;
    write_atomically(&path, &kubeconfig(api.addr))?;
    println!("ready {}", api.addr);
    std::io::stdout().flush()?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    drop(api);
    let _ = std::fs::remove_file(&path);
    Ok(())
}
