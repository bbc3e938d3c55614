//! Tests of the egress policy: parsing, matching, "never wider" and the serialized forms.

use super::*;

fn p(s: &str) -> EgressPolicy {
    EgressPolicy::parse(s).unwrap()
}

fn allows(policy: &str, host: &str) -> bool {
    p(policy).check(&Host::parse(host)).allowed
}

#[test]
fn parsing_names_what_is_wrong() {
    assert_eq!(p("off"), EgressPolicy::Off);
    assert_eq!(p(" OFF "), EgressPolicy::Off);
    assert_eq!(p("any"), EgressPolicy::any());
    assert_eq!(
        p("Example.ORG., *.b.org").to_string(),
        "example.org,*.b.org"
    );
    for bad in [
        "",
        " , ",
        "off,a.org",
        "!a.org",
        "a..org",
        "-a.org",
        "*.",
        "a/b",
        "*.*.a",
    ] {
        let err = EgressPolicy::parse(bad).unwrap_err();
        assert!(!err.is_empty(), "{bad:?}");
    }
    let many = vec!["a.org"; MAX_RULES + 1];
    assert!(
        EgressPolicy::from_items(&many)
            .unwrap_err()
            .contains("at most")
    );
}

#[test]
fn rules_match_names_wildcards_and_addresses_and_denials_win() {
    assert!(!allows("off", "a.org"));
    assert!(allows("any", "a.org"));
    assert!(
        allows("any", "10.0.0.1"),
        "the SSRF rules, not the policy, refuse private hosts"
    );
    assert!(allows("*.wikipedia.org", "en.wikipedia.org"));
    assert!(allows("*.wikipedia.org", "EN.Wikipedia.org."));
    assert!(!allows("*.wikipedia.org", "wikipedia.org"));
    assert!(!allows("*.wikipedia.org", "evilwikipedia.org"));
    assert!(!allows("*.wikipedia.org", "wikipedia.org.evil.com"));
    assert!(allows("a.org", "a.org"));
    assert!(!allows("a.org", "b.a.org"));
    assert!(allows("192.0.2.1", "192.0.2.1"));
    assert!(!allows("192.0.2.1", "192.0.2.2"));
    assert!(allows("2001:db8::1", "[2001:db8::1]"));
    assert!(!allows("a.org", "192.0.2.1"));
    let v = p("any,!*.ads.example").check(&Host::parse("x.ads.example"));
    assert_eq!((v.allowed, v.rule.as_str()), (false, "!*.ads.example"));
    let v = p("*.b.org").check(&Host::parse("c.org"));
    assert_eq!(
        (v.allowed, v.rule.as_str()),
        (false, "not in the allowlist")
    );
    let v = p("off").check(&Host::parse("c.org"));
    assert_eq!(v.rule, "egress off");
    let v = p("a.org,*.b.org").check(&Host::parse("x.b.org"));
    assert_eq!((v.allowed, v.rule.as_str()), (true, "*.b.org"));
}

#[test]
fn within_is_proved_on_the_rules() {
    let ok = |a: &str, w: &str| p(a).within(&p(w)).is_ok();
    assert!(ok("off", "off"));
    assert!(ok("off", "a.org"));
    assert!(!ok("a.org", "off"));
    assert!(ok("a.org", "any"));
    assert!(ok("any", "any"));
    assert!(!ok("any", "a.org"));
    assert!(ok("x.b.org,*.c.b.org", "*.b.org"));
    assert!(ok("*.b.org", "*.b.org"));
    assert!(
        !ok("b.org", "*.b.org"),
        "the wildcard does not match the domain itself"
    );
    assert!(!ok("*.org", "*.b.org"));
    assert!(ok("192.0.2.1", "192.0.2.1,a.org"));
    assert!(!ok("192.0.2.1", "a.org"));
    // The widest's denials must be kept by whoever allows near them.
    assert!(!ok("any", "any,!*.ads.example"));
    assert!(ok("any,!*.ads.example", "any,!*.ads.example"));
    assert!(ok("any,!*.example", "any,!*.ads.example"));
    assert!(!ok("*.example", "any,!*.ads.example"));
    assert!(ok("a.org", "any,!*.ads.example"), "far from the denial");
    let err = p("*.org").within(&p("*.b.org")).unwrap_err();
    assert!(err.contains("*.org") && err.contains("*.b.org"), "{err}");
}

#[test]
fn serialized_as_a_string_or_an_array() {
    let one: EgressPolicy = serde_json::from_str("\"any\"").unwrap();
    assert_eq!(serde_json::to_string(&one).unwrap(), "\"any\"");
    let many: EgressPolicy =
        serde_json::from_str("[\"a.org\", \"!b.a.org\", \"*.a.org\"]").unwrap();
    assert_eq!(
        serde_json::to_string(&many).unwrap(),
        "[\"a.org\",\"*.a.org\",\"!b.a.org\"]"
    );
    let csv: EgressPolicy = serde_json::from_str("\"a.org,*.b.org\"").unwrap();
    assert_eq!(csv, p("a.org,*.b.org"));
    let err = serde_json::from_str::<EgressPolicy>("[\"a..org\"]").unwrap_err();
    assert!(err.to_string().contains("a..org"), "{err}");
    assert!(serde_json::from_str::<EgressPolicy>("42").is_err());
}

#[test]
fn the_section_checks_its_default_against_its_widest() {
    assert!(EgressConfig::default().validate().is_ok());
    let c = EgressConfig {
        default: p("any"),
        widest: p("*.b.org"),
        ..EgressConfig::default()
    };
    assert_eq!(c.validate().unwrap_err().0, "egress.default");
    let c = EgressConfig {
        connections: 0,
        ..EgressConfig::default()
    };
    assert_eq!(c.validate().unwrap_err().0, "egress.connections");
}

#[test]
fn the_grammar_is_strict_where_the_schema_states_it() {
    // Spaces (only) around rules; one pair of brackets, for IPv6 only; one trailing dot.
    assert_eq!(p(" a.org ,  !b.a.org ").to_string(), "a.org,!b.a.org");
    assert_eq!(p("[2001:db8::1]").to_string(), "2001:db8::1");
    assert_eq!(p("1.2.3.4.").to_string(), "1.2.3.4");
    assert_eq!(p("ANY.").to_string(), "any");
    for bad in [
        "a.org,",
        ",a.org",
        "a.org,,b.org",
        "a.org\t",
        "! a.org,b.org",
        "[1.2.3.4]",
        "[[::1]]",
        "::1.",
        "a.org..",
        "[::1",
    ] {
        assert!(EgressPolicy::parse(bad).is_err(), "{bad:?}");
    }
    // A rule is at most MAX_RULE_CHARS as written, spaces included.
    let mut long = vec!["a".repeat(63); 4].join(".");
    long.truncate(MAX_RULE_CHARS);
    assert!(EgressPolicy::parse(&long).is_ok());
    assert!(EgressPolicy::parse(&format!("{long} ")).is_err());
    // One string is at most MAX_POLICY_CHARS when it arrives serialized (an array is not).
    let many = vec!["a.org"; 100];
    let csv = serde_json::Value::String(many.join(","));
    assert!(serde_json::from_value::<EgressPolicy>(csv).is_err());
    assert!(serde_json::from_value::<EgressPolicy>(serde_json::json!(many)).is_ok());
    assert!(
        EgressPolicy::parse(&many.join(",")).is_ok(),
        "the store's form is not capped"
    );
}
