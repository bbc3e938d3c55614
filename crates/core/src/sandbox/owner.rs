//! Who a session belongs to, and who is asking: the one owner model of every session.
//!
//! An `Owner` is recorded on the session's sandbox when it is created (a label, so it
//! survives the process) and checked on every lookup: a session of another owner is
//! answered exactly like a missing one, so nobody learns that it exists. `Viewer::Admin`
//! (the local command line, an operator of the service) sees every session.

use std::fmt;

use serde::Serialize;

use super::SandboxError;

/// The longest owner name; it is stored in a label and shown in listings.
const MAX_OWNER_LEN: usize = 128;

/// The owner of a session: a user of the service, an MCP client's token, the CLI user.
///
/// Only letters, digits and `._@:-` are allowed, so an owner is safe in a label, a log
/// line and a terminal, and two spellings never name the same owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Owner(String);

impl Owner {
    pub fn new(name: impl Into<String>) -> Result<Owner, SandboxError> {
        let name = name.into();
        let valid = !name.is_empty()
            && name.len() <= MAX_OWNER_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._@:-".contains(&b));
        if valid {
            Ok(Owner(name))
        } else {
            // Debug formatting escapes control characters: a hostile name cannot reach a
            // terminal or a log line raw.
            let shown: String = name.chars().take(MAX_OWNER_LEN + 1).collect();
            Err(SandboxError::InvalidRequest(format!(
                "{shown:?} is not a valid owner: use 1 to {MAX_OWNER_LEN} letters, digits or ._@:-"
            )))
        }
    }

    /// An owner named after a secret without revealing it: `prefix-` and the first 128
    /// bits of the secret's SHA-256 in hex (a bearer token must never reach a label).
    pub fn from_secret(prefix: &str, secret: &[u8]) -> Owner {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(secret);
        let mut name: String = prefix
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || "._@:-".contains(*c))
            .take(MAX_OWNER_LEN - 33)
            .collect();
        name.push('-');
        for b in &digest[..16] {
            name.push_str(&format!("{b:02x}"));
        }
        Owner(name)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who is looking at sessions: one owner (sees only its own) or the admin (sees all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Viewer {
    Owner(Owner),
    Admin,
}

impl Viewer {
    /// Whether this viewer may see a session recorded with `owner` (None: the sandbox
    /// carries no valid owner, which only the admin sees).
    pub fn sees(&self, owner: Option<&Owner>) -> bool {
        match self {
            Viewer::Admin => true,
            Viewer::Owner(me) => owner == Some(me),
        }
    }
}

impl From<Owner> for Viewer {
    fn from(owner: Owner) -> Self {
        Viewer::Owner(owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_plain_names() {
        assert!(Owner::new("alice@example.com").is_ok());
        assert!(Owner::new("token:0123abcd").is_ok());
        let t = Owner::from_secret("mcp token", b"Bearer s3cret");
        assert!(Owner::new(t.as_str()).is_ok(), "{t}");
        assert!(t.as_str().starts_with("mcptoken-") && !t.as_str().contains("s3cret"));
        assert_ne!(t, Owner::from_secret("mcp token", b"Bearer other"));
        for bad in ["", "a b", "a\u{1b}]0;x\u{7}", "ä", &"x".repeat(129)] {
            assert!(Owner::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_viewer_sees_only_its_own() {
        let a = Owner::new("a").unwrap();
        let b = Owner::new("b").unwrap();
        let va = Viewer::from(a.clone());
        assert!(va.sees(Some(&a)));
        assert!(!va.sees(Some(&b)));
        assert!(!va.sees(None));
        assert!(Viewer::Admin.sees(Some(&b)));
        assert!(Viewer::Admin.sees(None));
    }
}
