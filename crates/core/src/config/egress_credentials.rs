//! `[[egress.credentials]]`: secrets the egress proxy adds to requests for one host, so a
//! program in the sandbox can use an API without ever holding its key.
//!
//! The admin names the host, the header and the host environment variable that holds the
//! value; the value is read once at load (from the same environment the rest of the config
//! sees) into a `CredentialValue`, whose `Debug` prints `[REDACTED]` and which has no
//! `Display` and no `Serialize`: a config printed, serialized or logged never shows it.
//!
//! Host names are exact (no wildcards): a credential is sent to every host its rule matches,
//! and a wildcard would also match names the admin never vetted (per-user subdomains of a
//! hosting service, say); the proxy intercepts TLS only for these names, so an exact list
//! also keeps interception as narrow as it can be.

use std::fmt;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

/// One credential: `header: prefix + value` on every request the proxy relays to `host`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressCredential {
    /// The exact host name (lower case after load; no wildcard, no address).
    pub host: String,
    /// The header set on each request (replacing any the sandbox sent), e.g. `Authorization`.
    pub header: String,
    /// The environment variable of the host process that holds the value.
    pub value_env: String,
    /// Written before the value, e.g. `"Bearer "`.
    #[serde(default)]
    pub prefix: String,
    /// Whether the proxy also adds it to plain `http://` requests (where it crosses the
    /// network in cleartext). Off: a plain-HTTP request to this host is refused, never
    /// forwarded without the header nor with it.
    #[serde(default)]
    pub allow_http: bool,
    /// The value, read from `value_env` at load; never serialized.
    #[serde(skip)]
    pub value: CredentialValue,
}

/// A credential's value. secrecy's `SecretString` (already in the tree through async-openai)
/// rather than a bare `String`: its `Debug` is redacted, it is zeroized when dropped, and
/// every read is an explicit `expose_secret()` that a review can find.
#[derive(Clone, Default)]
pub struct CredentialValue(SecretString);

impl CredentialValue {
    pub fn new(value: &str) -> CredentialValue {
        CredentialValue(SecretString::from(value))
    }

    /// The value itself: only for writing the header upstream and for scrubbing it.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    pub fn is_empty(&self) -> bool {
        self.0.expose_secret().is_empty()
    }
}

impl fmt::Debug for CredentialValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// Compared by value (a failed `assert_eq!` still prints only `[REDACTED]`).
impl PartialEq for CredentialValue {
    fn eq(&self, other: &Self) -> bool {
        self.expose() == other.expose()
    }
}

/// The most credentials one config may hold (each is a name constraint of every session CA).
pub const MAX_CREDENTIALS: usize = 64;
/// The most `[egress] user_credentials` may allow one user (with the admin's, a session CA
/// has at most `MAX_CREDENTIALS + MAX_USER_CREDENTIALS` names).
pub const MAX_USER_CREDENTIALS: u32 = 64;
/// The longest value, prefix and header name a user may attach (bytes).
pub const MAX_VALUE_LEN: usize = 8192;
pub const MAX_PREFIX_LEN: usize = 64;
pub const MAX_HEADER_LEN: usize = 64;

impl EgressCredential {
    /// Reads the value from `env` and checks every field; (key, message) on error. The
    /// message names the variable, never its value.
    pub fn load(&mut self, index: usize, env: &[(String, String)]) -> Result<(), (String, String)> {
        let key = |field: &str| format!("egress.credentials[{index}].{field}");
        self.host = check_fields(&self.host, &self.header, &self.prefix)
            .map_err(|(field, m)| (key(field), m))?;
        let value = env
            .iter()
            .rev()
            .find(|(k, _)| *k == self.value_env)
            .map(|(_, v)| v.as_str());
        match value {
            None | Some("") => Err((
                key("value_env"),
                format!(
                    "the environment variable {:?} is not set (or empty) in sandboxd's environment; \
                     set it to the credential's value, or remove this credential",
                    self.value_env
                ),
            )),
            Some(v) if !header_text_ok(v) => Err((
                key("value_env"),
                format!(
                    "the value of {:?} is not a valid header value (line breaks or control \
                     characters); it is not shown here",
                    self.value_env
                ),
            )),
            Some(v) => {
                self.value = CredentialValue::new(v);
                Ok(())
            }
        }
    }
}

/// Checks where a credential goes and how it is written: the normalised host on success,
/// else (field, message). Shared by the admin's config and users' attachments.
pub fn check_fields(
    host: &str,
    header: &str,
    prefix: &str,
) -> Result<String, (&'static str, String)> {
    let host = host.trim().trim_end_matches('.').to_ascii_lowercase();
    check_host(&host).map_err(|m| ("host", m))?;
    if header.len() > MAX_HEADER_LEN || http::HeaderName::from_bytes(header.as_bytes()).is_err() {
        return Err((
            "header",
            format!("{header:?} is not a valid HTTP header name (at most {MAX_HEADER_LEN} bytes)"),
        ));
    }
    let lower = header.to_ascii_lowercase();
    if matches!(
        lower.as_str(),
        "host" | "content-length" | "transfer-encoding" | "connection" | "upgrade" | "te"
    ) {
        return Err((
            "header",
            format!("{header:?} frames or routes the request; a credential cannot set it"),
        ));
    }
    if prefix.len() > MAX_PREFIX_LEN || !header_text_ok(prefix) {
        return Err((
            "prefix",
            format!("must be printable text without line breaks, at most {MAX_PREFIX_LEN} bytes"),
        ));
    }
    Ok(host)
}

/// Checks a value a user attaches (the message never quotes it).
pub fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > MAX_VALUE_LEN {
        return Err(format!("must be 1 to {MAX_VALUE_LEN} bytes"));
    }
    if !header_text_ok(value) {
        return Err(
            "is not a valid header value (line breaks or control characters); it is not shown here"
                .into(),
        );
    }
    Ok(())
}

/// A header value the proxy can write as-is: visible ASCII and spaces, nothing that could
/// end the header line.
fn header_text_ok(s: &str) -> bool {
    s.bytes()
        .all(|b| b == b' ' || b == b'\t' || (0x21..0x7f).contains(&b))
}

/// An exact DNS host name: labels of letters, digits and hyphens; not an address.
fn check_host(host: &str) -> Result<(), String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.contains('*') {
        return Err(format!(
            "{host:?}: wildcards are not allowed; a credential names exact hosts (list each one)"
        ));
    }
    if host
        .trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
        .is_ok()
    {
        return Err(format!(
            "{host:?} is an address; a credential names a host name (its certificate is checked)"
        ));
    }
    if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(format!("{host:?} is not a host name"));
    }
    Ok(())
}

/// Loads the credentials of `[egress]` and checks its `extra_roots_pem` (a file that does not
/// parse is named now, not at the first intercepted connection).
pub fn load_section(
    egress: &mut super::EgressConfig,
    env: &[(String, String)],
) -> Result<(), (String, String)> {
    load_all(&mut egress.credentials, env)?;
    egress.credential_key = crate::egress::vault::CredentialKey::load(
        &egress.credential_key_file,
        &egress.credential_key_env,
        env,
    )?;
    if egress.user_credentials > MAX_USER_CREDENTIALS {
        return Err((
            "egress.user_credentials".into(),
            format!("at most {MAX_USER_CREDENTIALS}"),
        ));
    }
    if !egress.extra_roots_pem.is_empty() {
        crate::egress::mitm::UpstreamTls::new(&egress.extra_roots_pem)
            .map_err(|e| ("egress.extra_roots_pem".to_string(), e.to_string()))?;
    }
    Ok(())
}

/// Loads every credential of the section; one host has at most one credential.
pub fn load_all(
    credentials: &mut [EgressCredential],
    env: &[(String, String)],
) -> Result<(), (String, String)> {
    if credentials.len() > MAX_CREDENTIALS {
        return Err((
            "egress.credentials".into(),
            format!(
                "at most {MAX_CREDENTIALS} credentials; this config has {}",
                credentials.len()
            ),
        ));
    }
    for i in 0..credentials.len() {
        credentials[i].load(i, env)?;
        if credentials[..i]
            .iter()
            .any(|c| c.host == credentials[i].host)
        {
            return Err((
                format!("egress.credentials[{i}].host"),
                format!(
                    "{:?} has a credential already; one per host",
                    credentials[i].host
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "egress_credentials_tests.rs"]
mod tests;
