//! "No network", verified rather than assumed: a deny-all NetworkPolicy has an effect only
//! where the cluster's network plugin enforces it, and nothing in the API says whether it
//! does. So before the first session, a probe pod — the same hardened pod as a session's,
//! with the labels the policy selects — tries each `[kubernetes] egress_probe` target: a
//! name that resolves (DNS got out) or a connection that completes is a leak, and every
//! session is then refused with an error that says the plugin does not enforce the policy.
//! A probe that cannot tell (the pod does not start, python is missing) refuses too, but is
//! tried again at the next create; a clear verdict holds for the life of the process.
//!
//! What counts as blocked: a name that does not resolve and an address that does not
//! connect within 3 s (refused, unreachable, timed out). A refusal can come from a real
//! host, so a cluster with egress but no route to a target reads as blocked for that
//! target: the defaults mix an outside address, the cluster's own DNS name of the API
//! server (resolvable in any cluster that lets DNS out) and a public name.

use std::time::Duration;

use sandboxd_core::config::Limits;
use sandboxd_core::sandbox::runtime::SandboxSpec;
use sandboxd_core::sandbox::{ExecRequest, Sandbox, SandboxError};

use crate::{BACKEND, KubeRuntime, spec};

/// Runs every target at once in threads; a name lookup that hangs (a dropped DNS packet,
/// retried over the search domains) is cut at the join, so the probe ends in about 4 s.
/// Prints one line per target: `leak <target> <how>` or `blocked <target> <why>`.
const SCRIPT: &str = r#"
import ipaddress, os, socket, sys, threading
out = {}
def probe(t):
    host, _, port = t.rpartition(':')
    host = host.strip('[]')
    try:
        ipaddress.ip_address(host); named = False
    except ValueError:
        named = True
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except Exception as e:
        out[t] = 'blocked ' + t + ' resolve:' + type(e).__name__; return
    if named:
        out[t] = 'leak ' + t + ' resolved'; return
    why = 'no-address'
    for fam, typ, proto, _, addr in infos[:2]:
        s = socket.socket(fam, typ, proto); s.settimeout(3)
        try:
            s.connect(addr); out[t] = 'leak ' + t + ' connected'; return
        except Exception as e:
            why = type(e).__name__
        finally:
            s.close()
    out[t] = 'blocked ' + t + ' connect:' + why
ts = [threading.Thread(target=probe, args=(t,), daemon=True) for t in sys.argv[1:]]
for th in ts: th.start()
for th in ts: th.join(4)
for t in sys.argv[1:]: print(out.get(t, 'blocked ' + t + ' timeout'))
sys.stdout.flush(); os._exit(0)
"#;

/// How long the probe's command may run (its own cut is about 4 s).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// A verdict as remembered: Ok, or the leaks found.
pub(crate) type Isolation = Result<(), Vec<String>>;

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every target blocked, each with why.
    Isolated(Vec<String>),
    /// The targets the pod reached, each with how (resolved, connected).
    Leaks(Vec<String>),
}

/// The probe pod's spec: a session's, with the smallest limits the probe needs and an id
/// that says what it is (it is listed like any managed pod while it lives, so a probe left
/// by a process that died is removed by the reconciler).
pub(crate) fn probe_spec() -> SandboxSpec {
    use sha2::{Digest, Sha256};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let seed = format!(
        "{nanos}/{}/{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let suffix = &hex::encode(Sha256::digest(seed.as_bytes()))[..12];
    SandboxSpec {
        session_id: format!("probe{suffix}"),
        image: None,
        restore_bytes: None,
        owner: None,
        pooled: false,
        limits: Limits {
            memory_mb: 128,
            cpus: 0.25,
            workspace_mb: 16,
            tmp_mb: 16,
            ..Limits::default()
        },
        keep: false,
        replica: None,
    }
}

/// The probe's argv: `python3 -c SCRIPT TARGET…`, each target one word.
pub(crate) fn argv(targets: &[String]) -> Vec<String> {
    let mut argv = vec!["python3".to_string(), "-c".to_string(), SCRIPT.to_string()];
    argv.extend(targets.iter().cloned());
    argv
}

/// Reads the probe's output: one line per target, or the probe could not tell.
pub(crate) fn parse(stdout: &str, targets: &[String]) -> Result<Verdict, String> {
    let (mut leaks, mut blocked) = (Vec::new(), Vec::new());
    for t in targets {
        let line = stdout
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(t.as_str()))
            .ok_or_else(|| format!("the probe printed no line for {t}"))?;
        match line.split_once(' ') {
            Some(("leak", rest)) => leaks.push(rest.to_string()),
            Some(("blocked", rest)) => blocked.push(rest.to_string()),
            _ => return Err(format!("the probe printed {line:?}")),
        }
    }
    Ok(if leaks.is_empty() {
        Verdict::Isolated(blocked)
    } else {
        Verdict::Leaks(leaks)
    })
}

/// The refusal every create gets where the policy is not enforced.
pub(crate) fn not_enforced(leaks: &[String]) -> SandboxError {
    SandboxError::Backend {
        backend: BACKEND,
        operation: "start a session".into(),
        message: format!(
            "the cluster's network plugin (CNI) does not enforce NetworkPolicy: a probe pod under the deny-all policy {} reached {}, so a session would have the network its \"no network\" promises it has not. Install or enable a network plugin that enforces NetworkPolicy (Calico, Cilium, …), then restart sandboxd",
            spec::NETWORK_POLICY,
            leaks.join(", ")
        ),
    }
}

fn inconclusive(message: String) -> SandboxError {
    SandboxError::Backend {
        backend: BACKEND,
        operation: "verify that sandbox pods have no network (the probe pod)".into(),
        message: format!("{message}; no session starts until it can tell"),
    }
}

impl KubeRuntime {
    /// Runs the probe now: creates the probe pod, runs the probe in it, removes it.
    pub async fn probe_network(&self) -> Result<Verdict, SandboxError> {
        self.ensure_policy().await?;
        let ps = probe_spec();
        let pod = spec::pod(&self.settings, &ps, &self.creator());
        let name = self.create_pod(&pod, &ps.session_id).await?;
        let sandbox = self.sandbox(name.clone(), &ps.session_id, &ps.limits);
        let mut req = ExecRequest::new(argv(&self.settings.egress_probe));
        req.timeout = PROBE_TIMEOUT;
        let out = sandbox.exec(req).await;
        if let Err(e) = self.remove_pod(&name).await {
            tracing::warn!(pod = name, error = %e, "could not remove the network probe pod");
        }
        let out = out.map_err(|e| inconclusive(e.to_string()))?;
        if out.exit_code != Some(0) {
            let err: String = out.stderr_lossy().chars().take(300).collect();
            return Err(inconclusive(format!(
                "the probe exited with {:?}: {err}",
                out.exit_code
            )));
        }
        parse(&out.stdout_lossy(), &self.settings.egress_probe).map_err(inconclusive)
    }

    /// Ok once the probe found every target blocked; the refusal when it found a leak
    /// (remembered: the process must restart once the cluster is fixed); an inconclusive
    /// probe is an error now and is tried again next time. One probe at a time.
    pub async fn ensure_isolated(&self) -> Result<(), SandboxError> {
        let mut verdict = self.isolation.lock().await;
        if verdict.is_none() {
            match self.probe_network().await? {
                Verdict::Isolated(blocked) => {
                    tracing::info!(?blocked, "sandbox pods have no network (probe)");
                    *verdict = Some(Ok(()));
                }
                Verdict::Leaks(leaks) => {
                    tracing::error!(?leaks, "the network plugin does not enforce NetworkPolicy");
                    *verdict = Some(Err(leaks));
                }
            }
        }
        match verdict.as_ref() {
            Some(Err(leaks)) => Err(not_enforced(leaks)),
            _ => Ok(()),
        }
    }
}

impl KubeRuntime {
    /// For a readiness check, which must answer at once: the verdict if there is one, a
    /// probe run now if none has run, and "still running" while one runs (so checks that
    /// arrive meanwhile neither wait nor start probe pods of their own).
    pub(crate) async fn isolation_ready(&self) -> Result<(), String> {
        match self.isolation.try_lock() {
            Err(_) => Err("the network probe is still running".into()),
            Ok(v) => match v.as_ref() {
                Some(Ok(())) => Ok(()),
                Some(Err(leaks)) => Err(not_enforced(leaks).to_string()),
                None => {
                    drop(v);
                    self.ensure_isolated().await.map_err(|e| e.to_string())
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_read_per_target_and_anything_else_cannot_tell() {
        let targets = vec!["1.1.1.1:443".to_string(), "example.com:443".to_string()];
        assert_eq!(
            parse(
                "blocked 1.1.1.1:443 connect:OSError\nblocked example.com:443 resolve:gaierror\n",
                &targets
            ),
            Ok(Verdict::Isolated(vec![
                "1.1.1.1:443 connect:OSError".into(),
                "example.com:443 resolve:gaierror".into()
            ]))
        );
        assert_eq!(
            parse(
                "blocked 1.1.1.1:443 timeout\nleak example.com:443 resolved\n",
                &targets
            ),
            Ok(Verdict::Leaks(vec!["example.com:443 resolved".into()]))
        );
        assert!(parse("blocked 1.1.1.1:443 timeout\n", &targets).is_err());
        assert!(parse("", &targets).is_err());
        let message = not_enforced(&["example.com:443 resolved".into()]).to_string();
        assert!(
            message.contains("does not enforce NetworkPolicy"),
            "{message}"
        );
    }
}
