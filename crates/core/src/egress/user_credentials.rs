//! Users' own egress credentials: what the API (and any other front end) calls to attach,
//! list and remove them, and what a session's injector is given: the admin's
//! `[[egress.credentials]]` and its owner's, the latter opened from the store (vault.rs).
//!
//! A user may attach a credential only for a host their egress may reach (their quota's
//! widest policy, within the admin's), never for a host the admin already has one for (the
//! admin's secret is not theirs to replace), at most `[egress] user_credentials` of them,
//! each bounded in size. The value is sealed before it reaches the store and is never
//! returned: a listing has the hosts, headers and prefixes only.

use serde::Serialize;

use super::vault::{VaultError, row_aad};
use crate::config::egress::{CredentialValue, EgressConfig, EgressCredential, EgressPolicy};
use crate::config::egress_credentials::{check_fields, check_value};
use crate::store::{Store, StoreError, StoredCredential, now_ms};

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error(transparent)]
    Vault(#[from] VaultError),
    #[error("field `{field}`: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// The host is outside what the user may reach, or the admin's.
    #[error("{0}")]
    NotAllowed(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A credential a user attaches.
#[derive(Debug, Clone)]
pub struct NewCredential {
    pub host: String,
    pub header: String,
    pub prefix: String,
    pub allow_http: bool,
    pub value: CredentialValue,
}

/// A credential as a listing shows it: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CredentialInfo {
    pub host: String,
    pub header: String,
    pub prefix: String,
    pub allow_http: bool,
    pub created_ms: i64,
}

impl From<&StoredCredential> for CredentialInfo {
    fn from(c: &StoredCredential) -> Self {
        CredentialInfo {
            host: c.host.clone(),
            header: c.header.clone(),
            prefix: c.prefix.clone(),
            allow_http: c.allow_http,
            created_ms: c.created_ms,
        }
    }
}

/// Attaches `new` to `owner` (replacing theirs for the same host); `limit` is the widest
/// policy the owner may set (their quota's, or the admin's widest). True when it replaced one.
pub async fn attach(
    store: &dyn Store,
    config: &EgressConfig,
    limit: &EgressPolicy,
    owner: &str,
    new: NewCredential,
) -> Result<(CredentialInfo, bool), CredentialError> {
    if !config.credential_key.is_set() {
        return Err(VaultError::NoKey.into());
    }
    let host = check_fields(&new.host, &new.header, &new.prefix)
        .map_err(|(field, message)| CredentialError::Invalid { field, message })?;
    check_value(new.value.expose()).map_err(|message| CredentialError::Invalid {
        field: "value",
        message,
    })?;
    if config.credentials.iter().any(|c| c.host == host) {
        return Err(CredentialError::NotAllowed(format!(
            "{host} has a credential of the admin's ([[egress.credentials]]); it cannot be replaced"
        )));
    }
    let as_policy = EgressPolicy::parse(&host).map_err(|message| CredentialError::Invalid {
        field: "host",
        message,
    })?;
    for (outer, whose) in [
        (&config.widest, "the admin's [egress] widest"),
        (limit, "your egress quota"),
    ] {
        as_policy.within(outer).map_err(|m| {
            CredentialError::NotAllowed(format!(
                "{host}: {m}: {whose} does not reach it, so no session of yours could use a credential for it"
            ))
        })?;
    }
    let aad = row_aad(owner, &host, &new.header, &new.prefix, new.allow_http);
    let sealed = config.credential_key.seal(&aad, &new.value)?;
    let row = StoredCredential {
        owner: owner.to_string(),
        host,
        header: new.header,
        prefix: new.prefix,
        allow_http: new.allow_http,
        sealed,
        created_ms: now_ms(),
    };
    let replaced = store
        .put_egress_credential(&row, config.user_credentials)
        .await?;
    Ok((CredentialInfo::from(&row), replaced))
}

/// The owner's credentials, by host (no values).
pub async fn list(store: &dyn Store, owner: &str) -> Result<Vec<CredentialInfo>, CredentialError> {
    let rows = store.egress_credentials(owner).await?;
    Ok(rows.iter().map(CredentialInfo::from).collect())
}

/// Removes the owner's credential for `host`; false when they have none for it.
pub async fn remove(store: &dyn Store, owner: &str, host: &str) -> Result<bool, CredentialError> {
    let host = host.trim().trim_end_matches('.').to_ascii_lowercase();
    Ok(store.remove_egress_credential(owner, &host).await?)
}

/// The credentials a session of `owner` injects: the admin's, then the owner's own (opened
/// here). Without a key only the admin's; a row that does not open is left out (and named in
/// the log, never its value): one bad row must not cost the session its other credentials.
pub async fn for_session(
    store: &dyn Store,
    config: &EgressConfig,
    owner: &str,
) -> Result<Vec<EgressCredential>, CredentialError> {
    let mut out = config.credentials.clone();
    if !config.credential_key.is_set() {
        return Ok(out);
    }
    for row in store.egress_credentials(owner).await? {
        if out.iter().any(|c| c.host == row.host) {
            continue;
        }
        let aad = row_aad(
            &row.owner,
            &row.host,
            &row.header,
            &row.prefix,
            row.allow_http,
        );
        match config.credential_key.open(&aad, &row.sealed) {
            Ok(value) => out.push(EgressCredential {
                host: row.host,
                header: row.header,
                value_env: String::new(),
                prefix: row.prefix,
                allow_http: row.allow_http,
                value,
            }),
            Err(e) => {
                tracing::warn!(target: super::TRACE_TARGET, owner = %owner, host = %row.host,
                    error = %e, "a user's egress credential is not used");
            }
        }
    }
    Ok(out)
}
