//! The HTTP contract between a node and its callers, written once.
//!
//! The node serves these shapes and the client (`SemaphoreClient`, `permitctl`)
//! reads them, both from this module, so a renamed field, header, path or error
//! code is a compile error on both sides instead of a silent drift. The
//! configuration bodies live in [`crate::config`] (the engine keeps them too);
//! usage, holders and event bodies in the engine that computes them
//! ([`crate::engine::usage`], [`crate::engine::holders`],
//! [`crate::engine::lifecycle`]). Here:
//!
//! - [`protocol`]: the semaphore messages of `POST /v1/semaphores/{key}`;
//! - [`batch`]: `POST /v1/batch`, many messages in one call;
//! - [`validate`]: every input checked against [`crate::limits`] before it can
//!   reach the engine;
//! - [`paths`]: every route, as the template the node's router takes;
//! - [`headers`]: the header names the cluster adds to calls and answers;
//! - [`errors`]: the error codes, their HTTP statuses and the error body;
//! - [`cluster`]: `/cluster/status` and `/cluster/members`;
//! - [`keys`]: the paged key listing of `GET /v1/semaphores`;
//! - [`health`]: the answers of the open probes `/healthz` and `/readyz`.
//! - [`event_stream`]: the query and records of the event stream `GET /v1/events`.
//!
//! `docs/protocol.md` explains every field.

pub mod batch;
pub mod cluster;
pub mod errors;
pub mod event_stream;
pub mod headers;
pub mod health;
pub mod keys;
pub mod paths;
pub mod protocol;
pub mod validate;

pub use cluster::{
    ClusterMember, ClusterStatus, MemberRole, MembershipChange, ShardMap, ShardStatus,
};
pub use errors::{ErrorAnswer, ErrorBody, ErrorCode};
pub use event_stream::{CursorError, EventCursor, EventQuery, EventRecord};
pub use health::{Health, HealthStatus, Readiness, ReadyStatus, Serving};
pub use keys::{DeleteKeyQuery, KeyList, KeyUsage, ListQuery};
