//! planning: OpenManus's plan tool (create, update, list, get, set_active, mark_step,
//! delete) over the session's [`PlanBook`].
//!
//! Two differences from upstream, both on purpose: plan ids are assigned by sandboxd (a
//! `plan_id` sent with `create` is ignored and said so; any other command naming an id the
//! session does not hold gets an error observation), and inside a plan step the tool is
//! scoped to that step, so an executor can read the plan and add notes to its own step but
//! cannot rewrite the plan or mark other steps done (upstream's executors tended to do, and
//! claim, the whole plan in step 0).

pub mod book;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

pub use book::{Plan, PlanBook, PlanError, PlanStep, StepStatus};

use super::{Tool, ToolContext, ToolError, ToolResult, arg_str};

pub const NAME: &str = "planning";

/// What the tool may do.
#[derive(Debug, Clone, PartialEq)]
pub enum Scope {
    /// Every command (the planner; a user's own use).
    Full,
    /// One step of one plan being run: get/list, and mark_step on that step only.
    Step { plan_id: String, index: usize },
}

pub struct PlanningTool {
    book: Arc<PlanBook>,
    scope: Scope,
}

impl PlanningTool {
    pub fn new(book: Arc<PlanBook>) -> Self {
        Self {
            book,
            scope: Scope::Full,
        }
    }

    pub fn for_step(book: Arc<PlanBook>, plan_id: &str, index: usize) -> Self {
        Self {
            book,
            scope: Scope::Step {
                plan_id: plan_id.to_string(),
                index,
            },
        }
    }

    async fn run(&self, args: &Value) -> Result<String, String> {
        let command = arg_str(args, "command").unwrap_or_default();
        let plan_id = arg_str(args, "plan_id");
        if let Scope::Step {
            plan_id: own,
            index,
        } = &self.scope
            && let Err(why) = self
                .check_step_scope(command, plan_id, own, *index, args)
                .await
        {
            return Err(why);
        }
        let e = |e: PlanError| e.to_string();
        match command {
            "create" => self.create(args, plan_id).await,
            "update" => {
                let steps = string_list(args)?;
                let title = arg_str(args, "title");
                if steps.is_none() && title.is_none() {
                    return Err("update needs a new title, new steps, or both".into());
                }
                let plan = self
                    .book
                    .update(plan_id, title, steps.as_deref())
                    .await
                    .map_err(e)?;
                Ok(format!("Plan updated: {}\n\n{}", plan.id, plan.render()))
            }
            "list" => Ok(self.list().await),
            "get" => Ok(self.book.get(plan_id).await.map_err(e)?.render()),
            "set_active" => {
                let id = plan_id.ok_or("set_active needs plan_id")?;
                let plan = self.book.set_active(id).await.map_err(e)?;
                Ok(format!("Plan {} is now the active plan.", plan.id))
            }
            "mark_step" => self.mark_step(args, plan_id).await,
            "delete" => {
                let id = plan_id.ok_or("delete needs plan_id")?;
                self.book.delete(id).await.map_err(e)?;
                Ok(format!("Plan {} deleted.", book::clean_line(id, 80)))
            }
            other => Err(format!(
                "unknown command {other:?}; use create, update, list, get, set_active, mark_step or delete"
            )),
        }
    }

    /// create: a new plan, its id assigned here (a `plan_id` sent along is ignored, and said so).
    async fn create(&self, args: &Value, plan_id: Option<&str>) -> Result<String, String> {
        let title = arg_str(args, "title").ok_or("create needs a title (a string)")?;
        let steps = string_list(args)?.ok_or("create needs steps (a list of strings)")?;
        let plan = self
            .book
            .create(title, &steps)
            .await
            .map_err(|e| e.to_string())?;
        let mut out = format!(
            "Plan created with ID: {} (ids are assigned by sandboxd)\n\n{}",
            plan.id,
            plan.render()
        );
        if let Some(asked) = plan_id {
            out.push_str(&format!(
                "\nNote: the plan_id {:?} you sent was ignored; use {}.",
                book::clean_line(asked, 80),
                plan.id
            ));
        }
        Ok(out)
    }

    /// list: every plan of the session, the active one marked, with its progress.
    async fn list(&self) -> String {
        let (plans, active) = self.book.list().await;
        if plans.is_empty() {
            return "No plans in this session. Create one with command create.".into();
        }
        let mut out = String::from("Plans in this session:\n");
        for p in plans {
            let tag = if active.as_deref() == Some(p.id.as_str()) {
                " (active)"
            } else {
                ""
            };
            out.push_str(&format!(
                "• {}{tag}: {} — {}/{} steps completed\n",
                p.id,
                p.title,
                p.count(StepStatus::Completed),
                p.steps.len()
            ));
        }
        out
    }

    /// mark_step: the status and notes of a step; inside a step, only the notes count.
    async fn mark_step(&self, args: &Value, plan_id: Option<&str>) -> Result<String, String> {
        let index = step_index(args)?;
        let status = match arg_str(args, "step_status") {
            Some(s) => Some(StepStatus::parse(s).ok_or("unknown step_status")?),
            None => None,
        };
        let notes = arg_str(args, "step_notes");
        // Inside a step the flow sets the status from how the run ends; the model's
        // notes are kept.
        let status = match self.scope {
            Scope::Full => status,
            Scope::Step { .. } => None,
        };
        let plan = self
            .book
            .mark_step(plan_id, index, status, notes)
            .await
            .map_err(|e| e.to_string())?;
        let now = plan
            .steps
            .get(index)
            .map(|s| s.status.as_str())
            .unwrap_or("unknown");
        let mut out = format!("Step {index} (0-based) of plan {} is {now}.", plan.id);
        if matches!(self.scope, Scope::Step { .. }) {
            out.push_str(
                " Your notes are recorded; sandboxd sets the status from how this step ends (terminate success or failure).",
            );
        }
        Ok(out)
    }

    async fn check_step_scope(
        &self,
        command: &str,
        plan_id: Option<&str>,
        own: &str,
        index: usize,
        args: &Value,
    ) -> Result<(), String> {
        match command {
            "get" | "list" => Ok(()),
            "mark_step" => {
                if let Some(id) = plan_id
                    && id != own
                {
                    // Named as an unknown id when the session has no such plan at all.
                    self.book.get(Some(id)).await.map_err(|e| e.to_string())?;
                    return Err(format!(
                        "this step belongs to plan {own}; you can only mark step {index} (0-based) of it"
                    ));
                }
                match step_index(args) {
                    Ok(i) if i == index => Ok(()),
                    Ok(i) => Err(format!(
                        "you are running step {index} (0-based) of plan {own}; step {i} is run separately, so it cannot be marked now"
                    )),
                    Err(e) => Err(e),
                }
            }
            _ => Err(format!(
                "while sandboxd runs step {index} (0-based) of plan {own}, the plan is changed only by the flow; use get or list to read it, mark_step with step_notes on step {index}, and terminate when the step is done"
            )),
        }
    }
}

fn string_list(args: &Value) -> Result<Option<Vec<String>>, String> {
    let Some(v) = args.get("steps").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let items = v.as_array().ok_or("steps must be a list of strings")?;
    items
        .iter()
        .map(|s| {
            s.as_str()
                .map(String::from)
                .ok_or_else(|| "every step must be a string".to_string())
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn step_index(args: &Value) -> Result<usize, String> {
    let v = args
        .get("step_index")
        .ok_or("mark_step needs step_index (0-based)")?;
    v.as_u64()
        .and_then(|i| usize::try_from(i).ok())
        .ok_or_else(|| "step_index must be a whole number ≥ 0 (0-based)".to_string())
}

#[async_trait]
impl Tool for PlanningTool {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "Create and track a plan for a complex task. Commands: create (title, steps), update \
         (plan_id, title and/or steps; unchanged steps keep their status and notes), list, get \
         (plan_id or the active plan), set_active (plan_id), mark_step (step_index 0-based, \
         step_status, step_notes), delete (plan_id). Plan ids are assigned by sandboxd when a \
         plan is created; use the id it returns."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "enum": ["create", "update", "list", "get", "set_active", "mark_step", "delete"], "description": "The operation."},
                "plan_id": {"type": "string", "description": "A plan id sandboxd returned. Omit it to use the active plan; not accepted by create."},
                "title": {"type": "string", "description": "The plan's title (create, update)."},
                "steps": {"type": "array", "items": {"type": "string"}, "description": "The steps in order, each a short imperative sentence (create, update)."},
                "step_index": {"type": "integer", "description": "0-based index of the step (mark_step)."},
                "step_status": {"type": "string", "enum": ["not_started", "in_progress", "completed", "blocked"], "description": "The step's new status (mark_step)."},
                "step_notes": {"type": "string", "description": "Notes on the step: what was done, what it produced (mark_step)."}
            },
            "required": ["command"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<ToolResult, ToolError> {
        Ok(match self.run(&args).await {
            Ok(out) => ToolResult::ok(out),
            Err(why) => ToolResult::error(why),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolRegistry;

    async fn call(reg: &ToolRegistry, args: Value) -> ToolResult {
        reg.execute(NAME, &args.to_string(), &ToolContext::default())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn create_assigns_the_id_and_unknown_keys_are_refused() {
        let book = Arc::new(PlanBook::new(10));
        let mut reg = ToolRegistry::new();
        reg.register(Arc::new(PlanningTool::new(book.clone())))
            .unwrap();
        let r = call(
            &reg,
            json!({"command": "create", "plan_id": "mine", "title": "T", "steps": ["a", "b"]}),
        )
        .await;
        assert!(!r.is_error(), "{r:?}");
        assert!(r.output.contains("plan-1") && r.output.contains("\"mine\" you sent was ignored"));
        assert!(book.get(Some("mine")).await.is_err());
        let r = call(&reg, json!({"command": "get", "bogus": 1})).await;
        assert!(r.render().contains("unknown parameter \"bogus\""), "{r:?}");
        let r = call(
            &reg,
            json!({"command": "mark_step", "plan_id": "plan_42", "step_index": 0, "step_status": "completed"}),
        )
        .await;
        assert!(r.render().contains("no plan with id \"plan_42\""), "{r:?}");
        let r = call(
            &reg,
            json!({"command": "create", "title": "T", "steps": [1]}),
        )
        .await;
        assert!(r.is_error());
    }

    #[tokio::test]
    async fn a_step_scope_reads_the_plan_and_notes_its_own_step_only() {
        let book = Arc::new(PlanBook::new(10));
        let plan = book.create("T", &["a".into(), "b".into()]).await.unwrap();
        let mut reg = ToolRegistry::new();
        reg.register(Arc::new(PlanningTool::for_step(book.clone(), &plan.id, 1)))
            .unwrap();
        assert!(!call(&reg, json!({"command": "get"})).await.is_error());
        for bad in [
            json!({"command": "create", "title": "x", "steps": ["y"]}),
            json!({"command": "update", "steps": ["y"]}),
            json!({"command": "delete", "plan_id": plan.id}),
            json!({"command": "mark_step", "step_index": 0, "step_status": "completed"}),
        ] {
            assert!(call(&reg, bad.clone()).await.is_error(), "{bad}");
        }
        let r = call(
            &reg,
            json!({"command": "mark_step", "plan_id": "plan-77", "step_index": 1}),
        )
        .await;
        assert!(r.render().contains("no plan with id \"plan-77\""), "{r:?}");
        let r = call(
            &reg,
            json!({"command": "mark_step", "step_index": 1, "step_status": "completed", "step_notes": "half"}),
        )
        .await;
        assert!(!r.is_error(), "{r:?}");
        let p = book.get(None).await.unwrap();
        assert_eq!(
            p.steps[1].status,
            StepStatus::NotStarted,
            "the flow decides"
        );
        assert_eq!(p.steps[1].notes, "half");
    }
}
