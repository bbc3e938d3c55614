//! `[[remote_agents]]`: A2A agents elsewhere that a run may call as tools (`a2a_<name>`), the
//! other direction of `serve`'s own A2A endpoint. Configured by the admin like MCP servers:
//! a name, where the agent card is, an optional bearer token taken from the environment (a
//! secret never sits in the config file, the sandbox, events or logs), and which users' runs
//! get the tool. Every request goes through the research `Fetcher`, so the host-side URL rules
//! of `[research]` hold for the card, the endpoint the card names, and every redirect.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Most remote agents (each is one tool in every allowed run, and one card fetch at its start).
pub const MAX_REMOTE_AGENTS: usize = 16;

/// One `[[remote_agents]]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteAgentConfig {
    /// The tool is `a2a_<name>`: lower-case letters, digits and `_`, at most 32.
    pub name: String,
    /// The agent's base URL (its card is at `/.well-known/agent-card.json` under it) or the
    /// card's own URL (ending in `.json`).
    pub url: String,
    /// The tool's description for the model; empty takes the card's.
    pub description: String,
    /// An environment variable of sandboxd's process whose value is sent as
    /// `Authorization: Bearer <value>` to the agent's endpoint; empty sends none.
    pub bearer_env: String,
    /// Users whose runs get the tool: names, or `"*"` for everyone (the CLI's runs included).
    pub users: Vec<String>,
    /// The longest one call waits for the remote task to finish (it is cancelled after).
    pub timeout_secs: u64,
}

impl Default for RemoteAgentConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            url: String::new(),
            description: String::new(),
            bearer_env: String::new(),
            users: vec!["*".into()],
            timeout_secs: 300,
        }
    }
}

impl RemoteAgentConfig {
    /// The tool's name.
    pub fn tool_name(&self) -> String {
        format!("a2a_{}", self.name)
    }

    /// Whether `owner`'s runs get this agent.
    pub fn allows(&self, owner: &str) -> bool {
        self.users.iter().any(|u| u == "*" || u == owner)
    }
}

/// Refuses bad names, duplicates, URLs that are not http(s), and too many agents.
pub fn validate(agents: &[RemoteAgentConfig]) -> Result<(), ConfigError> {
    let bad = |key: String, message: String| Err(ConfigError::Invalid { key, message });
    if agents.len() > MAX_REMOTE_AGENTS {
        return bad(
            "remote_agents".into(),
            format!(
                "{} agents; at most {MAX_REMOTE_AGENTS} may be configured",
                agents.len()
            ),
        );
    }
    for (i, a) in agents.iter().enumerate() {
        let key = |field: &str| format!("remote_agents[{i}].{field}");
        if !super::agents::valid_name(&a.name) {
            return bad(
                key("name"),
                format!(
                    "{:?}: a remote agent's name is 1-32 lower-case letters, digits and _, starting with a letter",
                    a.name
                ),
            );
        }
        if agents[..i].iter().any(|b| b.name == a.name) {
            return bad(key("name"), format!("{:?} is configured twice", a.name));
        }
        match url::Url::parse(&a.url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            _ => {
                return bad(
                    key("url"),
                    format!(
                        "{:?} is not an http(s) URL; give the agent's base URL or its card's URL",
                        a.url
                    ),
                );
            }
        }
        if a.timeout_secs == 0 || a.timeout_secs > 3600 {
            return bad(
                key("timeout_secs"),
                format!("{} is not between 1 and 3600 seconds", a.timeout_secs),
            );
        }
        if !a.bearer_env.is_empty() && !valid_env_name(&a.bearer_env) {
            return bad(
                key("bearer_env"),
                format!("{:?} is not an environment variable's name", a.bearer_env),
            );
        }
        if a.users.is_empty() {
            return bad(
                key("users"),
                "no users: list names, or [\"*\"] for everyone".into(),
            );
        }
    }
    Ok(())
}

fn valid_env_name(name: &str) -> bool {
    name.len() <= 128
        && name.chars().next().is_some_and(|c| !c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, url: &str) -> RemoteAgentConfig {
        RemoteAgentConfig {
            name: name.into(),
            url: url.into(),
            ..RemoteAgentConfig::default()
        }
    }

    #[test]
    fn good_agents_pass_and_bad_ones_say_which_key() {
        assert!(validate(&[agent("weather", "https://a.example")]).is_ok());
        for (list, key) in [
            (
                vec![agent("Bad Name", "https://a.example")],
                "remote_agents[0].name",
            ),
            (vec![agent("w", "ftp://a.example")], "remote_agents[0].url"),
            (vec![agent("w", "not a url")], "remote_agents[0].url"),
            (
                vec![
                    agent("w", "https://a.example"),
                    agent("w", "https://b.example"),
                ],
                "remote_agents[1].name",
            ),
        ] {
            match validate(&list) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{list:?}: {other:?}"),
            }
        }
        let mut a = agent("w", "https://a.example");
        a.bearer_env = "A B".into();
        assert!(validate(&[a]).is_err());
    }

    #[test]
    fn users_choose_whose_runs_get_the_tool() {
        let mut a = agent("w", "https://a.example");
        assert!(a.allows("anyone"));
        a.users = vec!["alice".into()];
        assert!(a.allows("alice") && !a.allows("bob"));
    }
}
