//! API keys and bearer authentication.
//!
//! A key is `sbx_` + 32 random bytes (base64url, no padding); only its SHA-256 is stored, so
//! a lookup by hash in an indexed column is the whole check (a slow KDF buys nothing for a
//! 256-bit random secret, and the hash lookup leaks no useful timing). Failed attempts are
//! counted per source address in a fixed one-minute window; past the limit the address gets
//! 429 until the window ends, whether or not its next key is right.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::error::{ApiError, ErrorCode};
use crate::proxies::ClientAddr;
use sandboxd_core::store::{StoredKey, User, now_ms};

pub const KEY_PREFIX: &str = "sbx_";
/// Characters of the key kept for display (`sbx_` and 6 more).
const DISPLAY_CHARS: usize = 10;
/// last_used_at is written at most this often per user.
const TOUCH_EVERY_MS: i64 = 60_000;
/// Source addresses tracked at once; the oldest windows go first when full.
const MAX_TRACKED: usize = 10_000;

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

/// Failed authentications per source address (at most `MAX_TRACKED` sources).
pub struct Throttle {
    per_minute: u32,
    windows: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Throttle {
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute: per_minute.max(1),
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Seconds until `ip` may try again, if it is over the limit.
    pub fn blocked(&self, ip: IpAddr) -> Option<u64> {
        let ip = source(ip);
        let map = self.windows.lock().ok()?;
        let (start, n) = map.get(&ip)?;
        let left = Duration::from_secs(60).checked_sub(start.elapsed())?;
        (*n >= self.per_minute).then(|| left.as_secs().max(1))
    }

    pub fn failed(&self, ip: IpAddr) {
        let ip = source(ip);
        let Ok(mut map) = self.windows.lock() else {
            return;
        };
        if map.len() >= MAX_TRACKED && !map.contains_key(&ip) {
            map.retain(|_, (start, _)| start.elapsed() < Duration::from_secs(60));
            if map.len() >= MAX_TRACKED
                && let Some(oldest) = map.iter().min_by_key(|(_, (s, _))| *s).map(|(k, _)| *k)
            {
                map.remove(&oldest);
            }
        }
        let entry = map.entry(ip).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= Duration::from_secs(60) {
            *entry = (Instant::now(), 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }
}

fn bearer(req: &Request) -> Option<&str> {
    let v = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Resolves the key to a user, or None for a missing, unknown or expired key.
pub async fn authenticate(state: &AppState, token: &str) -> Result<Option<Arc<User>>, ApiError> {
    if !token.starts_with(KEY_PREFIX) || token.len() > 128 {
        return Ok(None);
    }
    let Some(user) = state.store.user_by_key(hash_key(token)).await? else {
        return Ok(None);
    };
    let now = now_ms();
    if user.expires_at.is_some_and(|e| e <= now) {
        return Ok(None);
    }
    if user.last_used_at.is_none_or(|t| now - t > TOUCH_EVERY_MS) {
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

/// The answer to a failed authentication: 429 while the source is over its limit, else 401
/// (and the failure counted).
pub fn refuse(state: &AppState, client: IpAddr) -> Response {
    if let Some(secs) = state.throttle.blocked(client) {
        let mut e = ApiError::new(
            ErrorCode::RateLimited,
            format!(
                "too many failed authentications from {client}; retry in {secs} s with a valid key (a valid key is never refused)"
            ),
        );
        e.retry_after = Some(secs);
        return e.into_response();
    }
    state.throttle.failed(client);
    ApiError::new(
        ErrorCode::Unauthorized,
        "send a valid API key as `Authorization: Bearer sbx_…`; `sandboxd users add NAME` creates one",
    )
    .into_response()
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
    let caller = match bearer(&req) {
        Some(token) => match authenticate(&state, token).await {
            Ok(u) => u.map(|user| Caller {
                user,
                credential: Credential::Key(hash_key(token)),
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
                })
            }
            Ok(None) => None,
            Err(e) => return e.into_response(),
        },
    };
    let Some(caller) = caller else {
        return refuse(&state, client);
    };
    let name = caller.user.name.clone();
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

    #[test]
    fn throttle_blocks_after_the_limit() {
        let t = Throttle::new(3);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..3 {
            assert!(t.blocked(ip).is_none());
            t.failed(ip);
        }
        assert!(t.blocked(ip).is_some_and(|s| (1..=60).contains(&s)));
        assert!(t.blocked(other).is_none());
    }

    #[test]
    fn ipv6_sources_are_counted_by_their_64() {
        let t = Throttle::new(2);
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let elsewhere: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        t.failed(a);
        t.failed(b);
        assert!(t.blocked(a).is_some() && t.blocked(b).is_some());
        assert!(t.blocked(elsewhere).is_none());
        // An IPv4-mapped address is its IPv4 address.
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        t.failed(v4);
        t.failed(mapped);
        assert!(t.blocked(v4).is_some());
    }
}
