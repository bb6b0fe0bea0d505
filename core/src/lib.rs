//! `permitd-core`: the wire contract and the deterministic round engine.
//!
//! Everything here is synchronous, does no IO and reads no clock or random
//! source. The storage crate feeds it log entries; every replica applying the
//! same entries reaches byte-identical state.
//!
//! Two rooms, and what both share:
//! - [`contract`]: what crosses the wire, written once for the node and the
//!   client: the semaphore messages ([`contract::protocol`]), batches
//!   ([`contract::batch`]), the checks every input passes before it can reach
//!   the engine ([`contract::validate`]), routes, headers, error codes and the
//!   other HTTP bodies;
//! - [`engine`]: the replicated state and the pure functions that change it:
//!   rounds, reports, reclaims, leases, syncs, force releases, `requestId`
//!   replays, and the views read from it (usage, holders, events);
//! - shared by both: the replicated key and group [`config`], log-derived
//!   [`ids`], every maximum in [`limits`], and the API [`tokens`] registry;
//! - beside them: a key's [`shard`] ([`shard_of`]), which the TypeScript and
//!   Python clients compute too, all three held to the same test vectors.
//!
//! The engine imports the contract's message types; the contract never imports
//! the engine, but for the answer bodies it computes (usage, holders, events).
//!
//! How data flows:
//! - untrusted bytes → [`contract::validate::parse_request`] (serde shapes in
//!   [`contract::protocol`], limits in [`limits`]) → a
//!   [`contract::protocol::SemaphoreRequest`];
//! - a round entry (`now`, requests in arrival order) →
//!   [`Semaphores::round`] → [`engine::round::run_round`], which applies
//!   [`engine::reports`], [`engine::reclaim`]s, grants oldest demand first and
//!   runs the [`engine::leases`] pass → one [`contract::protocol::PermitGrant`]
//!   per request plus [`engine::lifecycle::Event`]s;
//! - a sync → [`engine::permit_sync::run_sync`]; a claim-deadline timer →
//!   [`engine::reclaim`]; an operator's [`engine::force_release`] of one
//!   client, or [`engine::delete_key`] of a whole key; the [`engine::holders`] view; settings changes →
//!   [`Semaphores::set_key_config`] and friends.
//!
//! Invariants kept after every operation (checked by the property tests):
//! - with `strict`, `under` or no leases, outstanding grant permits plus live
//!   lease footprint never exceed the limit, except that lowering the limit
//!   evicts nothing (nothing new is granted until usage is below it again);
//!   with `over`, never above `limit + extra`;
//! - reports are cumulative and clamped: applying one twice equals once, and
//!   no report frees capacity twice;
//! - ids and fences come from the log index, never from a random source.

pub mod config;
pub mod contract;
pub mod engine;
pub mod ids;
pub mod limits;
pub mod shard;
pub mod tokens;

pub use config::{GroupConfig, KeyConfig, KeyConfigUpdate, LeasePolicy, Provisioning};
pub use contract::validate::InvalidInput;
pub use engine::lifecycle::Event;
pub use engine::semaphores::{KeyLimitReached, Semaphores, StateChanges};
pub use engine::usage::Usage;
pub use ids::{GrantId, IdAllocator, LeaseId, LogIndex};
pub use shard::{shard_of, ShardCountOutOfRange, MAX_SHARDS};
