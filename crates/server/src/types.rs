//! The API's wire types: what clients send and receive under /v1. They are separate from
//! the store's rows and the library's types, and their schemas are the OpenAPI document's.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use sandboxd_core::config::{LimitRequest, Limits};
use sandboxd_core::sandbox::file_mode::FileMode;
use sandboxd_core::store::{SessionKind, SessionRow, SessionState};

/// An optional whole number; JSON Schema counts `5.0` as an integer, so it is accepted.
pub(crate) fn integral<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let v: Option<f64> = Option::deserialize(d)?;
    match v {
        None => Ok(None),
        Some(f) if f.fract() == 0.0 && (0.0..=9.0e15).contains(&f) => Ok(Some(f as u64)),
        Some(f) => Err(serde::de::Error::custom(format!(
            "{f} is not a whole number between 0 and 9e15"
        ))),
    }
}

/// serde accepts a struct written as a JSON array; the API takes objects only.
fn object_only<'de, D: serde::Deserializer<'de>>(d: D) -> Result<LimitsRequest, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    if !v.is_object() {
        return Err(serde::de::Error::custom("expected an object"));
    }
    serde_path_to_error::deserialize(v)
        .map_err(|e| serde::de::Error::custom(format_args!("{}: {}", e.path(), e.inner())))
}

fn integral_i64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Ok(integral(d)?.map(|v| v as i64))
}

/// Limits a new session asks for; each may only lower the user's ceiling.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    #[schema(minimum = 32, maximum = 1048576)]
    #[serde(default, deserialize_with = "integral")]
    pub memory_mb: Option<u64>,
    #[schema(minimum = 0.05, maximum = 1024)]
    pub cpus: Option<f64>,
    #[schema(minimum = 16, maximum = 1048576)]
    #[serde(default, deserialize_with = "integral_i64")]
    pub pids: Option<i64>,
    #[schema(minimum = 1, maximum = 1048576)]
    #[serde(default, deserialize_with = "integral")]
    pub workspace_mb: Option<u64>,
    #[schema(minimum = 1, maximum = 1048576)]
    #[serde(default, deserialize_with = "integral")]
    pub tmp_mb: Option<u64>,
}

impl From<&LimitsRequest> for LimitRequest {
    fn from(r: &LimitsRequest) -> Self {
        LimitRequest {
            memory_mb: r.memory_mb,
            cpus: r.cpus,
            pids: r.pids,
            workspace_mb: r.workspace_mb,
            tmp_mb: r.tmp_mb,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    #[serde(default, deserialize_with = "object_only")]
    pub limits: LimitsRequest,
    /// Up to 32 pairs; keys match `^[A-Za-z0-9_.-]{1,64}$`, values are at most 512 characters.
    #[serde(default)]
    #[schema(schema_with = metadata_schema)]
    pub metadata: BTreeMap<String, String>,
    /// Seconds unused after which the session is removed; the admin's `[sessions]
    /// idle_timeout_secs` is the default and the maximum (a larger value is lowered to it).
    #[schema(minimum = 1, maximum = 31536000)]
    #[serde(default, deserialize_with = "integral")]
    pub idle_timeout: Option<u64>,
    /// Which hosts the sandbox may reach through its egress proxy: `"off"`, `"any"` (any
    /// public host), `"a.org,*.b.org,!c.b.org"` or an array of such rules. Absent: the
    /// admin's `[egress] default`. Never wider than `[egress] widest` and your quota's.
    #[serde(default)]
    #[schema(schema_with = crate::egress::policy_schema_or_null)]
    pub egress: Option<sandboxd_core::config::egress::EgressPolicy>,
    /// The image to make the sandbox from: `default` (the default, served by the warm pool)
    /// or the name of one of the admin's `[[templates]]` (made cold); an unknown name is a
    /// 404 whose message lists the known ones.
    #[serde(default)]
    #[schema(max_length = 64)]
    pub template: Option<String>,
    /// Environment variables every command, process and python interpreter of the session
    /// gets (as `env` on an exec: at most 128, names `[A-Za-z_][A-Za-z0-9_]*` but not
    /// `SANDBOXD_TAG`, values without NUL, 32 KiB a variable and 256 KiB in all); never part
    /// of a command line, an event or a view. Kept with the session (until it ends), so a
    /// resume, a restart or another replica gives its processes the same variables.
    #[serde(default)]
    #[schema(schema_with = env_schema)]
    pub env: BTreeMap<String, String>,
}

fn metadata_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[A-Za-z0-9_.-]{1,64}$")),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(512)),
        ))
        .max_properties(Some(32))
        .build()
}

/// The limits a session runs with.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LimitsView {
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: i64,
    pub workspace_mb: u64,
    pub tmp_mb: u64,
    /// The longest one command may run.
    pub max_timeout_secs: u64,
    /// Bytes kept per output stream of a command, in KiB.
    pub output_cap_kb: u64,
    pub max_file_mb: u64,
}

impl From<&Limits> for LimitsView {
    fn from(l: &Limits) -> Self {
        LimitsView {
            memory_mb: l.memory_mb,
            cpus: l.cpus,
            pids: l.pids,
            workspace_mb: l.workspace_mb,
            tmp_mb: l.tmp_mb,
            max_timeout_secs: l.max_timeout_secs,
            output_cap_kb: l.output_cap_kb,
            max_file_mb: l.max_file_mb,
        }
    }
}

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    /// Its container is being made.
    Creating,
    Running,
    /// Idle past `[sessions] hibernate_after_secs`: its /workspace is saved on the host and
    /// its container removed. Its next use (exec, files, tools, a run) resumes it with its
    /// files; processes and python variables do not survive (the answer says so).
    Hibernated,
    /// Ended by a DELETE, idleness, its user's removal, or its container's loss (see
    /// `end_reason`); its container is gone, its runs and events stay readable until the
    /// retention period or DELETE /v1/sessions/{id}/history.
    Ended,
}

impl From<SessionState> for SessionStatus {
    fn from(s: SessionState) -> Self {
        match s {
            SessionState::Creating => SessionStatus::Creating,
            SessionState::Running => SessionStatus::Running,
            SessionState::Ended => SessionStatus::Ended,
        }
    }
}

/// Which front end made a session; both kinds count in the same `quota.sessions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionKindView {
    /// Made by POST /v1/sessions or a run: exec, tools, files and runs use it.
    Api,
    /// The sandbox of an /mcp client: used only through /mcp; DELETE ends it, and it ends
    /// when its MCP session closes, when it idles out, or when the service stops.
    Mcp,
}

impl From<SessionKind> for SessionKindView {
    fn from(k: SessionKind) -> Self {
        match k {
            SessionKind::Api => SessionKindView::Api,
            SessionKind::Mcp => SessionKindView::Mcp,
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Session {
    pub id: String,
    /// The owning user's id.
    pub owner: String,
    pub state: SessionStatus,
    pub kind: SessionKindView,
    pub limits: LimitsView,
    pub metadata: BTreeMap<String, String>,
    /// Seconds unused after which the session is removed.
    pub idle_timeout: u64,
    pub created_at: DateTime<Utc>,
    pub last_used_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    /// Why the session ended.
    pub end_reason: Option<String>,
    /// Its egress policy as rules (`["off"]`, `["any"]`, `["a.org", "!b.a.org"]`);
    /// GET /v1/sessions/{id}/egress has its counters and recent connections.
    pub egress: Vec<String>,
    /// The backend its sandbox runs on: `docker` or `kubernetes`.
    pub backend: String,
    /// The backend's name for its sandbox (the Docker container id, the Kubernetes pod
    /// name); none before the sandbox is made.
    pub handle: Option<String>,
    /// The template its sandbox is made from: `default` (the default image) or the name of
    /// one of the admin's `[[templates]]`.
    pub template: String,
}

pub fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

impl Session {
    /// The view of `r`, a session on the backend named `backend`.
    pub fn of(r: &SessionRow, backend: &str) -> Self {
        Session {
            id: r.id.clone(),
            owner: r.owner.clone(),
            state: if r.hibernated() {
                SessionStatus::Hibernated
            } else {
                r.state.into()
            },
            kind: r.kind.into(),
            limits: (&r.limits).into(),
            metadata: r.metadata.clone(),
            idle_timeout: r.idle_timeout_secs,
            created_at: time(r.created_at),
            last_used_at: time(r.last_used_at),
            ended_at: r.ended_at.map(time),
            end_reason: r.end_reason.clone(),
            egress: r.egress.items(),
            backend: backend.trim().to_string(),
            // A hibernated session's container is gone.
            handle: r.container_id.clone().filter(|_| !r.hibernated()),
            template: r
                .template
                .clone()
                .unwrap_or_else(|| sandboxd_core::config::DEFAULT_TEMPLATE.into()),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListSessionsQuery {
    /// Page size, 1 to 100 (default 50).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^([1-9][0-9]{0,17})?$")]
    pub cursor: Option<String>,
    /// Metadata filter, URL-encoded `key=value&key2=value2`: every pair must match.
    #[param(pattern = "^([A-Za-z0-9_.-]{1,64}=[^&]*(&[A-Za-z0-9_.-]{1,64}=[^&]*)*)?$")]
    pub metadata: Option<String>,
    /// Include ended sessions (default false).
    pub include_ended: Option<bool>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<Session>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// A shell command for the session's persistent bash (cwd and exports persist).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// A bash command line; not blank, no NUL bytes.
    #[schema(pattern = "^[^\\u0000]*\\S[^\\u0000]*$")]
    pub command: String,
    /// Seconds before the command's process tree is killed; default 120; a value above the
    /// session's `max_timeout_secs` is lowered to it, and the answer says so (`timeout`, and
    /// the `Sandboxd-Timeout` header).
    #[schema(minimum = 1, maximum = 86400)]
    #[serde(default, deserialize_with = "integral")]
    pub timeout: Option<u64>,
    /// Environment variables for this command alone (at most 128; names
    /// `[A-Za-z_][A-Za-z0-9_]*` but not `SANDBOXD_TAG`, values without NUL). With `env` or
    /// `cwd` the command runs as its own process, not in the persistent shell: what it exports
    /// or `cd`s does not persist, and the values never appear in the command text.
    #[serde(default)]
    #[schema(schema_with = env_schema)]
    pub env: BTreeMap<String, String>,
    /// The command's working directory (its own process, as for `env`); a relative path is
    /// under /workspace. One that does not exist is a 404, one that is not a directory a 409.
    #[serde(default)]
    #[schema(min_length = 1, pattern = "^[^\\u0000]+$")]
    pub cwd: Option<String>,
}

/// A shell command for the streamed exec: it runs in the persistent shell, so it takes no
/// `env` or `cwd` (start a process with them, POST /v1/sessions/{id}/processes, and stream it).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecStreamBody {
    /// A bash command line; not blank, no NUL bytes.
    #[schema(pattern = "^[^\\u0000]*\\S[^\\u0000]*$")]
    pub command: String,
    /// Seconds before the command's process tree is killed; default 120; a value above the
    /// session's `max_timeout_secs` is lowered to it, and the answer says so (the
    /// `Sandboxd-Timeout` header and the `exit` event's `timeout`).
    #[schema(minimum = 1, maximum = 86400)]
    #[serde(default, deserialize_with = "integral")]
    pub timeout: Option<u64>,
}

impl From<ExecStreamBody> for ExecBody {
    fn from(b: ExecStreamBody) -> Self {
        ExecBody {
            command: b.command,
            timeout: b.timeout,
            env: BTreeMap::new(),
            cwd: None,
        }
    }
}

/// The schema of a process's environment (`env` of an exec or a process start): what
/// `processes::check_spec` takes, so a document-valid environment is never refused.
pub(crate) fn env_schema() -> utoipa::openapi::Object {
    use sandboxd_core::sandbox::processes::MAX_ENV;
    use utoipa::openapi::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^(?!SANDBOXD_TAG$)[A-Za-z_][A-Za-z0-9_]*$")),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[^\\u0000]*$")),
        ))
        .max_properties(Some(MAX_ENV))
        .build()
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExecResult {
    /// None when the command was killed (timeout) or the shell restarted.
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The middle of longer output was cut.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    pub duration_ms: u64,
    /// What sandboxd did besides running the command (e.g. restarted the shell).
    pub note: Option<String>,
    /// The timeout the command ran under, in seconds: the request's `timeout` (or the
    /// default), lowered to the session's `max_timeout_secs`.
    pub timeout: u64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolInfo {
    pub name: String,
    pub description: String,
    /// The JSON schema of the tool's arguments.
    #[schema(value_type = Object)]
    pub parameters: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolCallResult {
    pub output: String,
    /// Set when the tool reports a failure the caller can act on.
    pub error: Option<String>,
    pub is_error: bool,
    /// A base64 image (a plot, a screenshot), if the tool produced one: the first of
    /// `images`.
    pub base64_image: Option<String>,
    /// Every image the tool produced (base64 PNG or JPEG), in order: each figure of a
    /// python cell (up to sandboxd's per-call image limits); empty when there is none.
    pub images: Vec<String>,
    /// A note from sandboxd (e.g. output cut).
    pub system: Option<String>,
}

#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PathQuery {
    /// A path inside /workspace, absolute or relative to it.
    #[param(
        pattern = "^(?!.*[^/]{256})(/workspace(/[^\\u0000-\\u001f\\u007f-\\u009f]*)?|[^/\\u0000-\\u001f\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*)?$",
        max_length = 4096
    )]
    pub path: String,
}

#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UploadQuery {
    /// A path inside /workspace, absolute or relative to it; not through a symbolic link.
    #[param(
        pattern = "^(?!.*[^/]{256})(/workspace(/[^\\u0000-\\u001f\\u007f-\\u009f]*)?|[^/\\u0000-\\u001f\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*)?$",
        max_length = 4096
    )]
    pub path: String,
    /// The file's permission bits in octal (`0755`, `755` or `0o755`); without it a new file
    /// is 0644 and a replaced one keeps its mode. Setuid, setgid and sticky are refused.
    #[param(value_type = Option<String>, pattern = "^(0o)?0?[0-7]{1,3}$")]
    pub mode: Option<FileMode>,
}

/// A path to read: anywhere in the container the sandbox user can read.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReadPathQuery {
    /// An absolute path in the container, or one relative to /workspace (a `..` that goes
    /// above `/` is refused).
    #[param(
        pattern = "^(?!(.*/)?\\.\\.(/|$))(?!.*[^/]{256})[^\\u0000-\\u001f\\u007f-\\u009f]+$",
        max_length = 4096
    )]
    pub path: String,
}

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReadDirQuery {
    /// A directory to list: an absolute path in the container, or one relative to /workspace
    /// (default /workspace).
    #[param(
        pattern = "^(?!(.*/)?\\.\\.(/|$))(?!.*[^/]{256})[^\\u0000-\\u001f\\u007f-\\u009f]*$",
        max_length = 4096
    )]
    pub path: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DirQuery {
    /// A directory inside /workspace (default /workspace).
    #[param(
        pattern = "^(?!.*[^/]{256})(/workspace(/[^\\u0000-\\u001f\\u007f-\\u009f]*)?|[^/\\u0000-\\u001f\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*)?$",
        max_length = 4096
    )]
    pub path: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DirEntryView {
    pub name: String,
    /// file, dir, symlink or other
    pub kind: String,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DirListing {
    pub path: String,
    pub entries: Vec<DirEntryView>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Written {
    pub path: String,
    pub bytes: u64,
    /// Entries unpacked, for archives.
    pub entries: Option<u64>,
    /// The permission bits set (octal), when the upload gave a `mode`.
    pub mode: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QuotaView {
    pub sessions: u32,
    pub runs: u32,
    /// 0 means no limit.
    pub input_tokens_per_day: u64,
    /// CPU-seconds of the user's sandboxes per UTC day; 0 means no limit.
    pub cpu_seconds_per_day: u64,
    /// The most this user's sessions may ask for.
    pub ceiling: LimitsView,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UsageView {
    /// Live sessions of every kind (what `quota.sessions` bounds).
    pub active_sessions: u32,
    /// Of `active_sessions`, the sandboxes of /mcp clients.
    pub active_mcp_sessions: u32,
    pub active_runs: u32,
    pub input_tokens_today: u64,
    /// CPU-seconds the user's sandboxes used today (UTC), as of their last usage sample
    /// (`[sessions] usage_sample_secs`); 0 when the user has no daily CPU quota (it is not
    /// read then: GET /v1/usage has the figures).
    pub cpu_seconds_today: f64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UserView {
    pub id: String,
    pub name: String,
    pub admin: bool,
    /// The first characters of the user's key.
    pub key_prefix: String,
    /// When the user's key was made (at creation or its last rotation).
    pub key_created_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub quota: QuotaView,
    pub usage: UsageView,
}

/// A user to create (admins only).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    /// 1-64 letters, digits, `_`, `.` or `-`, starting with a letter or digit.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    pub name: String,
    /// Admins see and manage every user's objects.
    #[serde(default)]
    pub admin: bool,
    /// The key stops working after this many days (default: never).
    #[serde(default)]
    pub expires_in_days: Option<u32>,
}

/// A user and their new API key: the only time the key is shown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NewKey {
    pub user: UserView,
    pub key: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Health {
    /// "ok", or what is not ready.
    pub status: String,
    pub checks: BTreeMap<String, String>,
}
