//! The Docker backend's tests, one binary: the image build and hardening (image.rs) and the
//! runtime conformance suite every `Runtime` passes (conformance.rs), and the usage readings
//! from the host's cgroup files (usage.rs), on the real engine.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

mod conformance;
mod image;
mod usage;
