//! `--egress` of `sandboxd run|exec|shell|tool`: the session's egress policy for this
//! process (absent: `[egress] default`), never wider than `[egress] widest`. Checked before
//! the sandbox is made; then the sandbox's processes see the proxy variables while it is
//! not `off`, and this process runs the session's proxy (`start_proxy`, the one call).
//!
//! The CLI keeps no session row: a kept session continued later gets the policy of that
//! later invocation. With `[egress] credentials` whose host the policy allows, the proxy
//! injects them (egress/inject.rs) with a CA made for this invocation; its key lives and dies
//! with this process. Without such a credential no CA is made and nothing is intercepted.

use std::sync::{Arc, Mutex};

use anyhow::bail;
use sandboxd_core::config::egress::EgressPolicy;
use sandboxd_core::egress::inject::{self, Injector};
use sandboxd_core::egress::{EgressDeps, EgressProxy, FixedPolicy, Host, LogOnly, TRACE_TARGET};
use sandboxd_core::research::resolver::SystemResolver;
use sandboxd_core::research::ssrf::Policy;
use sandboxd_core::sandbox::manager::Session;
use sandboxd_core::tools::browser::Egress;
use sandboxd_core::tools::session::set_egress;

use super::Ctx;

/// The policy this invocation asks for, checked against `[egress] widest`.
pub(crate) fn policy(ctx: &Ctx, asked: Option<&EgressPolicy>) -> anyhow::Result<EgressPolicy> {
    let policy = asked
        .cloned()
        .unwrap_or_else(|| ctx.config.egress.default.clone());
    if let Err(m) = policy.within(&ctx.config.egress.widest) {
        bail!("--egress {policy}: {m}; ask for less, or widen [egress] widest in the config");
    }
    Ok(policy)
}

/// A running proxy of this process.
type RunningProxy = EgressProxy;

/// This process's proxy (one session per invocation), kept until the process ends.
static PROXY: Mutex<Option<RunningProxy>> = Mutex::new(None);

/// Turns the session's proxy variables on or off and, when the policy is not `off`, starts
/// its proxy. A proxy that cannot start is said on stderr (the sandbox then reaches
/// nothing, as with `off`), never a failure of the command.
pub(crate) async fn start(ctx: &Ctx, session: &Arc<Session>, policy: &EgressPolicy) {
    // Only the credentials whose host the policy allows: no CA for what cannot be reached.
    let mut config = ctx.config.egress.clone();
    config
        .credentials
        .retain(|c| policy.check(&Host::parse(&c.host)).allowed);
    let injector = match Injector::for_config(&session.id, &config) {
        Ok(i) => i.map(Arc::new),
        Err(e) => {
            eprintln!("sandboxd: [egress] credentials: {e}; their hosts are tunneled without them");
            None
        }
    };
    set_egress(
        session,
        Egress {
            source: Arc::new(FixedPolicy(policy.clone())),
            at_start: policy.clone(),
            chromium_args: inject::chromium_args(injector.as_ref()),
        },
    );
    let on = !policy.is_off();
    session.sandbox.set_proxy_env(on);
    if !on {
        return;
    }
    match start_proxy(ctx, session, policy, injector.clone()).await {
        Ok(p) => {
            if let Some(i) = &injector
                && let Err(e) = inject::install(session.sandbox.as_ref(), i).await
            {
                eprintln!(
                    "sandboxd: the session CA could not be written into the sandbox ({e}); its programs will not trust the credential hosts"
                );
            }
            if let Ok(mut slot) = PROXY.lock() {
                *slot = Some(p);
            }
        }
        Err(why) => {
            tracing::warn!(target: TRACE_TARGET, session = %session.id, error = %why, "the egress proxy did not start");
            eprintln!(
                "sandboxd: --egress {policy}: the egress proxy did not start ({why}); the sandbox reaches nothing"
            );
        }
    }
}

/// The one call that starts the CLI's proxy: a fixed policy (this invocation's), records
/// only logged (under `sandboxd::egress`).
async fn start_proxy(
    ctx: &Ctx,
    session: &Arc<Session>,
    policy: &EgressPolicy,
    injector: Option<Arc<Injector>>,
) -> Result<RunningProxy, String> {
    let ssrf = Policy::from_config(&ctx.config.research)?;
    let deps = EgressDeps {
        config: ctx.config.egress.clone(),
        ssrf: Arc::new(ssrf),
        resolver: Arc::new(SystemResolver),
        policy: Arc::new(FixedPolicy(policy.clone())),
        audit: Arc::new(LogOnly),
        session: session.id.clone(),
        owner: String::new(),
    };
    let started = match injector {
        None => EgressProxy::start(session.sandbox.clone(), deps).await,
        Some(i) => EgressProxy::start_intercepting(session.sandbox.clone(), deps, i).await,
    };
    started.map_err(|e| e.to_string())
}
