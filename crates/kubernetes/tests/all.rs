//! The Kubernetes backend's tests, one binary: the generated objects against golden files
//! and hostile input (golden.rs), and the backend against a fake API server on loopback
//! whose pods are real Docker containers of the sandbox image (fake/): the runtime
//! conformance suite every `Runtime` passes (conformance.rs) and the exec protocol's edges,
//! v4 and evictions (protocol.rs), replica Leases and the reconciler (lease.rs); agent-sandbox mode on claims (agent_sandbox.rs; its templates and bound pods,
//! agent_sandbox_templates.rs; under parallel creates and others' writes,
//! agent_sandbox_races.rs; its vanish watch, agent_sandbox_vanish.rs); the
//! deploy/kubernetes manifests as the types they claim (manifests.rs). No Kubernetes cluster runs here: see README.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

mod agent_sandbox;
mod agent_sandbox_lease;
mod agent_sandbox_races;
mod agent_sandbox_templates;
mod agent_sandbox_vanish;
mod conformance;
mod fake;
mod golden;
mod isolation;
mod lease;
mod manifests;
mod pool;
mod protocol;
mod vanish;
