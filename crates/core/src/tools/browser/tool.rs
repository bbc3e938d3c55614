//! browser_use as a `Tool`: its description (built per session: what the browser can open),
//! its parameters, and the steps before an action reaches Chromium: the egress check of
//! go_to_url and open_tab, and the host-side search of web_search.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::actions::{ACTIONS, Action};
use super::state::BrowserState;
use super::{BrowserUse, NAME, net, search};
use crate::egress::EgressPolicy;
use crate::tools::{Tool, ToolContext, ToolError, ToolResult};

/// The description: what opens (egress), then the actions (web_search only with `search`).
pub(super) fn describe(policy: Option<&EgressPolicy>, search: bool) -> String {
    let text = format!(
        "Drive a headless Chromium inside the sandbox. {} Each action returns the page state (URL, title, tabs, \
         numbered interactive elements of the viewport, pixels above/below) and a screenshot. Actions: \
         go_to_url(url); click_element(index); input_text(index, text); scroll_down/scroll_up(scroll_amount px, \
         default a screen); scroll_to_text(text); send_keys(keys, e.g. \"Enter\"); get_dropdown_options(index); \
         select_dropdown_option(index, text); go_back; refresh; wait(seconds); extract_content(goal); \
         switch_tab(tab_id); open_tab(url); close_tab(tab_id); screenshot; web_search(query): search, open the \
         first allowed result. Downloads go to /workspace. Indexes refer to the latest state.",
        net::reach(policy)
    );
    if search {
        text
    } else {
        text.replace(
            " web_search(query): search, open the first allowed result.",
            "",
        )
    }
}

/// The ways of calling browser_use, shared by the browser and `WithoutSearch`.
fn parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ACTIONS, "description": "The browser action to perform."},
            "url": {"type": "string", "description": "URL for go_to_url and open_tab."},
            "query": {"type": "string", "description": "What to search for, for web_search."},
            "index": {"type": "integer", "description": "Element index for click_element, input_text, get_dropdown_options, select_dropdown_option."},
            "text": {"type": "string", "description": "Text for input_text, scroll_to_text, select_dropdown_option."},
            "scroll_amount": {"type": "integer", "description": "Pixels for scroll_down / scroll_up (default: one viewport)."},
            "tab_id": {"type": "integer", "description": "Tab id for switch_tab and close_tab."},
            "goal": {"type": "string", "description": "What to extract, for extract_content."},
            "keys": {"type": "string", "description": "Key or combination for send_keys."},
            "seconds": {"type": "integer", "description": "Seconds for wait (default 3, at most 10)."}
        },
        "required": ["action"]
    })
}

/// The session's browser where the host-side search is not offered (the MCP server without
/// `[research] mcp`): every action but web_search, on the same browser.
pub struct WithoutSearch {
    browser: std::sync::Arc<BrowserUse>,
    description: String,
}

impl WithoutSearch {
    pub fn new(browser: std::sync::Arc<BrowserUse>) -> Self {
        let description = browser.description.replace(
            " web_search(query): search, open the first allowed result.",
            "",
        );
        Self {
            browser,
            description,
        }
    }
}

#[async_trait]
impl Tool for WithoutSearch {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        parameters()
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        if args.get("action").and_then(Value::as_str) == Some("web_search") {
            return Ok(ToolResult::error(
                "web_search is not offered here: the admin keeps the host-side search off this server ([research] mcp = false); open known URLs with go_to_url",
            ));
        }
        self.browser.execute(args, ctx).await
    }
}

impl BrowserUse {
    /// The session's egress policy now; unreadable, nothing outside the sandbox opens.
    async fn policy(&self) -> Result<EgressPolicy, String> {
        let Some(egress) = &self.egress else {
            return Ok(EgressPolicy::Off);
        };
        egress.source.policy().await.map_err(|e| {
            format!(
                "the session's egress policy could not be read ({e}), so only the sandbox's own pages can be opened now (rule \"policy-unavailable\")"
            )
        })
    }

    /// Checks a URL against the policy before anything starts (no waiting on an error page),
    /// and turns web_search into the go_to_url of the result it chose. `Err` is the answer.
    async fn prepare(
        &self,
        action: Action,
        ctx: &ToolContext,
    ) -> Result<Result<(Action, Option<String>), ToolResult>, ToolError> {
        let url = match &action {
            Action::GoToUrl { url } | Action::OpenTab { url } => url.clone(),
            Action::WebSearch { query } => {
                let policy = match self.policy().await {
                    Ok(p) => p,
                    Err(e) => return Ok(Err(ToolResult::error(e))),
                };
                let found = search::search(self.research.as_ref(), query, &policy, &ctx.cancel);
                return Ok(match found.await? {
                    Err(e) => Err(ToolResult::error(e)),
                    Ok(found) => match found.open {
                        Some(url) => Ok((Action::GoToUrl { url }, Some(found.listing))),
                        None => Err(ToolResult::error(found.listing)),
                    },
                });
            }
            _ => return Ok(Ok((action, None))),
        };
        let checked = match self.policy().await {
            Ok(policy) => net::check_url(&url, &policy),
            // Unreadable: only what needs no egress.
            Err(e) => net::check_url(&url, &EgressPolicy::Off).map_err(|_| e),
        };
        Ok(match checked {
            Ok(()) => Ok((action, None)),
            Err(e) => Err(ToolResult::error(e)),
        })
    }
}

#[async_trait]
impl Tool for BrowserUse {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        parameters()
    }

    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        let action = match Action::parse(&args) {
            Ok(a) => a,
            Err(e) => return Ok(ToolResult::error(e)),
        };
        let (action, searched) = match self.prepare(action, ctx).await? {
            Ok(prepared) => prepared,
            Err(answer) => return Ok(answer),
        };
        let (outcome, state, notes) = self.perform(&action, ctx).await?;
        let state_text = state
            .as_ref()
            .map(BrowserState::to_prompt)
            .unwrap_or_default();
        // web_search: the results first, then what opening the chosen one did.
        let outcome = match searched {
            Some(listing) => match outcome {
                Ok(m) => Ok(format!("{listing}\n{m}")),
                Err(e) => Err(format!("{listing}\n{e}")),
            },
            None => outcome,
        };
        let mut result = match outcome {
            Ok(message) if state_text.is_empty() => ToolResult::ok(message),
            Ok(message) => ToolResult::ok(format!("{message}\n\n{state_text}")),
            Err(e) => ToolResult {
                output: state_text,
                error: Some(e),
                ..ToolResult::default()
            },
        };
        if let Some(shot) = state.and_then(|s| s.screenshot) {
            result = result.with_image(shot);
        }
        if !notes.is_empty() {
            result = result.with_system(notes.join("; "));
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::registry::MAX_DESCRIPTION;

    #[test]
    fn every_description_fits() {
        let long: Vec<String> = (0..250).map(|i| format!("host{i}.example.org")).collect();
        for policy in [
            None,
            Some(EgressPolicy::Off),
            Some(EgressPolicy::any()),
            Some(EgressPolicy::from_items(&long).unwrap()),
        ] {
            let d = describe(policy.as_ref(), true);
            assert!(d.len() <= MAX_DESCRIPTION, "{}: {d}", d.len());
            assert!(d.contains("web_search(query)"), "{d}");
        }
        assert!(describe(None, true).contains("NO network"));
        assert!(
            describe(Some(&EgressPolicy::parse("a.org").unwrap()), true).contains("now: a.org")
        );
        let without = describe(None, false);
        assert!(!without.contains("web_search"), "{without}");
        assert!(without.contains("screenshot; Downloads"), "{without}");
    }
}
