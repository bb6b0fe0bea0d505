//! The round engine: every key's replicated state and the pure functions that
//! change it, one log entry at a time (docs/protocol.md, "A round, in order").
//!
//! - [`semaphores`]: every key's state, the cluster defaults and the replicated
//!   clock: the entry points the storage crate's apply calls;
//! - [`state`]: one key's grants, leases, settings and remembered answers, in
//!   [`small_map`]s sized for the few entries a key usually holds;
//! - [`round`]: one allocation round of one key, which applies [`reports`],
//!   [`reclaim`]s what passed its claim deadline, grants oldest demand first and
//!   runs the [`leases`] pass;
//! - [`permit_sync`]: a sync, reports only, applied without a round;
//! - [`replay`]: `requestId` de-duplication, a retry gets the original answer;
//! - [`rehearsal`]: a round on a copy of a key, for a leader to learn that a
//!   round now would serve nobody;
//! - [`force_release`]: an operator drops one client's footprint on a key, and
//!   [`delete_key`] a whole key (releasing its holders first when forced);
//! - [`restore`]: a whole backup written into a new cluster;
//! - views: [`usage`], [`holders`], and the [`lifecycle`] events apply returns.
//!
//! Nothing here reads a clock, a random source or a file: time and ids come
//! from the entry, iteration is ordered.

pub mod delete_key;
pub mod force_release;
pub mod holders;
pub mod leases;
pub mod lifecycle;
pub mod permit_sync;
pub mod reclaim;
pub mod rehearsal;
pub mod replay;
pub mod reports;
pub mod restore;
pub mod round;
pub mod semaphores;
pub mod small_map;
pub mod state;
pub mod usage;
