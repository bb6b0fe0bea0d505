//! `permitd-core`: the wire protocol and the deterministic round engine.
//!
//! Everything here is synchronous, does no IO and reads no clock or random
//! source. The storage crate feeds it log entries; every replica applying the
//! same entries reaches byte-identical state.
//!
//! How data flows:
//! - untrusted bytes → [`validate::parse_request`] (serde shapes in [`protocol`],
//!   limits in [`limits`]) → a [`protocol::SemaphoreRequest`];
//! - a round entry (`now`, requests in arrival order) →
//!   [`Semaphores::round`] → [`round::run_round`], which applies
//!   [`reports`], [`reclaim`]s, grants oldest demand first and runs the
//!   [`leases`] pass → one [`protocol::PermitGrant`] per request plus
//!   [`lifecycle::Event`]s;
//! - a sync → [`sync::run_sync`]; a claim-deadline timer → [`reclaim`]; an
//!   operator's [`force_release`] of one client, or [`delete_key`] of a whole
//!   key; the [`holders`] view;
//!   settings changes → [`Semaphores::set_key_config`] and friends.
//!
//! Invariants kept after every operation (checked by the property tests):
//! - with `strict`, `under` or no leases, outstanding grant permits plus live
//!   lease footprint never exceed the limit, except that lowering the limit
//!   evicts nothing (nothing new is granted until usage is below it again);
//!   with `over`, never above `limit + extra`;
//! - reports are cumulative and clamped: applying one twice equals once, and
//!   no report frees capacity twice;
//! - ids and fences come from the log index, never from a random source.

pub mod answers;
pub mod batch;
pub mod config;
pub mod contract;
pub mod delete_key;
pub mod force_release;
pub mod holders;
pub mod ids;
pub mod leases;
pub mod lifecycle;
pub mod limits;
pub mod protocol;
pub mod reclaim;
pub mod reports;
pub mod restore;
pub mod round;
pub mod semaphores;
pub mod small_map;
pub mod state;
pub mod sync;
pub mod tokens;
pub mod usage;
pub mod validate;

pub use config::{GroupConfig, KeyConfig, KeyConfigUpdate, LeasePolicy, Provisioning};
pub use ids::{GrantId, IdAllocator, LeaseId, LogIndex};
pub use lifecycle::Event;
pub use semaphores::{KeyLimitReached, Semaphores, StateChanges};
pub use usage::Usage;
pub use validate::InvalidInput;
