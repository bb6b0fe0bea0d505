//! permitd's deterministic simulator: a whole cluster and its clients in one
//! process, on one thread, under simulated time, network and disk, from one
//! seed (issue 34; docs/simulation.md).
//!
//! The nodes run the node's real code (`permitd_node::app`), reaching the
//! world only through their seams (`permitd_node::seams`): [`net::SimTransport`]
//! for every HTTP call, simulated TCP listeners for every connection they
//! serve (`node_host.rs`, through the production per-connection path), a
//! [`disk::SimDisk`] per node under the storage crate's disk seam, a simulated
//! wall clock, and tokio's paused clock for every timer. The runners are the
//! real Rust client over the same transport (`workload/`). turmoil (tokio-rs)
//! schedules the hosts and delivers the segments; [`nemesis`] injects faults
//! drawn from the seed; [`checker`] judges the [`history`] the clients saw.
//!
//! | file | what |
//! |---|---|
//! | `run.rs` | one run: a seed in, [`run::Outcome`] (verdict, trace hash) out |
//! | `scenario.rs` | scripted scenarios: no random faults, a test's script of calls and faults |
//! | `node_host.rs` | one simulated node |
//! | `workload/` | the operator, the job runners and the usage sampler |
//! | `waiters.rs` | runners whose requests the leader holds (`waitMs`), on keys of their own |
//! | `history.rs` | what they saw: requests and their fates, leases, writes, usage reads, replays |
//! | `nemesis.rs` | the faults |
//! | `checker/` | the properties |
//! | `elections.rs` | no election without a fault that explains it |
//! | `liveness.rs` | no held request waits while its key has a free permit |
//! | `replicas.rs` | every running node's applied state equals a replay of its own log |
//! | `trace.rs` | the events, their hash, the last few for a report |
//! | `net.rs` | HTTP over turmoil's TCP |
//! | `disk.rs`, `disk_model.rs` | the disk seam over an in-memory disk with powerfs's rules |

pub mod checker;
pub mod disk;
pub mod disk_model;
pub mod elections;
pub mod history;
pub mod liveness;
pub mod nemesis;
pub mod net;
pub mod node_host;
pub mod replicas;
pub mod run;
pub mod scenario;
pub mod trace;
pub mod waiters;
pub mod workload;
