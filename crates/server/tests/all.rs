//! The server crate's tests, one binary: serve's rules that need no container, checked
//! in-process on the fake runtime and a real SQLite store in milliseconds (the real-engine
//! serve tests in crates/sandboxd/tests keep what needs a container).
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

mod egress_audit;
mod harness;
mod in_process;
mod reaper;
mod replicas;
mod runs_across;
mod runs_in_process;
mod runs_replicas;
