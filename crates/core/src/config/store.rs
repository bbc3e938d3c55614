//! The `[store]` config section: which store keeps the service's state. Empty (the default)
//! is the embedded SQLite file in the data directory; a `postgres://` URL is a PostgreSQL
//! database several `serve` replicas can share. The binary (crates/sandboxd/src/backends.rs)
//! opens the one named here; this crate only checks that it is one of the two.

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `postgres://user:password@host:port/database` (or `postgresql://`); empty means the
    /// SQLite file `<data_dir>/sandboxd.db`. Also `SANDBOXD_STORE_URL`.
    pub url: String,
}

/// Which store a config names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind<'a> {
    /// The embedded SQLite file in the data directory.
    Sqlite,
    /// A PostgreSQL database at this URL.
    Postgres(&'a str),
}

impl StoreConfig {
    pub fn kind(&self) -> StoreKind<'_> {
        let url = self.url.trim();
        if url.is_empty() {
            StoreKind::Sqlite
        } else {
            StoreKind::Postgres(url)
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let url = self.url.trim();
        if url.is_empty() || url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(());
        }
        // Never echo the value: it may hold a password.
        let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
        Err(ConfigError::Invalid {
            key: "[store] url".into(),
            message: format!(
                "must be empty (the SQLite file in the data directory) or a postgres:// URL, got {}",
                if scheme.is_empty() || scheme.len() > 20 {
                    "something else".to_string()
                } else {
                    format!("a {scheme}:// URL")
                }
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn load(url: &str) -> Result<Config, ConfigError> {
        Config::load_with_env(None, &[("SANDBOXD_STORE_URL".into(), url.into())])
    }

    #[test]
    fn empty_is_sqlite_and_a_postgres_url_is_postgres() {
        assert_eq!(StoreConfig::default().kind(), StoreKind::Sqlite);
        let c = load("postgres://u:p@127.0.0.1:5432/sandboxd").unwrap();
        assert_eq!(
            c.store.kind(),
            StoreKind::Postgres("postgres://u:p@127.0.0.1:5432/sandboxd")
        );
        let c = load("postgresql://db/sandboxd").unwrap();
        assert!(matches!(c.store.kind(), StoreKind::Postgres(_)));
    }

    #[test]
    fn any_other_url_is_refused_without_echoing_it() {
        for bad in [
            "mysql://root:hunter2@db/x",
            "sqlite:///tmp/x.db",
            "hunter2",
            "http://x",
        ] {
            let err = load(bad).unwrap_err().to_string();
            assert!(err.contains("[store] url"), "{err}");
            assert!(err.contains("postgres://"), "{err}");
            assert!(!err.contains("hunter2"), "the value is not echoed: {err}");
        }
    }
}
