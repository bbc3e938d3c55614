//! The egress proxies this replica runs for the sessions it holds, and the one place one
//! is started (`start_proxy`).
//!
//! `follow` brings a session's sandbox in line with its row: the proxy variables of its
//! processes on or off (sandbox/proxy_env.rs), and a proxy running whenever the policy is
//! not `off` (a proxy whose session turned `off` keeps running and refuses everything: it
//! reads the policy at each connection). It runs at create and attach (attach.rs), on a PUT
//! of the policy, and in the upkeep (reconcile.rs), which so restarts a proxy that died.
//! Another replica's helper already serving the sandbox (`PortTaken`) is fine: that replica
//! serves it, with the same row as its policy.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Mutex;

use crate::AppState;
use crate::egress::{StoreAudit, StorePolicy};
use sandboxd_core::egress::{EgressDeps, EgressError, EgressProxy, TRACE_TARGET};
use sandboxd_core::research::resolver::SystemResolver;
use sandboxd_core::research::ssrf::Policy;
use sandboxd_core::sandbox::Sandbox;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::store::SessionRow;
use sandboxd_core::tools::browser::Egress;
use sandboxd_core::tools::session::set_egress;

/// A session's running proxy.
pub type RunningProxy = EgressProxy;

/// Why a proxy did not start.
#[derive(Debug)]
enum StartError {
    /// Another replica's helper serves the sandbox already.
    Taken,
    Failed(String),
}

/// The one call that starts a session's proxy: the policy is the session's row, read at
/// every connection (so a PUT on any replica counts at once); the audit is the store and
/// the run in flight.
async fn start_proxy(
    st: &AppState,
    sandbox: &Arc<dyn Sandbox>,
    row: &SessionRow,
) -> Result<RunningProxy, StartError> {
    let ssrf = Policy::from_config(&st.config.research).map_err(StartError::Failed)?;
    let deps = EgressDeps {
        config: st.config.egress.clone(),
        ssrf: Arc::new(ssrf),
        resolver: Arc::new(SystemResolver),
        policy: Arc::new(StorePolicy {
            store: st.store.clone(),
            session: row.id.clone(),
        }),
        audit: Arc::new(StoreAudit {
            store: st.store.clone(),
            runs: st.runs.clone(),
        }),
        session: row.id.clone(),
        owner: row.owner.clone(),
    };
    match EgressProxy::start(sandbox.clone(), deps).await {
        Ok(p) => Ok(p),
        Err(EgressError::PortTaken) => Err(StartError::Taken),
        Err(e) => Err(StartError::Failed(e.to_string())),
    }
}

/// The proxies of this replica, by API session id.
#[derive(Default)]
pub struct Proxies {
    running: Mutex<HashMap<String, RunningProxy>>,
}

impl Proxies {
    /// Stops the proxies of sessions this replica no longer holds (`held`: API ids).
    pub async fn keep_only(&self, held: &[String]) {
        let gone: Vec<RunningProxy> = {
            let mut map = self.running.lock().await;
            let ids: Vec<String> = map
                .keys()
                .filter(|id| !held.contains(id))
                .cloned()
                .collect();
            ids.iter().filter_map(|id| map.remove(id)).collect()
        };
        for p in gone {
            p.stop().await;
        }
    }

    /// Stops every proxy (shutdown).
    pub async fn stop_all(&self) {
        let all: Vec<RunningProxy> = self.running.lock().await.drain().map(|(_, p)| p).collect();
        for p in all {
            p.stop().await;
        }
    }
}

/// Brings the sandbox of `row` (held here) in line with the row's policy; never fails the
/// caller: a proxy that cannot start is logged, and the next upkeep tries again.
pub async fn follow(st: &AppState, session: &Arc<Session>, row: &SessionRow) {
    let sandbox = &session.sandbox;
    // The browser reads the same row as the proxy (at every navigation).
    set_egress(
        session,
        Egress {
            source: Arc::new(StorePolicy {
                store: st.store.clone(),
                session: row.id.clone(),
            }),
            at_start: row.egress.clone(),
        },
    );
    let on = !row.egress.is_off();
    sandbox.set_proxy_env(on);
    if !on {
        return;
    }
    let mut map = st.egress_proxies.running.lock().await;
    if map.get(&row.id).is_some_and(RunningProxy::is_running) {
        return;
    }
    if let Some(dead) = map.remove(&row.id) {
        tracing::warn!(target: TRACE_TARGET, session = %row.id, "the egress proxy had stopped; restarting it");
        dead.stop().await;
    }
    match start_proxy(st, sandbox, row).await {
        Ok(p) => {
            map.insert(row.id.clone(), p);
        }
        Err(StartError::Taken) => {
            tracing::debug!(target: TRACE_TARGET, session = %row.id, "another replica serves this session's egress");
        }
        Err(StartError::Failed(why)) => {
            tracing::warn!(target: TRACE_TARGET, session = %row.id, error = %why, "the egress proxy did not start");
        }
    }
}
