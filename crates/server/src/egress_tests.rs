//! The limits of a session's egress policy: the admin's widest and the user's quota, each
//! named in the refusal; a new session's default.

#![allow(clippy::unwrap_used)]

use super::*;

fn p(s: &str) -> EgressPolicy {
    EgressPolicy::parse(s).unwrap()
}

fn config(widest: &str, default: &str) -> EgressConfig {
    EgressConfig {
        widest: p(widest),
        default: p(default),
        ..Default::default()
    }
}

fn quota(egress: Option<&str>) -> QuotaOverride {
    QuotaOverride {
        egress: egress.map(p),
        ..Default::default()
    }
}

#[test]
fn a_policy_past_either_limit_is_refused_naming_the_rule_and_the_limit() {
    let c = config("*.example.org,a.test", "off");
    assert!(check_allowed(&c, &quota(None), &p("x.example.org,a.test")).is_ok());
    let e = check_allowed(&c, &quota(None), &p("a.test,b.test")).unwrap_err();
    assert_eq!(e.status, Some(axum::http::StatusCode::FORBIDDEN));
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
    assert!(
        e.detail.message.contains("\"b.test\"") && e.detail.message.contains("[egress] widest"),
        "{}",
        e.detail.message
    );
    let e = check_allowed(&c, &quota(Some("a.test")), &p("x.example.org")).unwrap_err();
    assert!(
        e.detail.message.contains("\"x.example.org\"") && e.detail.message.contains("quota"),
        "{}",
        e.detail.message
    );
    // A quota wider than the admin's widest widens nothing.
    assert!(check_allowed(&c, &quota(Some("any")), &p("any")).is_err());
    assert!(check_allowed(&c, &quota(Some("a.test")), &p("off")).is_ok());
}

#[test]
fn a_new_session_gets_what_it_asks_within_the_limits_or_the_default() {
    let c = config("any", "*.example.org");
    assert_eq!(
        for_new_session(&c, &quota(None), None).unwrap(),
        p("*.example.org")
    );
    assert_eq!(
        for_new_session(&c, &quota(None), Some(p("a.test"))).unwrap(),
        p("a.test")
    );
    // A quota narrower than the default: the default is not given, and nothing is.
    assert_eq!(
        for_new_session(&c, &quota(Some("a.test")), None).unwrap(),
        p("off")
    );
    assert!(for_new_session(&c, &quota(Some("a.test")), Some(p("b.test"))).is_err());
}
