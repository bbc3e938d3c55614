//! Whether a sandbox's processes see the egress proxy (`egress::proxy_env()`): on while the
//! session's policy is not `off`. The host keeps the wanted state per sandbox with a
//! generation that moves on every change; what is already running catches up lazily: the
//! persistent shell exports or unsets the variables before its next command, the python
//! interpreter updates `os.environ` before its next cell, and every process started from
//! then on gets them (or not) in its environment.
//!
//! The variables are a convenience, not a fence: the sandbox can set or clear them itself,
//! and the proxy decides every connection by the session's policy whatever they say.

use std::sync::Mutex;

use crate::egress::proxy_env;

/// The wanted proxy environment of a sandbox and its generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyEnvState {
    /// Moves on at every change; what applied an older one applies this one.
    pub generation: u64,
    pub on: bool,
}

/// The host's switch for one sandbox (held by the sandbox object).
#[derive(Debug, Default)]
pub struct ProxySwitch {
    state: Mutex<ProxyEnvState>,
}

impl ProxySwitch {
    /// Turns the variables on or off; a call that changes nothing keeps the generation.
    pub fn set(&self, on: bool) {
        if let Ok(mut s) = self.state.lock()
            && s.on != on
        {
            s.on = on;
            s.generation += 1;
        }
    }

    pub fn state(&self) -> ProxyEnvState {
        self.state.lock().map(|s| *s).unwrap_or_default()
    }

    /// What a process started now adds to its environment (before the request's own).
    pub fn spawn_env(&self) -> Vec<(String, String)> {
        if self.state().on {
            proxy_env()
        } else {
            Vec::new()
        }
    }
}

/// The names `proxy_env()` sets (and an `off` unsets).
fn names() -> Vec<String> {
    proxy_env().into_iter().map(|(k, _)| k).collect()
}

/// A bash prefix that brings a running shell to `on`: `builtin export K='v' …;` or
/// `builtin unset K …;`. The values are our constants (no quote in them, checked).
pub fn shell_line(on: bool) -> String {
    if on {
        let pairs: Vec<String> = proxy_env()
            .into_iter()
            .filter(|(_, v)| !v.contains('\''))
            .map(|(k, v)| format!("{k}='{v}'"))
            .collect();
        format!("builtin export {}; ", pairs.join(" "))
    } else {
        format!("builtin unset {}; ", names().join(" "))
    }
}

/// A python cell that brings a running interpreter to `on` (its `os.environ`, which the
/// processes it starts inherit). Leaves no name behind and has no value.
pub fn python_cell(on: bool) -> String {
    let body = if on {
        let pairs: Vec<String> = proxy_env()
            .into_iter()
            .map(|(k, v)| format!("{k:?}: {v:?}"))
            .collect();
        format!("__import__('os').environ.update({{{}}})", pairs.join(", "))
    } else {
        let keys: Vec<String> = names().iter().map(|k| format!("{k:?}")).collect();
        format!(
            "[__import__('os').environ.pop(k, None) for k in ({},)]\nNone",
            keys.join(", ")
        )
    };
    format!("{body}\n")
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
                on: true
            }
        );
        assert!(
            s.spawn_env()
                .iter()
                .any(|(k, v)| k == "HTTPS_PROXY" && v.contains("3128"))
        );
        s.set(false);
        assert_eq!(
            s.state(),
            ProxyEnvState {
                generation: 2,
                on: false
            }
        );
    }

    #[test]
    fn the_shell_and_python_lines_name_every_variable() {
        for name in ["HTTP_PROXY", "https_proxy", "NO_PROXY"] {
            assert!(shell_line(true).contains(&format!("{name}='")));
            assert!(shell_line(false).contains(name));
            assert!(python_cell(true).contains(&format!("\"{name}\": ")));
            assert!(python_cell(false).contains(&format!("\"{name}\"")));
        }
        assert!(shell_line(false).starts_with("builtin unset "));
    }
}
