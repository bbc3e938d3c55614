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
//!
//! With `[egress] credentials` or a key for users' own (`credential_key_file`), every
//! session held here gets one `Injector` (its leaf key in this process's memory only), made
//! at its first `follow` and kept while the session is held, so a restarted proxy keeps the
//! CA the sandbox already trusts and the browser's pin (on the session's one leaf key)
//! stays right. Every `follow` gives it the credentials that apply (the admin's and the
//! owner's, read from the store, whose host the row's policy allows): it has a CA only while
//! there is one, and TLS is terminated only for their hosts (every other host is tunneled,
//! its certificate the server's own). When their hosts changed its CA is made again and its
//! files are written into the sandbox again (they go in once a proxy runs); when the last
//! one went, the files and the trust variables go. Chromium's pin is read at each of its
//! starts, so it is there only while the session has a CA (a browser started before the
//! first credential is started again at its next action: tools/browser).
//!
//! The map's lock is never held across a start (a docker exec): a `Starting` entry claims
//! the session instead, so two `follow`s cannot both start its proxy.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::AppState;
use crate::egress::{StoreAudit, StorePolicy};
use sandboxd_core::config::egress::EgressCredential;
use sandboxd_core::egress::inject::{self, Injector};
use sandboxd_core::egress::user_credentials;
use sandboxd_core::egress::{EgressDeps, EgressError, EgressProxy, Host, TRACE_TARGET};
use sandboxd_core::research::resolver::SystemResolver;
use sandboxd_core::research::ssrf::Policy;
use sandboxd_core::sandbox::Sandbox;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::store::{SessionKind, SessionRow};
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

/// A claim older than this is stale (its `follow` was dropped half-way): a start waits at
/// most half a minute for the helper, and writing the CA files takes a moment more.
const STALE_CLAIM: Duration = Duration::from_secs(120);

/// How a `follow` changed the session's CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ca {
    Same,
    /// Made, or made again for other hosts: the trust files are written (again).
    Made,
    /// The last credential host went: the trust files and variables go.
    Dropped,
}

/// The credentials that apply to the session of `row`: those whose host its policy allows
/// (a session that cannot reach a host needs no CA for it; `off`: none). A policy changed
/// later is followed (PUT, and the upkeep), so the CA follows it.
fn applicable(mut credentials: Vec<EgressCredential>, row: &SessionRow) -> Vec<EgressCredential> {
    credentials.retain(|c| row.egress.check(&Host::parse(&c.host)).allowed);
    credentials
}

/// A session's slot in the map.
enum Slot {
    /// A `follow` is starting its proxy (without the map's lock), since then.
    Starting(Instant),
    Running(RunningProxy),
}

/// The proxies of this replica, by API session id.
#[derive(Default)]
pub struct Proxies {
    running: Mutex<HashMap<String, Slot>>,
    /// The credential injection of each held session (absent: no credentials configured).
    injectors: std::sync::Mutex<HashMap<String, Arc<Injector>>>,
    /// The `[research]` SSRF rules, built at the first start (the config does not change).
    ssrf: OnceLock<Result<Arc<Policy>, String>>,
}

/// The one call that starts a session's proxy: the policy is the session's row, read at
/// every connection (so a PUT on any replica counts at once); the audit is the store and
/// the run in flight.
async fn start_proxy(
    st: &AppState,
    sandbox: &Arc<dyn Sandbox>,
    row: &SessionRow,
    injector: Option<Arc<Injector>>,
) -> Result<RunningProxy, StartError> {
    let ssrf = st
        .egress_proxies
        .ssrf
        .get_or_init(|| Policy::from_config(&st.config.research).map(Arc::new))
        .clone()
        .map_err(StartError::Failed)?;
    let deps = EgressDeps {
        config: st.config.egress.clone(),
        ssrf,
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
    let started = match injector {
        None => EgressProxy::start(sandbox.clone(), deps).await,
        Some(i) => EgressProxy::start_intercepting(sandbox.clone(), deps, i).await,
    };
    match started {
        Ok(p) => Ok(p),
        Err(EgressError::PortTaken) => Err(StartError::Taken),
        Err(e) => Err(StartError::Failed(e.to_string())),
    }
}

impl Proxies {
    /// Stops the proxies of sessions this replica no longer holds (`held`: API ids), and
    /// drops their CAs. A start under way is left to its `follow` (which read the row just
    /// now; the upkeep's list of sessions may be older than that start): were its claim
    /// dropped, the proxy it starts would be stopped at once and the session's first command
    /// would find none. A stale claim goes.
    pub async fn keep_only(&self, held: &[String]) {
        let (gone, starting) = {
            let mut map = self.running.lock().await;
            map.retain(|id, slot| {
                held.contains(id)
                    || !matches!(slot, Slot::Starting(at) if at.elapsed() >= STALE_CLAIM)
            });
            let ids: Vec<String> = map
                .iter()
                .filter(|(id, slot)| !held.contains(id) && matches!(slot, Slot::Running(_)))
                .map(|(id, _)| id.clone())
                .collect();
            let gone: Vec<RunningProxy> = ids
                .iter()
                .filter_map(|id| match map.remove(id) {
                    Some(Slot::Running(p)) => Some(p),
                    _ => None,
                })
                .collect();
            // What is left and not held: starts under way.
            let starting: Vec<String> = map
                .keys()
                .filter(|id| !held.contains(id))
                .cloned()
                .collect();
            (gone, starting)
        };
        if let Ok(mut injectors) = self.injectors.lock() {
            injectors.retain(|id, _| held.contains(id) || starting.contains(id));
        }
        for p in gone {
            p.stop().await;
        }
    }

    /// Stops every proxy (shutdown).
    pub async fn stop_all(&self) {
        let all: Vec<Slot> = self.running.lock().await.drain().map(|(_, p)| p).collect();
        for slot in all {
            if let Slot::Running(p) = slot {
                p.stop().await;
            }
        }
    }

    /// The session's injector with its credentials brought up to date (the admin's and the
    /// owner's, read from the store now, those whose host the row's policy allows), made at
    /// the first call when the admin configured credentials or a key for users' own; and
    /// how its CA changed (made, or made again for a new set of hosts: the sandbox's trust
    /// files must be written again; dropped: they go).
    async fn injector(&self, st: &AppState, row: &SessionRow) -> (Option<Arc<Injector>>, Ca) {
        let config = &st.config.egress;
        if config.credentials.is_empty() && !config.credential_key.is_set() {
            return (None, Ca::Same);
        }
        let held = self
            .injectors
            .lock()
            .ok()
            .and_then(|m| m.get(&row.id).cloned());
        let credentials = match user_credentials::for_session(st.store.as_ref(), config, &row.owner)
            .await
        {
            Ok(c) => Some(applicable(c, row)),
            Err(e) => {
                tracing::warn!(target: TRACE_TARGET, session = %row.id, error = %e,
                        "the owner's egress credentials cannot be read; the session keeps the ones it has");
                None
            }
        };
        if let Some(i) = held {
            let had = i.has_ca();
            let change = match credentials.map(|c| i.set_credentials(c)) {
                Some(Ok(true)) => Ca::Made,
                Some(Ok(false)) if had && !i.has_ca() => Ca::Dropped,
                Some(Ok(false)) | None => Ca::Same,
                Some(Err(e)) => {
                    tracing::warn!(target: TRACE_TARGET, session = %row.id, error = %e,
                        "the session CA could not be made for the new credentials; the old ones stay");
                    Ca::Same
                }
            };
            return (Some(i), change);
        }
        let credentials =
            credentials.unwrap_or_else(|| applicable(config.credentials.clone(), row));
        match Injector::new(&row.id, config, credentials) {
            Ok(i) => {
                // Two first `follow`s may race: the one in the map first is the session's.
                let i = match self.injectors.lock() {
                    Ok(mut map) => map.entry(row.id.clone()).or_insert(Arc::new(i)).clone(),
                    Err(_) => Arc::new(i),
                };
                (Some(i), Ca::Made)
            }
            Err(e) => {
                tracing::warn!(target: TRACE_TARGET, session = %row.id, error = %e,
                    "no credential injection for this session; its credential hosts are tunneled without their credentials");
                (None, Ca::Same)
            }
        }
    }

    /// Whether this replica runs the session's proxy now.
    async fn runs(&self, id: &str) -> bool {
        matches!(self.running.lock().await.get(id), Some(Slot::Running(p)) if p.is_running())
    }

    /// Claims the session for a start: false when its proxy runs or another start is under
    /// way; a dead proxy is taken out (returned, to be stopped).
    async fn claim(&self, id: &str) -> (bool, Option<RunningProxy>) {
        let mut map = self.running.lock().await;
        match map.get(id) {
            Some(Slot::Starting(at)) if at.elapsed() < STALE_CLAIM => return (false, None),
            Some(Slot::Running(p)) if p.is_running() => return (false, None),
            _ => {}
        }
        match map.insert(id.to_string(), Slot::Starting(Instant::now())) {
            Some(Slot::Running(dead)) => (true, Some(dead)),
            _ => (true, None),
        }
    }

    /// Ends a claim: the proxy goes in when the claim still stands (a `keep_only` or
    /// `stop_all` in between dropped it: then it is stopped); None clears the claim.
    async fn settle(&self, id: &str, proxy: Option<RunningProxy>) {
        let mut map = self.running.lock().await;
        let claimed = matches!(map.get(id), Some(Slot::Starting(_)));
        match proxy {
            Some(p) if claimed => {
                map.insert(id.to_string(), Slot::Running(p));
            }
            Some(p) => {
                drop(map);
                p.stop().await;
            }
            None if claimed => {
                map.remove(id);
            }
            None => {}
        }
    }
}

/// Brings the sandbox of `row` (held here) in line with the row's policy; never fails the
/// caller: a proxy that cannot start is logged, and the next upkeep tries again.
pub async fn follow(st: &AppState, session: &Session, row: &SessionRow) {
    let sandbox = &session.sandbox;
    let proxies = &st.egress_proxies;
    let (injector, ca) = proxies.injector(st, row).await;
    if ca == Ca::Dropped
        && let Some(i) = &injector
        && let Err(e) = inject::uninstall(sandbox.as_ref(), i).await
    {
        tracing::warn!(target: TRACE_TARGET, session = %row.id, error = %e,
            "the session CA's files could not be removed from the sandbox");
    }
    // The browser reads the same row as the proxy (at every navigation).
    set_egress(
        session,
        Egress {
            source: Arc::new(StorePolicy {
                store: st.store.clone(),
                session: row.id.clone(),
            }),
            at_start: row.egress.clone(),
            chromium_args: inject::chromium_args(injector.as_ref()),
        },
    );
    let on = !row.egress.is_off();
    sandbox.set_proxy_env(on);
    if !on {
        return;
    }
    let (claimed, dead) = proxies.claim(&row.id).await;
    if let Some(dead) = dead {
        tracing::warn!(target: TRACE_TARGET, session = %row.id, "the egress proxy had stopped; restarting it");
        dead.stop().await;
    }
    if !claimed {
        // Its proxy runs here already: a CA made again for new credential hosts goes in now.
        if ca == Ca::Made
            && let Some(i) = &injector
            && proxies.runs(&row.id).await
        {
            install_trust(sandbox.as_ref(), i, &row.id).await;
        }
        return;
    }
    let started = match start_proxy(st, sandbox, row, injector.clone()).await {
        Ok(p) => Some(p),
        Err(StartError::Taken) => {
            tracing::debug!(target: TRACE_TARGET, session = %row.id, "another replica serves this session's egress");
            None
        }
        Err(StartError::Failed(why)) => {
            tracing::warn!(target: TRACE_TARGET, session = %row.id, error = %why, "the egress proxy did not start");
            None
        }
    };
    let written = match (&started, &injector) {
        (Some(_), Some(i)) => {
            let generation = i.ca_generation();
            install_trust(sandbox.as_ref(), i, &row.id).await;
            Some(generation)
        }
        _ => None,
    };
    proxies.settle(&row.id, started).await;
    // A credential attached while this start was under way found no running proxy and left
    // the trust files to it: once the proxy is in the map, a CA made since is written here
    // (a later change finds the proxy running and writes its own).
    if let (Some(generation), Some(i)) = (written, &injector)
        && i.ca_generation() != generation
        && proxies.runs(&row.id).await
    {
        install_trust(sandbox.as_ref(), i, &row.id).await;
    }
}

/// The manager's session of a running row when this replica holds it: an API session
/// (marked used), or an /mcp sandbox (owned by its user's MCP owner).
pub async fn held_session(st: &AppState, row: &SessionRow) -> Option<Arc<Session>> {
    match row.kind {
        SessionKind::Mcp => {
            let runtime_id = row.runtime_id.as_deref()?;
            let owner = crate::mcp::McpUsers::owner_of(&row.owner);
            st.backend.manager().held(&owner, runtime_id)
        }
        SessionKind::Api => st.backend.get(row).await.map(|l| l.session().clone()),
    }
}

/// Writes the session CA's files into the sandbox (nothing while no host has a credential).
async fn install_trust(sandbox: &dyn Sandbox, injector: &Injector, id: &str) {
    if let Err(e) = inject::install(sandbox, injector).await {
        tracing::warn!(target: TRACE_TARGET, session = %id, error = %e,
            "the session CA could not be written into the sandbox; its programs will not trust the credential hosts");
    }
}
