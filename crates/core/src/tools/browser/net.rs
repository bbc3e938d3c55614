//! What the browser may open: the sandbox's own pages always, other hosts when the session's
//! egress policy allows them.
//!
//! Chromium runs with `--proxy-server` pointing at the session's egress proxy on the
//! sandbox's loopback (chromium.rs), so every request to another host (sub-resources,
//! redirects, WebSockets) goes through the host-side proxy, which checks the policy again at
//! every connection. The check here only makes the model's own `go_to_url`/`open_tab` fail
//! at once, with the rule that refused, instead of on an error page: it is a courtesy, the
//! proxy is the guarantee. Loopback stays direct (Chromium never proxies it), which keeps
//! servers started inside the sandbox working with egress off.

use std::sync::Arc;

pub use crate::egress::mitm_trust::ChromiumArgs;
use crate::egress::{EgressPolicy, Host, PolicySource};

/// The session's egress, as the browser sees it.
#[derive(Clone)]
pub struct Egress {
    /// The session's policy, read at every go_to_url, open_tab and web_search (so a policy
    /// changed while the session runs takes effect at the next one).
    pub source: Arc<dyn PolicySource>,
    /// The policy when the tools were built: the tool's description names its hosts (a
    /// description is fixed for the session; refusals always name the current rule).
    pub at_start: EgressPolicy,
    /// Added to Chromium's command line, read at each start: the pin of the session's
    /// credential-injection leaf key (egress/mitm_trust.rs) while the session has a
    /// credential, nothing otherwise.
    pub chromium_args: ChromiumArgs,
}

/// How to change a session's egress, for refusals.
const HOW_TO_ENABLE: &str = "the session's egress policy decides which hosts the browser may open: \
     it is set with `PUT /v1/sessions/{id}/egress` (or `--egress` on sandboxd run, exec and tool)";

/// The sandbox's own addresses: never proxied, always allowed.
fn is_local(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `url` may be opened under `policy`; the refusal names the rule and what to do.
pub fn check_url(url: &str, policy: &EgressPolicy) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a valid URL ({e}); give a full URL such as http://localhost:8000/ or file:///workspace/index.html"))?;
    match parsed.scheme() {
        "file" | "about" | "data" => Ok(()),
        "http" | "https" => {
            let raw = parsed.host_str().unwrap_or_default();
            let host = raw.trim_start_matches('[').trim_end_matches(']');
            if is_local(host) {
                return Ok(());
            }
            // 0.0.0.0 and :: mean "this machine" to Chromium: neither local by name nor a
            // host on the web.
            if host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_unspecified())
            {
                return Err(format!(
                    "cannot open {url:?}: {host} is not an address a page can be fetched from; use http://localhost:PORT/ for a server inside the sandbox"
                ));
            }
            let verdict = policy.check(&Host::parse(host));
            if verdict.allowed {
                return Ok(());
            }
            Err(refusal(url, host, &verdict.rule, policy))
        }
        other => Err(format!(
            "cannot open {url:?}: the browser opens http(s), file:, data: and about: URLs only, not {other}:"
        )),
    }
}

/// The refusal of a host by the policy (or of every host, with egress off).
pub fn refusal(url: &str, host: &str, rule: &str, policy: &EgressPolicy) -> String {
    if policy.is_off() {
        return format!(
            "cannot open {url:?}: egress is off for this session (rule \"egress off\"), so the sandbox has no network. \
             Only file://, data:, about: and http(s) on localhost / 127.0.0.1 / [::1] (servers started inside the sandbox) \
             can be opened. To reach other hosts, {HOW_TO_ENABLE}."
        );
    }
    format!(
        "cannot open {url:?}: the session's egress policy refuses {host} (rule {rule:?}; the policy allows: {}). \
         Use an allowed host, or ask for a wider policy: {HOW_TO_ENABLE}.",
        shown(policy, 300)
    )
}

/// The policy's rules for the model, cut at about `max` bytes (a policy may hold 256 rules).
fn shown(policy: &EgressPolicy, max: usize) -> String {
    let all = policy.items().join(", ");
    if all.len() <= max {
        return all;
    }
    let mut cut = max;
    while !all.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{} …", &all[..cut])
}

/// The part of the tool's description that says what can be opened.
pub fn reach(policy: Option<&EgressPolicy>) -> String {
    match policy {
        None | Some(EgressPolicy::Off) => {
            "Egress is off: the sandbox has NO network, so only file://, data:, about: and \
             http(s)://localhost (servers you start in the sandbox) can be opened."
                .into()
        }
        Some(p) => format!(
            "It opens file://, data:, about:, http(s)://localhost (servers in the sandbox) and http(s) URLs of hosts \
             the session's egress policy allows (now: {}; it may change: a refusal names the rule).",
            shown(p, 120)
        ),
    }
}

/// A navigation that failed in Chromium (`net::ERR_…`), said so that the model knows why.
pub fn load_failure(url: &str, error: &str) -> String {
    let error: String = error.chars().take(200).collect();
    let why = if error.contains("ERR_PROXY_CONNECTION_FAILED") {
        " (the session's egress proxy is not running: egress is off or was not started, so nothing outside the sandbox can be reached)"
    } else if error.contains("ERR_TUNNEL_CONNECTION_FAILED") {
        " (the session's egress proxy refused or could not make the connection: the host is not allowed by the egress policy or could not be reached)"
    } else if error.contains("ERR_NAME_NOT_RESOLVED") {
        " (the host name does not resolve)"
    } else {
        ""
    };
    format!("could not load {url:?}: {error}{why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(raw: &str) -> EgressPolicy {
        EgressPolicy::parse(raw).unwrap()
    }

    #[test]
    fn sandbox_local_urls_pass_under_every_policy() {
        for p in [EgressPolicy::Off, policy("a.org"), EgressPolicy::any()] {
            for ok in [
                "http://localhost:8000/",
                "https://LOCALHOST/x",
                "http://127.0.0.1:9/",
                "http://127.1.2.3/",
                "http://[::1]:8000/",
                "file:///workspace/a.html",
                "about:blank",
                "data:text/html,<h1>x</h1>",
            ] {
                assert_eq!(check_url(ok, &p), Ok(()), "{ok} under {p}");
            }
            for bad in [
                "ftp://localhost/",
                "chrome://settings",
                "javascript:alert(1)",
                "http://0.0.0.0:8000/",
                "http://[::]:8000/",
            ] {
                assert!(check_url(bad, &p).is_err(), "{bad} under {p}");
            }
        }
        assert!(
            check_url("not a url", &EgressPolicy::Off)
                .unwrap_err()
                .contains("not a valid URL")
        );
    }

    #[test]
    fn with_egress_off_other_hosts_are_refused_naming_the_rule_and_the_way_to_enable() {
        for bad in [
            "https://example.com/",
            "http://localhost.evil.com/",
            "http://10.0.0.1/",
        ] {
            let e = check_url(bad, &EgressPolicy::Off).unwrap_err();
            assert!(e.contains("rule \"egress off\""), "{e}");
            assert!(e.contains("no network"), "{e}");
            assert!(e.contains("PUT /v1/sessions/{id}/egress"), "{e}");
            assert!(e.contains("--egress"), "{e}");
        }
    }

    #[test]
    fn a_policy_allows_its_hosts_and_refuses_others_with_the_rule() {
        let p = policy("example.org,*.wikipedia.org,!ads.wikipedia.org");
        assert_eq!(check_url("https://example.org/x", &p), Ok(()));
        assert_eq!(check_url("http://en.wikipedia.org/wiki/A", &p), Ok(()));
        let e = check_url("https://other.org/", &p).unwrap_err();
        assert!(e.contains("refuses other.org"), "{e}");
        assert!(e.contains("rule \"not in the allowlist\""), "{e}");
        assert!(
            e.contains("example.org, *.wikipedia.org, !ads.wikipedia.org"),
            "{e}"
        );
        let e = check_url("https://ads.wikipedia.org/", &p).unwrap_err();
        assert!(e.contains("rule \"!ads.wikipedia.org\""), "{e}");
        // The scheme rules hold whatever the policy.
        assert!(check_url("ftp://example.org/", &p).is_err());
        // "any" lets every host through here; the proxy applies the SSRF rules.
        assert_eq!(
            check_url("https://anything.example/", &EgressPolicy::any()),
            Ok(())
        );
    }

    #[test]
    fn the_description_says_what_opens() {
        assert!(reach(None).contains("NO network"));
        assert!(reach(Some(&EgressPolicy::Off)).contains("NO network"));
        let r = reach(Some(&policy("a.org,*.b.org")));
        assert!(r.contains("now: a.org, *.b.org"), "{r}");
        // A long policy is cut, on a character boundary.
        let many: Vec<String> = (0..200).map(|i| format!("host{i}.example")).collect();
        let r = reach(Some(&EgressPolicy::from_items(&many).unwrap()));
        assert!(r.len() < 400, "{}", r.len());
        assert!(r.contains(" …"));
    }

    #[test]
    fn load_failures_say_why() {
        let m = load_failure("https://a.org/", "net::ERR_PROXY_CONNECTION_FAILED");
        assert!(m.contains("egress proxy is not running"), "{m}");
        let m = load_failure("https://a.org/", "net::ERR_TUNNEL_CONNECTION_FAILED");
        assert!(m.contains("refused"), "{m}");
        assert!(load_failure("u", &"x".repeat(5000)).len() < 400);
    }
}
