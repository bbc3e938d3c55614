//! `[sso]`: single sign-on to the web UI through an OpenID Connect provider (authorization
//! code flow with PKCE). Off while `issuer` is empty; the sign-in page then shows only the key
//! form. The client secret is never in the file: `client_secret_env` names the environment
//! variable that holds it.

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SsoConfig {
    /// The provider's issuer URL (its discovery document is at
    /// `<issuer>/.well-known/openid-configuration`); empty turns single sign-on off. Every
    /// request sandboxd makes to the provider must be under this URL's origin.
    pub issuer: String,
    /// This service's client id at the provider.
    pub client_id: String,
    /// The environment variable holding the client secret; empty for a public client (PKCE only).
    pub client_secret_env: String,
    /// Where the provider sends the browser back: `https://HOST/login/sso/callback`. Empty:
    /// made from the request's Host (and `X-Forwarded-Proto`).
    pub redirect_url: String,
    /// Scopes asked for besides `openid`.
    pub scopes: Vec<String>,
    /// The ID-token claim whose value is the sandboxd user name (matched, or created).
    pub user_claim: String,
    /// The ID-token claim listing the user's groups; empty: SSO never changes who is an admin.
    pub groups_claim: String,
    /// Members of this group (in `groups_claim`) are admins, others not; empty: no admin by SSO.
    pub admin_group: String,
    /// Whether a user the store does not know is created at their first sign-in.
    pub create_users: bool,
    /// How long the provider's discovery document and keys are kept before being fetched again.
    pub discovery_ttl_secs: u64,
    /// Time limit of each request to the provider.
    pub timeout_secs: u64,
}

impl Default for SsoConfig {
    fn default() -> Self {
        Self {
            issuer: String::new(),
            client_id: String::new(),
            client_secret_env: String::new(),
            redirect_url: String::new(),
            scopes: vec!["email".into(), "profile".into()],
            user_claim: "preferred_username".into(),
            groups_claim: "groups".into(),
            admin_group: String::new(),
            create_users: true,
            discovery_ttl_secs: 300,
            timeout_secs: 10,
        }
    }
}

impl SsoConfig {
    pub fn enabled(&self) -> bool {
        !self.issuer.is_empty()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| {
            Err(ConfigError::Invalid {
                key: format!("sso.{key}"),
                message,
            })
        };
        if !self.enabled() {
            return Ok(());
        }
        match url::Url::parse(&self.issuer) {
            Ok(u) if matches!(u.scheme(), "https" | "http") && u.host().is_some() => {}
            _ => return bad("issuer", format!("{:?} is not an http(s) URL", self.issuer)),
        }
        if self.client_id.is_empty() {
            return bad("client_id", "is required when `issuer` is set".into());
        }
        if self.user_claim.is_empty() {
            return bad(
                "user_claim",
                "must name a claim (e.g. preferred_username)".into(),
            );
        }
        if !self.admin_group.is_empty() && self.groups_claim.is_empty() {
            return bad(
                "groups_claim",
                "must name the groups claim when `admin_group` is set".into(),
            );
        }
        if !self.redirect_url.is_empty() && url::Url::parse(&self.redirect_url).is_err() {
            return bad(
                "redirect_url",
                format!("{:?} is not a URL", self.redirect_url),
            );
        }
        if !(1..=120).contains(&self.timeout_secs) {
            return bad(
                "timeout_secs",
                format!("{} is not between 1 and 120", self.timeout_secs),
            );
        }
        Ok(())
    }
}
