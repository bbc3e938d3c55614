//! Quotas on searches and fetches: per run (one tool registry: a `sandboxd run`, one MCP
//! session) and per owner over a sliding 24 hours. The per-owner book lives in this
//! process (`UserBook::global`); `serve` can hand in its own book backed by the store.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use std::time::Instant;

use crate::config::ResearchConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Search,
    Fetch,
}

impl Kind {
    fn plural(self) -> &'static str {
        match self {
            Kind::Search => "searches",
            Kind::Fetch => "fetches",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("quota reached: {used} of {limit} {what} {scope}. {fix}")]
pub struct QuotaExceeded {
    pub what: &'static str,
    pub scope: String,
    pub used: u32,
    pub limit: u32,
    pub fix: String,
}

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Per-owner use over the last 24 hours. Each owner keeps at most `limit` timestamps per
/// kind, so the book is bounded by the number of owners times the configured limits.
#[derive(Default)]
pub struct UserBook {
    used: Mutex<HashMap<(String, Kind), VecDeque<Instant>>>,
}

impl UserBook {
    /// The book of this process.
    pub fn global() -> Arc<UserBook> {
        static BOOK: OnceLock<Arc<UserBook>> = OnceLock::new();
        BOOK.get_or_init(|| Arc::new(UserBook::default())).clone()
    }

    /// `now` is a parameter so the sliding window is tested without waiting a day.
    fn take(&self, owner: &str, kind: Kind, limit: u32, now: Instant) -> Result<(), QuotaExceeded> {
        let Ok(mut map) = self.used.lock() else {
            return Ok(());
        };
        let q = map.entry((owner.to_string(), kind)).or_default();
        while q.front().is_some_and(|t| now.duration_since(*t) >= DAY) {
            q.pop_front();
        }
        if q.len() as u32 >= limit {
            let wait = q
                .front()
                .map(|t| DAY.saturating_sub(now.duration_since(*t)))
                .unwrap_or_default();
            return Err(QuotaExceeded {
                what: kind.plural(),
                scope: format!("for {owner} in 24 hours"),
                used: q.len() as u32,
                limit,
                fix: format!(
                    "the next one is possible in {} min; the admin can raise [research] {}_per_user_per_day",
                    wait.as_secs().div_ceil(60),
                    kind.plural()
                ),
            });
        }
        q.push_back(now);
        Ok(())
    }
}

/// The quotas one set of research tools draws on.
pub struct Quotas {
    owner: String,
    book: Arc<UserBook>,
    searches: AtomicU32,
    fetches: AtomicU32,
    limits: [(u32, u32); 2],
}

impl Quotas {
    pub fn new(config: &ResearchConfig, owner: &str, book: Arc<UserBook>) -> Self {
        Self {
            owner: owner.to_string(),
            book,
            searches: AtomicU32::new(0),
            fetches: AtomicU32::new(0),
            limits: [
                (config.searches_per_run, config.searches_per_user_per_day),
                (config.fetches_per_run, config.fetches_per_user_per_day),
            ],
        }
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Takes one unit of `kind`, or says which quota is spent.
    pub fn take(&self, kind: Kind) -> Result<(), QuotaExceeded> {
        self.take_at(kind, Instant::now())
    }

    fn take_at(&self, kind: Kind, now: Instant) -> Result<(), QuotaExceeded> {
        let (counter, (per_run, per_user)) = match kind {
            Kind::Search => (&self.searches, self.limits[0]),
            Kind::Fetch => (&self.fetches, self.limits[1]),
        };
        let used = counter.load(Ordering::SeqCst);
        if used >= per_run {
            return Err(QuotaExceeded {
                what: kind.plural(),
                scope: "in this run".into(),
                used,
                limit: per_run,
                fix: format!(
                    "work with what is in /workspace/research; the admin can raise [research] {}_per_run",
                    kind.plural()
                ),
            });
        }
        self.book.take(&self.owner, kind, per_user, now)?;
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(per_run: u32, per_user: u32) -> ResearchConfig {
        ResearchConfig {
            fetches_per_run: per_run,
            fetches_per_user_per_day: per_user,
            ..ResearchConfig::default()
        }
    }

    #[test]
    fn a_run_stops_at_its_quota() {
        let q = Quotas::new(&config(2, 100), "alice", Arc::new(UserBook::default()));
        q.take(Kind::Fetch).unwrap();
        q.take(Kind::Fetch).unwrap();
        let e = q.take(Kind::Fetch).unwrap_err();
        assert!(e.to_string().contains("fetches_per_run"), "{e}");
        q.take(Kind::Search).unwrap();
    }

    #[test]
    fn an_owner_is_limited_across_runs_for_a_day() {
        let book = Arc::new(UserBook::default());
        let c = config(100, 3);
        let t0 = Instant::now();
        let first = Quotas::new(&c, "alice", book.clone());
        for _ in 0..2 {
            first.take_at(Kind::Fetch, t0).unwrap();
        }
        let second = Quotas::new(&c, "alice", book.clone());
        second
            .take_at(Kind::Fetch, t0 + Duration::from_secs(60))
            .unwrap();
        let e = second
            .take_at(Kind::Fetch, t0 + Duration::from_secs(3600))
            .unwrap_err();
        assert!(e.to_string().contains("for alice in 24 hours"), "{e}");
        assert!(e.to_string().contains("in 1380 min"), "{e}");
        // Another owner is not affected.
        Quotas::new(&c, "bob", book.clone())
            .take_at(Kind::Fetch, t0)
            .unwrap();
        // A day after the first two, two units are free again, not three.
        let later = t0 + DAY + Duration::from_secs(1);
        second.take_at(Kind::Fetch, later).unwrap();
        second.take_at(Kind::Fetch, later).unwrap();
        assert!(second.take_at(Kind::Fetch, later).is_err());
    }
}
