//! sandboxd's core: the agent, its tools, the sandbox and store seams and everything built
//! only on them. It names no backend and no store: the Docker backend (sandboxd-docker), the
//! SQLite store (sandboxd-sqlite) and the HTTP service (sandboxd-server) are crates above it,
//! and the binary (sandboxd) is the one place that picks a runtime and a store.
//!
//! Floors, lowest first: `events`, `config`, `datadir` (the ground floor: serde and std only);
//! `llm`, `research`, `sandbox`, `store`; `egress`, `tools`; `mcp`, `a2a`; `agent`; `flow`.

pub mod a2a;
pub mod agent;
pub mod config;
pub mod datadir;
pub mod egress;
pub mod events;
pub mod flow;
pub mod llm;
pub mod mcp;
pub mod metrics;
pub mod research;
pub mod sandbox;
pub mod store;
pub mod tools;
