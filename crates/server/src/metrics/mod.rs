//! `/metrics`: this replica's measurements in the Prometheus text format (0.0.4; OpenMetrics
//! when the scraper asks for it), through the Prometheus project's `prometheus-client`.
//!
//! Where each number comes from: the core's seam (`sandboxd_core::metrics`: session creates,
//! tool calls, LLM requests), this crate's own points (HTTP requests by matched route,
//! the sync exec, runs' endings, egress records, store calls), and at scrape time the
//! manager's census (sessions and the warm pool) and /proc (`process`). `http` has the
//! request counter layer, the admin-only route and the separate unauthenticated listener.
//!
//! Every label value is bounded: a route is the matched route template or `unmatched`,
//! never the raw path; a method one of the standard ones or `other`; a tool a built-in name
//! or `mcp`; a model the configured one. README "Metrics" documents each metric.

pub mod http;
mod process;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sandboxd_core::metrics::{Census, Claim, LlmCall, Recorder};

macro_rules! labels {
    ($name:ident { $($field:ident : $ty:ty),* }) => {
        #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
        struct $name { $($field: $ty),* }
    };
}
labels!(Sessions { state: &'static str, backend: String });
labels!(Creates { claim: &'static str });
labels!(Tool { tool: String, outcome: &'static str });
labels!(Outcome { outcome: &'static str });
labels!(Model { model: String });
labels!(ModelOutcome { model: String, outcome: &'static str });
labels!(Tokens { model: String, kind: &'static str });
labels!(Decision { decision: &'static str });
labels!(Direction { direction: &'static str });
labels!(Route { method: &'static str, route: String, status: u16 });
labels!(RouteTime { method: &'static str, route: String });
labels!(StoreOp { op: &'static str });

type Hist<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latency buckets from 1 ms to about 66 s (doubling).
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn hist<L: Clone + std::hash::Hash + Eq>() -> Hist<L> {
    Family::new_with_constructor(seconds as fn() -> Histogram)
}

/// The registry and every metric family of this process.
pub struct Metrics {
    registry: Registry,
    backend: String,
    sessions: Family<Sessions, Gauge>,
    pool_target: Gauge,
    creates: Family<Creates, Counter>,
    create_seconds: Hist<Creates>,
    exec_seconds: Histogram,
    tool_seconds: Hist<Tool>,
    runs: Family<Outcome, Counter>,
    llm_requests: Family<ModelOutcome, Counter>,
    llm_tokens: Family<Tokens, Counter>,
    llm_seconds: Hist<Model>,
    egress_connections: Family<Decision, Counter>,
    egress_bytes: Family<Direction, Counter>,
    http_requests: Family<Route, Counter>,
    http_seconds: Hist<RouteTime>,
    store_seconds: Hist<StoreOp>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Every family registered under the `sandboxd_` prefix (the process ones under
    /// `process_`, as Prometheus' clients name them); `backend` labels the session gauges.
    pub fn new(backend: &str, pool_size: usize) -> Arc<Metrics> {
        let mut root = Registry::default();
        root.register_collector(Box::new(process::Process));
        let mut m = Metrics {
            registry: Registry::default(),
            backend: backend.to_string(),
            sessions: Family::default(),
            pool_target: Gauge::default(),
            creates: Family::default(),
            create_seconds: hist(),
            exec_seconds: seconds(),
            tool_seconds: hist(),
            runs: Family::default(),
            llm_requests: Family::default(),
            llm_tokens: Family::default(),
            llm_seconds: hist(),
            egress_connections: Family::default(),
            egress_bytes: Family::default(),
            http_requests: Family::default(),
            http_seconds: hist(),
            store_seconds: hist(),
        };
        m.pool_target.set(pool_size as i64);
        let r = root.sub_registry_with_prefix("sandboxd");
        m.register_all(r);
        m.registry = root;
        Arc::new(m)
    }

    fn register_all(&self, r: &mut Registry) {
        r.register("sessions", "Sessions this replica holds, by state (live: usable; starting: being created) and backend", self.sessions.clone());
        r.register(
            "pool_target",
            "The warm pool's configured size ([pool] size)",
            self.pool_target.clone(),
        );
        r.register("session_creates", "Sessions created, by claim (warm: taken from the pool; cold: a sandbox made for the request)", self.creates.clone());
        r.register(
            "session_create_duration_seconds",
            "Time from a create request to a usable session, by claim",
            self.create_seconds.clone(),
        );
        r.register(
            "exec_duration_seconds",
            "Duration of the commands of POST /v1/sessions/{id}/exec, as the sandbox timed them",
            self.exec_seconds.clone(),
        );
        r.register("tool_call_duration_seconds", "Duration of tool calls (the agent's and POST .../tools/{name}), by tool (remote MCP tools: mcp) and outcome", self.tool_seconds.clone());
        r.register("runs_ended", "Runs this replica drove to their end, by outcome (succeeded, failed, cancelled, interrupted)", self.runs.clone());
        r.register(
            "llm_requests",
            "LLM chat requests (one per turn, retries included), by model and outcome (ok, error)",
            self.llm_requests.clone(),
        );
        r.register("llm_tokens", "LLM tokens as the server's usage reported them, by model and kind (prompt, completion)", self.llm_tokens.clone());
        r.register(
            "llm_request_duration_seconds",
            "Duration of LLM chat requests, retries included, by model",
            self.llm_seconds.clone(),
        );
        r.register("egress_connections", "Connections out of sandboxes through their egress proxies, by decision (allowed, refused)", self.egress_connections.clone());
        r.register(
            "egress_bytes",
            "Bytes through the egress proxies, by direction (up: from the sandbox; down: to it)",
            self.egress_bytes.clone(),
        );
        r.register("http_requests", "HTTP requests answered, by method, matched route template (unmatched: no route) and status", self.http_requests.clone());
        r.register(
            "http_request_duration_seconds",
            "Time to the response head of HTTP requests, by method and matched route template",
            self.http_seconds.clone(),
        );
        r.register(
            "store_operation_duration_seconds",
            "Duration of store calls, by operation (lease_renew, user_by_key)",
            self.store_seconds.clone(),
        );
    }

    /// The scrape: the census refreshed, then every family encoded; OpenMetrics when
    /// `openmetrics`, else Prometheus' text format 0.0.4.
    pub fn render(&self, census: Census, openmetrics: bool) -> Result<String, std::fmt::Error> {
        for (state, n) in [
            ("live", census.live),
            ("starting", census.starting),
            ("warm", census.warm),
            ("filling", census.filling),
        ] {
            let labels = Sessions {
                state,
                backend: self.backend.clone(),
            };
            self.sessions.get_or_create(&labels).set(n as i64);
        }
        let mut out = String::with_capacity(16 * 1024);
        if openmetrics {
            prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?;
        }
        Ok(out)
    }

    pub fn exec(&self, took: Duration) {
        self.exec_seconds.observe(took.as_secs_f64());
    }

    pub fn run_ended(&self, outcome: &'static str) {
        self.runs.get_or_create(&Outcome { outcome }).inc();
    }

    pub fn egress(&self, allowed: bool, up: u64, down: u64) {
        let decision = if allowed { "allowed" } else { "refused" };
        self.egress_connections
            .get_or_create(&Decision { decision })
            .inc();
        self.egress_bytes
            .get_or_create(&Direction { direction: "up" })
            .inc_by(up);
        self.egress_bytes
            .get_or_create(&Direction { direction: "down" })
            .inc_by(down);
    }

    pub fn store_call(&self, op: &'static str, took: Duration) {
        self.store_seconds
            .get_or_create(&StoreOp { op })
            .observe(took.as_secs_f64());
    }

    /// Counts one HTTP request (the `track` layer; public for the bench).
    pub fn http(&self, method: &'static str, route: String, status: u16, took: Duration) {
        self.http_seconds
            .get_or_create(&RouteTime {
                method,
                route: route.clone(),
            })
            .observe(took.as_secs_f64());
        self.http_requests
            .get_or_create(&Route {
                method,
                route,
                status,
            })
            .inc();
    }
}

impl Recorder for Metrics {
    fn session_created(&self, claim: Claim, took: Duration) {
        let claim = match claim {
            Claim::Warm => "warm",
            Claim::Cold => "cold",
        };
        self.creates.get_or_create(&Creates { claim }).inc();
        self.create_seconds
            .get_or_create(&Creates { claim })
            .observe(took.as_secs_f64());
    }

    fn tool_call(&self, tool: &str, took: Duration, failed: bool) {
        let outcome = if failed { "error" } else { "ok" };
        self.tool_seconds
            .get_or_create(&Tool {
                tool: tool.to_string(),
                outcome,
            })
            .observe(took.as_secs_f64());
    }

    fn llm_request(&self, call: LlmCall<'_>) {
        let model = call.model.to_string();
        let outcome = if call.ok { "ok" } else { "error" };
        self.llm_requests
            .get_or_create(&ModelOutcome {
                model: model.clone(),
                outcome,
            })
            .inc();
        self.llm_seconds
            .get_or_create(&Model {
                model: model.clone(),
            })
            .observe(call.took.as_secs_f64());
        for (kind, n) in [
            ("prompt", call.prompt_tokens),
            ("completion", call.completion_tokens),
        ] {
            self.llm_tokens
                .get_or_create(&Tokens {
                    model: model.clone(),
                    kind,
                })
                .inc_by(n);
        }
    }
}

static ONE: std::sync::OnceLock<Arc<Metrics>> = std::sync::OnceLock::new();

/// The process's metrics, made and installed as the core's recorder once (a second serve in
/// the same process, as in unit tests, shares the first's).
pub fn install(backend: &str, pool_size: usize) -> Arc<Metrics> {
    ONE.get_or_init(|| {
        let m = Metrics::new(backend, pool_size);
        sandboxd_core::metrics::install(m.clone());
        m
    })
    .clone()
}

/// The installed metrics, for the points that hold no `AppState` (runs, egress records,
/// the lease); None before `install`.
pub fn get() -> Option<&'static Arc<Metrics>> {
    ONE.get()
}

/// Times a store call under `op` (no-op before `install`).
pub async fn store_timed<T>(op: &'static str, call: impl Future<Output = T>) -> T {
    let started = std::time::Instant::now();
    let out = call.await;
    if let Some(m) = get() {
        m.store_call(op, started.elapsed());
    }
    out
}

#[cfg(test)]
mod tests;
