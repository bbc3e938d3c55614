//! The open streams (run event streams, streamed execs) and long requests (sync exec, tool
//! call) of every user, with the credential each was opened with: what makes revocation
//! revoke, and what caps a user's streams.
//!
//! Each one holds a `StreamGuard` for its whole life: a cancellation token (a child of the
//! shutdown token) that the stream selects on, and a slot in the registry that its drop gives
//! back. Rotating a key, removing a user or signing out cancels the tokens of what that
//! credential opened at once (the reason is kept, so the stream can end with a last
//! `credential_revoked` error instead of just stopping). A key rotated or a user removed by
//! another process (`sandboxd users rotate|rm` on the same store; later, another replica)
//! is not seen here, so every `RECHECK` the registry also looks each open credential up in
//! the store, as authentication does, and revokes those no longer valid (expired keys and
//! sign-ins too).
//!
//! Streams count against `[server] streams_per_user`; the one over it is refused with
//! `too_many_streams` before anything starts. Long requests are registered uncounted: they
//! are bounded by their time limit, and the cap is about connections held open.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::auth::{Caller, Credential};
use crate::error::{ApiError, ErrorCode};
use sandboxd_core::store::{Store, StoreError, now_ms};

/// How often open credentials are looked up in the store.
pub const RECHECK: Duration = Duration::from_secs(5);

/// Why a stream's credential no longer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    /// The user's key was rotated here (the old key and its sign-ins are dead).
    Rotated,
    /// The user was removed.
    UserRemoved,
    /// The web sign-in was signed out.
    SignedOut,
    /// The store no longer accepts the credential (rotated or removed elsewhere, expired).
    NoLongerValid,
}

impl Revoked {
    /// The error a revoked stream ends with.
    pub fn error(self) -> ApiError {
        let why = match self {
            Revoked::Rotated => "the API key this stream was opened with was rotated",
            Revoked::UserRemoved => "the user this stream belongs to was removed",
            Revoked::SignedOut => "the web sign-in this stream was opened with was signed out",
            Revoked::NoLongerValid => {
                "the credential this stream was opened with is no longer valid (rotated, removed or expired)"
            }
        };
        ApiError::new(
            ErrorCode::CredentialRevoked,
            format!("{why}, so it was ended; open it again with a valid key or sign-in"),
        )
    }
}

/// Whether a registered stream counts against the per-user cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An event stream that follows, or a streamed exec: counted.
    Stream,
    /// A long request (sync exec, tool call, events with follow=false): only revoked,
    /// never refused.
    Request,
}

struct Entry {
    credential: Credential,
    kind: Kind,
    token: CancellationToken,
    why: Arc<OnceLock<Revoked>>,
}

impl Entry {
    fn revoke(&self, why: Revoked) {
        let _ = self.why.set(why);
        self.token.cancel();
    }
}

/// Every open stream of this process, by user id and then by stream number.
pub struct Streams {
    per_user: usize,
    open: Mutex<HashMap<String, HashMap<u64, Entry>>>,
    next: AtomicU64,
}

impl Streams {
    pub fn new(per_user: u32) -> Arc<Self> {
        Arc::new(Self {
            per_user: per_user.max(1) as usize,
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        })
    }

    /// Registers a stream of the caller; its token is a child of `parent` (the shutdown).
    /// A `Kind::Stream` over the caller's cap is refused with `too_many_streams`.
    pub fn open(
        self: &Arc<Self>,
        caller: &Caller,
        kind: Kind,
        parent: &CancellationToken,
    ) -> Result<StreamGuard, ApiError> {
        let mut open = self
            .open
            .lock()
            .map_err(|_| ApiError::internal("the stream registry's lock is poisoned"))?;
        let mine = open.entry(caller.id().to_string()).or_default();
        if kind == Kind::Stream {
            let streams = mine.values().filter(|e| e.kind == Kind::Stream).count();
            if streams >= self.per_user {
                return Err(ApiError::new(
                    ErrorCode::TooManyStreams,
                    format!(
                        "you have {streams} event streams and streamed execs open, the most one user may ([server] streams_per_user); close one and retry (a run's events with ?follow=false are not counted)"
                    ),
                ));
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let token = parent.child_token();
        let why = Arc::new(OnceLock::new());
        mine.insert(
            id,
            Entry {
                credential: caller.credential,
                kind,
                token: token.clone(),
                why: why.clone(),
            },
        );
        Ok(StreamGuard {
            streams: self.clone(),
            user: caller.id().to_string(),
            id,
            token,
            why,
        })
    }

    /// Ends every stream of the user (their key was rotated, or they were removed).
    pub fn revoke_user(&self, user_id: &str, why: Revoked) {
        self.revoke(why, |user, _| user == user_id);
    }

    /// Ends the streams opened with one credential of the user (a sign-out).
    pub fn revoke_credential(&self, user_id: &str, credential: Credential, why: Revoked) {
        self.revoke(why, |user, c| user == user_id && c == credential);
    }

    fn revoke(&self, why: Revoked, matches: impl Fn(&str, Credential) -> bool) {
        let Ok(open) = self.open.lock() else {
            return;
        };
        for (user, mine) in open.iter() {
            for e in mine.values().filter(|e| matches(user, e.credential)) {
                e.revoke(why);
            }
        }
    }

    /// The distinct (user, credential) pairs of the open streams.
    fn credentials(&self) -> HashSet<(String, Credential)> {
        let Ok(open) = self.open.lock() else {
            return HashSet::new();
        };
        open.iter()
            .flat_map(|(user, mine)| mine.values().map(|e| (user.clone(), e.credential)))
            .collect()
    }

    /// How many counted streams the user has open (for tests and the log).
    pub fn count(&self, user_id: &str) -> usize {
        self.open
            .lock()
            .ok()
            .and_then(|o| {
                o.get(user_id)
                    .map(|m| m.values().filter(|e| e.kind == Kind::Stream).count())
            })
            .unwrap_or(0)
    }

    fn close(&self, user_id: &str, id: u64) {
        let Ok(mut open) = self.open.lock() else {
            return;
        };
        if let Some(mine) = open.get_mut(user_id) {
            mine.remove(&id);
            if mine.is_empty() {
                open.remove(user_id);
            }
        }
    }

    /// One pass of the re-check: every open credential the store no longer accepts has its
    /// streams ended. A store error leaves them open (it is logged; the next pass retries).
    pub async fn recheck(&self, store: &dyn Store) {
        for (user, credential) in self.credentials() {
            match still_valid(store, &user, credential).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!(user = %user, "a credential with open streams is no longer valid; ending them");
                    self.revoke_credential(&user, credential, Revoked::NoLongerValid);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not re-check an open stream's credential")
                }
            }
        }
    }

    /// Runs `recheck` every `RECHECK` until `shutdown`.
    pub fn spawn_recheck(
        self: &Arc<Self>,
        store: Arc<dyn Store>,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let streams = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(RECHECK) => {}
                    _ = shutdown.cancelled() => return,
                }
                streams.recheck(store.as_ref()).await;
            }
        })
    }
}

/// Whether the store still accepts the credential for this user, as authentication would.
async fn still_valid(
    store: &dyn Store,
    user_id: &str,
    credential: Credential,
) -> Result<bool, StoreError> {
    let now = now_ms();
    Ok(match credential {
        Credential::Key(hash) => store
            .user_by_key(hash)
            .await?
            .is_some_and(|u| u.id == user_id && u.expires_at.is_none_or(|e| e > now)),
        Credential::SignIn(hash) => store
            .login(hash, now)
            .await?
            .is_some_and(|l| l.user.id == user_id),
    })
}

/// A registered stream: its token ends it, its drop frees its slot.
pub struct StreamGuard {
    streams: Arc<Streams>,
    user: String,
    id: u64,
    token: CancellationToken,
    why: Arc<OnceLock<Revoked>>,
}

impl StreamGuard {
    /// Cancelled when the credential is revoked or the server shuts down.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Why the stream was revoked, if it was (None: still valid, or a shutdown).
    pub fn revoked(&self) -> Option<Revoked> {
        self.why.get().copied()
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.streams.close(&self.user, self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxd_core::store::User;

    fn caller(id: &str, credential: Credential) -> Caller {
        Caller {
            user: Arc::new(User {
                id: id.into(),
                name: id.into(),
                admin: false,
                key_prefix: "sbx_".into(),
                created_at: 0,
                key_created_at: 0,
                last_used_at: None,
                expires_at: None,
                quota: Default::default(),
            }),
            credential,
            who: Default::default(),
        }
    }

    #[test]
    fn the_cap_counts_streams_per_user_and_a_drop_frees_a_slot() {
        let s = Streams::new(2);
        let root = CancellationToken::new();
        let a = caller("a", Credential::Key([1; 32]));
        let b = caller("b", Credential::Key([2; 32]));
        let one = s.open(&a, Kind::Stream, &root).unwrap();
        let _two = s.open(&a, Kind::Stream, &root).unwrap();
        let err = s.open(&a, Kind::Stream, &root).err().unwrap();
        assert_eq!(err.detail.code, ErrorCode::TooManyStreams);
        // Requests are not counted, and another user has their own slots.
        let _req = s.open(&a, Kind::Request, &root).unwrap();
        let _b = s.open(&b, Kind::Stream, &root).unwrap();
        drop(one);
        assert_eq!(s.count("a"), 1);
        let _again = s.open(&a, Kind::Stream, &root).unwrap();
    }

    /// What another process does to the store (`sandboxd users rotate|rm`) ends the streams
    /// at the next re-check: the key's and the sign-in's made with it.
    #[tokio::test]
    async fn the_recheck_ends_streams_whose_credential_the_store_no_longer_accepts() {
        use crate::accounts;
        use crate::auth::hash_key;
        use sandboxd_core::store::{Logins as _, NewLogin};
        use sandboxd_sqlite::SqliteStore;
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("s.db")).await.unwrap();
        let (ann, key) = accounts::add(&store, "ann", false, None, Default::default())
            .await
            .unwrap();
        let (bob, bob_key) = accounts::add(&store, "bob", false, None, Default::default())
            .await
            .unwrap();
        store
            .add_login(NewLogin {
                token_hash: [7; 32],
                user_id: ann.id.clone(),
                csrf: "c".into(),
                created_at: now_ms(),
                expires_at: now_ms() + 60_000,
            })
            .await
            .unwrap();
        let s = Streams::new(4);
        let root = CancellationToken::new();
        let as_ann = |credential| Caller {
            user: Arc::new(ann.clone()),
            credential,
            who: Default::default(),
        };
        let by_key = s
            .open(
                &as_ann(Credential::Key(hash_key(&key))),
                Kind::Stream,
                &root,
            )
            .unwrap();
        let by_cookie = s
            .open(&as_ann(Credential::SignIn([7; 32])), Kind::Stream, &root)
            .unwrap();
        let other = Caller {
            user: Arc::new(bob),
            credential: Credential::Key(hash_key(&bob_key)),
            who: Default::default(),
        };
        let bobs = s.open(&other, Kind::Stream, &root).unwrap();
        s.recheck(&store).await;
        assert!(!by_key.token().is_cancelled() && !by_cookie.token().is_cancelled());
        accounts::rotate(&store, "ann", None).await.unwrap();
        s.recheck(&store).await;
        assert_eq!(by_key.revoked(), Some(Revoked::NoLongerValid));
        assert_eq!(by_cookie.revoked(), Some(Revoked::NoLongerValid));
        assert!(!bobs.token().is_cancelled());
        accounts::remove(&store, "bob").await.unwrap();
        s.recheck(&store).await;
        assert_eq!(bobs.revoked(), Some(Revoked::NoLongerValid));
    }

    #[test]
    fn revocation_ends_what_the_credential_opened_and_says_why() {
        let s = Streams::new(8);
        let root = CancellationToken::new();
        let key = caller("a", Credential::Key([1; 32]));
        let cookie = caller("a", Credential::SignIn([3; 32]));
        let other = caller("b", Credential::Key([2; 32]));
        let k = s.open(&key, Kind::Stream, &root).unwrap();
        let c = s.open(&cookie, Kind::Request, &root).unwrap();
        let o = s.open(&other, Kind::Stream, &root).unwrap();
        s.revoke_credential("a", Credential::SignIn([3; 32]), Revoked::SignedOut);
        assert_eq!(c.revoked(), Some(Revoked::SignedOut));
        assert!(c.token().is_cancelled() && !k.token().is_cancelled());
        s.revoke_user("a", Revoked::Rotated);
        assert_eq!(k.revoked(), Some(Revoked::Rotated));
        assert_eq!(
            c.revoked(),
            Some(Revoked::SignedOut),
            "the first reason stays"
        );
        assert!(!o.token().is_cancelled());
        // A shutdown cancels without a reason.
        root.cancel();
        assert!(o.token().is_cancelled() && o.revoked().is_none());
    }
}
