//! Which LLM endpoint to talk to: [llm] settings (which already include SANDBOXD_LLM_*),
//! then the usual OPENAI_* variables. With nothing usable configured, the error carries a
//! guide that names every variable and key to set, with examples for OpenAI, a local
//! OpenAI-compatible server and Azure.

use crate::config::LlmConfig;

use super::LlmError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiType {
    OpenAi,
    Azure,
}

/// A resolved endpoint: everything needed to build a client.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub api_type: ApiType,
    /// Without a trailing slash; for OpenAI-style servers it ends in /v1.
    pub base_url: String,
    pub api_key: String,
    pub model: String,
    pub deployment: String,
    pub api_version: String,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key never reaches a log line.
        f.debug_struct("Endpoint")
            .field("api_type", &self.api_type)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("deployment", &self.deployment)
            .finish_non_exhaustive()
    }
}

pub(super) const OPENAI_BASE: &str = "https://api.openai.com/v1";

/// Resolves the main endpoint. `env` looks up process variables (injected for tests).
pub fn resolve(
    cfg: &LlmConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Endpoint, LlmError> {
    let api_type = match cfg.api_type.trim().to_ascii_lowercase().as_str() {
        "" | "openai" => ApiType::OpenAi,
        "azure" => ApiType::Azure,
        other => {
            return Err(LlmError::Invalid {
                key: "llm.api_type".into(),
                message: format!(
                    "{other:?} is not a known API type; use \"openai\" (also for Ollama, vLLM and other compatible servers) or \"azure\""
                ),
            });
        }
    };
    let mut missing = Vec::new();
    let endpoint = match api_type {
        ApiType::OpenAi => openai_endpoint(cfg, env, &mut missing),
        ApiType::Azure => azure_endpoint(cfg, env, &mut missing),
    };
    if !missing.is_empty() {
        return Err(LlmError::NotConfigured { missing });
    }
    check(endpoint)
}

/// The configured value when set, else the first of the environment variables `vars` set.
fn pick(own: &str, vars: &[&str], env: &dyn Fn(&str) -> Option<String>) -> String {
    if !own.trim().is_empty() {
        return own.trim().to_string();
    }
    vars.iter()
        .filter_map(|v| env(v))
        .map(|v| v.trim().to_string())
        .find(|v| !v.is_empty())
        .unwrap_or_default()
}

/// An OpenAI-compatible endpoint (OpenAI's own when no base URL is given); what it lacks
/// goes into `missing`.
fn openai_endpoint(
    cfg: &LlmConfig,
    env: &dyn Fn(&str) -> Option<String>,
    missing: &mut Vec<String>,
) -> Endpoint {
    let model = cfg.model.trim().to_string();
    let api_key = pick(&cfg.api_key, &["OPENAI_API_KEY"], env);
    let base_url = pick(&cfg.base_url, &["OPENAI_BASE_URL"], env);
    if api_key.is_empty() && base_url.is_empty() {
        missing.push("an API key (OPENAI_API_KEY or [llm] api_key) or, for a local server, a base URL (SANDBOXD_LLM_BASE_URL or [llm] base_url)".to_string());
    }
    if model.is_empty() {
        missing.push("the model (SANDBOXD_LLM_MODEL or [llm] model)".into());
    }
    Endpoint {
        api_type: ApiType::OpenAi,
        base_url: if base_url.is_empty() {
            OPENAI_BASE.into()
        } else {
            base_url
        },
        api_key,
        model,
        deployment: String::new(),
        api_version: String::new(),
    }
}

/// An Azure OpenAI endpoint (the model defaults to the deployment); what it lacks goes into
/// `missing`.
fn azure_endpoint(
    cfg: &LlmConfig,
    env: &dyn Fn(&str) -> Option<String>,
    missing: &mut Vec<String>,
) -> Endpoint {
    let model = cfg.model.trim().to_string();
    let api_key = pick(&cfg.api_key, &["AZURE_OPENAI_API_KEY"], env);
    let base_url = pick(&cfg.base_url, &["AZURE_OPENAI_ENDPOINT"], env);
    let deployment = cfg.deployment.trim().to_string();
    let api_version = cfg.api_version.trim().to_string();
    for (value, what) in [
        (
            &api_key,
            "the Azure key (AZURE_OPENAI_API_KEY or [llm] api_key)",
        ),
        (
            &base_url,
            "the Azure endpoint (AZURE_OPENAI_ENDPOINT or [llm] base_url)",
        ),
        (
            &deployment,
            "the deployment (SANDBOXD_LLM_DEPLOYMENT or [llm] deployment)",
        ),
        (
            &api_version,
            "the API version (SANDBOXD_LLM_API_VERSION or [llm] api_version)",
        ),
    ] {
        if value.is_empty() {
            missing.push(what.to_string());
        }
    }
    let model = if model.is_empty() {
        deployment.clone()
    } else {
        model
    };
    Endpoint {
        api_type: ApiType::Azure,
        base_url,
        api_key,
        model,
        deployment,
        api_version,
    }
}

/// Resolves the optional [llm.vision] override on top of the main endpoint.
pub fn resolve_vision(cfg: &LlmConfig, main: &Endpoint) -> Result<Option<Endpoint>, LlmError> {
    let Some(v) = &cfg.vision else {
        return Ok(None);
    };
    if v.model.trim().is_empty() {
        return Ok(None);
    }
    let mut e = main.clone();
    e.model = v.model.trim().to_string();
    if !v.base_url.trim().is_empty() {
        e.base_url = v.base_url.trim().to_string();
    }
    if !v.api_key.trim().is_empty() {
        e.api_key = v.api_key.trim().to_string();
    }
    check(e).map(Some)
}

fn check(mut e: Endpoint) -> Result<Endpoint, LlmError> {
    // async-openai panics on a header value it cannot encode; refuse such a key here.
    if e.api_key.chars().any(|c| !c.is_ascii_graphic()) {
        return Err(LlmError::Invalid {
            key: "llm.api_key".into(),
            message: "the key contains spaces, control or non-ASCII characters; paste it again"
                .into(),
        });
    }
    while e.base_url.ends_with('/') {
        e.base_url.pop();
    }
    if !(e.base_url.starts_with("http://") || e.base_url.starts_with("https://")) {
        return Err(LlmError::Invalid {
            key: "llm.base_url".into(),
            message: format!(
                "{:?} is not an http(s) URL; e.g. http://localhost:11434/v1",
                e.base_url
            ),
        });
    }
    Ok(e)
}

/// The text shown when no LLM is configured.
pub fn guidance(missing: &[String]) -> String {
    let mut s = String::from("no LLM is configured; missing:\n");
    for m in missing {
        s.push_str(&format!("  - {m}\n"));
    }
    s.push_str(
        r#"
Set environment variables (or the same keys under [llm] in config/sandboxd.toml), for example:

  OpenAI:
    export OPENAI_API_KEY=sk-...
    export SANDBOXD_LLM_MODEL=gpt-4o

  An OpenAI-compatible local server (Ollama, vLLM, llama.cpp, LM Studio); no key needed:
    export SANDBOXD_LLM_BASE_URL=http://localhost:11434/v1     # vLLM: http://localhost:8000/v1
    export SANDBOXD_LLM_MODEL=qwen2.5:7b                       # a model that supports tool calls

  Azure OpenAI:
    export SANDBOXD_LLM_API_TYPE=azure
    export AZURE_OPENAI_ENDPOINT=https://YOUR-RESOURCE.openai.azure.com
    export AZURE_OPENAI_API_KEY=...
    export SANDBOXD_LLM_DEPLOYMENT=your-deployment-name
    export SANDBOXD_LLM_API_VERSION=2024-10-21

  or in config/sandboxd.toml:
    [llm]
    model = "gpt-4o"
    api_key = "sk-..."                         # or: base_url = "http://localhost:11434/v1"

Then check it with `sandboxd doctor`."#,
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(a, _)| *a == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn nothing_configured_names_what_is_missing() {
        let err = resolve(&LlmConfig::default(), &env_of(&[])).unwrap_err();
        let LlmError::NotConfigured { missing } = &err else {
            panic!("{err}")
        };
        assert_eq!(missing.len(), 2);
        let text = guidance(missing);
        for needle in [
            "OPENAI_API_KEY",
            "SANDBOXD_LLM_MODEL",
            "SANDBOXD_LLM_BASE_URL",
            "AZURE_OPENAI_ENDPOINT",
            "[llm]",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
    }

    #[test]
    fn local_server_needs_no_key_and_env_fills_in() {
        let cfg = LlmConfig {
            model: "qwen".into(),
            ..LlmConfig::default()
        };
        let e = resolve(
            &cfg,
            &env_of(&[("OPENAI_BASE_URL", "http://localhost:11434/v1/")]),
        )
        .unwrap();
        assert_eq!(e.base_url, "http://localhost:11434/v1");
        assert_eq!(e.api_key, "");
        let e = resolve(&cfg, &env_of(&[("OPENAI_API_KEY", "sk-x")])).unwrap();
        assert_eq!(e.base_url, OPENAI_BASE);
    }

    #[test]
    fn azure_and_bad_values() {
        let cfg = LlmConfig {
            api_type: "azure".into(),
            deployment: "d".into(),
            ..LlmConfig::default()
        };
        let err = resolve(&cfg, &env_of(&[("AZURE_OPENAI_API_KEY", "k")])).unwrap_err();
        assert!(
            matches!(&err, LlmError::NotConfigured { missing } if missing.len() == 2),
            "{err}"
        );
        let cfg = LlmConfig {
            model: "m".into(),
            api_key: "bad key\n".into(),
            ..LlmConfig::default()
        };
        assert!(matches!(
            resolve(&cfg, &env_of(&[])),
            Err(LlmError::Invalid { .. })
        ));
    }
}
