//! [[agents]]: the user's own agent profiles (a tool set, a prompt file, a step limit), next
//! to the built-in ones of `agent::profiles`. Only the shape is checked here; the profiles
//! module reads the prompt files and refuses clashes with the built-in names.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Most user-defined profiles (each is listed by `sandboxd agents` and offered to the planner).
pub const MAX_PROFILES: usize = 32;

/// One `[[agents]]` table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentProfileConfig {
    /// Chosen with `--agent NAME` / `{"agent": NAME}`: lower-case letters, digits and `_`.
    pub name: String,
    /// One line for `sandboxd agents` and the planner.
    pub description: String,
    /// The tools offered (names not installed are skipped; `terminate` always is); empty
    /// offers all of them.
    pub tools: Vec<String>,
    /// A Markdown file whose text is added to the system prompt (relative paths are read
    /// from the working directory of sandboxd); empty adds nothing.
    pub prompt_file: String,
    /// Most steps of one run; 0 means [agent] max_steps.
    pub max_steps: usize,
}

/// Whether `name` can name a profile (and a flow executor tag, which it also becomes).
pub fn valid_name(name: &str) -> bool {
    name.len() <= 32
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Refuses bad names, duplicates and too many profiles.
pub fn validate(agents: &[AgentProfileConfig]) -> Result<(), ConfigError> {
    let bad = |key: String, message: String| Err(ConfigError::Invalid { key, message });
    if agents.len() > MAX_PROFILES {
        return bad(
            "agents".into(),
            format!(
                "{} profiles; at most {MAX_PROFILES} may be defined",
                agents.len()
            ),
        );
    }
    for (i, a) in agents.iter().enumerate() {
        if !valid_name(&a.name) {
            return bad(
                format!("agents[{i}].name"),
                format!(
                    "{:?}: a profile name is 1-32 lower-case letters, digits and _, starting with a letter",
                    a.name
                ),
            );
        }
        if agents[..i].iter().any(|b| b.name == a.name) {
            return bad(
                format!("agents[{i}].name"),
                format!("{:?} is defined twice", a.name),
            );
        }
    }
    Ok(())
}
