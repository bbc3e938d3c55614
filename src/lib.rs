//! sandboxd: a sandbox-first agent service.

pub mod sandbox;
