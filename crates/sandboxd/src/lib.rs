//! The `sandboxd` binary's library half: the benchmark harnesses behind `sandboxd bench`,
//! kept out of the core and server crates (they need a real runtime, a store and fake
//! model servers), and reachable from this package's tests.

pub mod bench;
