//! [flow]: the planning flow's settings and its executors (a tool subset and a prompt per
//! step tag such as `[python]`). Kept beside the flow so src/config.rs only names it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Most steps a plan may have, whatever a caller asks for.
pub const MAX_STEPS_CEILING: usize = 50;

/// Most attempts a step may get after its first, whatever the config says.
pub const MAX_RETRIES: u32 = 3;
/// Most re-plannings of one flow, whatever the config says.
pub const MAX_REPLANS: u32 = 5;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlowConfig {
    /// Most steps a plan may have.
    pub max_plan_steps: usize,
    /// Extra attempts of a step that ended without success before it is blocked (≤ 3).
    pub step_retries: u32,
    /// Re-plannings after a blocked step (≤ 5); 0 ends the flow at the first blocked step.
    pub max_replans: u32,
    /// Deadline of the whole flow; what is done by then is returned as a partial result.
    pub timeout_secs: u64,
    /// Input tokens the whole flow (planner, steps, summary) may spend; 0 means no budget.
    pub max_input_tokens: u64,
    /// Executors by step tag (`[python]` → "python"); untagged steps and unknown tags use
    /// the default agent with all its tools.
    pub executors: BTreeMap<String, ExecutorConfig>,
}

/// How a tagged step is run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecutorConfig {
    /// Shown to the planner so it knows when to use the tag.
    pub description: String,
    /// The tools offered (names not installed are skipped); empty means all. `planning`
    /// and `terminate` are always offered.
    pub tools: Vec<String>,
    /// A paragraph added to the system prompt of the step's run.
    pub prompt: String,
    /// Most steps of one run of this executor; 0 means [agent] max_steps.
    pub max_steps: usize,
    /// An agent profile (`sandboxd agents`) whose tools, prompt and step limit the executor
    /// takes where it sets none of its own; empty: none.
    pub agent: String,
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl Default for FlowConfig {
    fn default() -> Self {
        let mut executors = BTreeMap::new();
        executors.insert(
            "python".to_string(),
            ExecutorConfig {
                description: "data work, calculations and plots in the session's python".into(),
                tools: names(&["python", "str_replace_editor"]),
                prompt: "You are the data-analysis executor: do the work in python (pandas, numpy and matplotlib are available when installed in the image) and save results and plots under /workspace.".into(),
                max_steps: 0,
                agent: String::new(),
            },
        );
        executors.insert(
            "research".to_string(),
            ExecutorConfig {
                description: "finding and reading sources on the web".into(),
                tools: names(&[
                    "web_search",
                    "web_fetch",
                    "browser_use",
                    "str_replace_editor",
                    "python",
                ]),
                prompt: "You are the research executor: find and read sources, save what you use under /workspace/research, and cite the URLs in your answer.".into(),
                max_steps: 0,
                agent: String::new(),
            },
        );
        Self {
            max_plan_steps: 10,
            step_retries: 1,
            max_replans: 0,
            timeout_secs: 3600,
            max_input_tokens: 0,
            executors,
        }
    }
}

impl FlowConfig {
    /// Refuses executor tags a step could not name and settings outside their bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: String, message: String| Err(ConfigError::Invalid { key, message });
        if self.max_plan_steps == 0 || self.max_plan_steps > MAX_STEPS_CEILING {
            return bad(
                "flow.max_plan_steps".into(),
                format!(
                    "{} is not between 1 and {}",
                    self.max_plan_steps, MAX_STEPS_CEILING
                ),
            );
        }
        if self.step_retries > MAX_RETRIES {
            return bad(
                "flow.step_retries".into(),
                format!(
                    "{} is above the maximum of {MAX_RETRIES}",
                    self.step_retries
                ),
            );
        }
        if self.max_replans > MAX_REPLANS {
            return bad(
                "flow.max_replans".into(),
                format!("{} is above the maximum of {MAX_REPLANS}", self.max_replans),
            );
        }
        if self.timeout_secs == 0 {
            return bad("flow.timeout_secs".into(), "must be at least 1".into());
        }
        for tag in self.executors.keys() {
            let ok = tag.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && tag
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !ok || tag == "default" {
                return bad(
                    format!("flow.executors.{tag}"),
                    "an executor tag is lower-case letters, digits and _ (starting with a letter), and not \"default\"".into(),
                );
            }
        }
        Ok(())
    }
}
