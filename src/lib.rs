//! sandboxd: a sandbox-first agent service.
