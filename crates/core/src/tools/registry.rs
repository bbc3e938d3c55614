//! ToolRegistry: the tools of one session, rendered for the model and called by name with
//! the raw JSON argument string the model produced.
//!
//! Everything the model sends is checked here — unknown tool, arguments that are not JSON,
//! a missing required parameter, a wrong type, a value outside an enum — and turned into an
//! error observation the model can read and act on, never a panic or a dropped call.

use std::sync::Arc;

use regex::Regex;
use serde::Serialize;
use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolResult};

/// OpenAI rejects longer descriptions (OpenManus issue #787).
pub const MAX_DESCRIPTION: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("tool name {0:?} is invalid: names must match ^[a-zA-Z0-9_-]{{1,64}}$")]
    BadName(String),
    #[error(
        "tool {name}: the description is {len} characters; OpenAI accepts at most {MAX_DESCRIPTION}"
    )]
    DescriptionTooLong { name: String, len: usize },
    #[error("tool {name}: the parameters must be a JSON schema object with \"type\": \"object\"")]
    BadSchema { name: String },
}

/// A tool as the model (or an MCP client) sees it.
#[derive(Debug, Clone, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

#[derive(Default, Clone)]
pub struct ToolRegistry {
    tools: Vec<Arc<dyn Tool>>,
}

fn name_pattern() -> &'static Regex {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        Regex::new("^[a-zA-Z0-9_-]{1,64}$").unwrap_or_else(|_| unreachable!("constant regex"))
    })
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool. On a duplicate name the first registered wins and a warning is logged.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.name().to_string();
        if !name_pattern().is_match(&name) {
            return Err(RegistryError::BadName(name));
        }
        let len = tool.description().chars().count();
        if len > MAX_DESCRIPTION {
            return Err(RegistryError::DescriptionTooLong { name, len });
        }
        if tool.parameters().get("type").and_then(Value::as_str) != Some("object") {
            return Err(RegistryError::BadSchema { name });
        }
        if self.get(&name).is_some() {
            tracing::warn!(tool = %name, "a tool with this name is already registered; keeping the first");
            return Ok(());
        }
        self.tools.push(tool);
        Ok(())
    }

    /// Removes a tool by name (MCP servers whose tools went away).
    pub fn unregister(&mut self, name: &str) -> bool {
        let before = self.tools.len();
        self.tools.retain(|t| t.name() != name);
        before != self.tools.len()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name)
    }

    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name().to_string()).collect()
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools
            .iter()
            .map(|t| ToolSpec {
                name: t.name().to_string(),
                description: t.description().to_string(),
                parameters: t.parameters(),
            })
            .collect()
    }

    /// The tools in OpenAI's function format.
    pub fn to_openai(&self) -> Vec<Value> {
        self.specs()
            .into_iter()
            .map(|s| json!({"type": "function", "function": {"name": s.name, "description": s.description, "parameters": s.parameters}}))
            .collect()
    }

    /// Runs a call given as the model sent it. Bad calls come back as error observations.
    pub async fn execute(
        &self,
        name: &str,
        raw_args: &str,
        ctx: &ToolContext,
    ) -> Result<ToolResult, ToolError> {
        let Some(tool) = self.get(name) else {
            return Ok(ToolResult::error(format!(
                "there is no tool named {name:?}; the available tools are: {}",
                self.names().join(", ")
            )));
        };
        let args = match parse_args(raw_args) {
            Ok(a) => a,
            Err(msg) => {
                return Ok(ToolResult::error(format!(
                    "the arguments of {name} are not valid JSON ({msg}); send a JSON object"
                )));
            }
        };
        if let Err(msg) = check_args(&tool.parameters(), &args) {
            return Ok(ToolResult::error(format!(
                "bad arguments for {name}: {msg}"
            )));
        }
        let started = std::time::Instant::now();
        let result = match tool.execute(args, ctx).await {
            Ok(r) => Ok(r),
            Err(e) => e.into_observation(),
        };
        if let Some(m) = crate::metrics::recorder() {
            let failed = !matches!(&result, Ok(r) if r.error.is_none());
            m.tool_call(crate::metrics::tool_label(name), started.elapsed(), failed);
        }
        result
    }
}

fn parse_args(raw: &str) -> Result<Value, String> {
    if raw.trim().is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(other) => Err(format!("expected an object, got {}", type_name(&other))),
        Err(e) => Err(e.to_string()),
    }
}

/// Checks the top level of a JSON-schema object: required keys, types, enums.
pub fn check_args(schema: &Value, args: &Value) -> Result<(), String> {
    let props = schema.get("properties").and_then(Value::as_object);
    let empty = serde_json::Map::new();
    let given = args.as_object().unwrap_or(&empty);
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for key in required.iter().filter_map(Value::as_str) {
            if given.get(key).is_none_or(Value::is_null) {
                return Err(format!("the required parameter {key:?} is missing"));
            }
        }
    }
    let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
    for (key, value) in given {
        let Some(prop) = props.and_then(|p| p.get(key)) else {
            if closed {
                return Err(format!("unknown parameter {key:?}"));
            }
            continue;
        };
        if value.is_null() {
            continue;
        }
        if let Some(expected) = prop.get("type") {
            let ok = match expected {
                Value::String(t) => type_matches(t, value),
                Value::Array(ts) => ts
                    .iter()
                    .filter_map(Value::as_str)
                    .any(|t| type_matches(t, value)),
                _ => true,
            };
            if !ok {
                return Err(format!(
                    "parameter {key:?} must be of type {expected}, got {}",
                    type_name(value)
                ));
            }
        }
        if let Some(options) = prop.get("enum").and_then(Value::as_array)
            && !options.contains(value)
        {
            return Err(format!(
                "parameter {key:?} must be one of {}, got {value}",
                Value::Array(options.clone())
            ));
        }
    }
    Ok(())
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "null" => v.is_null(),
        _ => true,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
