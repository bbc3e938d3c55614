//! Users' egress credentials at rest: each value is sealed with AES-256-GCM under the admin's
//! key before it reaches the store, and opened only in the proxy's process when a session of
//! its owner needs it.
//!
//! ring's AEAD rather than RustCrypto's `aes-gcm`: ring is already compiled into the tree
//! (rustls and rcgen use it), its AES-GCM is the constant-time code that protects TLS records,
//! and it adds no crate. A nonce is 96 random bits from the system's generator per seal: a
//! user keeps at most `[egress] user_credentials` values, far from GCM's random-nonce limit.
//!
//! The additional data binds a sealed value to its row (owner, host, header, prefix,
//! `allow_http`): whoever can write the database cannot move a user's secret to another
//! user, another host or a cleartext-allowed row; such a row fails to open.
//!
//! The key is the admin's (`[egress] credential_key_file`, or the variable that
//! `credential_key_env` names): 64 hex characters, never hard-coded; without one, user
//! credentials are refused with an error that says how to set it.

use std::sync::Arc;

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use secrecy::zeroize::Zeroize;
use sha2::{Digest, Sha256};

use crate::config::egress::CredentialValue;

/// What the admin is told when user credentials are used without a key.
pub const NO_KEY: &str = "user egress credentials are off: the admin has not set a key to seal them with; set [egress] credential_key_file to a file (mode 0600) holding 64 hex characters (`openssl rand -hex 32`), or credential_key_env to the name of a variable holding them, and restart sandboxd";

#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("{NO_KEY}")]
    NoKey,
    #[error("the system's random generator failed")]
    Random,
    /// Another key sealed it, or the row was changed: the value is not used.
    #[error(
        "a stored credential does not open under the configured key (the key changed, or the row was altered); attach it again"
    )]
    Open,
}

/// The admin's sealing key (absent: user credentials are refused).
#[derive(Clone, Default)]
pub struct CredentialKey(Option<Arc<Sealer>>);

struct Sealer {
    key: LessSafeKey,
    /// A hash of the key: equality of two configs without comparing keys.
    id: [u8; 32],
}

impl std::fmt::Debug for CredentialKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_set() {
            "[REDACTED]"
        } else {
            "(none)"
        })
    }
}

impl PartialEq for CredentialKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_ref().map(|s| s.id) == other.0.as_ref().map(|s| s.id)
    }
}

impl CredentialKey {
    /// A key from its 64 hex characters (surrounding white space ignored).
    pub fn from_hex(text: &str) -> Result<CredentialKey, String> {
        let mut bytes = hex::decode(text.trim()).map_err(|_| {
            "must be 64 hex characters (a 256-bit key: `openssl rand -hex 32`)".to_string()
        })?;
        if bytes.len() != 32 {
            bytes.zeroize();
            return Err("must be 64 hex characters (a 256-bit key: `openssl rand -hex 32`)".into());
        }
        let id: [u8; 32] = Sha256::digest(&bytes).into();
        let unbound = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| "not a key".to_string());
        bytes.zeroize();
        Ok(CredentialKey(Some(Arc::new(Sealer {
            key: LessSafeKey::new(unbound?),
            id,
        }))))
    }

    /// The key of `[egress]`: from `file`, or from the variable `env_name` of `env`; neither
    /// set is no key. (key, message) on error; a message never shows the key.
    pub fn load(
        file: &str,
        env_name: &str,
        env: &[(String, String)],
    ) -> Result<CredentialKey, (String, String)> {
        match (file.is_empty(), env_name.is_empty()) {
            (true, true) => Ok(CredentialKey::default()),
            (false, false) => Err((
                "egress.credential_key_file".into(),
                "set either credential_key_file or credential_key_env, not both".into(),
            )),
            (false, true) => {
                let key = "egress.credential_key_file".to_string();
                check_mode(file).map_err(|m| (key.clone(), m))?;
                let mut text = std::fs::read_to_string(file)
                    .map_err(|e| (key.clone(), format!("{file}: {e}")))?;
                let parsed = CredentialKey::from_hex(&text);
                text.zeroize();
                parsed.map_err(|m| (key, format!("{file}: {m}")))
            }
            (true, false) => {
                let key = "egress.credential_key_env".to_string();
                let value = env.iter().rev().find(|(k, _)| k == env_name);
                match value {
                    None => Err((
                        key,
                        format!(
                            "the environment variable {env_name:?} is not set in sandboxd's environment"
                        ),
                    )),
                    Some((_, v)) => CredentialKey::from_hex(v)
                        .map_err(|m| (key, format!("the value of {env_name:?} {m}"))),
                }
            }
        }
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// `value` sealed for the row `aad` names: nonce, then ciphertext and tag.
    pub fn seal(&self, aad: &[u8], value: &CredentialValue) -> Result<Vec<u8>, VaultError> {
        let sealer = self.0.as_ref().ok_or(VaultError::NoKey)?;
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| VaultError::Random)?;
        let mut buf = value.expose().as_bytes().to_vec();
        let sealed = sealer.key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut buf,
        );
        if sealed.is_err() {
            buf.zeroize();
            return Err(VaultError::Random);
        }
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Ok(out)
    }

    /// The value sealed by `seal` for the same `aad`.
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<CredentialValue, VaultError> {
        let sealer = self.0.as_ref().ok_or(VaultError::NoKey)?;
        if sealed.len() < NONCE_LEN {
            return Err(VaultError::Open);
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| VaultError::Open)?;
        let mut buf = body.to_vec();
        let plain = match sealer.key.open_in_place(nonce, Aad::from(aad), &mut buf) {
            Ok(p) => std::str::from_utf8(p).map(CredentialValue::new).ok(),
            Err(_) => None,
        };
        buf.zeroize();
        plain.ok_or(VaultError::Open)
    }
}

/// A key file others can read is refused: the key opens every user's secrets.
fn check_mode(path: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{path}: {e}"))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{path} can be read by other users (mode {:o}); `chmod 600 {path}`",
            meta.permissions().mode() & 0o777
        ));
    }
    Ok(())
}

/// The additional data of one credential row: everything that decides where and how the
/// value is sent, so none of it can change without the seal failing.
pub fn row_aad(owner: &str, host: &str, header: &str, prefix: &str, allow_http: bool) -> Vec<u8> {
    let mut aad = b"sandboxd egress credential v1".to_vec();
    for part in [
        owner,
        host,
        header,
        prefix,
        if allow_http { "1" } else { "0" },
    ] {
        aad.push(0);
        aad.extend_from_slice(part.as_bytes());
    }
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn seals_and_opens_only_for_its_row_and_key() {
        let key = CredentialKey::from_hex(KEY).unwrap();
        let v = CredentialValue::new("s3cret-token");
        let aad = row_aad("u1", "api.example.com", "Authorization", "Bearer ", false);
        let sealed = key.seal(&aad, &v).unwrap();
        assert!(!sealed.windows(12).any(|w| w == b"s3cret-token"));
        assert_eq!(key.open(&aad, &sealed).unwrap(), v);
        let other_row = row_aad("u2", "api.example.com", "Authorization", "Bearer ", false);
        assert!(matches!(
            key.open(&other_row, &sealed),
            Err(VaultError::Open)
        ));
        let http = row_aad("u1", "api.example.com", "Authorization", "Bearer ", true);
        assert!(matches!(key.open(&http, &sealed), Err(VaultError::Open)));
        let other_key = CredentialKey::from_hex(&KEY.replace("00", "ff")).unwrap();
        assert!(matches!(
            other_key.open(&aad, &sealed),
            Err(VaultError::Open)
        ));
        assert!(matches!(
            key.open(&aad, &sealed[..5]),
            Err(VaultError::Open)
        ));
        // Two seals of one value differ (a fresh nonce each).
        assert_ne!(key.seal(&aad, &v).unwrap(), sealed);
    }

    #[test]
    fn no_key_and_bad_keys_are_refused_clearly() {
        let none = CredentialKey::default();
        let err = none.seal(b"x", &CredentialValue::new("v")).unwrap_err();
        assert!(err.to_string().contains("credential_key_file"), "{err}");
        assert!(CredentialKey::from_hex("abcd").is_err());
        assert!(CredentialKey::from_hex("zz").is_err());
        let env = vec![("K".to_string(), KEY.to_string())];
        assert!(CredentialKey::load("", "K", &env).unwrap().is_set());
        assert!(!CredentialKey::load("", "", &env).unwrap().is_set());
        let (k, m) = CredentialKey::load("", "MISSING", &env).unwrap_err();
        assert_eq!(k, "egress.credential_key_env");
        assert!(m.contains("MISSING"), "{m}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, KEY).unwrap();
        let p = path.to_str().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (_, m) = CredentialKey::load(p, "", &env).unwrap_err();
        assert!(m.contains("chmod 600") && !m.contains(KEY), "{m}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(CredentialKey::load(p, "", &env).unwrap().is_set());
        assert!(format!("{:?}", CredentialKey::load(p, "", &env).unwrap()) == "[REDACTED]");
    }
}
