//! The tool sets, built in one place so the agent, the MCP server, `sandboxd tool` and the
//! benchmarks all hand out the same tools with the same limits.

use std::sync::Arc;
use std::time::Duration;

use super::ask_human::{AskHuman, Asker};
use super::bash::Bash;
use super::browser::extract::Extractor;
use super::browser::{self, BrowserUse, Egress, WithoutSearch};
use super::editor::StrReplaceEditor;
use super::files::{ListDir, ReadFile, WriteFile};
use super::python::Python;
use super::saved::SavedTools;
use super::terminate::Terminate;
use super::view_image::ViewImage;
use super::web::research_tools;
use super::{Tool, ToolRegistry};
use crate::config::{Config, Limits};
use crate::research::Research;
use crate::sandbox::Sandbox;
use crate::sandbox::manager::Session;

/// What a session's tools are built with beyond its sandbox, limits and config.
#[derive(Clone, Default)]
pub struct ToolOptions {
    /// The session's egress: the browser opens the hosts its policy allows (through the
    /// session's proxy). None: egress off, the browser opens only the sandbox's own pages.
    pub egress: Option<Egress>,
}

/// The tools that act inside one sandbox, with their state: bash (its shell lives in the
/// sandbox handle), the python interpreter, the editor's undo history and the browser.
/// Built once per session and shared by all its runs, so what a run leaves in them (python
/// variables, tabs, undo steps) is there for the next run.
#[derive(Clone)]
pub struct SessionTools {
    pub bash: Arc<Bash>,
    pub python: Arc<Python>,
    pub editor: Arc<StrReplaceEditor>,
    pub browser: Arc<BrowserUse>,
    /// What each run's web_search/web_fetch are built from (fresh per registry, so the
    /// per-run quotas are per run), and who their per-user quotas are charged to.
    research: Option<(Arc<dyn Sandbox>, crate::research::ResearchConfig)>,
    owner: String,
    sandbox: Arc<dyn Sandbox>,
    output_cap: usize,
    view_image: Arc<ViewImage>,
}

impl SessionTools {
    pub fn new(sandbox: Arc<dyn Sandbox>, limits: &Limits, config: &Config) -> Self {
        let owner = config.sessions.default_owner.clone();
        Self::build(
            sandbox,
            limits,
            config,
            &owner,
            ToolOptions::default(),
            None,
        )
    }

    /// The tools with `options`, research quotas charged to `owner`; `saved` keeps what a
    /// later process needs (a kept session's editor history and browser).
    fn build(
        sandbox: Arc<dyn Sandbox>,
        limits: &Limits,
        config: &Config,
        owner: &str,
        options: ToolOptions,
        saved: Option<SavedTools>,
    ) -> Self {
        let max_timeout = Duration::from_secs(limits.max_timeout_secs.max(1));
        let default_timeout = Duration::from_secs(config.agent.bash_timeout_secs.max(1));
        let output_cap = limits.output_cap();
        let mut editor = StrReplaceEditor::new(sandbox.clone(), limits.max_file_bytes());
        let mut browser = BrowserUse::new(sandbox.clone());
        if let Some(saved) = saved {
            editor = editor.with_saved(saved.clone());
            browser = browser.with_saved(saved);
        }
        if let Some(egress) = options.egress {
            browser = browser.with_egress(egress);
        }
        // The browser's web_search: the session's own engines and quotas (it outlives runs).
        if config.research.enabled {
            let research = Research::new(&config.research, owner);
            if research.can_search() {
                browser = browser.with_research(research);
            }
        }
        Self {
            bash: Arc::new(Bash::new(
                sandbox.clone(),
                default_timeout,
                max_timeout,
                output_cap,
            )),
            python: Arc::new(Python::new(
                sandbox.clone(),
                default_timeout,
                max_timeout,
                output_cap,
            )),
            editor: Arc::new(editor),
            research: Some((sandbox.clone(), config.research.clone())),
            owner: owner.to_string(),
            output_cap,
            browser: Arc::new(browser),
            view_image: Arc::new(ViewImage::new(
                sandbox.clone(),
                config.llm.takes_images(),
                config.llm.model.clone(),
            )),
            sandbox,
        }
    }

    /// The four as registry entries.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        vec![
            self.bash.clone(),
            self.python.clone(),
            self.editor.clone(),
            self.browser.clone(),
        ]
    }

    /// The agent's registry over these tools: the four, the research tools, view_image,
    /// ask_human with `asker`, terminate.
    pub fn agent_registry(&self, asker: Arc<dyn Asker>) -> ToolRegistry {
        let mut tools = self.tools();
        if let Some((sandbox, research)) = &self.research {
            tools.extend(research_tools(sandbox.clone(), research, &self.owner));
        }
        tools.push(self.view_image.clone());
        tools.push(Arc::new(AskHuman::new(asker)));
        tools.push(Arc::new(Terminate));
        registry_of(tools)
    }
}

/// Fresh sandbox tools (for a handle no session state is kept for) and their browser.
/// `extractor` is the LLM behind browser_use's extract_content (None returns the page text).
pub fn sandbox_tools(
    sandbox: Arc<dyn Sandbox>,
    limits: &Limits,
    config: &Config,
    extractor: Option<Arc<dyn Extractor>>,
) -> (Vec<Arc<dyn Tool>>, Arc<BrowserUse>) {
    let tools = SessionTools::new(sandbox, limits, config);
    tools.browser.set_extractor(extractor);
    (tools.tools(), tools.browser)
}

/// The agent's tools, and its browser (whose state the agent shows the model).
pub struct AgentTools {
    pub registry: ToolRegistry,
    pub browser: Arc<BrowserUse>,
}

impl SessionTools {
    /// `session`'s tools: made on first use, then the same for every run of the session.
    /// A kept session's tools also save what a later sandboxd process needs to carry on
    /// (the browser's endpoint and tabs, the undo history; see saved.rs) and start from what
    /// an earlier one saved. The python interpreter needs nothing: it is found in the sandbox.
    /// The browser's egress is the one `set_egress` left in the session's slots, if any.
    pub fn of(session: &Session, config: &Config) -> Arc<SessionTools> {
        // Read before `of_with`: its options are made under the slots' lock.
        let egress = session.slots.get::<SessionEgress>().map(|e| e.0.clone());
        Self::of_with(session, config, move || ToolOptions { egress })
    }

    /// `session`'s tools, made with `options()` on first use (later calls get the same
    /// tools, whatever their options: the browser's egress is the session's for its life).
    pub fn of_with(
        session: &Session,
        config: &Config,
        options: impl FnOnce() -> ToolOptions,
    ) -> Arc<SessionTools> {
        session.slots.get_or_insert_with(|| {
            let saved = session
                .keep
                .then(|| {
                    SavedTools::new(session.records.clone(), &session.id, session.owner.as_str())
                })
                .flatten();
            Self::build(
                session.sandbox.clone(),
                &session.limits,
                config,
                session.owner.as_str(),
                options(),
                saved,
            )
        })
    }
}

/// A session's egress as its front end runs it (the policy source its proxy reads), kept in
/// the session's slots for the browser built later by `SessionTools::of`.
pub struct SessionEgress(pub Egress);

/// Gives `session`'s browser its egress: serve calls it where it starts the session's proxy
/// (create and attach, before any run), the CLI after it made the session. The first call
/// counts; the source reads the live policy, so later changes need no second call. Tools
/// made before it (none are, on those paths) keep egress off.
pub fn set_egress(session: &Session, egress: Egress) {
    session.slots.get_or_insert_with(|| SessionEgress(egress));
}

/// The agent's tools on `session` (its lasting tools, ask_human and terminate).
pub fn session_tools(session: &Session, config: &Config, asker: Arc<dyn Asker>) -> ToolRegistry {
    SessionTools::of(session, config).agent_registry(asker)
}

/// The agent's tools on any sandbox handle (a lazy one lists them without a container),
/// research quotas charged to `[sessions] default_owner`.
pub fn agent_tools(
    sandbox: Arc<dyn Sandbox>,
    limits: &Limits,
    config: &Config,
    asker: Arc<dyn Asker>,
    extractor: Option<Arc<dyn Extractor>>,
) -> AgentTools {
    let owner = config.sessions.default_owner.clone();
    agent_tools_of(&owner, sandbox, limits, config, asker, extractor)
}

/// The agent's tools, research quotas charged to `owner`.
pub fn agent_tools_of(
    owner: &str,
    sandbox: Arc<dyn Sandbox>,
    limits: &Limits,
    config: &Config,
    asker: Arc<dyn Asker>,
    extractor: Option<Arc<dyn Extractor>>,
) -> AgentTools {
    let (mut tools, browser) = sandbox_tools(sandbox.clone(), limits, config, extractor);
    tools.extend(research_tools(sandbox.clone(), &config.research, owner));
    tools.push(Arc::new(ViewImage::new(
        sandbox,
        config.llm.takes_images(),
        config.llm.model.clone(),
    )));
    tools.push(Arc::new(AskHuman::new(asker)));
    tools.push(Arc::new(Terminate));
    AgentTools {
        registry: registry_of(tools),
        browser,
    }
}

/// What the MCP server offers: the sandbox tools plus plain file access, and the research
/// tools only when `[research] mcp = true`.
pub fn server_tools(sandbox: Arc<dyn Sandbox>, limits: &Limits, config: &Config) -> ToolRegistry {
    registry_of(SessionTools::new(sandbox, limits, config).server_tool_list(config))
}

/// A session's MCP registry, kept in its slots so the research quotas count per session.
struct ServerRegistry(Arc<ToolRegistry>);

impl SessionTools {
    fn server_tool_list(&self, config: &Config) -> Vec<Arc<dyn Tool>> {
        let mut tools = self.tools();
        if config.research.mcp
            && let Some((sandbox, research)) = &self.research
        {
            tools.extend(research_tools(sandbox.clone(), research, &self.owner));
        } else if let Some(browser) = tools.iter_mut().find(|t| t.name() == browser::NAME) {
            // The browser's web_search is the host-side search too: off where research is.
            *browser = Arc::new(WithoutSearch::new(self.browser.clone()));
        }
        let sandbox = self.sandbox.clone();
        tools.push(Arc::new(ReadFile::new(sandbox.clone(), self.output_cap)));
        tools.push(Arc::new(WriteFile::new(sandbox.clone())));
        tools.push(Arc::new(ListDir::new(sandbox)));
        tools
    }

    /// What the MCP server offers on `session`, over the session's own tools (the same
    /// python interpreter, browser and undo history its runs use); made once per session.
    pub fn server_registry(session: &Session, config: &Config) -> Arc<ToolRegistry> {
        let tools = SessionTools::of(session, config);
        session
            .slots
            .get_or_insert_with(|| {
                ServerRegistry(Arc::new(registry_of(tools.server_tool_list(config))))
            })
            .0
            .clone()
    }
}

fn registry_of(tools: Vec<Arc<dyn Tool>>) -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    for tool in tools {
        let name = tool.name().to_string();
        // Our own tools always pass the registry's checks; a failure here is a bug in one.
        if let Err(e) = registry.register(tool) {
            debug_assert!(false, "built-in tool {name} rejected: {e}");
            tracing::error!(tool = %name, error = %e, "a built-in tool was rejected by the registry");
        }
    }
    registry
}
