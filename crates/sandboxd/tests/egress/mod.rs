//! The per-session egress proxy (issue 24): the in-container helper, the host's checks and
//! caps, and its abuse, against the real engine and image with local "internet" servers.

mod abuse;
mod full_size;
mod inject;
mod limits;
mod page_bench;
mod proxy;
mod python;
pub(crate) mod support;
