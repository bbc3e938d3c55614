//! The sandboxd package's integration tests, one binary: each former test file is a module
//! here (run one with `cargo test -p sandboxd --test all -- MODULE::`). Shared plumbing is
//! declared once below; the fakes come from the sandboxd-testkit crate.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

mod browser_support;
#[path = "mcp/common.rs"]
mod mcp_common;
mod serve;
mod support;
#[macro_use]
#[path = "tar_safety/support.rs"]
#[allow(dead_code, unused_macros)]
mod tar_support;

mod agent_bench;
mod agent_browser;
mod agent_cli;
mod agent_context;
mod agent_llm;
mod agent_loop;
mod agent_research;
mod agent_session;
mod agent_stream;
mod browser_actions;
mod browser_bench;
mod browser_egress;
mod browser_lifecycle;
mod browser_live_web;
mod cli_copy_out;
mod cli_exec;
mod cli_lifecycle;
mod egress;
mod egress_grammar;
mod egress_trust;
mod flow_cli;
mod flow_plan;
mod hostile_sandbox;
mod mcp_hostile;
mod mcp_loop;
mod mcp_third_party;
mod oci_runtime;
mod pool;
mod pool_engine;
mod python_daemon;
mod research_rules;
mod research_tools;
mod runtime_abuse;
mod runtime_files;
mod runtime_hardening;
mod runtime_lifecycle;
mod runtime_shell;
mod serve_api;
mod serve_bench;
mod serve_connections;
mod serve_docker_tls;
mod serve_egress;
mod serve_egress_agent;
mod serve_egress_inject;
mod serve_egress_live;
mod serve_exec;
mod serve_fuzz;
mod serve_history;
mod serve_in_use;
mod serve_inflight;
mod serve_lockout;
mod serve_mcp_quota;
mod serve_pool;
mod serve_replica_edges;
mod serve_replicas;
mod serve_restart;
mod serve_revoke;
mod serve_runs;
mod serve_runs_cancel;
mod serve_runs_lifecycle;
mod serve_runs_users;
mod serve_stream;
mod serve_transfer_memory;
mod session_across;
mod session_manager;
mod session_records;
mod tar_safety;
mod tool_editor;
mod tool_python;
mod tool_registry;
mod web_sign_in;
mod web_ui;
mod web_ui_hardening;
mod web_ui_runs;
