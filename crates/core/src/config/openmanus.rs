//! `sandboxd config import-openmanus`: an OpenManus `config.toml` turned into a `sandboxd.toml`,
//! with a report that says, key by key, what was mapped where and what was dropped and why.
//!
//! OpenManus's file is read as an untyped TOML tree, never through sandboxd's own
//! `deny_unknown_fields` types: its keys are foreign by definition, and every one of them must
//! show up in the report rather than fail the import. The output is built as a TOML table and
//! checked by deserializing it into [`Config`] before anyone writes it, so an import never
//! produces a file that sandboxd itself refuses.
//!
//! What cannot be carried over is dropped on purpose, not by omission: OpenManus's sandbox
//! switch and network flag (sandboxd always sandboxes and never gives a container a network
//! device), its browser's host-side settings (sandboxd's Chromium runs inside the sandbox,
//! headless, with fixed hardening flags), Daytona's keys, and model providers sandboxd does not
//! speak. The mapping table lives in [`map_key`].

use serde::Deserialize;

use super::Config;

/// One key of the OpenManus file and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportLine {
    /// The key's dotted path in the OpenManus file, e.g. `llm.vision.model`.
    pub key: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Carried over to this sandboxd key (dotted path); the note says how when it is not a copy.
    Mapped { to: String, note: Option<String> },
    /// Left out; the reason says why and, where there is one, what to use instead.
    Dropped { reason: String },
}

/// The result of an import: the new `sandboxd.toml` text and the report.
#[derive(Debug)]
pub struct Imported {
    pub toml: String,
    pub report: Vec<ReportLine>,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("the OpenManus config is not valid TOML: {0}")]
    Parse(String),
    #[error("the OpenManus key {key} has a value sandboxd cannot use: {message}")]
    Value { key: String, message: String },
    #[error(
        "the imported values do not load as sandboxd config: {0}; fix that key in the OpenManus file, or edit the result"
    )]
    Output(String),
}

/// A value in sandboxd's config tree, at a dotted path.
pub(super) type Assignment = (Vec<&'static str>, toml::Value);

/// Converts the text of an OpenManus `config.toml`. `mcp_file`, when given, is the path the
/// written `mcp.json` will have; it becomes `[mcp] servers_file`.
pub fn import(text: &str, mcp_file: Option<&str>) -> Result<Imported, ImportError> {
    let tree: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ImportError::Parse(e.to_string()))?;
    let mut leaves = Vec::new();
    flatten(&mut Vec::new(), &tree, &mut leaves);

    let mut out = toml::Table::new();
    let mut report = Vec::new();
    for (path, value) in &leaves {
        let key = path.join(".");
        let (assignments, outcome) = map_key(path, value, &tree)?;
        for (target, v) in assignments {
            set(&mut out, &target, v);
        }
        report.push(ReportLine { key, outcome });
    }
    if let Some(file) = mcp_file {
        set(
            &mut out,
            &["mcp", "servers_file"],
            toml::Value::String(file.to_string()),
        );
    }
    Config::deserialize(toml::Value::Table(out.clone()))
        .map_err(|e| ImportError::Output(e.to_string()))?;
    let body = toml::to_string(&out).map_err(|e| ImportError::Output(e.to_string()))?;
    let toml = format!(
        "# Imported from an OpenManus config.toml by `sandboxd config import-openmanus`.\n\
         # Every other key keeps its default: config/sandboxd.example.toml lists them all.\n\n{body}"
    );
    Ok(Imported { toml, report })
}

/// Every leaf of the tree with its path; a table is descended into, anything else (arrays
/// included) is a leaf.
fn flatten(path: &mut Vec<String>, table: &toml::Table, out: &mut Vec<(Vec<String>, toml::Value)>) {
    for (k, v) in table {
        path.push(k.clone());
        match v {
            toml::Value::Table(t) => flatten(path, t, out),
            other => out.push((path.clone(), other.clone())),
        }
        path.pop();
    }
}

fn set(table: &mut toml::Table, path: &[&str], value: toml::Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = table;
    for p in parents {
        let entry = cur
            .entry((*p).to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        let toml::Value::Table(t) = entry else {
            return;
        };
        cur = t;
    }
    cur.insert((*last).to_string(), value);
}

pub(super) fn mapped(to: &[&'static str], value: toml::Value) -> (Vec<Assignment>, Outcome) {
    (
        vec![(to.to_vec(), value)],
        Outcome::Mapped {
            to: to.join("."),
            note: None,
        },
    )
}

pub(super) fn dropped(reason: impl Into<String>) -> (Vec<Assignment>, Outcome) {
    (
        Vec::new(),
        Outcome::Dropped {
            reason: reason.into(),
        },
    )
}

pub(super) fn with_note(
    (a, outcome): (Vec<Assignment>, Outcome),
    note: impl Into<String>,
) -> (Vec<Assignment>, Outcome) {
    match outcome {
        Outcome::Mapped { to, .. } => (
            a,
            Outcome::Mapped {
                to,
                note: Some(note.into()),
            },
        ),
        other => (a, other),
    }
}

/// The mapping table: one OpenManus key (its path and value; `root` for keys whose meaning
/// depends on a sibling, like Azure's base URL) to sandboxd's keys.
fn map_key(
    path: &[String],
    value: &toml::Value,
    root: &toml::Table,
) -> Result<(Vec<Assignment>, Outcome), ImportError> {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    let v = value.clone();
    Ok(match p.as_slice() {
        ["llm", key] => super::openmanus_llm::main_key(key, v, root)?,
        ["llm", "vision", key] => super::openmanus_llm::vision_key(key, v),
        ["llm", name, _] => dropped(format!(
            "sandboxd has one model (plus [llm.vision]); the named model [llm.{name}] is not used"
        )),
        ["agent", "max_steps"] => mapped(&["agent", "max_steps"], v),
        ["browser", rest @ ..] => dropped(browser_reason(rest)),
        ["search", key] => search_key(key, v),
        ["sandbox", key] => sandbox_key(&path.join("."), key, v)?,
        ["mcp", "server_reference"] => dropped(
            "sandboxd serves its own tools over MCP (`sandboxd mcp`, or /mcp on `serve`); \
             there is no Python module to name",
        ),
        ["daytona", ..] => dropped(
            "Daytona is a hosted sandbox; sandboxd runs its own sandboxes on Docker or Kubernetes \
             ([runtime] backend)",
        ),
        ["runflow", "use_data_analysis_agent"] => dropped(
            "sandboxd's planning flow (`sandboxd run --plan`) picks its step executors itself",
        ),
        _ => dropped("not a key of OpenManus's documented config; nothing in sandboxd matches it"),
    })
}

fn browser_reason(rest: &[&str]) -> String {
    match rest {
        ["headless"] => "sandboxd's Chromium always runs headless, inside the sandbox".into(),
        ["disable_security"] => {
            "sandboxd never turns the browser's security off; its hardening flags are fixed".into()
        }
        ["extra_chromium_args"] => {
            "Chromium's flags are fixed by sandboxd so that no setting can weaken them".into()
        }
        ["chrome_instance_path" | "wss_url" | "cdp_url"] => {
            "the browser runs inside the sandbox; sandboxd does not drive a browser on the host"
                .into()
        }
        ["proxy", ..] => "the sandbox has no network; the live web goes through sandboxd's \
                          egress proxy, set by policy ([egress] default/widest, or --egress)"
            .into(),
        _ => "not a browser setting sandboxd has".into(),
    }
}

fn search_key(key: &str, v: toml::Value) -> (Vec<Assignment>, Outcome) {
    match key {
        "engine" | "fallback_engines" => {
            let names: Vec<String> = match &v {
                toml::Value::String(s) => vec![s.clone()],
                toml::Value::Array(a) => a
                    .iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect(),
                _ => Vec::new(),
            };
            let known: Vec<&str> = names
                .iter()
                .filter(|n| n.eq_ignore_ascii_case("duckduckgo"))
                .map(|_| "duckduckgo")
                .collect();
            if known.is_empty() {
                dropped(format!(
                    "{names:?}: sandboxd's engines are searxng, duckduckgo, brave and tavily \
                     ([research] engines); the default order is kept"
                ))
            } else {
                dropped(format!(
                    "DuckDuckGo is already in sandboxd's default [research] engines \
                     (searxng, duckduckgo, brave, tavily); the others in {names:?} have no \
                     sandboxd engine"
                ))
            }
        }
        "max_retries" => with_note(
            mapped(&["research", "retries"], v),
            "extra attempts of one engine after a network error",
        ),
        "retry_delay" => with_note(
            mapped(&["research", "cooldown_secs"], v),
            "how long a rate-limited engine is left alone",
        ),
        "lang" | "country" => dropped("sandboxd's search engines take no language or country"),
        _ => dropped("not a search setting sandboxd has"),
    }
}

fn sandbox_key(
    full: &str,
    key: &str,
    v: toml::Value,
) -> Result<(Vec<Assignment>, Outcome), ImportError> {
    let bad = |message: &str| ImportError::Value {
        key: full.to_string(),
        message: message.to_string(),
    };
    Ok(match key {
        "use_sandbox" => dropped("sandboxd always runs every tool inside a sandbox"),
        "image" => dropped(
            "sandboxd builds its own hardened image offline (`sandboxd image build`); a \
             foreign image would lack its helpers",
        ),
        "work_dir" => dropped("the working directory is always /workspace"),
        "network_enabled" => dropped(
            "a sandbox never has a network device; the live web goes through the egress proxy, \
             by policy ([egress] default, or --egress)",
        ),
        "memory_limit" => {
            let text = v
                .as_str()
                .ok_or_else(|| bad("expected a string like \"1g\""))?;
            let mb = docker_size_mb(text).ok_or_else(|| bad("expected a size like 512m or 1g"))?;
            let mb = i64::try_from(mb).map_err(|_| bad("too large"))?;
            with_note(
                mapped(&["limits", "memory_mb"], toml::Value::Integer(mb)),
                format!("{text} = {mb} MiB"),
            )
        }
        "cpu_limit" => {
            let cpus = v
                .as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .ok_or_else(|| bad("expected a number of CPUs"))?;
            mapped(&["limits", "cpus"], toml::Value::Float(cpus))
        }
        "timeout" => with_note(
            mapped(&["limits", "max_timeout_secs"], v),
            "the longest one command may run",
        ),
        _ => dropped("not a sandbox setting sandboxd has"),
    })
}

/// Docker's size notation (`512m`, `1g`, `2048k`, bytes) in MiB, rounded up.
fn docker_size_mb(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let bytes = match unit {
        "" => n,
        "k" => n.checked_mul(1 << 10)?,
        "m" => n.checked_mul(1 << 20)?,
        "g" => n.checked_mul(1 << 30)?,
        _ => return None,
    };
    Some(bytes.div_ceil(1 << 20))
}

#[cfg(test)]
#[path = "openmanus_tests.rs"]
mod tests;
