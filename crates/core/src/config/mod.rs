//! Typed configuration: defaults, then the file (config/sandboxd.toml), then SANDBOXD_*
//! environment variables, then CLI flags. An unknown or malformed key is an error that
//! names the key; config/sandboxd.example.toml lists every key with its default.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub mod agents;
pub mod egress;
pub mod egress_credentials;
pub mod egress_grammar;
pub mod flow;
pub mod openmanus;
mod openmanus_llm;
pub mod proxies;
pub mod remote_agents;
pub mod runtime;

pub mod server;
pub mod sso;
pub mod store;
pub mod templates;
pub mod vision;

pub use crate::research::ResearchConfig;
pub use agents::AgentProfileConfig;
pub use egress::{EgressConfig, EgressPolicy};
pub use flow::{ExecutorConfig, FlowConfig, MAX_STEPS_CEILING};
pub use remote_agents::RemoteAgentConfig;
pub use runtime::{BackendKind, KubeMode, KubernetesConfig, RuntimeConfig};
pub use server::{AuditConfig, QuotasConfig, ServerConfig};
pub use sso::SsoConfig;
pub use store::{StoreConfig, StoreKind};
pub use templates::{DEFAULT_TEMPLATE, TemplateConfig, TemplateFile};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "config file {path}: {message}\n(see config/sandboxd.example.toml for every key and its default)"
    )]
    Parse { path: PathBuf, message: String },
    #[error(
        "environment variable {var}: {message} (variables are SANDBOXD_<SECTION>_<KEY>, e.g. SANDBOXD_LIMITS_MEMORY_MB=512)"
    )]
    Env { var: String, message: String },
    #[error("invalid setting {key}: {message}")]
    Invalid { key: String, message: String },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Which backend makes the sandboxes: Docker (default) or Kubernetes.
    pub runtime: RuntimeConfig,
    pub docker: DockerConfig,
    /// The Kubernetes backend's pods (`[runtime] backend = "kubernetes"`).
    pub kubernetes: KubernetesConfig,
    pub limits: Limits,
    pub sessions: SessionsConfig,
    pub pool: PoolConfig,
    pub llm: LlmConfig,
    pub agent: AgentConfig,
    pub mcp: McpConfig,
    /// The planning flow (`sandboxd run --plan`).
    pub flow: FlowConfig,
    /// `[[agents]]`: the user's own agent profiles (agent/profiles.rs has the built-in ones).
    pub agents: Vec<AgentProfileConfig>,
    /// `[[remote_agents]]`: A2A agents a run may call as tools (remote_agents.rs).
    pub remote_agents: Vec<RemoteAgentConfig>,
    /// Host-side web_search and web_fetch (src/research/config.rs).
    pub research: ResearchConfig,
    /// `sandboxd serve`: listener, limits of requests, retention.
    pub server: ServerConfig,
    /// Per-user quota defaults of `sandboxd serve`.
    pub quotas: QuotasConfig,
    /// Which store keeps the service's state: SQLite (default) or a PostgreSQL URL.
    pub store: StoreConfig,
    /// The per-session egress proxy: default and widest policy, caps.
    pub egress: EgressConfig,
    /// `sandboxd serve`'s audit log: how long and how much it keeps.
    pub audit: server::AuditConfig,
    /// `[sso]`: the web UI's single sign-on through an OpenID Connect provider (sso.rs).
    pub sso: SsoConfig,
    /// Where run transcripts and other state are kept.
    pub data_dir: Option<PathBuf>,
    /// Named sandbox images beyond the default (`[[templates]]`, see templates.rs).
    pub templates: Vec<TemplateConfig>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DockerConfig {
    /// Image to run; empty means the image built by `sandboxd image build` for this version.
    pub image: String,
    /// Optional OCI runtime, e.g. "runsc" for gVisor; empty means Docker's default (runc).
    pub runtime: String,
}

/// Resource limits of one session container. The admin's values are ceilings: a request
/// may lower them (see `Limits::lowered`) and never raise them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: i64,
    pub workspace_mb: u64,
    pub tmp_mb: u64,
    pub nofile: u64,
    pub fsize_mb: u64,
    /// The longest a single command may run.
    pub max_timeout_secs: u64,
    /// Bytes kept per output stream of a command (the middle of longer output is cut).
    pub output_cap_kb: u64,
    /// Largest file read or written in one call.
    pub max_file_mb: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_mb: 1024,
            cpus: 1.0,
            pids: 256,
            workspace_mb: 1024,
            tmp_mb: 256,
            nofile: 4096,
            fsize_mb: 1024,
            max_timeout_secs: 600,
            output_cap_kb: 256,
            max_file_mb: 100,
        }
    }
}

/// What a request (CLI flag, API call, MCP client) may ask for: only lower limits.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitRequest {
    pub memory_mb: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<i64>,
    pub workspace_mb: Option<u64>,
    pub tmp_mb: Option<u64>,
}

impl Limits {
    /// Applies a request, refusing any value above the admin's ceiling or below a floor
    /// that would make the sandbox unusable.
    pub fn lowered(&self, req: &LimitRequest) -> Result<Limits, ConfigError> {
        fn pick<T: PartialOrd + Copy + std::fmt::Display>(
            key: &str,
            ceiling: T,
            floor: T,
            asked: Option<T>,
        ) -> Result<T, ConfigError> {
            match asked {
                None => Ok(ceiling),
                // NaN compares false both ways: refuse anything not inside [floor, ceiling].
                Some(v) if v.partial_cmp(&floor).is_none() => Err(ConfigError::Invalid {
                    key: key.into(),
                    message: "not a number".into(),
                }),
                Some(v) if v > ceiling => Err(ConfigError::Invalid {
                    key: key.into(),
                    message: format!(
                        "{v} is above the configured maximum of {ceiling}; a request can only lower limits"
                    ),
                }),
                Some(v) if v < floor => Err(ConfigError::Invalid {
                    key: key.into(),
                    message: format!("{v} is below the minimum of {floor}"),
                }),
                Some(v) => Ok(v),
            }
        }
        let mut out = self.clone();
        out.memory_mb = pick("memory_mb", self.memory_mb, 32, req.memory_mb)?;
        out.cpus = pick("cpus", self.cpus, 0.05, req.cpus)?;
        out.pids = pick("pids", self.pids, 16, req.pids)?;
        out.workspace_mb = pick("workspace_mb", self.workspace_mb, 1, req.workspace_mb)?;
        out.tmp_mb = pick("tmp_mb", self.tmp_mb, 1, req.tmp_mb)?;
        Ok(out)
    }

    /// Refuses ceilings that would disable a limit (NaN or zero CPUs means "unlimited" to
    /// Docker) or make a sandbox unusable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| {
            Err(ConfigError::Invalid {
                key: format!("limits.{key}"),
                message,
            })
        };
        if !(self.cpus.is_finite() && self.cpus >= 0.05) {
            return bad(
                "cpus",
                format!("{} is not a CPU count of at least 0.05", self.cpus),
            );
        }
        if self.memory_mb < 32 {
            return bad(
                "memory_mb",
                format!("{} MiB is below the minimum of 32", self.memory_mb),
            );
        }
        if self.pids < 16 {
            return bad("pids", format!("{} is below the minimum of 16", self.pids));
        }
        for (key, v) in [
            ("workspace_mb", self.workspace_mb),
            ("tmp_mb", self.tmp_mb),
            ("nofile", self.nofile),
            ("fsize_mb", self.fsize_mb),
            ("max_timeout_secs", self.max_timeout_secs),
            ("output_cap_kb", self.output_cap_kb),
            ("max_file_mb", self.max_file_mb),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        Ok(())
    }

    pub fn output_cap(&self) -> usize {
        (self.output_cap_kb as usize).saturating_mul(1024)
    }

    pub fn max_file_bytes(&self) -> u64 {
        self.max_file_mb.saturating_mul(1 << 20)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// Most sessions (containers) alive at once.
    pub max: usize,
    /// Most sessions one owner may hold at once (at most `max`): one client or user cannot
    /// take every session.
    pub max_per_owner: usize,
    /// A session unused for this long is removed by the reaper.
    pub idle_timeout_secs: u64,
    pub reap_interval_secs: u64,
    /// The owner recorded on sessions started from the CLI.
    pub default_owner: String,
    /// The memory this process's sandboxes (sessions and warm ones) may use together, as
    /// the backend measures it, in MiB; 0 = no budget. Over it the pool stops filling and
    /// gives up warm sandboxes first, then the reaper removes the longest-idle sessions.
    pub memory_budget_mb: u64,
    /// A session unused for this long hibernates, where the process can (serve's API
    /// sessions): its /workspace is saved to the host and its sandbox removed, and its next
    /// use recreates it and restores the files (processes and python variables do not
    /// survive). 0 = never (the default: hibernation ends processes, which a user must opt
    /// into). Only below `idle_timeout_secs` does it do anything.
    pub hibernate_after_secs: u64,
    /// Where hibernated sessions' /workspace snapshots are saved (None: `<data_dir>/snapshots`).
    /// Replicas that may resume each other's sessions must share it (an NFS or ReadWriteMany
    /// volume); a replica that cannot see a snapshot answers 503 and keeps the session.
    pub snapshot_dir: Option<PathBuf>,
    /// How often serve samples the CPU and memory of the sandboxes it holds for usage
    /// metering (each session also gets a last reading when it ends); 0 = only that last
    /// reading.
    pub usage_sample_secs: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            max: 16,
            max_per_owner: 16,
            idle_timeout_secs: 1800,
            reap_interval_secs: 60,
            default_owner: "local".into(),
            memory_budget_mb: 0,
            hibernate_after_secs: 0,
            snapshot_dir: None,
            usage_sample_secs: 60,
        }
    }
}

/// The warm pool: sandboxes of the configured limits profile created and started ahead of
/// time (no owner, no env, no secrets), their shell and file helper already up, so a
/// session created by a long-lived process (the MCP server, `serve`) starts in milliseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Warm sandboxes kept ready; 0 turns the pool off. Together with live sessions they
    /// never exceed `[sessions] max`.
    pub size: usize,
    /// A warm sandbox older than this is replaced (so a pool never serves a stale one).
    pub max_age_secs: u64,
    /// How often the pool is checked and refilled besides the refill after each claim.
    pub refill_interval_secs: u64,
    /// How long the refill a claim wakes waits before it starts: a new container's create,
    /// start and warm-up take the cores for a few hundred ms, which the claimed session's
    /// first command would otherwise share (BENCHMARKS.md). 0 = refill at once.
    pub refill_delay_ms: u64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            size: 2,
            max_age_secs: 3600,
            refill_interval_secs: 10,
            refill_delay_ms: 100,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmConfig {
    pub model: String,
    /// OpenAI-compatible endpoint; empty means OPENAI_BASE_URL or https://api.openai.com/v1.
    pub base_url: String,
    /// Empty means OPENAI_API_KEY.
    pub api_key: String,
    /// "openai" or "azure".
    pub api_type: String,
    pub deployment: String,
    pub api_version: String,
    pub max_tokens: u32,
    pub temperature: f32,
    pub timeout_secs: u64,
    pub max_retries: u32,
    /// Whether the model sees images (plots, screenshots, view_image); unset: by the model's
    /// family (vision.rs).
    pub multimodal: Option<bool>,
    /// Model-name prefixes that take max_completion_tokens and no temperature.
    pub reasoning_prefixes: Vec<String>,
    /// The model's context window in tokens; 0 means the default of its family
    /// (llm/tokens.rs). Requests are kept under it minus max_tokens.
    pub context_window: usize,
    /// Stream answers (`stream: true`), so the CLI and the web UI show text as it comes;
    /// a server that refuses streaming gets plain requests automatically.
    pub stream: bool,
    pub vision: Option<VisionConfig>,
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self {
            model: String::new(),
            base_url: String::new(),
            api_key: String::new(),
            api_type: "openai".into(),
            deployment: String::new(),
            api_version: String::new(),
            max_tokens: 4096,
            temperature: 0.0,
            timeout_secs: 300,
            max_retries: 6,
            multimodal: None,
            reasoning_prefixes: ["o1", "o3", "o4", "gpt-5"].map(String::from).to_vec(),
            context_window: 0,
            stream: true,
            vision: None,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VisionConfig {
    pub model: String,
    pub base_url: String,
    pub api_key: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    pub max_steps: usize,
    /// Characters of one tool observation shown to the model.
    pub max_observe: usize,
    /// Input tokens one run may spend in total; 0 means no budget.
    pub max_input_tokens: u64,
    /// Token budget of the context sent in one request (0: the model's window); past it the
    /// history is condensed, then older turns are trimmed.
    pub context_tokens: usize,
    /// Condense (mask old outputs, summarize the middle) before trimming.
    pub condense: bool,
    /// Default timeout of a bash tool call, in seconds (capped by limits.max_timeout_secs).
    pub bash_timeout_secs: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            max_steps: 20,
            max_observe: 10_000,
            max_input_tokens: 0,
            context_tokens: 100_000,
            condense: true,
            bash_timeout_secs: 120,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Bearer token for `sandboxd mcp --listen`; empty means SANDBOXD_MCP_TOKEN.
    pub token: String,
    /// Client config (mcpServers) used by `sandboxd run`; empty means none.
    pub servers_file: String,
    /// The users of `sandboxd serve` (names, or "*" for everyone) whose runs get the servers
    /// of `servers_file` too; empty: no service run gets them.
    pub service_users: Vec<String>,
}

impl McpConfig {
    /// The admin's MCP servers file for a service run of user `name`, if they are allowed it.
    pub fn servers_for(&self, name: &str) -> Option<PathBuf> {
        let allowed = self.service_users.iter().any(|u| u == "*" || u == name);
        (allowed && !self.servers_file.is_empty()).then(|| PathBuf::from(&self.servers_file))
    }
}

impl Config {
    /// Loads defaults → file → environment. `path` None means config/sandboxd.toml if it exists.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        Self::load_with_env(path, &env)
    }

    pub fn load_with_env(
        path: Option<&Path>,
        env: &[(String, String)],
    ) -> Result<Config, ConfigError> {
        let default_path = PathBuf::from("config/sandboxd.toml");
        let path = match path {
            Some(p) => Some(p.to_path_buf()),
            None => default_path.exists().then_some(default_path),
        };
        let mut tree = match &path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.clone(),
                    source,
                })?;
                text.parse::<toml::Table>()
                    .map_err(|e| ConfigError::Parse {
                        path: p.clone(),
                        message: e.to_string(),
                    })?
            }
            None => toml::Table::new(),
        };
        // Validate the file on its own first, so an error names the file and not the env.
        if let Some(p) = &path {
            Config::deserialize(toml::Value::Table(tree.clone())).map_err(|e| {
                ConfigError::Parse {
                    path: p.clone(),
                    message: e.to_string(),
                }
            })?;
        }
        for (var, value) in env {
            let Some(rest) = var.strip_prefix("SANDBOXD_") else {
                continue;
            };
            // IMAGE_KEEP_OLD is read by the image build (docker_image::KEEP_OLD_ENV), not config;
            // TEST_* by the tests and BENCH_* by `sandboxd bench` (its SDK venv, its Postgres).
            if matches!(rest, "CONFIG" | "LOG" | "IMAGE_KEEP_OLD")
                || rest.starts_with("TEST_")
                || rest.starts_with("BENCH_")
            {
                continue;
            }
            apply_env(&mut tree, var, rest, value)?;
        }
        let mut config =
            Config::deserialize(toml::Value::Table(tree)).map_err(|e| ConfigError::Env {
                var: "SANDBOXD_*".into(),
                message: e.to_string(),
            })?;
        config.limits.validate()?;
        config.flow.validate()?;
        agents::validate(&config.agents)?;
        remote_agents::validate(&config.remote_agents)?;
        // The profiles' prompt files are read here first, so a bad one stops the start.
        crate::agent::profiles::Profiles::from_config(&config).map_err(|e| {
            ConfigError::Invalid {
                key: "agents".into(),
                message: e.to_string(),
            }
        })?;
        config.server.validate()?;
        config.audit.validate()?;
        config.sso.validate()?;
        config.store.validate()?;
        config.runtime.validate()?;
        templates::validate(&config.templates)?;
        config.kubernetes.validate(config.runtime.kind())?;
        config
            .research
            .validate()
            .map_err(|(key, message)| ConfigError::Invalid { key, message })?;
        config
            .egress
            .validate()
            .map_err(|(key, message)| ConfigError::Invalid { key, message })?;
        // The credentials' values come from the same environment as everything else.
        egress_credentials::load_section(&mut config.egress, env)
            .map_err(|(key, message)| ConfigError::Invalid { key, message })?;
        Ok(config)
    }

    /// Where hibernated sessions' snapshots are saved (`[sessions] snapshot_dir`).
    pub fn snapshot_dir(&self) -> PathBuf {
        match &self.sessions.snapshot_dir {
            Some(d) => d.clone(),
            None => self.data_dir().join("snapshots"),
        }
    }

    /// The directory for transcripts and other files sandboxd keeps.
    pub fn data_dir(&self) -> PathBuf {
        if let Some(d) = &self.data_dir {
            return d.clone();
        }
        if let Some(d) = std::env::var_os("XDG_DATA_HOME") {
            return PathBuf::from(d).join("sandboxd");
        }
        match std::env::var_os("HOME") {
            Some(h) => PathBuf::from(h).join(".local/share/sandboxd"),
            None => PathBuf::from(".sandboxd"),
        }
    }
}

const SECTIONS: &[&str] = &[
    "runtime",
    "docker",
    "kubernetes",
    "limits",
    "sessions",
    "pool",
    "llm",
    "agent",
    "mcp",
    "flow",
    "research",
    "server",
    "quotas",
    "store",
    "egress",
    "audit",
    "sso",
];

fn apply_env(
    tree: &mut toml::Table,
    var: &str,
    rest: &str,
    value: &str,
) -> Result<(), ConfigError> {
    let lower = rest.to_ascii_lowercase();
    let (section, key) = match SECTIONS
        .iter()
        .find(|s| lower.starts_with(&format!("{s}_")))
    {
        Some(s) => (Some(*s), lower[s.len() + 1..].to_string()),
        None if lower == "data_dir" => (None, lower.clone()),
        None => {
            return Err(ConfigError::Env {
                var: var.into(),
                message: format!(
                    "unknown section; known sections are {}",
                    SECTIONS.join(", ")
                ),
            });
        }
    };
    // A value is read as a TOML literal when it is one (numbers, booleans, arrays), else as a string.
    let parsed = format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    let target = match section {
        Some(s) => tree
            .entry(s)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| ConfigError::Env {
                var: var.into(),
                message: format!("[{s}] in the file is not a table"),
            })?,
        None => &mut *tree,
    };
    target.insert(key, parsed);
    let probe = Config::deserialize(toml::Value::Table(tree.clone()));
    probe.map(|_| ()).map_err(|e| ConfigError::Env {
        var: var.into(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn env_overrides_defaults_with_types() {
        let c = Config::load_with_env(
            None,
            &env(&[
                ("SANDBOXD_LIMITS_MEMORY_MB", "512"),
                ("SANDBOXD_LLM_MODEL", "gpt-4o"),
            ]),
        )
        .unwrap();
        assert_eq!(c.limits.memory_mb, 512);
        assert_eq!(c.llm.model, "gpt-4o");
    }

    /// The variables the tests and `sandboxd bench` read for themselves are not config: a
    /// bench run with SANDBOXD_BENCH_E2B_PYTHON set was refused as an unknown section.
    #[test]
    fn test_and_bench_variables_are_not_config() {
        let c = Config::load_with_env(
            None,
            &env(&[
                ("SANDBOXD_BENCH_E2B_PYTHON", "/venv/bin/python"),
                ("SANDBOXD_BENCH_PG_URL", "postgres://x"),
                ("SANDBOXD_TEST_RUNSC", "1"),
            ]),
        );
        assert!(c.is_ok(), "{:?}", c.err());
        let e = Config::load_with_env(None, &env(&[("SANDBOXD_BENCHX", "1")])).unwrap_err();
        assert!(e.to_string().contains("SANDBOXD_BENCHX"), "{e}");
    }

    #[test]
    fn unknown_env_key_is_named() {
        let e =
            Config::load_with_env(None, &env(&[("SANDBOXD_LIMITS_MEMORYMB", "512")])).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("SANDBOXD_LIMITS_MEMORYMB") && msg.contains("memorymb"),
            "{msg}"
        );
    }

    #[test]
    fn unknown_file_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "[limits]\nmemroy_mb = 5\n").unwrap();
        let msg = Config::load_with_env(Some(&p), &[])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("memroy_mb"), "{msg}");
        std::fs::write(&p, "[limits]\nmemory_mb = \"lots\"\n").unwrap();
        let msg = Config::load_with_env(Some(&p), &[])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("memory_mb") || msg.contains("integer"),
            "{msg}"
        );
    }

    #[test]
    fn ceilings_that_disable_a_limit_are_refused() {
        for (var, value) in [
            ("SANDBOXD_LIMITS_CPUS", "nan"),
            ("SANDBOXD_LIMITS_CPUS", "0"),
            ("SANDBOXD_LIMITS_PIDS", "0"),
        ] {
            let err = Config::load_with_env(None, &env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("limits."), "{var}={value}: {err}");
        }
    }

    #[test]
    fn bad_research_lists_are_named_at_load() {
        let err = Config::load_with_env(
            None,
            &env(&[("SANDBOXD_RESEARCH_ALLOW", "[\"10.0.0.0/33\"]")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("research.allow") && err.contains("10.0.0.0/33"),
            "{err}"
        );
        let err =
            Config::load_with_env(None, &env(&[("SANDBOXD_RESEARCH_ENGINES", "[\"google\"]")]))
                .unwrap_err()
                .to_string();
        assert!(err.contains("unknown engine \"google\""), "{err}");
        let ok = Config::load_with_env(
            None,
            &env(&[(
                "SANDBOXD_RESEARCH_ALLOW",
                "[\"wiki.lan\", \"*.corp.example\", \"10.1.2.0/24\", \"::1\"]",
            )]),
        )
        .unwrap();
        assert_eq!(ok.research.allow.len(), 4);
    }

    #[test]
    fn requests_only_lower_limits() {
        let l = Limits::default();
        let lowered = l
            .lowered(&LimitRequest {
                memory_mb: Some(256),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(lowered.memory_mb, 256);
        let nan = l.lowered(&LimitRequest {
            cpus: Some(f64::NAN),
            ..Default::default()
        });
        assert!(nan.is_err(), "NaN must not pass as a CPU limit");
        let err = l
            .lowered(&LimitRequest {
                pids: Some(100_000),
                ..Default::default()
            })
            .unwrap_err();
        assert!(err.to_string().contains("above the configured maximum"));
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;

    /// config/sandboxd.example.toml must list every key with exactly its default.
    #[test]
    fn the_example_file_lists_every_key_with_its_default() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/sandboxd.example.toml");
        let loaded = Config::load_with_env(Some(&path), &[]).expect("the example parses");
        let as_value = |c: &Config| toml::Value::try_from(c).expect("serializable");
        assert_eq!(
            as_value(&loaded),
            as_value(&Config::default()),
            "the example's values differ from the defaults"
        );
        let text: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
        let toml::Value::Table(defaults) = as_value(&Config::default()) else {
            panic!()
        };
        for (section, keys) in defaults {
            let toml::Value::Table(keys) = keys else {
                continue;
            };
            for key in keys.keys() {
                assert!(
                    text.get(&section).and_then(|s| s.get(key)).is_some(),
                    "config/sandboxd.example.toml does not list [{section}] {key}"
                );
            }
        }
    }
}
