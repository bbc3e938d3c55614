//! `[[egress.credentials]]` at load: the value comes from the environment, every mistake is
//! named by its key, and nothing that prints or serializes a config shows the value.

use std::io::Write as _;

use crate::config::{Config, ConfigError};

const SECRET: &str = "ghp_s3cr3t-VALUE-for-the-credential-tests";

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const ONE: &str = r#"
[[egress.credentials]]
host = "API.GitHub.com."
header = "Authorization"
value_env = "MITM_TEST_TOKEN"
prefix = "Bearer "
"#;

fn load(text: &str, vars: &[(&str, &str)]) -> Result<Config, String> {
    let f = file(text);
    Config::load_with_env(Some(f.path()), &env(vars)).map_err(|e| e.to_string())
}

#[test]
fn the_value_is_read_from_the_environment_and_never_shown() {
    let c = load(ONE, &[("MITM_TEST_TOKEN", SECRET)]).unwrap();
    let cred = &c.egress.credentials[0];
    assert_eq!(cred.host, "api.github.com", "the host is normalized");
    assert_eq!(cred.value.expose(), SECRET);
    let debug = format!("{c:?} {cred:?} {:#?}", c.egress);
    assert!(!debug.contains(SECRET), "Debug printed the value: {debug}");
    assert!(debug.contains("[REDACTED]"), "{debug}");
    let toml = toml::to_string(&c).unwrap();
    assert!(!toml.contains(SECRET), "serializing printed the value");
    assert!(toml.contains("value_env = \"MITM_TEST_TOKEN\""), "{toml}");
    let json = serde_json::to_string(&c.egress).unwrap();
    assert!(!json.contains(SECRET));
}

#[test]
fn a_missing_variable_names_the_key_and_the_variable() {
    for vars in [&[][..], &[("MITM_TEST_TOKEN", "")][..]] {
        let err = load(ONE, vars).unwrap_err();
        assert!(err.contains("egress.credentials[0].value_env"), "{err}");
        assert!(err.contains("MITM_TEST_TOKEN"), "{err}");
    }
}

#[test]
fn a_value_that_could_split_the_header_is_refused_without_showing_it() {
    let hostile = format!("{SECRET}\r\nX-Injected: 1");
    let err = load(ONE, &[("MITM_TEST_TOKEN", &hostile)]).unwrap_err();
    assert!(err.contains("not a valid header value"), "{err}");
    assert!(!err.contains(SECRET), "the error showed the value: {err}");
}

#[test]
fn bad_hosts_and_headers_are_named() {
    let cases = [
        ("*.github.com", "Authorization", "wildcards are not allowed"),
        ("10.0.0.1", "Authorization", "is an address"),
        ("bad host", "Authorization", "is not a host name"),
        (
            "api.github.com",
            "Bad Header",
            "not a valid HTTP header name",
        ),
        (
            "api.github.com",
            "Content-Length",
            "frames or routes the request",
        ),
        ("api.github.com", "host", "frames or routes the request"),
    ];
    for (host, header, expected) in cases {
        let text = format!(
            "[[egress.credentials]]\nhost = \"{host}\"\nheader = \"{header}\"\nvalue_env = \"T\"\n"
        );
        let err = load(&text, &[("T", SECRET)]).unwrap_err();
        assert!(
            err.contains("egress.credentials[0]."),
            "{host} {header}: {err}"
        );
        assert!(err.contains(expected), "{host} {header}: {err}");
        assert!(!err.contains(SECRET), "{err}");
    }
}

#[test]
fn one_credential_per_host() {
    let text = format!("{ONE}{}", ONE.replace("API.GitHub.com.", "api.github.com"));
    let err = load(&text, &[("MITM_TEST_TOKEN", SECRET)]).unwrap_err();
    assert!(err.contains("egress.credentials[1].host"), "{err}");
    assert!(err.contains("one per host"), "{err}");
}

#[test]
fn an_unknown_field_is_named() {
    let text = format!("{ONE}value = \"written inline\"\n");
    let f = file(&text);
    let err =
        Config::load_with_env(Some(f.path()), &env(&[("MITM_TEST_TOKEN", SECRET)])).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("unknown field `value`"), "{msg}");
}

#[test]
fn extra_roots_that_do_not_parse_are_named_at_load() {
    let roots = file("not a certificate\n");
    let text = format!(
        "[egress]\nextra_roots_pem = {:?}\n",
        roots.path().to_str().unwrap()
    );
    let err = load(&text, &[]).unwrap_err();
    assert!(
        err.contains("invalid setting egress.extra_roots_pem"),
        "{err}"
    );
    assert!(err.contains("holds no CERTIFICATE block"), "{err}");
}
