//! The store's side of users' egress credentials: one row per (owner, host) with the header,
//! its prefix and the value **sealed** (egress/vault.rs: AEAD under the admin's key, bound to
//! the owner, host and header). The store never sees a value in clear text and never needs
//! the key; it only bounds how many rows one owner keeps, in the same transaction as the
//! write, so two concurrent attaches cannot pass the bound together.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::StoreError;

/// One stored credential of a user.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCredential {
    /// The user id the credential belongs to.
    pub owner: String,
    /// The exact destination host (lower case).
    pub host: String,
    /// The header the proxy sets.
    pub header: String,
    /// Written before the value (`"Bearer "`).
    pub prefix: String,
    /// Whether the proxy also adds it to plain `http://` requests.
    pub allow_http: bool,
    /// The value, sealed: nonce followed by ciphertext and tag (never the value itself).
    pub sealed: Vec<u8>,
    /// When it was attached (unix ms).
    pub created_ms: i64,
}

/// The sealed bytes are noise to a reader, and long: `Debug` shows their length only.
impl std::fmt::Debug for StoredCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredCredential")
            .field("owner", &self.owner)
            .field("host", &self.host)
            .field("header", &self.header)
            .field("prefix_len", &self.prefix.len())
            .field("allow_http", &self.allow_http)
            .field("sealed_len", &self.sealed.len())
            .field("created_ms", &self.created_ms)
            .finish()
    }
}

/// The credential rows of the store. Every method is one short transaction.
#[async_trait]
pub trait EgressCredentials: Send + Sync {
    /// Attaches `cred`, replacing the owner's credential for the same host (true when it
    /// replaced one). A new host past `max_per_owner` rows of that owner is refused with
    /// `StoreError::CredentialQuota` and changes nothing.
    async fn put_egress_credential(
        &self,
        cred: &StoredCredential,
        max_per_owner: u32,
    ) -> Result<bool, StoreError>;
    /// The owner's credentials, by host.
    async fn egress_credentials(&self, owner: &str) -> Result<Vec<StoredCredential>, StoreError>;
    /// Removes the owner's credential for `host`; false when there is none.
    async fn remove_egress_credential(&self, owner: &str, host: &str) -> Result<bool, StoreError>;
}
