//! The `[llm]` and `[llm.vision]` part of the OpenManus import (see `openmanus.rs`).
//!
//! sandboxd's `[llm]` section was shaped after OpenManus's, so most keys copy over; the
//! exceptions are the provider (`api_type`: Ollama is OpenAI-compatible, Bedrock is not
//! spoken), Azure's base URL (OpenManus puts the deployment in it, sandboxd keeps it apart),
//! and API keys left as the example's placeholder.

use super::openmanus::{Assignment, ImportError, Outcome, dropped, mapped, with_note};

/// What OpenManus's example files put where a key belongs.
const PLACEHOLDER_KEYS: &[&str] = &["YOUR_API_KEY", "AZURE API KEY", ""];

pub(super) fn main_key(
    key: &str,
    v: toml::Value,
    root: &toml::Table,
) -> Result<(Vec<Assignment>, Outcome), ImportError> {
    let api_type = root
        .get("llm")
        .and_then(|l| l.get("api_type"))
        .and_then(|t| t.as_str())
        .unwrap_or("openai")
        .to_ascii_lowercase();
    Ok(match key {
        "model" => mapped(&["llm", "model"], v),
        "base_url" if api_type == "azure" => azure_base_url(v)?,
        "base_url" => mapped(&["llm", "base_url"], v),
        "api_key" => api_key(&["llm", "api_key"], v),
        "max_tokens" => mapped(&["llm", "max_tokens"], v),
        "temperature" => mapped(&["llm", "temperature"], float(v)),
        "api_version" => mapped(&["llm", "api_version"], v),
        "max_input_tokens" => with_note(
            mapped(&["agent", "max_input_tokens"], v),
            "input tokens one run may spend in total",
        ),
        "api_type" => match api_type.as_str() {
            "openai" | "" => mapped(&["llm", "api_type"], "openai".into()),
            "azure" => mapped(&["llm", "api_type"], "azure".into()),
            "ollama" => with_note(
                mapped(&["llm", "api_type"], "openai".into()),
                "Ollama speaks the OpenAI API at its base_url",
            ),
            other => dropped(format!(
                "the provider {other:?} is not spoken by sandboxd (OpenAI-compatible and Azure \
                 are); point [llm] base_url at an OpenAI-compatible gateway for it"
            )),
        },
        _ => dropped("not a model setting sandboxd has"),
    })
}

pub(super) fn vision_key(key: &str, v: toml::Value) -> (Vec<Assignment>, Outcome) {
    match key {
        "model" => mapped(&["llm", "vision", "model"], v),
        "base_url" => mapped(&["llm", "vision", "base_url"], v),
        "api_key" => api_key(&["llm", "vision", "api_key"], v),
        "max_tokens" | "temperature" | "api_type" | "api_version" => {
            dropped("the vision model shares [llm]'s settings in sandboxd")
        }
        _ => dropped("not a vision-model setting sandboxd has"),
    }
}

fn api_key(to: &[&'static str], v: toml::Value) -> (Vec<Assignment>, Outcome) {
    match v.as_str() {
        Some(k) if PLACEHOLDER_KEYS.contains(&k.trim()) => {
            dropped("the example's placeholder, not a key: set OPENAI_API_KEY (or [llm] api_key)")
        }
        Some(_) => with_note(
            mapped(to, v),
            "the key is written into the new file, which is created readable by its owner only",
        ),
        None => dropped("not a string"),
    }
}

/// OpenManus writes `temperature = 0` as often as `0.0`; sandboxd's field is a float.
fn float(v: toml::Value) -> toml::Value {
    match v {
        toml::Value::Integer(i) => toml::Value::Float(i as f64),
        other => other,
    }
}

/// OpenManus's Azure base URL is `{endpoint}/openai/deployments/{deployment}`; sandboxd takes
/// the endpoint and the deployment as two keys.
fn azure_base_url(v: toml::Value) -> Result<(Vec<Assignment>, Outcome), ImportError> {
    let url = v.as_str().unwrap_or_default().trim_end_matches('/');
    let Some((endpoint, deployment)) = url.split_once("/openai/deployments/") else {
        return Ok(mapped(&["llm", "base_url"], v));
    };
    if deployment.is_empty() || deployment.contains('/') || deployment.contains('{') {
        return Ok(dropped(format!(
            "{url:?} does not end in /openai/deployments/NAME with a real deployment name; \
             set [llm] base_url (the endpoint) and [llm] deployment"
        )));
    }
    Ok((
        vec![
            (vec!["llm", "base_url"], endpoint.into()),
            (vec!["llm", "deployment"], deployment.into()),
        ],
        Outcome::Mapped {
            to: "llm.base_url, llm.deployment".into(),
            note: Some(format!(
                "endpoint {endpoint}, deployment {deployment} (sandboxd keeps them apart)"
            )),
        },
    ))
}
