//! The service's persistent state: users and their keys, sessions, runs, events,
//! conversations and kept sessions' tool records, behind one small trait so a PostgreSQL
//! implementation can follow.
//!
//! Implementations are crates of their own (the embedded default is sandboxd-sqlite); the
//! binary picks one. Times are unix milliseconds. Rows carry the owner's user id; the callers (the
//! server) compare it with the caller on every access, the store only stores.

pub mod audit;
mod code_contexts;
pub mod conversation;
pub mod egress;
pub mod egress_credentials;
mod mcp_sessions;
pub mod metering;
mod replicas;
mod runs;
mod snapshots;
mod throttle;
mod tool_records;
pub mod wakes;

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use audit::{Audit, AuditBound, AuditEntry, AuditQuery, NewAudit};
pub use code_contexts::{CodeContextRow, CodeContexts, ContextAdded};
pub use egress::{EgressCounters, EgressLog};
pub use egress_credentials::{EgressCredentials, StoredCredential};
pub use mcp_sessions::{McpSandbox, McpSessionRow, McpSessions};
pub use metering::{Counted, DayUsage, Metering, Reading, SessionUsage, UsageQuery, UsageTotals};
pub use replicas::{Replicas, new_replica_id};
pub use runs::{
    Appended, RunControl, RunPage, RunPatch, RunQuery, RunRow, RunScope, RunState, StopRequest,
    StoredEvent, StoredQuestion, Turn,
};
pub use snapshots::SessionSnapshots;
pub use throttle::{AuthFailures, AuthWindow};
pub use tool_records::{StoreRecords, ToolRecords, check_record_size};
pub use wakes::{RunWakes, WAKE_ALL, Wake, Woken, control_wake, wait_for_run};

use crate::config::Limits;
use crate::config::egress::EgressPolicy;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the store at {path} cannot be opened: {message}")]
    Open { path: String, message: String },
    #[error(
        "the store's schema is version {found}, newer than this sandboxd knows ({known}); upgrade sandboxd"
    )]
    TooNew { found: i64, known: i64 },
    #[error("a user named {name:?} already exists")]
    UserExists { name: String },
    #[error("the concurrent-sessions quota of {limit} is reached ({active} active)")]
    SessionQuota { limit: u32, active: u32 },
    /// The global cap (`[sessions] max`): every owner's sessions together.
    #[error("the service's cap of {limit} concurrent sessions is reached ({active} active)")]
    SessionsFull { limit: u32, active: u32 },
    #[error("the concurrent-runs quota of {limit} is reached ({active} in flight)")]
    RunQuota { limit: u32, active: u32 },
    #[error("the store failed: {0}")]
    Sql(String),
    #[error(
        "run {run_id} is not driven by replica {driver}: its lease ended, another replica took the run over, or the run has ended"
    )]
    Fenced { run_id: String, driver: String },
    /// The store cannot be reached now (its server is down or restarting, the connections
    /// are used up): the same request may succeed when retried later.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    #[error("the store holds a malformed {what}: {message}")]
    Corrupt { what: &'static str, message: String },
    #[error(
        "the {kind:?} tool record of session {session:?} is {len} bytes, over the store's limit of {max} bytes"
    )]
    RecordTooLarge {
        session: String,
        kind: String,
        len: u64,
        max: u64,
    },
    /// An owner's egress credentials are bounded (`[egress] user_credentials`).
    #[error("the quota of {limit} egress credentials is reached; remove one first")]
    CredentialQuota { limit: u32 },
}

/// Overrides of the configured quota defaults for one user; `None` keeps the default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuotaOverride {
    pub sessions: Option<u32>,
    pub runs: Option<u32>,
    pub input_tokens_per_day: Option<u64>,
    /// Left out of the JSON when unset, so a row no one gave it reads the same to an
    /// earlier sandboxd (whose `deny_unknown_fields` would refuse the field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_seconds_per_day: Option<u64>,
    pub memory_mb: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<i64>,
    pub workspace_mb: Option<u64>,
    pub tmp_mb: Option<u64>,
    /// The widest egress policy the user may give a session (None: the admin's
    /// `[egress] widest`); never wider than the admin's, whatever is stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressPolicy>,
}

impl QuotaOverride {
    /// Fields set in `other` replace ours.
    pub fn merged(&self, other: &QuotaOverride) -> QuotaOverride {
        QuotaOverride {
            sessions: other.sessions.or(self.sessions),
            runs: other.runs.or(self.runs),
            input_tokens_per_day: other.input_tokens_per_day.or(self.input_tokens_per_day),
            cpu_seconds_per_day: other.cpu_seconds_per_day.or(self.cpu_seconds_per_day),
            memory_mb: other.memory_mb.or(self.memory_mb),
            cpus: other.cpus.or(self.cpus),
            pids: other.pids.or(self.pids),
            workspace_mb: other.workspace_mb.or(self.workspace_mb),
            tmp_mb: other.tmp_mb.or(self.tmp_mb),
            egress: other.egress.clone().or_else(|| self.egress.clone()),
        }
    }
}

/// A user and the one API key they hold.
#[derive(Debug, Clone)]
pub struct User {
    pub id: String,
    pub name: String,
    pub admin: bool,
    /// The first characters of the key (`sbx_` and a few more), for telling keys apart.
    pub key_prefix: String,
    pub created_at: i64,
    pub key_created_at: i64,
    pub last_used_at: Option<i64>,
    /// After this time the key is refused.
    pub expires_at: Option<i64>,
    pub quota: QuotaOverride,
}

/// A key as stored: the SHA-256 of the whole key and its display prefix.
#[derive(Debug, Clone)]
pub struct StoredKey {
    pub hash: [u8; 32],
    pub prefix: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct NewUser {
    pub name: String,
    pub admin: bool,
    pub key: StoredKey,
    pub quota: QuotaOverride,
}

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Reserved against the quota; its container is being made.
    Creating,
    Running,
    Ended,
}

impl SessionState {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Creating => "creating",
            SessionState::Running => "running",
            SessionState::Ended => "ended",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "creating" => Some(SessionState::Creating),
            "running" => Some(SessionState::Running),
            "ended" => Some(SessionState::Ended),
            _ => None,
        }
    }
}

/// Which front end made a session: both count in the owner's one session quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionKind {
    /// POST /v1/sessions or a run: a kept container the API drives.
    #[default]
    Api,
    /// The sandbox of an /mcp client (one per MCP session, or per stateless `sandbox_id`):
    /// driven only through /mcp, and gone when the serve that made it stops.
    Mcp,
}

impl SessionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionKind::Api => "api",
            SessionKind::Mcp => "mcp",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "api" => Some(SessionKind::Api),
            "mcp" => Some(SessionKind::Mcp),
            _ => None,
        }
    }
}

/// One stored session.
#[derive(Debug, Clone)]
pub struct SessionRow {
    pub id: String,
    /// The owning user's id.
    pub owner: String,
    pub state: SessionState,
    pub kind: SessionKind,
    pub limits: Limits,
    pub metadata: BTreeMap<String, String>,
    pub idle_timeout_secs: u64,
    /// The runtime's name for the session (the container's `sandboxd.session` label), once made.
    pub runtime_id: Option<String>,
    pub container_id: Option<String>,
    pub created_at: i64,
    pub last_used_at: i64,
    pub ended_at: Option<i64>,
    pub end_reason: Option<String>,
    /// Which hosts its sandbox may reach through its egress proxy (read at every connection).
    pub egress: EgressPolicy,
    /// The template its sandbox was made from (None: the default image), so a hibernated
    /// session resumes from the same image.
    pub template: Option<String>,
    /// Hibernated: the snapshot file its /workspace was saved to; its sandbox is gone and
    /// the next use resumes it (see `SessionSnapshots`). None while its sandbox lives.
    pub snapshot: Option<String>,
    /// The environment its processes get (`env` at create, E2B's `envVars`), kept so that a
    /// resume or another replica's attach gives it back.
    pub env: SessionEnv,
}

/// A session's environment variables. The values may be secrets: `Debug` shows the names
/// only, and no view, event or log shows a value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SessionEnv(pub BTreeMap<String, String>);

impl std::fmt::Debug for SessionEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl SessionEnv {
    /// As the store keeps it: None when empty, else a JSON object.
    pub fn to_stored(&self) -> Option<String> {
        if self.0.is_empty() {
            None
        } else {
            serde_json::to_string(&self.0).ok()
        }
    }

    /// From what the store kept (see `to_stored`).
    pub fn from_stored(stored: Option<&str>) -> Result<Self, StoreError> {
        match stored {
            None => Ok(Self::default()),
            Some(text) => serde_json::from_str(text)
                .map(Self)
                .map_err(|e| StoreError::Corrupt {
                    what: "session env",
                    message: e.to_string(),
                }),
        }
    }

    /// The variables, for `Sandbox::set_session_env`.
    pub fn vars(&self) -> Vec<(String, String)> {
        self.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

impl SessionRow {
    /// A session as `reserve_session` records it: reserved, no container yet, used now.
    pub fn creating(
        id: impl Into<String>,
        owner: impl Into<String>,
        limits: Limits,
        metadata: BTreeMap<String, String>,
        idle_timeout_secs: u64,
        now: i64,
    ) -> Self {
        Self {
            id: id.into(),
            owner: owner.into(),
            state: SessionState::Creating,
            kind: SessionKind::Api,
            limits,
            metadata,
            idle_timeout_secs,
            runtime_id: None,
            container_id: None,
            created_at: now,
            last_used_at: now,
            ended_at: None,
            end_reason: None,
            egress: EgressPolicy::Off,
            template: None,
            snapshot: None,
            env: SessionEnv::default(),
        }
    }
}

impl SessionRow {
    /// The same row with another kind (what `reserve_session` records).
    pub fn with_kind(mut self, kind: SessionKind) -> Self {
        self.kind = kind;
        self
    }

    /// The same row made from a template (what `reserve_session` records).
    pub fn with_template(mut self, template: Option<String>) -> Self {
        self.template = template;
        self
    }

    /// Whether it is hibernated: running, but its sandbox saved and removed.
    pub fn hibernated(&self) -> bool {
        self.state == SessionState::Running && self.snapshot.is_some()
    }

    /// The same row with an environment for its processes (what `reserve_session` records).
    pub fn with_env(mut self, env: BTreeMap<String, String>) -> Self {
        self.env = SessionEnv(env);
        self
    }

    /// The same row with another egress policy (what `reserve_session` records).
    pub fn with_egress(mut self, egress: EgressPolicy) -> Self {
        self.egress = egress;
        self
    }
}

/// The caps `reserve_session_within` checks, and the replica it records as the new
/// session's first holder.
#[derive(Debug, Clone)]
pub struct SessionCaps {
    /// The owner's sessions that have not ended, the new one included, at most.
    pub per_owner: u32,
    /// Every owner's sessions that have not ended, at most (the global cap).
    pub total: u32,
    /// The replica making the session (see `add_session_holder`).
    pub holder: Option<String>,
}

impl SessionCaps {
    /// Only a per-owner cap, no holder.
    pub fn per_owner(max_active: u32) -> Self {
        Self {
            per_owner: max_active,
            total: u32::MAX,
            holder: None,
        }
    }
}

/// What `list_sessions` returns: newest first, after an opaque cursor.
#[derive(Debug, Clone, Default)]
pub struct SessionQuery {
    /// Only this owner's sessions; None for every owner (admins).
    pub owner: Option<String>,
    /// Include ended sessions.
    pub include_ended: bool,
    /// Every pair must be present in the session's metadata.
    pub metadata: Vec<(String, String)>,
    /// Only sessions older than this cursor (from a previous page).
    pub before: Option<i64>,
    pub limit: u32,
}

/// One page of sessions and the cursor of the next page, if there is one.
#[derive(Debug, Clone)]
pub struct SessionPage {
    pub sessions: Vec<SessionRow>,
    pub next: Option<i64>,
}

/// What a user is using now, for quotas and the admin's view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Every live session: API sessions and /mcp sandboxes alike.
    pub active_sessions: u32,
    /// Of those, the /mcp sandboxes.
    pub active_mcp_sessions: u32,
    pub active_runs: u32,
    pub input_tokens_today: u64,
}

/// A web UI sign-in being made: the SHA-256 of the cookie's token, never the token.
#[derive(Debug, Clone)]
pub struct NewLogin {
    pub token_hash: [u8; 32],
    pub user_id: String,
    /// The CSRF token the page sends back on every state-changing request.
    pub csrf: String,
    pub created_at: i64,
    pub expires_at: i64,
}

/// A live sign-in: its user (as of now) and CSRF token.
#[derive(Debug, Clone)]
pub struct Login {
    pub user: User,
    pub csrf: String,
    pub expires_at: i64,
}

/// The web UI's sign-ins. A sign-in is bound to the user's key at the time: a rotated or
/// removed key ends it.
#[async_trait]
pub trait Logins: Send + Sync {
    async fn add_login(&self, login: NewLogin) -> Result<(), StoreError>;
    /// The sign-in with this token hash, unless it expired or its key changed.
    async fn login(&self, token_hash: [u8; 32], now: i64) -> Result<Option<Login>, StoreError>;
    async fn remove_login(&self, token_hash: [u8; 32]) -> Result<(), StoreError>;
    /// Keeps a single sign-on attempt until `expires_at` (expired ones go with each new one).
    async fn add_sso_state(&self, state: SsoState) -> Result<(), StoreError>;
    /// The attempt whose state has this hash, removed in the same step, so it is found once;
    /// none when unknown, already taken or expired at `now`.
    async fn take_sso_state(
        &self,
        state_hash: [u8; 32],
        now: i64,
    ) -> Result<Option<SsoState>, StoreError>;
}

/// A single sign-on attempt between the redirect to the provider and its callback: the
/// SHA-256 of the `state` sent (never the state), the PKCE verifier and the nonce. Kept in the
/// store, not in memory, so the callback may reach another replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SsoState {
    pub state_hash: [u8; 32],
    pub pkce_verifier: String,
    pub nonce: String,
    pub created_at: i64,
    pub expires_at: i64,
}

/// The store boundary. Every method is one short transaction.
#[async_trait]
pub trait Store:
    Logins
    + ToolRecords
    + Replicas
    + RunControl
    + AuthFailures
    + McpSessions
    + EgressLog
    + EgressCredentials
    + Audit
    + Metering
    + SessionSnapshots
    + CodeContexts
    + Send
    + Sync
{
    /// A write that proves the store is writable (readiness).
    async fn ping(&self) -> Result<(), StoreError>;

    async fn add_user(&self, user: NewUser) -> Result<User, StoreError>;
    async fn user_by_key(&self, hash: [u8; 32]) -> Result<Option<User>, StoreError>;
    async fn user_by_name(&self, name: &str) -> Result<Option<User>, StoreError>;
    /// The user of that id (a session's owner); None when there is none (removed).
    async fn user_by_id(&self, id: &str) -> Result<Option<User>, StoreError>;
    async fn users(&self) -> Result<Vec<User>, StoreError>;
    async fn user_count(&self) -> Result<u64, StoreError>;
    /// Removes the user and ends their sessions (the server removes the containers).
    async fn remove_user(&self, name: &str, now: i64) -> Result<bool, StoreError>;
    /// Replaces the user's key; the old one stops working at once.
    async fn replace_key(&self, name: &str, key: StoredKey) -> Result<bool, StoreError>;
    async fn set_quota(&self, name: &str, quota: QuotaOverride) -> Result<bool, StoreError>;
    /// Makes the user an admin or not (single sign-on's group claim); false if none is named so.
    async fn set_admin(&self, name: &str, admin: bool) -> Result<bool, StoreError>;
    async fn touch_user(&self, id: &str, now: i64) -> Result<(), StoreError>;

    /// Inserts a `creating` session unless its owner already has `max_active` that have not
    /// ended (`StoreError::SessionQuota`). Atomic: the count and the insert happen as one
    /// transaction, so concurrent callers (other tasks, other processes on the same store)
    /// never both pass the cap: of two racing for the last place, one gets the error.
    async fn reserve_session(&self, row: SessionRow, max_active: u32) -> Result<(), StoreError> {
        self.reserve_session_within(row, SessionCaps::per_owner(max_active))
            .await
    }
    /// `reserve_session` with the global cap too (`StoreError::SessionsFull`, checked before
    /// the owner's), counted in the same transaction under one lock shared by every owner,
    /// so replicas racing for the last place never both pass; `caps.holder`, if any, is
    /// recorded as the session's first holder in that transaction.
    async fn reserve_session_within(
        &self,
        row: SessionRow,
        caps: SessionCaps,
    ) -> Result<(), StoreError>;
    /// The container exists: record it and mark the session running.
    async fn session_started(
        &self,
        id: &str,
        runtime_id: &str,
        container_id: &str,
    ) -> Result<(), StoreError>;
    async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError>;
    async fn list_sessions(&self, q: &SessionQuery) -> Result<SessionPage, StoreError>;
    /// Sessions that are creating or running, every owner.
    async fn active_sessions(&self) -> Result<Vec<SessionRow>, StoreError>;
    async fn touch_session(&self, id: &str, now: i64) -> Result<(), StoreError>;
    /// Gives the running (or hibernated) session `id` the idle timeout `secs`, counted from
    /// `now` (its last use becomes `now` unless later already); returns whether it did
    /// (false: it does not exist, or is not running). Every replica's idle end reads it.
    async fn set_idle_timeout(&self, id: &str, secs: u64, now: i64) -> Result<bool, StoreError>;
    /// Marks a session ended (idempotent); returns whether it was still active.
    async fn end_session(&self, id: &str, reason: &str, now: i64) -> Result<bool, StoreError>;

    /// Ends the running session whose runtime id is `runtime_id` as idle, only if its
    /// `last_used_at` is at least its `idle_timeout_secs` before `now` and none of its runs is
    /// in flight; returns the id of the row this call ended (None: it did not end one). One
    /// conditional update: of replicas
    /// reaping at once exactly one ends it, and a use recorded meanwhile keeps it.
    async fn end_idle_session(
        &self,
        runtime_id: &str,
        reason: &str,
        now: i64,
    ) -> Result<Option<String>, StoreError>;
    /// Records that replica `replica_id` attached session `session_id` (idempotent): its
    /// persistent shell there carries the replica's tag, which whoever finds the replica dead
    /// kills. A missing session is not an error (nothing is recorded).
    async fn add_session_holder(
        &self,
        session_id: &str,
        replica_id: &str,
    ) -> Result<(), StoreError>;
    /// Forgets the holders `replica_ids` of the session (their shells were killed).
    async fn remove_session_holders(
        &self,
        session_id: &str,
        replica_ids: &[String],
    ) -> Result<(), StoreError>;
    /// (session id, replica id) of every holder of a session that has not ended.
    async fn session_holders(&self) -> Result<Vec<(String, String)>, StoreError>;

    /// Deletes a session row with its history: its runs, their events and images, and its
    /// conversation go with it (`DELETE /v1/sessions/{id}/history`, and a session whose
    /// container could not be made). Ending a session (`end_session`) keeps all of it.
    async fn delete_session(&self, id: &str) -> Result<bool, StoreError>;

    /// Every user id this store knows: its users and the owners of its session rows (a
    /// removed user's ended sessions included). The reconciler touches only their containers.
    async fn owner_ids(&self) -> Result<Vec<String>, StoreError>;

    async fn usage(&self, owner: &str, now: i64) -> Result<Usage, StoreError>;

    /// Inserts a run unless its owner already has `max_active` in flight
    /// (`StoreError::RunQuota`). Atomic like `reserve_session`: the count and the insert
    /// happen as one transaction, and concurrent callers never both pass the cap.
    async fn insert_run(&self, row: RunRow, max_active: u32) -> Result<(), StoreError>;
    async fn run(&self, id: &str) -> Result<Option<RunRow>, StoreError>;
    async fn list_runs(&self, q: &RunQuery) -> Result<RunPage, StoreError>;
    /// Runs queued, running or waiting, every owner.
    async fn runs_in_flight(&self) -> Result<Vec<RunRow>, StoreError>;
    /// Applies a patch to a run without an event.
    async fn patch_run(&self, id: &str, patch: RunPatch) -> Result<(), StoreError>;
    /// Commits one event (its seq follows the run's `last_seq`) and the patch it brings, in
    /// one transaction: a reader that sees the new `last_seq` sees the event. Fenced: only
    /// while the run is in flight, its driver is `driver` and `driver`'s lease is live by the
    /// store's clock, checked in the same transaction (else `StoreError::Fenced`). With
    /// `patch.count_owner_tokens` the owner's daily input tokens grow in that transaction too
    /// (a refused append counts nothing). Once it has committed, the run's id is sent to
    /// `run_wakes` (never before: a woken reader finds it).
    async fn append_event(
        &self,
        run_id: &str,
        driver: &str,
        event: StoredEvent,
        patch: RunPatch,
    ) -> Result<Appended, StoreError>;
    /// Wake-ups about runs (wakes.rs): after an event of a run commits the run's id is sent,
    /// and on `wake_run` its `control_wake` form, to the receivers of every process on this
    /// store (SQLite: this process; Postgres: every replica, by NOTIFY). Lossy and only a
    /// hint: a receiver that lags, or a store whose listener reconnected, gets `WAKE_ALL`
    /// ("re-read everything"); the table is the truth, so waiters also re-read on a timeout.
    fn run_wakes(&self) -> tokio::sync::broadcast::Receiver<String>;
    /// Sends `control_wake(run_id)` to every process on this store: a control change of the
    /// run that is not an event (a cancel requested, an answer posted), which only the run's
    /// driver acts on; it need not re-read its runs' rows after each of its own events.
    async fn wake_run(&self, run_id: &str) -> Result<(), StoreError>;
    /// Events with seq > `after`, in order, at most `limit`.
    async fn events_after(
        &self,
        run_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError>;
    /// Keeps an image a run's event references (once per run and id).
    async fn put_image(
        &self,
        run_id: &str,
        id: &str,
        media_type: &str,
        data: Vec<u8>,
    ) -> Result<(), StoreError>;
    /// The media type and bytes of an image of that run.
    async fn image(&self, run_id: &str, id: &str) -> Result<Option<(String, Vec<u8>)>, StoreError>;
    /// The session's conversation a next run continues, as `set_conversation` stored it
    /// (the store keeps the text as given; `conversation::decode` reads it).
    async fn conversation(&self, session_id: &str) -> Result<Option<String>, StoreError>;
    /// Replaces the session's conversation with `messages` (`conversation::encode`'s text).
    async fn set_conversation(
        &self,
        session_id: &str,
        messages: String,
        now: i64,
    ) -> Result<(), StoreError>;
    /// Adds input tokens to the owner's count of the UTC day of `now`; the day's total. (A
    /// run's model answers count in their event's append: `RunPatch::count_owner_tokens`.)
    async fn add_input_tokens(&self, owner: &str, tokens: u64, now: i64)
    -> Result<u64, StoreError>;
    /// Deletes ended sessions and finished runs (with their events) that ended before `cutoff`.
    async fn purge_before(&self, cutoff: i64) -> Result<u64, StoreError>;
}

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
