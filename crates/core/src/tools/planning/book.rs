//! The plans of one session: a small, bounded book keyed by ids that sandboxd assigns.
//!
//! OpenManus keeps every plan in one process-wide dict keyed by an id the model (or the
//! flow's clock) chooses. Here a book belongs to one session, ids come from the book's own
//! counter, and everything a plan holds (titles, steps, notes) is model text: it is
//! cleaned of control characters and cut to fixed sizes before it is stored.
//!
//! A kept session's book is also saved on the host after every change (`tools::saved`, kind
//! `plans`) and read back by the next process that uses the session, so plans, their
//! statuses and the id counter survive a `run --session` in a new process or a `serve`
//! restart: a plan id is never handed out twice in one session. The saved book is read on
//! the book's first use, and every change is saved before the book's lock is let go.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, MutexGuard};

use crate::tools::saved::SavedTools;

/// The kind of a kept session's saved book (`<id>.plans.json`).
const RECORD: &str = "plans";

/// Most plans one session keeps at once.
pub const MAX_PLANS: usize = 16;
pub use crate::config::MAX_STEPS_CEILING;
const MAX_TITLE: usize = 200;
const MAX_STEP_TEXT: usize = 500;
const MAX_NOTES: usize = 2000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    NotStarted,
    InProgress,
    Completed,
    Blocked,
}

impl StepStatus {
    pub fn parse(s: &str) -> Option<StepStatus> {
        Some(match s {
            "not_started" => StepStatus::NotStarted,
            "in_progress" => StepStatus::InProgress,
            "completed" => StepStatus::Completed,
            "blocked" => StepStatus::Blocked,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::NotStarted => "not_started",
            StepStatus::InProgress => "in_progress",
            StepStatus::Completed => "completed",
            StepStatus::Blocked => "blocked",
        }
    }

    /// The checklist mark: ✓ done, ▶ running, ✗ blocked, · not started.
    pub fn mark(self) -> &'static str {
        match self {
            StepStatus::NotStarted => "·",
            StepStatus::InProgress => "▶",
            StepStatus::Completed => "✓",
            StepStatus::Blocked => "✗",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStep {
    pub text: String,
    pub status: StepStatus,
    /// What the step produced or why it is blocked (empty until then).
    pub notes: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Assigned by the book ("plan-1", "plan-2", …), never by the model.
    pub id: String,
    pub title: String,
    pub steps: Vec<PlanStep>,
}

impl Plan {
    pub fn count(&self, status: StepStatus) -> usize {
        self.steps.iter().filter(|s| s.status == status).count()
    }

    /// The plan as the model reads it (OpenManus's layout, numbered from 1 for people).
    pub fn render(&self) -> String {
        let n = self.steps.len();
        let done = self.count(StepStatus::Completed);
        let pct = (done * 100).checked_div(n).unwrap_or(0);
        let mut out = format!(
            "Plan: {} (ID: {})\nProgress: {done}/{n} steps completed ({pct}%)\nStatus: {done} completed, {} in progress, {} blocked, {} not started\nSteps:\n",
            self.title,
            self.id,
            self.count(StepStatus::InProgress),
            self.count(StepStatus::Blocked),
            self.count(StepStatus::NotStarted),
        );
        for (i, s) in self.steps.iter().enumerate() {
            let mark = match s.status {
                StepStatus::NotStarted => "[ ]",
                StepStatus::InProgress => "[→]",
                StepStatus::Completed => "[✓]",
                StepStatus::Blocked => "[!]",
            };
            out.push_str(&format!("{}. {mark} {}\n", i + 1, s.text));
            if !s.notes.is_empty() {
                out.push_str(&format!("   Notes: {}\n", s.notes));
            }
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("there is no plan with id {id:?} in this session; {known}")]
    NoPlan { id: String, known: String },
    #[error("there is no active plan; create one first or pass plan_id")]
    NoActive,
    #[error("step_index {index} is out of range: the plan has steps 0 to {last} (0-based)")]
    BadStep { index: usize, last: usize },
    #[error("{0}")]
    Invalid(String),
    #[error(
        "this session already holds {MAX_PLANS} plans; delete one (command delete) before creating another"
    )]
    Full,
}

#[derive(Default, Serialize, Deserialize)]
struct Inner {
    plans: Vec<Plan>,
    active: Option<String>,
    next_id: u64,
}

/// The plans of one session.
pub struct PlanBook {
    inner: Mutex<Inner>,
    /// Most steps a plan may have (config [flow] max_plan_steps, capped).
    max_steps: usize,
    /// Where a kept session's book is saved after every change; None: it lives in memory.
    saved: Option<SavedTools>,
    /// Whether the saved book was read (on first use, under the lock).
    restored: AtomicBool,
}

impl PlanBook {
    pub fn new(max_steps: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            max_steps: max_steps.clamp(1, MAX_STEPS_CEILING),
            saved: None,
            restored: AtomicBool::new(false),
        }
    }

    /// A book saved in `saved` after every change, starting from what an earlier process
    /// saved there (read on first use; a missing, unreadable or foreign record starts empty).
    pub fn with_saved(max_steps: usize, saved: SavedTools) -> Self {
        Self {
            saved: Some(saved),
            ..Self::new(max_steps)
        }
    }

    /// `session`'s plans: made on first use, then the same for every run and flow of the
    /// session (plans live with the session, not in a process-wide table). A kept session's
    /// book is saved in the session's records and carries on from what an earlier process
    /// saved.
    pub fn of(session: &crate::sandbox::manager::Session, max_steps: usize) -> Arc<PlanBook> {
        session.slots.get_or_insert_with(|| {
            let saved = session
                .keep
                .then(|| {
                    SavedTools::new(session.records.clone(), &session.id, session.owner.as_str())
                })
                .flatten();
            match saved {
                Some(saved) => PlanBook::with_saved(max_steps, saved),
                None => PlanBook::new(max_steps),
            }
        })
    }

    pub fn max_steps(&self) -> usize {
        self.max_steps
    }

    /// The book, locked; a kept session's is first read from its record, once.
    async fn lock(&self) -> MutexGuard<'_, Inner> {
        let mut guard = self.inner.lock().await;
        if let Some(saved) = &self.saved
            && !self.restored.swap(true, Ordering::AcqRel)
            && let Some(read) = saved.load::<Inner>(RECORD).await
        {
            *guard = read.checked();
        }
        guard
    }

    async fn with<T>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<T, PlanError>,
    ) -> Result<T, PlanError> {
        f(&mut *self.lock().await)
    }

    /// `with` for a change: a kept session's book is saved once the change is made. Saving
    /// under the lock keeps the record in the order of the changes; a book is a few KiB.
    async fn change<T>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<T, PlanError>,
    ) -> Result<T, PlanError> {
        let mut guard = self.lock().await;
        let out = f(&mut guard)?;
        if let Some(saved) = &self.saved {
            saved.save(RECORD, &*guard).await;
        }
        Ok(out)
    }

    /// A new plan, made the active one; returns it with its assigned id.
    pub async fn create(&self, title: &str, steps: &[String]) -> Result<Plan, PlanError> {
        let title = clean_title(title)?;
        let steps = self.clean_steps(steps)?;
        self.change(|b| {
            if b.plans.len() >= MAX_PLANS {
                return Err(PlanError::Full);
            }
            b.next_id += 1;
            let plan = Plan {
                id: format!("plan-{}", b.next_id),
                title,
                steps: steps
                    .into_iter()
                    .map(|text| PlanStep {
                        text,
                        status: StepStatus::NotStarted,
                        notes: String::new(),
                    })
                    .collect(),
            };
            b.active = Some(plan.id.clone());
            b.plans.push(plan.clone());
            Ok(plan)
        })
        .await
    }

    /// New title and/or steps; a step whose text is unchanged at the same index keeps its
    /// status and notes (OpenManus's rule), every other step starts over.
    pub async fn update(
        &self,
        id: Option<&str>,
        title: Option<&str>,
        steps: Option<&[String]>,
    ) -> Result<Plan, PlanError> {
        let title = title.map(clean_title).transpose()?;
        let steps = steps.map(|s| self.clean_steps(s)).transpose()?;
        self.change(|b| {
            let plan = find_mut(b, id)?;
            if let Some(t) = title {
                plan.title = t;
            }
            if let Some(new) = steps {
                let old = std::mem::take(&mut plan.steps);
                plan.steps = new
                    .into_iter()
                    .enumerate()
                    .map(|(i, text)| match old.get(i) {
                        Some(o) if o.text == text => o.clone(),
                        _ => PlanStep {
                            text,
                            status: StepStatus::NotStarted,
                            notes: String::new(),
                        },
                    })
                    .collect();
            }
            Ok(plan.clone())
        })
        .await
    }

    /// A plan by id, or the active one.
    pub async fn get(&self, id: Option<&str>) -> Result<Plan, PlanError> {
        self.with(|b| find_mut(b, id).map(|p| p.clone())).await
    }

    /// Every plan, and the active plan's id.
    pub async fn list(&self) -> (Vec<Plan>, Option<String>) {
        self.with(|b| Ok((b.plans.clone(), b.active.clone())))
            .await
            .unwrap_or_default()
    }

    pub async fn set_active(&self, id: &str) -> Result<Plan, PlanError> {
        self.change(|b| {
            let plan = find_mut(b, Some(id))?.clone();
            b.active = Some(plan.id.clone());
            Ok(plan)
        })
        .await
    }

    /// Sets a step's status and/or notes (0-based index).
    pub async fn mark_step(
        &self,
        id: Option<&str>,
        index: usize,
        status: Option<StepStatus>,
        notes: Option<&str>,
    ) -> Result<Plan, PlanError> {
        self.change(|b| {
            let plan = find_mut(b, id)?;
            let last = plan.steps.len().saturating_sub(1);
            let step = plan
                .steps
                .get_mut(index)
                .ok_or(PlanError::BadStep { index, last })?;
            if let Some(s) = status {
                step.status = s;
            }
            if let Some(n) = notes {
                step.notes = clean_line(n, MAX_NOTES);
            }
            Ok(plan.clone())
        })
        .await
    }

    pub async fn delete(&self, id: &str) -> Result<(), PlanError> {
        self.change(|b| {
            let id = find_mut(b, Some(id))?.id.clone();
            b.plans.retain(|p| p.id != id);
            if b.active.as_deref() == Some(id.as_str()) {
                b.active = None;
            }
            Ok(())
        })
        .await
    }

    fn clean_steps(&self, steps: &[String]) -> Result<Vec<String>, PlanError> {
        if steps.is_empty() {
            return Err(PlanError::Invalid(
                "steps must be a non-empty list of strings".into(),
            ));
        }
        if steps.len() > self.max_steps {
            return Err(PlanError::Invalid(format!(
                "a plan may have at most {} steps; this one has {}: merge some",
                self.max_steps,
                steps.len()
            )));
        }
        steps
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let text = clean_line(s, MAX_STEP_TEXT);
                if text.is_empty() {
                    Err(PlanError::Invalid(format!("step {i} (0-based) is empty")))
                } else {
                    Ok(text)
                }
            })
            .collect()
    }
}

impl Inner {
    /// A book read back from the host, made to hold this book's rules whatever the file
    /// says: at most MAX_PLANS plans, an active id that names one of them, and a counter past
    /// every id in it, so no id is given out twice.
    fn checked(mut self) -> Inner {
        self.plans.truncate(MAX_PLANS);
        if let Some(active) = &self.active
            && !self.plans.iter().any(|p| &p.id == active)
        {
            self.active = None;
        }
        let highest = self
            .plans
            .iter()
            .filter_map(|p| p.id.strip_prefix("plan-")?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        self.next_id = self.next_id.max(highest);
        self
    }
}

fn find_mut<'a>(b: &'a mut Inner, id: Option<&str>) -> Result<&'a mut Plan, PlanError> {
    let id = match id {
        Some(id) => id.to_string(),
        None => b.active.clone().ok_or(PlanError::NoActive)?,
    };
    let known = if b.plans.is_empty() {
        "this session has no plans".to_string()
    } else {
        let ids: Vec<&str> = b.plans.iter().map(|p| p.id.as_str()).collect();
        format!("its plans are: {}", ids.join(", "))
    };
    b.plans
        .iter_mut()
        .find(|p| p.id == id)
        .ok_or(PlanError::NoPlan {
            id: clean_line(&id, 80),
            known,
        })
}

fn clean_title(title: &str) -> Result<String, PlanError> {
    let t = clean_line(title, MAX_TITLE);
    if t.is_empty() {
        return Err(PlanError::Invalid(
            "title must be a non-empty string".into(),
        ));
    }
    Ok(t)
}

/// One line of at most `max` characters: control characters (newlines, escapes) become
/// spaces, runs of whitespace collapse, the ends are trimmed.
pub fn clean_line(text: &str, max: usize) -> String {
    let mut out = String::new();
    let mut space = false;
    for c in text.chars() {
        if c.is_control() || c.is_whitespace() {
            space = !out.is_empty();
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        out.push(c);
    }
    match out.char_indices().nth(max) {
        Some((at, _)) => {
            out.truncate(at);
            out.push('…');
            out
        }
        None => out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn ids_are_assigned_and_unknown_ids_are_refused() {
        let b = PlanBook::new(10);
        let p = b.create("T", &steps(&["a", "b"])).await.unwrap();
        assert_eq!(p.id, "plan-1");
        assert_eq!(b.create("U", &steps(&["c"])).await.unwrap().id, "plan-2");
        let e = b
            .mark_step(Some("plan_invented"), 0, None, None)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("plan-1, plan-2"), "{e}");
        assert!(matches!(
            b.mark_step(None, 5, None, None).await,
            Err(PlanError::BadStep { index: 5, last: 0 })
        ));
    }

    #[tokio::test]
    async fn a_saved_book_carries_on_in_a_later_process_and_a_foreign_one_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let records: std::sync::Arc<dyn crate::sandbox::records::SessionRecords> =
            std::sync::Arc::new(crate::sandbox::records::FileRecords::new(dir.path()));
        let saved = || SavedTools::new(records.clone(), "sess-1", "alice").unwrap();
        let first = PlanBook::with_saved(10, saved());
        first.create("T", &steps(&["a", "b"])).await.unwrap();
        first
            .mark_step(None, 0, Some(StepStatus::Completed), Some("done a"))
            .await
            .unwrap();
        first.create("U", &steps(&["c"])).await.unwrap();
        first.delete("plan-2").await.unwrap();

        let later = PlanBook::with_saved(10, saved());
        let (plans, active) = later.list().await;
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].steps[0].status, StepStatus::Completed);
        assert_eq!(plans[0].steps[0].notes, "done a");
        assert_eq!(active, None, "the active plan was deleted");
        // The counter carries on: plan-2 was handed out once already.
        assert_eq!(
            later.create("V", &steps(&["d"])).await.unwrap().id,
            "plan-3"
        );

        // Another owner naming the same session id starts empty.
        let other = SavedTools::new(records.clone(), "sess-1", "mallory").unwrap();
        assert!(PlanBook::with_saved(10, other).list().await.0.is_empty());
    }

    #[test]
    fn a_book_read_back_keeps_the_rules_whatever_the_file_says() {
        let plan = |id: &str| Plan {
            id: id.into(),
            title: "T".into(),
            steps: Vec::new(),
        };
        let read = Inner {
            plans: (1..=MAX_PLANS + 3)
                .map(|i| plan(&format!("plan-{i}")))
                .collect(),
            active: Some("plan-404".into()),
            next_id: 2,
        }
        .checked();
        assert_eq!(read.plans.len(), MAX_PLANS);
        assert_eq!(read.active, None);
        assert_eq!(read.next_id, MAX_PLANS as u64);
    }

    #[tokio::test]
    async fn update_keeps_unchanged_steps_only() {
        let b = PlanBook::new(10);
        b.create("T", &steps(&["a", "b", "c"])).await.unwrap();
        b.mark_step(None, 0, Some(StepStatus::Completed), Some("did a"))
            .await
            .unwrap();
        b.mark_step(None, 1, Some(StepStatus::Blocked), Some("no"))
            .await
            .unwrap();
        let p = b
            .update(None, None, Some(&steps(&["a", "b2", "c"])))
            .await
            .unwrap();
        assert_eq!(p.steps[0].status, StepStatus::Completed);
        assert_eq!(p.steps[0].notes, "did a");
        assert_eq!(p.steps[1].status, StepStatus::NotStarted);
        assert!(p.render().contains("1. [✓] a\n   Notes: did a"));
    }

    #[tokio::test]
    async fn hostile_text_is_cleaned_and_bounded() {
        let b = PlanBook::new(3);
        let p = b
            .create("x\u{1b}]0;owned\u{7}\ny", &steps(&["  one\r\ntwo  "]))
            .await
            .unwrap();
        assert_eq!(p.title, "x ]0;owned y");
        assert_eq!(p.steps[0].text, "one two");
        assert!(b.create("T", &steps(&["a", "b", "c", "d"])).await.is_err());
        assert!(b.create(" ", &steps(&["a"])).await.is_err());
        assert!(b.create("T", &steps(&["a", "\n"])).await.is_err());
        assert_eq!(clean_line(&"é".repeat(10), 4), "éééé…");
        for _ in 1..MAX_PLANS {
            b.create("T", &steps(&["a"])).await.unwrap();
        }
        assert_eq!(b.create("T", &steps(&["a"])).await, Err(PlanError::Full));
    }
}
