//! The permitd node: one member of every Raft group of a cluster (one per
//! shard, [`shard`]) serving the v1 API.
//!
//! Where things are, top to bottom (a module uses only those below it;
//! `scripts/module-arrows` checks that there is no cycle):
//! - [`cli`]: the command line (`serve`, `up`, `restore`);
//! - [`edge`]: the HTTP edge. [`edge::api`] receives HTTP (on any node); a
//!   follower forwards v1 and membership calls to the leader in one hop
//!   ([`edge::api::forward`]); [`edge::auth`] checks tokens; peers call
//!   [`edge::raft_inbound`];
//! - [`app`]: one running node, the state every handler shares, and
//!   [`shard`]: one shard's Raft group and tasks on it (a key lives in
//!   `shard_of(key, S)`; shard 0 also holds tokens and defaults);
//! - [`config`] with [`config_env`]: the cluster file and its environment
//!   overrides, and the settings a node is started with;
//! - [`leader`]: on the leader, a `request` is parked in its key's pending list
//!   by [`leader::rounds`] until the key's round falls due, and a `sync` until
//!   the next entry leaves; one `Command::Round` entry carries the syncs that
//!   arrived meanwhile and the rounds of every key that fell due (the rules:
//!   [`leader::schedule`], pure and unit-tested); configuration changes are
//!   proposed at once; [`leader::reclaim`] keeps one timer per key at the
//!   earliest claim deadline of an unclaimed grant and proposes a reclaim entry
//!   when it passes; [`leader::seed_defaults`] writes the file's `[defaults]` on
//!   a leader whose cluster has never had any written (a failed write after
//!   `/cluster/init`);
//! - [`observe`]: [`observe::applied_events`] turns every applied entry's
//!   lifecycle events into tracing events and [`observe::metrics`];
//! - [`raft`]: openraft, on a runtime of its own ([`raft::runtime`]), replicates
//!   the entry through [`raft::network`] to the peers' [`edge::raft_inbound`]
//!   endpoints; every replica's state machine (storage crate) applies it; the
//!   leader answers each waiting request with its part of the result;
//! - [`credentials`]: the peer secret, the admin token and TLS, used by the edge
//!   and the Raft transport alike;
//! - [`shutdown`]: the stop signal both listeners share.
//!
//! Invariants:
//! - only the leader holds pending requests; when it loses leadership every one of
//!   them fails at once with `leader_changed`, and nothing is retried for the client;
//! - rounds of one key start at least `roundPeriodMs` apart; several may be in
//!   flight (their outcomes are computed at apply time, in log order);
//! - the node never touches the store directly: state is read through `permitd_storage::SharedState`
//!   and changed only by log entries.

pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod config_env;
pub mod credentials;
pub mod edge;
pub mod leader;
pub mod observe;
pub mod raft;
pub mod seams;
pub mod shard;
pub mod shutdown;
