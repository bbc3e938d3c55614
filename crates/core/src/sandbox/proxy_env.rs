//! Whether a sandbox's processes see the egress proxy (`egress::proxy_env()`): on while the
//! session's policy is not `off`; and, while on, whether they also see the session CA's
//! trust variables (`mitm_trust::trust_env()`: `SSL_CERT_FILE` & co.), once the proxy that
//! injects credentials runs and the CA files are written. The host keeps the wanted state per
//! sandbox with a generation that moves on every change; what is already running catches up
//! lazily: the persistent shell exports or unsets the variables before its next command, the
//! python interpreter updates `os.environ` before its next cell, and every process started
//! from then on gets them (or not) in its environment.
//!
//! The variables are a convenience, not a fence: the sandbox can set or clear them itself,
//! and the proxy decides every connection by the session's policy whatever they say.

use std::sync::Mutex;

use crate::egress::mitm_trust::trust_env;
use crate::egress::proxy_env;

/// The wanted proxy environment of a sandbox and its generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyEnvState {
    /// Moves on at every change; what applied an older one applies this one.
    pub generation: u64,
    pub on: bool,
    /// The session CA's files are in the sandbox (its variables are set while `on`).
    pub trust: bool,
}

impl ProxyEnvState {
    /// The variables set in this state (the rest of `names()` are unset).
    fn vars(&self) -> Vec<(String, String)> {
        let mut vars = Vec::new();
        if self.on {
            vars.extend(proxy_env());
            if self.trust {
                vars.extend(trust_env());
            }
        }
        vars
    }
}

/// The host's switch for one sandbox (held by the sandbox object); it also keeps the
/// session's own environment (`set_session_env`), which every process started after it is
/// set gets before the proxy's variables and the request's own.
#[derive(Debug, Default)]
pub struct ProxySwitch {
    state: Mutex<ProxyEnvState>,
    session: Mutex<Vec<(String, String)>>,
}

impl ProxySwitch {
    /// Turns the variables on or off; a call that changes nothing keeps the generation.
    pub fn set(&self, on: bool) {
        self.change(|s| &mut s.on, on);
    }

    /// Turns the trust variables on or off (they are set only while `on` too).
    pub fn set_trust(&self, trust: bool) {
        self.change(|s| &mut s.trust, trust);
    }

    fn change(&self, field: impl Fn(&mut ProxyEnvState) -> &mut bool, to: bool) {
        if let Ok(mut s) = self.state.lock()
            && *field(&mut s) != to
        {
            *field(&mut s) = to;
            s.generation += 1;
        }
    }

    pub fn state(&self) -> ProxyEnvState {
        self.state.lock().map(|s| *s).unwrap_or_default()
    }

    /// Sets the session's environment (E2B's `envVars`): given to every process started from
    /// now on, never written into a command line. What already runs does not see it (the
    /// caller restarts the shell).
    pub fn set_session_env(&self, env: Vec<(String, String)>) {
        if let Ok(mut s) = self.session.lock() {
            *s = env;
        }
    }

    /// What a process started now adds to its environment (before the request's own): the
    /// session's variables, then the proxy's.
    pub fn spawn_env(&self) -> Vec<(String, String)> {
        let mut env = self.session.lock().map(|s| s.clone()).unwrap_or_default();
        env.extend(self.state().vars());
        env
    }
}

/// Every name a state may set (those it does not set are unset).
fn names() -> Vec<String> {
    proxy_env()
        .into_iter()
        .chain(trust_env())
        .map(|(k, _)| k)
        .collect()
}

/// A bash prefix that brings a running shell to `state`: `builtin export K='v' …;` for what
/// it sets, `builtin unset K …;` for the rest. The values are our constants (no quote in
/// them, checked).
pub fn shell_line(state: ProxyEnvState) -> String {
    let vars = state.vars();
    let mut line = String::new();
    if !vars.is_empty() {
        let pairs: Vec<String> = vars
            .iter()
            .filter(|(_, v)| !v.contains('\''))
            .map(|(k, v)| format!("{k}='{v}'"))
            .collect();
        line.push_str(&format!("builtin export {}; ", pairs.join(" ")));
    }
    let unset: Vec<String> = names()
        .into_iter()
        .filter(|n| !vars.iter().any(|(k, _)| k == n))
        .collect();
    if !unset.is_empty() {
        line.push_str(&format!("builtin unset {}; ", unset.join(" ")));
    }
    line
}

/// A python cell that brings a running interpreter to `state` (its `os.environ`, which the
/// processes it starts inherit). Leaves no name behind and has no value.
pub fn python_cell(state: ProxyEnvState) -> String {
    let vars = state.vars();
    let pairs: Vec<String> = vars.iter().map(|(k, v)| format!("{k:?}: {v:?}")).collect();
    let unset: Vec<String> = names()
        .into_iter()
        .filter(|n| !vars.iter().any(|(k, _)| k == n))
        .map(|k| format!("{k:?}"))
        .collect();
    format!(
        "__import__('os').environ.update({{{}}})\n[__import__('os').environ.pop(k, None) for k in [{}]]\nNone\n",
        pairs.join(", "),
        unset.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_moves_the_generation_and_a_repeat_does_not() {
        let s = ProxySwitch::default();
        assert_eq!(s.state(), ProxyEnvState::default());
        assert!(s.spawn_env().is_empty());
        s.set(true);
        s.set(true);
        assert_eq!(
            s.state(),
            ProxyEnvState {
                generation: 1,
                on: true,
                trust: false,
            }
        );
        assert!(
            s.spawn_env()
                .iter()
                .any(|(k, v)| k == "HTTPS_PROXY" && v.contains("3128"))
        );
        assert!(!s.spawn_env().iter().any(|(k, _)| k == "SSL_CERT_FILE"));
        s.set_trust(true);
        s.set_trust(true);
        assert_eq!(s.state().generation, 2);
        assert!(s.spawn_env().iter().any(|(k, _)| k == "SSL_CERT_FILE"));
        assert!(
            s.spawn_env()
                .iter()
                .any(|(k, _)| k == "NODE_EXTRA_CA_CERTS")
        );
        s.set(false);
        assert_eq!(
            s.state(),
            ProxyEnvState {
                generation: 3,
                on: false,
                trust: true,
            }
        );
        assert!(s.spawn_env().is_empty(), "off sets nothing, trust or not");
    }

    #[test]
    fn the_session_env_comes_first_and_stays_out_of_the_lines() {
        let s = ProxySwitch::default();
        s.set_session_env(vec![("TOKEN".into(), "it's secret".into())]);
        s.set(true);
        let env = s.spawn_env();
        assert_eq!(env[0], ("TOKEN".to_string(), "it's secret".to_string()));
        assert!(env.iter().any(|(k, _)| k == "HTTPS_PROXY"));
        assert!(!shell_line(s.state()).contains("secret"));
        assert!(!python_cell(s.state()).contains("secret"));
        s.set(false);
        assert_eq!(s.spawn_env().len(), 1, "the proxy's go, the session's stay");
    }

    #[test]
    fn the_shell_and_python_lines_name_every_variable() {
        let st = |on, trust| ProxyEnvState {
            generation: 1,
            on,
            trust,
        };
        for name in ["HTTP_PROXY", "https_proxy", "NO_PROXY"] {
            assert!(shell_line(st(true, false)).contains(&format!("{name}='")));
            assert!(shell_line(st(false, false)).contains(name));
            assert!(python_cell(st(true, false)).contains(&format!("\"{name}\": ")));
            assert!(python_cell(st(false, false)).contains(&format!("\"{name}\"")));
        }
        assert!(shell_line(st(false, false)).starts_with("builtin unset "));
        assert!(!shell_line(st(false, true)).contains("export"));
        // On without trust: the proxy exported, the CA's variables unset (a session whose
        // proxy lost its CA must not keep pointing at stale files).
        let line = shell_line(st(true, false));
        assert!(
            line.contains("builtin unset ") && line.contains("SSL_CERT_FILE"),
            "{line}"
        );
        assert!(!line.contains("SSL_CERT_FILE='"), "{line}");
        let line = shell_line(st(true, true));
        assert!(
            line.contains("SSL_CERT_FILE='/tmp/sandboxd-egress/ca-bundle.pem'"),
            "{line}"
        );
        assert!(!line.contains("unset"), "{line}");
        let cell = python_cell(st(true, true));
        assert!(cell.contains("\"REQUESTS_CA_BUNDLE\": \"/tmp/"), "{cell}");
    }
}
