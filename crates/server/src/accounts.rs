//! Users and their keys as one flow for both shells: `sandboxd users` (the CLI, on the
//! store directly) and the admin API (`POST /v1/users`, `DELETE /v1/users/{name}`,
//! `POST /v1/users/{name}/rotate`). A key's text exists only in the answer of `add` and
//! `rotate`; the store keeps its hash.

use crate::auth::new_key;
use sandboxd_core::store::{NewUser, QuotaOverride, SessionRow, Store, StoreError, User, now_ms};

#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error(
        "user name {0:?}: use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
    )]
    BadName(String),
    #[error("a user named {0:?} exists; rotating their key gives them a new one")]
    Exists(String),
    #[error("no user named {0:?}")]
    NoSuchUser(String),
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for AccountError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::UserExists { name } => AccountError::Exists(name),
            e => AccountError::Store(e),
        }
    }
}

/// Checks a user name: it appears in URLs, logs and container labels.
pub fn check_name(name: &str) -> Result<(), AccountError> {
    let ok = (1..=64).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(AccountError::BadName(name.to_string()))
    }
}

/// A key expiry `days` from now.
pub fn expiry(days: Option<u32>) -> Option<i64> {
    days.map(|d| now_ms() + i64::from(d) * 86_400_000)
}

/// Creates a user; returns them and their key's text (to be shown once).
pub async fn add(
    store: &dyn Store,
    name: &str,
    admin: bool,
    expires_at: Option<i64>,
    quota: QuotaOverride,
) -> Result<(User, String), AccountError> {
    check_name(name)?;
    let (text, key) = new_key(expires_at);
    let user = store
        .add_user(NewUser {
            name: name.to_string(),
            admin,
            key,
            quota,
        })
        .await?;
    Ok((user, text))
}

/// Gives a user a new key (the old one, and the web sign-ins made with it, stop working).
pub async fn rotate(
    store: &dyn Store,
    name: &str,
    expires_at: Option<i64>,
) -> Result<(User, String), AccountError> {
    let (text, key) = new_key(expires_at);
    if !store.replace_key(name, key).await? {
        return Err(AccountError::NoSuchUser(name.to_string()));
    }
    let user = store
        .user_by_name(name)
        .await?
        .ok_or_else(|| AccountError::NoSuchUser(name.to_string()))?;
    Ok((user, text))
}

/// Removes a user; their sessions are ended in the store. Returns the sessions that were
/// live, whose containers the caller removes (the server at once, the CLI's reaper later).
pub async fn remove(store: &dyn Store, name: &str) -> Result<Vec<SessionRow>, AccountError> {
    let user = store
        .user_by_name(name)
        .await?
        .ok_or_else(|| AccountError::NoSuchUser(name.to_string()))?;
    let live: Vec<SessionRow> = store
        .active_sessions()
        .await?
        .into_iter()
        .filter(|s| s.owner == user.id)
        .collect();
    if !store.remove_user(name, now_ms()).await? {
        return Err(AccountError::NoSuchUser(name.to_string()));
    }
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["bob", "a.b-c_d", "9lives"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", "a b", "<img>", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
