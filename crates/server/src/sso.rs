//! Single sign-on's side facing the OpenID Connect provider (`[sso]`), on the `openidconnect`
//! crate: discovery (the document and its keys, kept `discovery_ttl_secs`), the
//! authorization URL with PKCE S256, state and nonce, the code exchange, and the ID token's
//! verification (signature against the provider's JWKS, issuer, audience, expiry, nonce).
//!
//! Every request to the provider goes through `ProviderHttp`: only to the configured issuer's
//! origin (a discovery document naming endpoints elsewhere fails), with a time limit, no
//! redirects and a bounded response body. The client secret is read once from the variable
//! `client_secret_env` names and is never logged.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openidconnect::core::{
    CoreAuthenticationFlow, CoreClient, CoreIdToken, CoreIdTokenVerifier, CoreProviderMetadata,
};
use openidconnect::{
    AsyncHttpClient, AuthorizationCode, ClientId, ClientSecret, CsrfToken, EndpointMaybeSet,
    EndpointNotSet, EndpointSet, HttpRequest, HttpResponse, IssuerUrl, Nonce, PkceCodeChallenge,
    PkceCodeVerifier, RedirectUrl, Scope,
};
use sandboxd_core::config::SsoConfig;
use tokio::sync::Mutex;

/// The largest answer read from the provider (discovery, keys, token).
const MAX_BODY: usize = 256 << 10;

type Client = CoreClient<
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// Why a sign-in through the provider failed: the reason is audited and shown.
#[derive(Debug, thiserror::Error)]
pub enum SsoError {
    #[error("the identity provider could not be reached or answered wrongly: {0}")]
    Provider(String),
    #[error("the identity provider's token answer had no ID token")]
    NoIdToken,
    #[error("the ID token was refused: {0}")]
    Token(String),
    #[error("the ID token has no usable `{0}` claim")]
    MissingClaim(String),
}

/// A request to the provider refused or failed before an answer.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HttpError(String);

/// The HTTP client of the provider's calls: its origin only, bounded in time and size.
pub struct ProviderHttp {
    client: reqwest::Client,
    origin: url::Origin,
}

impl ProviderHttp {
    fn new(issuer: &url::Url, timeout: Duration) -> Result<Self, anyhow::Error> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()?;
        Ok(Self {
            client,
            origin: issuer.origin(),
        })
    }

    async fn send(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let target = url::Url::parse(&request.uri().to_string())
            .map_err(|e| HttpError(format!("bad URL {}: {e}", request.uri())))?;
        if target.origin() != self.origin {
            return Err(HttpError(format!(
                "{} is not at the configured issuer's origin {}",
                target,
                self.origin.ascii_serialization()
            )));
        }
        let (parts, body) = request.into_parts();
        let resp = self
            .client
            .request(parts.method, target)
            .headers(parts.headers)
            .body(body)
            .send()
            .await
            .map_err(|e| HttpError(format!("request failed: {e}")))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let mut body = Vec::new();
        let mut resp = resp;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| HttpError(format!("reading the answer: {e}")))?
        {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(HttpError(format!(
                    "the answer is over {} KiB",
                    MAX_BODY >> 10
                )));
            }
            body.extend_from_slice(&chunk);
        }
        let mut out = HttpResponse::new(body);
        *out.status_mut() = status;
        *out.headers_mut() = headers;
        Ok(out)
    }
}

impl<'c> AsyncHttpClient<'c> for ProviderHttp {
    type Error = HttpError;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'c>>;

    fn call(&'c self, request: HttpRequest) -> Self::Future {
        Box::pin(self.send(request))
    }
}

/// Where the browser is sent, and what the callback needs back (kept in the store).
pub struct Start {
    pub url: url::Url,
    pub state: String,
    pub pkce_verifier: String,
    pub nonce: String,
}

/// The verified identity: the user name (from `user_claim`) and the groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub subject: String,
    pub groups: Vec<String>,
}

/// The configured provider, its discovery cached.
pub struct Provider {
    config: SsoConfig,
    issuer: IssuerUrl,
    secret: Option<ClientSecret>,
    http: ProviderHttp,
    discovered: Mutex<Option<(Instant, Arc<CoreProviderMetadata>)>>,
}

impl Provider {
    /// The provider of `[sso]`, or none when single sign-on is off. Fails when the secret's
    /// variable is named but unset.
    pub fn from_config(config: &SsoConfig) -> anyhow::Result<Option<Arc<Self>>> {
        if !config.enabled() {
            return Ok(None);
        }
        let issuer = IssuerUrl::new(config.issuer.clone())?;
        let secret = match config.client_secret_env.as_str() {
            "" => None,
            var => Some(ClientSecret::new(std::env::var(var).map_err(|_| {
                anyhow::anyhow!(
                    "[sso] client_secret_env names {var}, which is not set; set it to the client secret the provider gave"
                )
            })?)),
        };
        let http = ProviderHttp::new(issuer.url(), Duration::from_secs(config.timeout_secs))?;
        Ok(Some(Arc::new(Self {
            config: config.clone(),
            issuer,
            secret,
            http,
            discovered: Mutex::new(None),
        })))
    }

    pub fn config(&self) -> &SsoConfig {
        &self.config
    }

    /// The discovery document and keys, fetched again when older than the TTL.
    async fn metadata(&self) -> Result<Arc<CoreProviderMetadata>, SsoError> {
        let mut cached = self.discovered.lock().await;
        let ttl = Duration::from_secs(self.config.discovery_ttl_secs);
        if let Some((at, m)) = cached.as_ref()
            && at.elapsed() < ttl
        {
            return Ok(m.clone());
        }
        let m = CoreProviderMetadata::discover_async(self.issuer.clone(), &self.http)
            .await
            .map_err(|e| SsoError::Provider(format!("discovery: {}", chain(&e))))?;
        let m = Arc::new(m);
        *cached = Some((Instant::now(), m.clone()));
        Ok(m)
    }

    async fn client(&self, redirect: &str) -> Result<Client, SsoError> {
        let redirect = RedirectUrl::new(redirect.to_string())
            .map_err(|e| SsoError::Provider(format!("redirect URL {redirect:?}: {e}")))?;
        let m = self.metadata().await?;
        Ok(CoreClient::from_provider_metadata(
            (*m).clone(),
            ClientId::new(self.config.client_id.clone()),
            self.secret.clone(),
        )
        .set_redirect_uri(redirect))
    }

    /// The provider's authorization URL for a new attempt, with fresh state, nonce and PKCE.
    pub async fn start(&self, redirect: &str) -> Result<Start, SsoError> {
        let client = self.client(redirect).await?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut req = client.authorize_url(
            CoreAuthenticationFlow::AuthorizationCode,
            CsrfToken::new_random,
            Nonce::new_random,
        );
        for s in &self.config.scopes {
            req = req.add_scope(Scope::new(s.clone()));
        }
        let (url, state, nonce) = req.set_pkce_challenge(challenge).url();
        Ok(Start {
            url,
            state: state.secret().clone(),
            pkce_verifier: verifier.secret().clone(),
            nonce: nonce.secret().clone(),
        })
    }

    /// Exchanges the code (with the PKCE verifier) and verifies the ID token it brings.
    pub async fn finish(
        &self,
        redirect: &str,
        code: &str,
        pkce_verifier: &str,
        nonce: &str,
    ) -> Result<Identity, SsoError> {
        let client = self.client(redirect).await?;
        let tokens = client
            .exchange_code(AuthorizationCode::new(code.to_string()))
            .map_err(|e| SsoError::Provider(format!("no token endpoint: {e}")))?
            .set_pkce_verifier(PkceCodeVerifier::new(pkce_verifier.to_string()))
            .set_redirect_uri(Cow::Owned(
                RedirectUrl::new(redirect.to_string())
                    .map_err(|e| SsoError::Provider(format!("redirect URL: {e}")))?,
            ))
            .request_async(&self.http)
            .await
            .map_err(|e| SsoError::Provider(format!("code exchange: {}", chain(&e))))?;
        let id_token =
            openidconnect::TokenResponse::id_token(&tokens).ok_or(SsoError::NoIdToken)?;
        verify(
            &id_token.to_string(),
            &client.id_token_verifier(),
            nonce,
            &self.config,
        )
    }
}

/// Verifies an ID token (signature, issuer, audience, expiry, nonce) and reads the identity
/// from it. The extra claims are read from the same token's payload, whose signature has just
/// been checked.
pub fn verify(
    raw: &str,
    verifier: &CoreIdTokenVerifier<'_>,
    nonce: &str,
    config: &SsoConfig,
) -> Result<Identity, SsoError> {
    let token: CoreIdToken = raw
        .parse()
        .map_err(|e| SsoError::Token(format!("not a JWT: {e}")))?;
    let claims = token
        .claims(verifier, &Nonce::new(nonce.to_string()))
        .map_err(|e| SsoError::Token(chain(&e)))?;
    let payload = payload(raw)?;
    let name = match config.user_claim.as_str() {
        "sub" => Some(claims.subject().to_string()),
        c => payload.get(c).and_then(|v| v.as_str()).map(str::to_string),
    }
    .filter(|n| !n.is_empty())
    .ok_or_else(|| SsoError::MissingClaim(config.user_claim.clone()))?;
    let groups = match payload.get(&config.groups_claim) {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|g| g.as_str().map(str::to_string))
            .collect(),
        Some(serde_json::Value::String(g)) => vec![g.clone()],
        _ => Vec::new(),
    };
    Ok(Identity {
        name,
        subject: claims.subject().to_string(),
        groups,
    })
}

fn payload(raw: &str) -> Result<serde_json::Map<String, serde_json::Value>, SsoError> {
    use base64::Engine as _;
    let part = raw
        .split('.')
        .nth(1)
        .ok_or_else(|| SsoError::Token("no payload".into()))?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|e| SsoError::Token(format!("payload: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| SsoError::Token(format!("payload: {e}")))
}

/// An error with its causes, one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
#[path = "sso_tests.rs"]
mod tests;
