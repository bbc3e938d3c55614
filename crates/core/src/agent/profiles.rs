//! Agent profiles: a tool set, a prompt and a step limit under a name. The built-in four
//! (`general`, `coding`, `browser`, `data`) follow OpenManus's agents; `[[agents]]` in the
//! config adds the user's own. Every front end (`sandboxd run --agent`, `POST /v1/runs`,
//! the web UI, the planning flow's executors) picks one by name through `Profiles::get`,
//! and the run takes it as its `RunShape` (see session_run.rs), so no front end composes
//! a profile itself.

use crate::config::{AgentProfileConfig, Config, ExecutorConfig, FlowConfig};

/// The profile a run gets when none is named.
pub const DEFAULT: &str = "general";
/// The largest prompt file a profile may name.
pub const MAX_PROMPT_BYTES: usize = 64 * 1024;

const CODING: &str = include_str!("prompts/profiles/coding.md");
const BROWSER: &str = include_str!("prompts/profiles/browser.md");
const DATA: &str = include_str!("prompts/profiles/data.md");

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// The tools offered (`terminate` always is, MCP servers' tools are added); None: all.
    pub tools: Option<Vec<String>>,
    /// Added to the system prompt; None adds nothing (the general agent's prompt alone).
    pub prompt: Option<String>,
    /// Most steps of a run unless the request says otherwise; None: [agent] max_steps.
    pub max_steps: Option<usize>,
    /// Defined in the config rather than built in.
    pub user_defined: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("there is no agent profile named {name:?}; the known ones are: {}", known.join(", "))]
    Unknown { name: String, known: Vec<String> },
    #[error(
        "agent profile {name:?} in [[agents]] has the name of a built-in profile; choose another"
    )]
    Shadows { name: String },
    #[error("agent profile {name:?}: cannot read its prompt_file {path}: {message}")]
    Prompt {
        name: String,
        path: String,
        message: String,
    },
}

fn names(v: &[&str]) -> Option<Vec<String>> {
    Some(v.iter().map(|s| s.to_string()).collect())
}

fn built_in() -> Vec<Profile> {
    let profile = |name: &str, description: &str, tools, prompt: &str, max_steps| Profile {
        name: name.into(),
        description: description.into(),
        tools,
        prompt: (!prompt.is_empty()).then(|| prompt.trim_end().to_string()),
        max_steps,
        user_defined: false,
    };
    vec![
        profile(
            DEFAULT,
            "every tool: shell, python, editor, browser, research, asking the user",
            None,
            "",
            None,
        ),
        profile(
            "coding",
            "software work in a repository under /workspace: bash, the editor and python",
            names(&["bash", "str_replace_editor", "python"]),
            CODING,
            Some(30),
        ),
        profile(
            "browser",
            "getting things done on web pages: the browser and the research tools",
            names(&["browser_use", "web_search", "web_fetch"]),
            BROWSER,
            Some(25),
        ),
        profile(
            "data",
            "data analysis in python: Excel and CSV in, statistics, PNG and interactive HTML charts out",
            names(&["python", "str_replace_editor", "view_image"]),
            DATA,
            Some(25),
        ),
    ]
}

/// The built-in profiles and the config's own, in that order.
#[derive(Debug, Clone)]
pub struct Profiles(Vec<Profile>);

impl Profiles {
    /// Reads the `[[agents]]` prompt files; a missing or oversized file, or a profile named
    /// like a built-in one, is an error naming it.
    pub fn from_config(config: &Config) -> Result<Self, ProfileError> {
        let mut all = built_in();
        for a in &config.agents {
            if all.iter().any(|p| p.name == a.name) {
                return Err(ProfileError::Shadows {
                    name: a.name.clone(),
                });
            }
            all.push(user_profile(a)?);
        }
        Ok(Self(all))
    }

    pub fn list(&self) -> &[Profile] {
        &self.0
    }

    /// The profile `name` (None: the default one), or an error listing the known ones.
    pub fn get(&self, name: Option<&str>) -> Result<&Profile, ProfileError> {
        let name = name.unwrap_or(DEFAULT);
        self.0
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| ProfileError::Unknown {
                name: name.to_string(),
                known: self.0.iter().map(|p| p.name.clone()).collect(),
            })
    }

    /// The planning flow's executors with the profiles in them: an executor whose `agent`
    /// names a profile takes the profile's tools, prompt and step limit where it sets none
    /// of its own, and every profile but the default one is also a step tag of its own name
    /// unless an executor already has it.
    pub fn executors(&self, flow: &mut std::collections::BTreeMap<String, ExecutorConfig>) {
        for (tag, executor) in flow.iter_mut() {
            let named = executor.agent.trim();
            let Some(p) = self.0.iter().find(|p| !named.is_empty() && p.name == named) else {
                continue;
            };
            if executor.tools.is_empty() {
                executor.tools = p.tools.clone().unwrap_or_default();
            }
            if let Some(prompt) = &p.prompt {
                executor.prompt = match executor.prompt.trim() {
                    "" => prompt.clone(),
                    own => format!("{prompt}\n\n{own}"),
                };
            }
            if executor.max_steps == 0 {
                executor.max_steps = p.max_steps.unwrap_or(0);
            }
            if executor.description.is_empty() {
                executor.description = p.description.clone();
            }
            tracing::debug!(tag = %tag, agent = %p.name, "flow executor uses an agent profile");
        }
        for p in self.0.iter().filter(|p| p.name != DEFAULT) {
            flow.entry(p.name.clone())
                .or_insert_with(|| ExecutorConfig {
                    description: p.description.clone(),
                    tools: p.tools.clone().unwrap_or_default(),
                    prompt: p.prompt.clone().unwrap_or_default(),
                    max_steps: p.max_steps.unwrap_or(0),
                    agent: p.name.clone(),
                });
        }
    }
}

/// The planning flow's settings with the profiles in its executors (`Profiles::executors`);
/// what every front end hands `PlanningFlow::new`. Profiles that cannot be read now (a
/// prompt file removed since the start) leave the executors as configured, with a warning.
pub fn flow_config(config: &Config) -> FlowConfig {
    let mut flow = config.flow.clone();
    match Profiles::from_config(config) {
        Ok(p) => p.executors(&mut flow.executors),
        Err(e) => tracing::warn!(error = %e, "the agent profiles are not offered to the planner"),
    }
    flow
}

fn user_profile(a: &AgentProfileConfig) -> Result<Profile, ProfileError> {
    let prompt = match a.prompt_file.trim() {
        "" => None,
        path => Some(read_prompt(&a.name, path)?),
    };
    Ok(Profile {
        name: a.name.clone(),
        description: a.description.clone(),
        tools: (!a.tools.is_empty()).then(|| a.tools.clone()),
        prompt,
        max_steps: (a.max_steps > 0).then_some(a.max_steps),
        user_defined: true,
    })
}

fn read_prompt(name: &str, path: &str) -> Result<String, ProfileError> {
    let fail = |message: String| ProfileError::Prompt {
        name: name.into(),
        path: path.into(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".into()));
    }
    if meta.len() > MAX_PROMPT_BYTES as u64 {
        return Err(fail(format!(
            "{} bytes; a prompt file may have at most {MAX_PROMPT_BYTES}",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| fail("not UTF-8 text".into()))?;
    Ok(text.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_the_known_ones() {
        let p = Profiles::from_config(&Config::default()).expect("built-ins");
        assert_eq!(p.get(None).expect("default").name, "general");
        let e = p.get(Some("nope")).expect_err("unknown").to_string();
        assert!(e.contains("general, coding, browser, data"), "{e}");
    }

    #[test]
    fn user_profiles_cannot_shadow_built_ins_or_miss_their_prompt() {
        let mut c = Config::default();
        c.agents.push(AgentProfileConfig {
            name: "data".into(),
            ..Default::default()
        });
        assert!(matches!(
            Profiles::from_config(&c),
            Err(ProfileError::Shadows { .. })
        ));
        c.agents[0].name = "mine".into();
        c.agents[0].prompt_file = "/nonexistent/prompt.md".into();
        let e = Profiles::from_config(&c)
            .expect_err("missing file")
            .to_string();
        assert!(e.contains("/nonexistent/prompt.md"), "{e}");
    }

    #[test]
    fn profiles_become_flow_executors() {
        let mut flow = crate::config::FlowConfig::default().executors;
        flow.get_mut("python").expect("python").agent = "data".into();
        Profiles::from_config(&Config::default())
            .expect("built-ins")
            .executors(&mut flow);
        let python = &flow["python"];
        assert!(python.prompt.contains("data analyst") && python.prompt.contains("executor"));
        assert_eq!(
            flow["coding"].tools,
            ["bash", "str_replace_editor", "python"]
        );
        assert!(!flow.contains_key("general"));
    }
}
