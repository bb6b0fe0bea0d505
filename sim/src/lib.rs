//! permitd's deterministic simulator: a whole cluster and its clients in one
//! process, on one thread, under simulated time, network and disk, from one
//! seed (issue 34; docs/simulation.md).
//!
//! The nodes run the node's real code (`permitd_node::app`), reaching the
//! world only through their seams: [`net::SimTransport`] for every HTTP call,
//! simulated TCP listeners for every connection they serve, a [`disk_model`]
//! per node under the storage crate's disk seam, a simulated wall clock, and
//! tokio's paused clock for every timer. turmoil (tokio-rs) schedules the
//! hosts and delivers the segments.

pub mod disk_model;
pub mod net;
