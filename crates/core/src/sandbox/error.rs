//! SandboxError: what failed while reaching a session's sandbox, and what to do about it.
//!
//! The variants name a backend, never Docker: the Docker backend fills in its own wording
//! (which engine, how to start it), a Kubernetes backend would fill in its own.

use std::time::Duration;

/// Every variant says what failed and how to recover. Failures the model can act on
/// (a missing file, a bad path) are turned into observations by the tools; the rest are
/// failures of sandboxd or of its environment.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The backend cannot be reached at all. `backend` names it ("the Docker engine"),
    /// `fix` says how to bring it up.
    #[error("{backend} is not reachable ({message}); {fix}")]
    BackendUnavailable {
        backend: &'static str,
        message: String,
        fix: &'static str,
    },

    #[error(
        "the sandbox of session {session} is gone ({message}); it was removed or killed from outside: start a new session"
    )]
    SandboxGone { session: String, message: String },

    #[error("the sandbox image {tag} is missing; build the image, then create the session again")]
    ImageMissing { tag: String },

    /// Another process is doing the same thing to the same sandbox right now (a resume on
    /// another replica): nothing was changed; the caller retries.
    #[error("{0}; retry in a moment")]
    Busy(String),

    #[error("no session {id}; list the live sessions for the right id")]
    SessionNotFound { id: String },

    #[error(
        "the session limit of {limit} is reached; remove an idle session or raise [sessions] max"
    )]
    TooManySessions { limit: usize },

    #[error(
        "{owner} already has {limit} sessions, the most one owner may have ([sessions] max_per_owner); remove one it no longer needs"
    )]
    TooManySessionsForOwner { owner: String, limit: usize },

    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: String },

    #[error("no such file or directory: {path}")]
    NotFound { path: String },

    #[error(
        "{path} is {size} bytes, over the cap of {limit} bytes; read it in parts (head, tail, sed -n)"
    )]
    FileTooLarge { path: String, size: u64, limit: u64 },

    #[error("{operation} {path}: {message}")]
    FileOp {
        operation: &'static str,
        path: String,
        message: String,
    },

    #[error("unsafe archive: {0}")]
    Tar(#[from] crate::sandbox::tar_safety::TarError),

    #[error("{what} timed out after {after:?}")]
    Timeout { what: String, after: Duration },

    #[error("the in-sandbox helper {helper} broke its protocol: {message}")]
    Protocol { helper: String, message: String },

    #[error(
        "could not confirm that {what} was killed: {detail}; its processes may still be running in the sandbox (restart the session if it misbehaves)"
    )]
    KillUnconfirmed { what: String, detail: String },

    /// The backend answered but refused; `backend` names it ("Docker").
    #[error("{backend} refused to {operation}: {message}")]
    Backend {
        backend: &'static str,
        operation: String,
        message: String,
    },

    #[error("invalid request: {0}")]
    InvalidRequest(String),

    /// A well-formed request the sandbox's present state refuses (a name already taken,
    /// stdin already closed); the message says what is in the way.
    #[error("{0}")]
    Conflict(String),

    /// The front end that asked for a session refused it by its own rules (a user's
    /// session quota on `serve`); the message says what is in use and what to do.
    #[error("{message}")]
    Refused { message: String },
}

impl SandboxError {
    /// Whether this error means the sandbox cannot be used any more.
    pub fn is_fatal_for_session(&self) -> bool {
        matches!(
            self,
            SandboxError::SandboxGone { .. } | SandboxError::BackendUnavailable { .. }
        )
    }
}
