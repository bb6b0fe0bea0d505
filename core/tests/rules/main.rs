//! The rules of a round, one named test each, against the public API of
//! `permitd-core` only.
//!
//! Every test drives [`permitd_core::Semaphores`] the way the replicated log
//! does: rounds with increasing log indexes at the leader's `now`, syncs and
//! reclaim passes, through the miniature log in [`support`]. The files follow the
//! sections of `docs/protocol.md`, and the worked examples there are these tests'
//! numbers.

mod grants;
mod leases;
mod provisioning;
mod reclaim;
mod replication;
mod reports;
mod support;
