//! config/mcp.json: the external MCP servers whose tools join the agent's registry.
//!
//! ```json
//! {"mcpServers": {
//!    "files": {"command": "uvx", "args": ["mcp-server-x"], "env": {"API_KEY": "..."}},
//!    "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ..."}},
//!    "browser": {"command": "browser-mcp", "keep_names": true},
//!    "legacy": {"type": "sse", "url": "http://127.0.0.1:8000/sse"}
//! }}
//! ```
//!
//! `"type"` is optional, as in OpenManus's and Claude Desktop's files: `"stdio"`, `"sse"` (the
//! legacy HTTP+SSE transport, for servers that offer nothing newer) or `"streamable-http"`
//! (also `"http"`); without it a `command` means stdio and a `url` streamable HTTP.
//!
//! A stdio server runs **inside the session's sandbox** (its limits, no network, no host
//! files); `"host": true` is the explicit opt-out for a server that must run on the host, as
//! a host process with the host's network and files. On the host the child starts from an
//! EMPTY environment plus the host's PATH and exactly the
//! variables listed in `env`; variables that change how a program loads code
//! (LD_PRELOAD, PYTHONPATH, NODE_OPTIONS, DYLD_*, ...) are refused, so a config entry cannot
//! be used to inject code into an otherwise trusted server binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum McpConfigError {
    #[error("cannot read the MCP server list {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the MCP server list {path} is not valid: {message} (see config/mcp.example.json)")]
    Parse { path: PathBuf, message: String },
    #[error("MCP server {server:?}: {message}")]
    Invalid { server: String, message: String },
}

/// Variables never passed to a stdio server: they load foreign code into it.
const DENIED_ENV: &[&str] = &[
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PERL5LIB",
    "PERL5OPT",
    "RUBYLIB",
    "RUBYOPT",
    "BASH_ENV",
    "ENV",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "GCONV_PATH",
    "PATH",
    "PYTHONUSERBASE",
    "PYTHONWARNINGS",
    "PERLLIB",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    "LUA_INIT",
    "DOTNET_STARTUP_HOOKS",
];

/// Prefixes of variables refused the same way: the dynamic loaders, glibc tunables, and the
/// settings through which interpreters, package runners (uvx, npx) and libraries load code or
/// fetch packages from elsewhere.
const DENIED_PREFIXES: &[&str] = &[
    "DYLD_",
    "LD_",
    "GLIBC_TUNABLES",
    "OPENSSL_",
    "CORECLR_",
    "GIT_",
    "PIP_",
    "NPM_CONFIG_",
    "LUA_INIT",
];

pub fn env_denied(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    DENIED_ENV.contains(&upper.as_str()) || DENIED_PREFIXES.iter().any(|p| upper.starts_with(p))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    #[serde(rename = "mcpServers")]
    mcp_servers: BTreeMap<String, RawServer>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    /// The transport, when the file names it (OpenManus writes it on every entry).
    #[serde(rename = "type")]
    kind: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// Use the server's own tool names instead of `mcp_{server}_{tool}`.
    #[serde(default)]
    keep_names: bool,
    /// Re-list the tools every N calls (for servers that send no list_changed); 0 = never.
    #[serde(default)]
    refresh_every: Option<u32>,
    #[serde(default)]
    disabled: bool,
    /// Run a stdio server on the host instead of inside the session's sandbox.
    #[serde(default)]
    host: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    Stdio {
        command: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
        /// Runs on the host (`"host": true`) rather than inside the session's sandbox.
        host: bool,
    },
    Http {
        url: String,
        headers: Vec<(String, String)>,
    },
    /// The legacy HTTP+SSE transport (MCP 2024-11-05): a GET event stream that names the
    /// URL to POST messages to.
    Sse {
        url: String,
        headers: Vec<(String, String)>,
    },
}

/// The transports `"type"` may name, as they are written in the wild.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Stdio,
    Sse,
    StreamableHttp,
}

fn parse_kind(name: &str) -> Result<Kind, String> {
    match name.to_ascii_lowercase().as_str() {
        "stdio" => Ok(Kind::Stdio),
        "sse" => Ok(Kind::Sse),
        "streamable-http" | "streamable_http" | "streamablehttp" | "http" => {
            Ok(Kind::StreamableHttp)
        }
        _ => Err(format!(
            "\"type\": {name:?} is not a transport sandboxd knows; use \"stdio\", \"sse\" or \"streamable-http\""
        )),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub name: String,
    pub transport: Transport,
    pub keep_names: bool,
    pub refresh_every: u32,
}

/// Calls between two re-listings of a server that never sent list_changed.
pub const DEFAULT_REFRESH_EVERY: u32 = 5;

/// Parses the file. Entries in error are returned beside the good ones so one bad server
/// does not take the others down.
pub fn load(path: &Path) -> Result<(Vec<ServerConfig>, Vec<McpConfigError>), McpConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| McpConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).map_err(|message| McpConfigError::Parse {
        path: path.to_path_buf(),
        message,
    })
}

pub fn parse(text: &str) -> Result<(Vec<ServerConfig>, Vec<McpConfigError>), String> {
    let file: FileFormat = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (name, raw) in file.mcp_servers {
        if raw.disabled {
            continue;
        }
        match convert(&name, raw) {
            Ok(s) => good.push(s),
            Err(message) => bad.push(McpConfigError::Invalid {
                server: name,
                message,
            }),
        }
    }
    Ok((good, bad))
}

fn convert(name: &str, raw: RawServer) -> Result<ServerConfig, String> {
    if name.is_empty() {
        return Err("the server name is empty".into());
    }
    let kind = raw.kind.as_deref().map(parse_kind).transpose()?;
    match (kind, &raw.command, &raw.url) {
        (Some(Kind::Stdio), None, _) => return Err("\"type\": \"stdio\" needs \"command\"".into()),
        (Some(Kind::Sse | Kind::StreamableHttp), _, None) => {
            return Err("an HTTP \"type\" needs \"url\"".into());
        }
        _ => {}
    }
    let transport = match (raw.command, raw.url) {
        (Some(_), Some(_)) => {
            return Err("give either \"command\" (stdio) or \"url\" (HTTP), not both".into());
        }
        (None, None) => return Err("give \"command\" (stdio) or \"url\" (streamable HTTP)".into()),
        (Some(command), None) => {
            if command.trim().is_empty() {
                return Err("\"command\" is empty".into());
            }
            if !raw.headers.is_empty() {
                return Err("\"headers\" only applies to \"url\" servers".into());
            }
            if let Some(bad) = raw.env.keys().find(|k| env_denied(k)) {
                return Err(format!(
                    "the environment variable {bad} is not allowed: it changes how programs load code"
                ));
            }
            if let Some(bad) = raw
                .env
                .keys()
                .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
            {
                return Err(format!("invalid environment variable name {bad:?}"));
            }
            Transport::Stdio {
                command,
                args: raw.args,
                env: raw.env.into_iter().collect(),
                host: raw.host,
            }
        }
        (None, Some(url)) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "\"url\" must start with http:// or https://, got {url:?}"
                ));
            }
            if !raw.args.is_empty() || !raw.env.is_empty() || raw.host {
                return Err(
                    "\"args\", \"env\" and \"host\" only apply to \"command\" servers".into(),
                );
            }
            let headers = raw.headers.into_iter().collect();
            if kind == Some(Kind::Sse) {
                Transport::Sse { url, headers }
            } else {
                Transport::Http { url, headers }
            }
        }
    };
    Ok(ServerConfig {
        name: name.to_string(),
        transport,
        keep_names: raw.keep_names,
        refresh_every: raw.refresh_every.unwrap_or(DEFAULT_REFRESH_EVERY),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_file_parses_without_errors() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/mcp.example.json");
        let (servers, errors) = load(&path).expect("config/mcp.example.json is readable and valid");
        assert!(errors.is_empty(), "{errors:?}");
        let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
        assert!(
            names.contains(&"fetch") && names.contains(&"remote"),
            "{names:?}"
        );
        assert!(!names.contains(&"off"), "a disabled server is not started");
    }

    #[test]
    fn parses_both_kinds_and_reports_bad_entries() {
        let text = r#"{"mcpServers": {
            "a": {"command": "srv", "args": ["-x"], "env": {"KEY": "v"}},
            "b": {"url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer t"}, "keep_names": true},
            "c": {"command": "srv", "env": {"LD_PRELOAD": "/x.so"}},
            "d": {"command": "srv", "env": {"dyld_insert_libraries": "/x"}},
            "e": {"command": "srv", "url": "http://x"},
            "f": {"url": "file:///etc/passwd"},
            "g": {"command": "srv", "disabled": true}
        }}"#;
        let (good, bad) = parse(text).unwrap();
        assert_eq!(good.len(), 2);
        assert_eq!(good[0].name, "a");
        assert!(
            matches!(&good[0].transport, Transport::Stdio { env, .. } if env == &[("KEY".to_string(), "v".to_string())])
        );
        assert!(good[1].keep_names);
        let msgs: Vec<String> = bad.iter().map(|e| e.to_string()).collect();
        assert_eq!(msgs.len(), 4, "{msgs:?}");
        assert!(msgs[0].contains("LD_PRELOAD"), "{msgs:?}");
        assert!(msgs[1].contains("dyld_insert_libraries"), "{msgs:?}");
        assert!(parse(r#"{"mcpServers": {"a": {"command": "x", "bogus": 1}}}"#).is_err());
    }

    #[test]
    fn the_type_field_of_openmanus_files_is_accepted() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/openmanus/mcp.example.json");
        let (good, bad) = load(&path).expect("OpenManus's own mcp.example.json parses");
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(good.len(), 2);
        let bourdon = good.iter().find(|s| s.name == "bourdon").unwrap();
        assert!(
            matches!(&bourdon.transport, Transport::Stdio { command, args, .. }
            if command == "bourdon" && args == &["serve", "--quiet"])
        );
        let sse = good.iter().find(|s| s.name == "server1").unwrap();
        assert!(
            matches!(&sse.transport, Transport::Sse { url, .. } if url == "http://localhost:8000/sse")
        );

        let text = r#"{"mcpServers": {
            "a": {"type": "streamable-http", "url": "http://127.0.0.1:1/mcp"},
            "b": {"type": "http", "url": "http://127.0.0.1:1/mcp"},
            "c": {"type": "websocket", "url": "ws://x"},
            "d": {"type": "stdio", "url": "http://127.0.0.1:1/mcp"},
            "e": {"type": "sse", "command": "x"}
        }}"#;
        let (good, bad) = parse(text).unwrap();
        assert_eq!(good.len(), 2);
        assert!(
            good.iter()
                .all(|s| matches!(s.transport, Transport::Http { .. }))
        );
        let msgs: Vec<String> = bad.iter().map(|e| e.to_string()).collect();
        assert!(
            msgs[0].contains("websocket") && msgs[0].contains("streamable-http"),
            "{msgs:?}"
        );
        assert!(msgs[1].contains("needs \"command\""), "{msgs:?}");
        assert!(msgs[2].contains("needs \"url\""), "{msgs:?}");
    }
}
