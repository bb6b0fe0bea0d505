//! `permitd-client`: what job runners embed to queue work under permitd's
//! concurrency budgets, plus the `permitctl` admin tool (`src/bin`).
//!
//! Three ways in:
//! - [`SemaphoreClient`] ([`client`]): every v1 call (request, sync, usage, key and
//!   group configuration, key listing, cluster status) against a list of nodes;
//!   [`client`]'s overview follows one call through its files, and [`admin`]
//!   holds the operator's calls on the cluster (listing, holders, force
//!   release, membership, backups). It remembers the leader, and each shard's
//!   leader for calls about a key ([`leader`], [`shard_leaders`]), retries 429, 502, 503 and 504 answers,
//!   connection failures and timed-out attempts with capped, jittered
//!   exponential backoff ([`backoff`]) inside a per-call deadline, always sends
//!   a `requestId` so a retried request gets the original answer, and honours
//!   each key's `nextRequestAt`.
//! - [`SemaphoreClient::acquire`] and [`SemaphoreClient::with_permit`]
//!   ([`permit`]): one piece of work under a permit; the guard
//!   ([`permit::Permit`]) releases on drop (the queue's [`ItemPermit`] names
//!   what an item was admitted under). [`run`] wraps a
//!   command in one (`permitctl run`).
//! - [`SemaphoreQueue`] ([`queue`]): the job queue. Items `{id, key, group,
//!   body}` wait for a permit; the queue asks each key's holder with its demand
//!   and oldest enqueue time, draws lease permits locally (one per item), claims
//!   grants, admits items through the application's [`Admission`], takes
//!   `release(id)`, recovers lost releases via `finished`, heartbeats, returns
//!   and settles leases, and survives restarts and power cuts through a journal
//!   it `fdatasync`s ([`queue::store`]).
//!
//! Data flow of one admission: `enqueue` → [`queue::state::QueueState`] (pure
//! accounting) → a `request` → the holder's round → grants (claimed by a `sync`)
//! or a lease (drawn locally) → `Admission::admit` → work → `release` → the
//! next report returns the permit.
//!
//! Every HTTP exchange (calls, probes, event streams) is built in `outgoing.rs`
//! and sent through the client's `permitd_transport::Transport`: by default a
//! reqwest client built from the [`ClientConfig`], or one given with
//! [`ClientConfig::with_transport`] (the deterministic simulator's network, a
//! test's in-process fake).
//!
//! The crate depends on `permitd-core` for the wire types only and on
//! `permitd-transport` for the HTTP seam, never on the server crates. Errors:
//! [`ClientError`] for calls, [`QueueError`] for the queue.

pub mod admin;
pub mod backoff;
pub mod client;
pub mod error;
pub mod events;
pub mod leader;
mod outgoing;
pub mod permit;
pub mod queue;
pub mod run;
pub mod shard_leaders;

pub use client::{ClientConfig, ItemResult, SemaphoreClient};
pub use error::{AcquireError, ClientError, QueueError};
pub use permit::AcquireOptions;
pub use permitd_core::contract::batch::BatchItem;
/// The wire shapes the client reads, from the one contract both sides share.
pub use permitd_core::contract::{
    ClusterMember, ClusterStatus, ErrorCode, KeyUsage, MemberRole, ShardMap, ShardStatus,
};
pub use permitd_core::tokens::CreatedToken;
pub use queue::{
    Admission, AdmittedItem, EnqueueOutcome, ItemPermit, ItemStatus, QueueConfig, QueueCounts,
    QueueItem, ReleaseOutcome, SemaphoreQueue, ShutdownReport, StateConfig,
};
