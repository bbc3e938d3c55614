//! The `[server]`, `[quotas]` and `[audit]` config sections of `sandboxd serve` (how one
//! user's quota is worked out from them lives with the server: its `quota.rs`).

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address `sandboxd serve` listens on when --listen is not given.
    pub listen: String,
    /// Host names accepted in the Host header besides loopback names and the listen address
    /// (the DNS-rebinding guard); add the name the service is reached by behind a proxy.
    pub allowed_hosts: Vec<String>,
    /// Origins allowed by CORS; empty means CORS is off (no Access-Control headers).
    pub cors_origins: Vec<String>,
    /// Largest JSON request body.
    pub body_limit_kb: u64,
    /// Largest file or tar upload.
    pub upload_limit_mb: u64,
    /// File and archive transfers (uploads and downloads over 1 MiB, archives, previews) one
    /// user may have in progress at once; one more is answered 429.
    pub transfers_per_user: u32,
    /// File and archive transfers the whole server may have in progress at once. With
    /// `upload_limit_mb` and the sessions' `workspace_mb` this bounds the spool files in
    /// `<data_dir>/spool`; one more is answered 429.
    pub transfers: u32,
    /// Time limit of a request that does not run a command; exec, tool and file routes get
    /// `[limits] max_timeout_secs` plus this.
    pub request_timeout_secs: u64,
    /// How long shutdown waits for requests in flight before closing them.
    pub drain_secs: u64,
    /// Ended sessions and finished runs older than this are deleted; 0 keeps them forever.
    pub retention_days: u64,
    /// Failed authentications one client address may make per minute before its failures
    /// get 429 (a valid key or sign-in is never refused).
    pub auth_failures_per_minute: u32,
    /// How long a run's `ask_human` question waits for POST /v1/runs/{id}/answer before the
    /// run goes on without an answer.
    pub question_timeout_secs: u64,
    /// How long a web UI sign-in (its cookie) lasts, at most: the key's own expiry, if
    /// sooner, wins. Seconds, so a test can watch one run out.
    pub sign_in_secs: u64,
    // Who the client is, and what one user may hold open (issue 20, `auth`).
    /// Reverse proxies (IP addresses or CIDR networks) whose `X-Forwarded-For` names the
    /// client; from any other peer the header is ignored. Empty: the TCP peer is the client.
    pub trusted_proxies: Vec<String>,
    /// Event streams and streamed execs one user may have open at once.
    pub streams_per_user: u32,
    /// How long a client has to send a complete request head: from the connection's accept,
    /// or from the first byte of a later request on a kept-alive connection (slow-header
    /// attacks end here).
    pub header_timeout_secs: u64,
    /// How long a kept-alive connection may wait, with no request in flight, for the next
    /// request to begin. A request in flight (an event stream, a long exec) is never idle.
    pub idle_timeout_secs: u64,
    /// Client connections open at once. At the cap, the connection that has waited longest
    /// without a request in flight is closed for a new one; with none, the new one is closed.
    /// Lowered at start to half the process's open-file limit if that is smaller.
    pub max_connections: u64,
    /// How long a replica's lease lasts: every `serve` on one store renews its own every
    /// third of this, and what a replica held (the runs it drives) is taken for orphaned by
    /// the others once its lease has run out, so a replica killed with `kill -9` is noticed
    /// within this bound. At least 1.
    pub lease_secs: u64,
    /// A second address that serves only `GET /metrics`, without authentication (for a
    /// Prometheus on a private network); empty = none. On the main address `/metrics` needs
    /// an admin's key.
    pub metrics_listen: String,
}

/// The longest replica lease: a dead replica's runs must not wait longer to be noticed.
pub const MAX_LEASE_SECS: u64 = 3600;

/// The longest sign-in allowed: a cookie that outlives a month is a key by another name.
pub const MAX_SIGN_IN_SECS: u64 = 30 * 86_400;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            allowed_hosts: Vec::new(),
            cors_origins: Vec::new(),
            body_limit_kb: 1024,
            upload_limit_mb: 100,
            transfers_per_user: 2,
            transfers: 8,
            request_timeout_secs: 30,
            drain_secs: 5,
            retention_days: 30,
            auth_failures_per_minute: 20,
            question_timeout_secs: 300,
            sign_in_secs: 12 * 3600,
            trusted_proxies: Vec::new(),
            streams_per_user: 16,
            header_timeout_secs: 10,
            idle_timeout_secs: 60,
            max_connections: 1024,
            lease_secs: 5,
            metrics_listen: String::new(),
        }
    }
}

impl ServerConfig {
    /// Refuses values that make no sense rather than guessing what was meant.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value, default) in [
            ("server.transfers_per_user", self.transfers_per_user, 2),
            ("server.transfers", self.transfers, 8),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid {
                    key: key.into(),
                    message: format!(
                        "0 would refuse every upload and download; give at least 1 (the default is {default})"
                    ),
                });
            }
        }
        if !(1..=MAX_LEASE_SECS).contains(&self.lease_secs) {
            return Err(ConfigError::Invalid {
                key: "server.lease_secs".into(),
                message: format!(
                    "{} is not a replica lease between 1 and {MAX_LEASE_SECS} seconds; the default is 5",
                    self.lease_secs
                ),
            });
        }
        if !(1..=MAX_SIGN_IN_SECS).contains(&self.sign_in_secs) {
            return Err(ConfigError::Invalid {
                key: "server.sign_in_secs".into(),
                message: format!(
                    "{} is not a sign-in lifetime between 1 and {MAX_SIGN_IN_SECS} seconds (30 days); the default is 43200 (12 hours)",
                    self.sign_in_secs
                ),
            });
        }
        if let Err(e) = super::proxies::TrustedProxies::parse(&self.trusted_proxies) {
            return Err(ConfigError::Invalid {
                key: "server.trusted_proxies".into(),
                message: format!(
                    "{e}; list the addresses of your reverse proxies, or leave it empty when clients connect directly"
                ),
            });
        }
        if self.streams_per_user == 0 {
            return Err(ConfigError::Invalid {
                key: "server.streams_per_user".into(),
                message: "0 would refuse every event stream; the default is 16".into(),
            });
        }
        let metrics = self.metrics_listen.trim();
        if !metrics.is_empty() && metrics.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::Invalid {
                key: "server.metrics_listen".into(),
                message: format!(
                    "{metrics:?} is not an address and port such as 127.0.0.1:9464; leave it empty to serve /metrics only to admins on the main address"
                ),
            });
        }
        self.validate_connections()
    }

    /// The connection keys: zero would close every connection (or refuse all), and past the
    /// upper bounds the limit no longer protects anything.
    fn validate_connections(&self) -> Result<(), ConfigError> {
        let checks: [(&str, u64, u64, u64, &str); 3] = [
            (
                "header_timeout_secs",
                self.header_timeout_secs,
                1,
                3600,
                "10",
            ),
            ("idle_timeout_secs", self.idle_timeout_secs, 1, 86_400, "60"),
            ("max_connections", self.max_connections, 1, 1 << 20, "1024"),
        ];
        for (key, value, min, max, default) in checks {
            if !(min..=max).contains(&value) {
                return Err(ConfigError::Invalid {
                    key: format!("server.{key}"),
                    message: format!(
                        "{value} is not between {min} and {max}; the default is {default}"
                    ),
                });
            }
        }
        Ok(())
    }

    /// `sign_in_secs` in milliseconds, the store's unit.
    pub fn sign_in_ms(&self) -> i64 {
        i64::try_from(self.sign_in_secs.min(MAX_SIGN_IN_SECS))
            .unwrap_or(i64::MAX)
            .saturating_mul(1000)
    }
}

/// The default quota of every user; `sandboxd users quota` overrides it per user.
/// For the limit ceilings, 0 means "the admin's `[limits]`".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuotasConfig {
    /// Sessions one user may have alive at once.
    pub sessions: u32,
    /// Runs one user may have in flight at once.
    pub runs: u32,
    /// LLM input tokens one user may spend per UTC day; 0 means no limit.
    pub input_tokens_per_day: u64,
    /// CPU-seconds one user's sandboxes may use per UTC day (usage metering's figure);
    /// 0 means no limit.
    pub cpu_seconds_per_day: u64,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: i64,
    pub workspace_mb: u64,
    pub tmp_mb: u64,
}

impl Default for QuotasConfig {
    fn default() -> Self {
        Self {
            sessions: 4,
            runs: 2,
            input_tokens_per_day: 0,
            cpu_seconds_per_day: 0,
            memory_mb: 0,
            cpus: 0.0,
            pids: 0,
            workspace_mb: 0,
            tmp_mb: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sign_in_lifetime_of_zero_or_over_a_month_is_refused_at_load() {
        let load = |v: &str| {
            crate::config::Config::load_with_env(
                None,
                &[("SANDBOXD_SERVER_SIGN_IN_SECS".to_string(), v.to_string())],
            )
        };
        for bad in ["0", "2592001", "18446744073709551615"] {
            let err = load(bad).unwrap_err().to_string();
            assert!(
                err.contains("server.sign_in_secs") && err.contains(bad),
                "{bad}: {err}"
            );
        }
        let ok = load("5").unwrap();
        assert_eq!(ok.server.sign_in_ms(), 5000);
        assert_eq!(ServerConfig::default().sign_in_ms(), 12 * 3600 * 1000);
    }

    #[test]
    fn trusted_proxies_and_the_stream_cap_are_checked_at_load() {
        let load = |k: &str, v: &str| {
            crate::config::Config::load_with_env(None, &[(k.to_string(), v.to_string())])
        };
        let ok = load(
            "SANDBOXD_SERVER_TRUSTED_PROXIES",
            r#"["127.0.0.1", "10.0.0.0/8", "::1"]"#,
        )
        .unwrap();
        assert_eq!(ok.server.trusted_proxies.len(), 3);
        let err = load(
            "SANDBOXD_SERVER_TRUSTED_PROXIES",
            r#"["127.0.0.1", "proxy.local"]"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("server.trusted_proxies") && err.contains("proxy.local"),
            "{err}"
        );
        let err = load("SANDBOXD_SERVER_STREAMS_PER_USER", "0")
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.streams_per_user"), "{err}");
    }

    #[test]
    fn connection_limits_of_zero_or_absurd_size_are_refused_at_load() {
        for (key, bad) in [
            ("HEADER_TIMEOUT_SECS", "0"),
            ("HEADER_TIMEOUT_SECS", "3601"),
            ("IDLE_TIMEOUT_SECS", "0"),
            ("MAX_CONNECTIONS", "0"),
            ("MAX_CONNECTIONS", "18446744073709551615"),
        ] {
            let err = crate::config::Config::load_with_env(
                None,
                &[(format!("SANDBOXD_SERVER_{key}"), bad.to_string())],
            )
            .unwrap_err()
            .to_string();
            let name = format!("server.{}", key.to_ascii_lowercase());
            assert!(
                err.contains(&name) && err.contains(bad),
                "{key}={bad}: {err}"
            );
        }
        ServerConfig::default().validate().unwrap();
    }
}

/// `[audit]`: the audit log's bound (entries past either go with the next append).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Entries older than this many days go; at least 1.
    pub retention_days: u64,
    /// At most this many entries stay (the oldest go first); at least 1000.
    pub max_rows: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            retention_days: 365,
            max_rows: 1_000_000,
        }
    }
}

impl AuditConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=36_500).contains(&self.retention_days) {
            return Err(ConfigError::Invalid {
                key: "audit.retention_days".into(),
                message: format!(
                    "{} is not between 1 and 36500 days; the default is 365",
                    self.retention_days
                ),
            });
        }
        if self.max_rows < 1000 {
            return Err(ConfigError::Invalid {
                key: "audit.max_rows".into(),
                message: format!(
                    "{} would keep too little to answer who did what; give at least 1000 (the default is 1000000)",
                    self.max_rows
                ),
            });
        }
        Ok(())
    }
}
