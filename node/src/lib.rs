//! The permitd node: one member of a Raft group serving the v1 API.
//!
//! How a request flows through this crate:
//! - [`api`] receives HTTP (on any node). A follower forwards v1 and membership
//!   calls to the leader in one hop ([`api::forward`]);
//! - on the leader, a `request` is parked in its key's pending list by [`rounds`]
//!   until the key's round falls due, and a `sync` until the next entry leaves;
//!   one `Command::Round` entry carries the syncs that arrived meanwhile and the
//!   rounds of every key that fell due (the rules: [`schedule`], pure and
//!   unit-tested); configuration changes are proposed at once;
//! - openraft replicates the entry through [`raft::network`] to the peers'
//!   [`raft::inbound`] endpoints; every replica's state machine (storage crate)
//!   applies it; the leader answers each waiting request with its part of the result;
//! - [`reclaim`] keeps one timer per key at the earliest claim deadline of an
//!   unclaimed grant and proposes a reclaim entry when it passes;
//! - [`defaults`] writes the file's `[defaults]` on a leader whose cluster has
//!   never had any written (a failed write after `/cluster/init`);
//! - [`events`] turns every applied entry's lifecycle events into tracing events and
//!   [`metrics`].
//!
//! Invariants:
//! - only the leader holds pending requests; when it loses leadership every one of
//!   them fails at once with `leader_changed`, and nothing is retried for the client;
//! - rounds of one key start at least `roundPeriodMs` apart; several may be in
//!   flight (their outcomes are computed at apply time, in log order);
//! - the node never touches the store directly: state is read through `permitd_storage::SharedState`
//!   and changed only by log entries.

pub mod api;
pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod config_env;
pub mod defaults;
pub mod edge;
pub mod event_log;
pub mod events;
pub mod fatal;
pub mod http_metrics;
pub mod leadership;
pub mod metrics;
pub mod propose;
pub mod raft;
pub mod raft_metrics;
pub mod reclaim;
pub mod rounds;
pub mod schedule;
pub mod shutdown;
pub mod snapshots;
pub mod stall_probe;
pub mod timer;
pub mod tls;

/// Milliseconds since the Unix epoch by this node's clock: the `now` of entries
/// this node proposes as leader.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}
