//! API keys and bearer authentication.
//!
//! A key is `sbx_` + 32 random bytes (base64url, no padding); only its SHA-256 is stored, so
//! a lookup by hash in an indexed column is the whole check (a slow KDF buys nothing for a
//! 256-bit random secret, and the hash lookup leaks no useful timing). Failed attempts are
//! counted per source address in a one-minute window that starts at its first failure, in
//! the store (`AuthFailures`), so every replica on one store counts into the same window;
//! past the limit the address's failures get 429 until the window ends. Only failures are
//! counted and checked: a valid key is never refused, and costs no throttle write.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::error::{ApiError, ErrorCode};
use crate::proxies::ClientAddr;
use sandboxd_core::store::{Store, StoreError, StoredKey, User, now_ms};

pub const KEY_PREFIX: &str = "sbx_";
/// Characters of the key kept for display (`sbx_` and 6 more).
const DISPLAY_CHARS: usize = 10;
/// last_used_at is written at most this often per user.
const TOUCH_EVERY_MS: i64 = 60_000;
/// A key used after this long without use (or for the first time) is an audit entry
/// (`key.use`); its last use is then written before the request goes on, so the next
/// request does not count again.
pub const KEY_IDLE_MS: i64 = 3_600_000;
/// Source addresses tracked at once; the oldest windows go first when full.
const MAX_TRACKED: u32 = 10_000;
/// The throttle's window: a source's failures are counted for this long from its first.
const WINDOW_MS: i64 = 60_000;

/// A fresh key: the text shown once, and what the store keeps.
pub fn new_key(expires_at: Option<i64>) -> (String, StoredKey) {
    let raw: [u8; 32] = rand::random();
    let text = format!(
        "{KEY_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
    );
    let stored = StoredKey {
        hash: hash_key(&text),
        prefix: text.chars().take(DISPLAY_CHARS).collect(),
        created_at: now_ms(),
        expires_at,
    };
    (text, stored)
}

pub fn hash_key(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// What a request authenticated with: the SHA-256 of the API key, or of the web sign-in's
/// cookie token. Streams remember it, so that revoking it ends them (`streams`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Credential {
    Key([u8; 32]),
    SignIn([u8; 32]),
}

/// The authenticated user of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: Arc<User>,
    pub credential: Credential,
    /// The request's actor, id and client address, for its audit entries.
    pub who: crate::audit::Who,
}

impl Caller {
    pub fn id(&self) -> &str {
        &self.user.id
    }

    pub fn is_admin(&self) -> bool {
        self.user.admin
    }

    /// Whether this caller may see an object owned by `owner`.
    pub fn owns(&self, owner: &str) -> bool {
        self.user.admin || self.user.id == owner
    }
}

/// What the throttle counts by: an IPv4 address, or an IPv6 address's /64 (one host's
/// usual allocation, so an attacker cannot get a fresh count, or fill the map, by walking
/// their own prefix).
fn source(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let seg = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(
                seg[0], seg[1], seg[2], seg[3], 0, 0, 0, 0,
            ))
        }
        v4 => v4,
    }
}

/// Failed authentications per source address, counted in the store (at most `MAX_TRACKED`
/// sources).
pub struct Throttle {
    per_minute: u32,
    store: Arc<dyn Store>,
}

impl Throttle {
    pub fn new(per_minute: u32, store: Arc<dyn Store>) -> Self {
        Self {
            per_minute: per_minute.max(1),
            store,
        }
    }

    /// Counts a failed authentication from `ip`; the seconds until it may try again when
    /// this failure is over the limit.
    pub async fn failed(&self, ip: IpAddr) -> Result<Option<u64>, StoreError> {
        let now = now_ms();
        let window = self
            .store
            .auth_failed(&source(ip).to_string(), now, WINDOW_MS, MAX_TRACKED)
            .await?;
        Ok((window.failures > self.per_minute).then(|| {
            let left_ms = window.ends_at.saturating_sub(now).max(0) as u64;
            left_ms.div_ceil(1000).max(1)
        }))
    }
}

/// The API key a request carries: `Authorization: Bearer sbx_…`, or the headers E2B's SDKs
/// send it in (`X-API-Key` to the control plane; to a sandbox, `X-Access-Token` and, on the
/// code interpreter's context routes, only `E2B-Traffic-Access-Token`; see e2b/).
pub fn request_key(headers: &axum::http::HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token);
    let e2b = ["x-api-key", "x-access-token", "e2b-traffic-access-token"]
        .into_iter()
        .find_map(|h| headers.get(h).and_then(|v| v.to_str().ok()));
    bearer.or(e2b).map(str::trim).filter(|t| !t.is_empty())
}

/// Resolves the key to a user, or None for a missing, unknown or expired key.
pub async fn authenticate(state: &AppState, token: &str) -> Result<Option<Arc<User>>, ApiError> {
    if !token.starts_with(KEY_PREFIX) || token.len() > 128 {
        return Ok(None);
    }
    let lookup = state.store.user_by_key(hash_key(token));
    let Some(user) = crate::metrics::store_timed("user_by_key", lookup).await? else {
        return Ok(None);
    };
    let now = now_ms();
    if user.expires_at.is_some_and(|e| e <= now) {
        return Ok(None);
    }
    if user.last_used_at.is_none_or(|t| now - t > KEY_IDLE_MS) {
        if let Err(e) = state.store.touch_user(&user.id, now).await {
            tracing::warn!(error = %e, "could not record a key's last use");
        }
    } else if user.last_used_at.is_none_or(|t| now - t > TOUCH_EVERY_MS) {
        let store = state.store.clone();
        let id = user.id.clone();
        tokio::spawn(async move {
            if let Err(e) = store.touch_user(&id, now).await {
                tracing::warn!(error = %e, "could not record a key's last use");
            }
        });
    }
    Ok(Some(Arc::new(user)))
}

/// The request's client address: what the access log layer worked out (see `proxies`),
/// else the TCP peer.
pub fn client_addr(req_ext: &axum::http::Extensions, peer: SocketAddr) -> IpAddr {
    req_ext
        .get::<ClientAddr>()
        .map_or_else(|| peer.ip().to_canonical(), |c| c.0)
}

/// The answer to a failed authentication: the failure counted, then 401, or 429 while the
/// source is over its limit (503 when the store cannot count it).
pub async fn refuse(state: &AppState, client: IpAddr) -> Response {
    match state.throttle.failed(client).await {
        Ok(Some(secs)) => {
            let mut e = ApiError::new(
                ErrorCode::RateLimited,
                format!(
                    "too many failed authentications from {client}; retry in {secs} s with a valid key (a valid key is never refused)"
                ),
            );
            e.retry_after = Some(secs);
            e.into_response()
        }
        Ok(None) => ApiError::new(
            ErrorCode::Unauthorized,
            "send a valid API key as `Authorization: Bearer sbx_…`; `sandboxd users add NAME` creates one",
        )
        .into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// The middleware on every authenticated route: a valid key (or the web UI's sign-in cookie,
/// see `ui::login`) gets in; anything else is 401, or 429 for a source over its failure limit.
pub async fn require_user(
    State(state): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut req: Request,
    next: Next,
) -> Response {
    let client = client_addr(req.extensions(), peer);
    let caller = match request_key(req.headers()) {
        Some(token) => match authenticate(&state, token).await {
            Ok(u) => u.map(|user| Caller {
                user,
                credential: Credential::Key(hash_key(token)),
                who: Default::default(),
            }),
            Err(e) => return e.into_response(),
        },
        // No key: the web UI's sign-in cookie, with its CSRF token on state changes.
        None => match crate::ui::login::from_cookie(&state, req.headers()).await {
            Ok(Some((login, hash))) => {
                if crate::ui::login::changes_state(req.method())
                    && let Err(e) = crate::ui::login::check_csrf(req.headers(), &login)
                {
                    return e.into_response();
                }
                Some(Caller {
                    user: Arc::new(login.user),
                    credential: Credential::SignIn(hash),
                    who: Default::default(),
                })
            }
            Ok(None) => None,
            Err(e) => return e.into_response(),
        },
    };
    let Some(mut caller) = caller else {
        return refuse(&state, client).await;
    };
    caller.who = crate::audit::Who {
        actor: caller.user.name.clone(),
        request_id: req
            .extensions()
            .get::<crate::audit::RequestId>()
            .map(|r| r.0.clone())
            .unwrap_or_default(),
        client: client.to_string(),
    };
    let name = caller.user.name.clone();
    let last = caller.user.last_used_at;
    let idle = matches!(caller.credential, Credential::Key(_))
        && last.is_none_or(|t| now_ms() - t > KEY_IDLE_MS);
    if idle {
        let details =
            serde_json::json!({"key_prefix": caller.user.key_prefix, "last_used_at": last});
        crate::audit::record(&state, &caller.who, "key.use", &name, details).await;
    }
    req.extensions_mut().insert(caller);
    let mut resp = next.run(req).await;
    resp.extensions_mut().insert(crate::http::AccessUser(name));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_long_random_and_hashed() {
        let (a, sa) = new_key(None);
        let (b, _) = new_key(None);
        assert_ne!(a, b);
        assert!(a.starts_with("sbx_") && a.len() == 4 + 43, "{a}");
        assert_eq!(sa.hash, hash_key(&a));
        assert_eq!(sa.prefix.len(), DISPLAY_CHARS);
        assert!(a.starts_with(&sa.prefix));
    }

    async fn throttle(per_minute: u32) -> (tempfile::TempDir, Throttle) {
        let dir = tempfile::tempdir().unwrap();
        let store = sandboxd_sqlite::SqliteStore::open(&dir.path().join("s.db"))
            .await
            .unwrap();
        (dir, Throttle::new(per_minute, Arc::new(store)))
    }

    #[tokio::test]
    async fn throttle_blocks_after_the_limit() {
        let (_dir, t) = throttle(3).await;
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(t.failed(ip).await.unwrap(), None);
        }
        let secs = t.failed(ip).await.unwrap();
        assert!(secs.is_some_and(|s| (1..=60).contains(&s)), "{secs:?}");
        assert_eq!(t.failed(other).await.unwrap(), None);
    }

    #[tokio::test]
    async fn ipv6_sources_are_counted_by_their_64() {
        let (_dir, t) = throttle(2).await;
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let elsewhere: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(t.failed(a).await.unwrap(), None);
        assert_eq!(t.failed(b).await.unwrap(), None);
        assert!(t.failed(a).await.unwrap().is_some());
        assert!(t.failed(b).await.unwrap().is_some());
        assert_eq!(t.failed(elsewhere).await.unwrap(), None);
        // An IPv4-mapped address is its IPv4 address.
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(t.failed(v4).await.unwrap(), None);
        assert_eq!(t.failed(mapped).await.unwrap(), None);
        assert!(t.failed(v4).await.unwrap().is_some());
    }
}
