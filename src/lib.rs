//! sandboxd: a sandbox-first agent service. Every session runs in its own hardened Docker
//! container; the host keeps only the agent loop, the LLM calls and the orchestration.

pub mod agent;
pub mod bench_stats;
pub mod bench_support;
pub mod config;
pub mod flow;
pub mod llm;
pub mod mcp;
pub mod research;
pub mod sandbox;
pub mod server;
pub mod store;
pub mod tools;
