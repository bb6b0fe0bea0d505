//! Lifecycle events (docs/protocol.md, "Events"). Apply returns them; the node
//! emits them (tracing, metrics, the event stream) once the entry is committed
//! and applied. On the wire (`GET /v1/events`) `type` is the snake_case name and
//! the fields are camelCase, like every other body.

use serde::Serialize;

use crate::contract::protocol::BlockedReason;
use crate::engine::usage::Usage;
use crate::ids::{GrantId, LeaseId};

/// Something a round, sync or reclaim pass did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum Event {
    /// One round ran: permits asked for and handed out, and the usage after it.
    Round {
        timestamp_ms: u64,
        requested: u64,
        granted: u64,
        usage: Usage,
    },
    /// Permits of a group that stayed queued, and why.
    Blocked {
        timestamp_ms: u64,
        group: String,
        reason: BlockedReason,
        count: u64,
    },
    /// Unclaimed permits returned to the pool at the claim deadline.
    GrantReclaimed {
        timestamp_ms: u64,
        grant_id: GrantId,
        client_id: String,
        group: String,
        permits: u64,
    },
    /// A new lease.
    LeaseGranted {
        timestamp_ms: u64,
        lease_id: LeaseId,
        client_id: String,
        group: String,
        permits: u64,
    },
    /// A lease its client never acknowledged by its claim deadline was deleted:
    /// the client cannot have drawn from it, so its permits return to the pool.
    LeaseReclaimed {
        timestamp_ms: u64,
        lease_id: LeaseId,
        client_id: String,
        group: String,
        permits: u64,
    },
    /// The holder stopped a lease; `permits` is its undrawn headroom as last reported.
    LeaseRetired {
        timestamp_ms: u64,
        lease_id: LeaseId,
        client_id: String,
        group: String,
        permits: u64,
    },
    /// An operator dropped one client's whole footprint on the key (a runner
    /// that died for good): `permits` is the grant permits plus lease footprint
    /// returned.
    ClientReleased {
        timestamp_ms: u64,
        client_id: String,
        grants: u64,
        leases: u64,
        permits: u64,
    },
    /// An operator deleted the key's settings and state; with `force`, after
    /// releasing its holders (`grants`, `leases` and their `permits`, zeros
    /// for a key that was idle). The key follows the defaults again.
    KeyDeleted {
        timestamp_ms: u64,
        grants: u64,
        leases: u64,
        permits: u64,
    },
}

impl Event {
    /// The event's name in logs and reports.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Round { .. } => "round",
            Self::Blocked { .. } => "blocked",
            Self::GrantReclaimed { .. } => "grant_reclaimed",
            Self::LeaseGranted { .. } => "lease_granted",
            Self::LeaseRetired { .. } => "lease_retired",
            Self::LeaseReclaimed { .. } => "lease_reclaimed",
            Self::ClientReleased { .. } => "client_released",
            Self::KeyDeleted { .. } => "key_deleted",
        }
    }
}
