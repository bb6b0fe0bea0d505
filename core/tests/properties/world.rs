//! The generated world (keys, groups, clients, a lease policy) and the
//! operations a case applies to it: rounds, syncs, reclaims, settings changes and
//! client-local work, with the network noise added to reports.

use super::*;

/// What stays fixed for one case.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub(crate) limits: [u64; 2],
    pub(crate) grant_timeout_ms: u64,
    pub(crate) round_period_ms: u64,
    pub(crate) leases: Option<LeasePolicy>,
    /// Clients that send `leases` in every message.
    pub(crate) lease_clients: [bool; 4],
}

impl Setup {
    pub(crate) fn key_config(&self, limit: u64) -> KeyConfig {
        KeyConfig {
            limit,
            round_wait_ms: 1_000,
            round_period_ms: self.round_period_ms,
            grant_timeout_ms: self.grant_timeout_ms,
            leases: self.leases.clone(),
        }
    }
}

/// The clock of an entry, relative to the largest clock applied so far.
#[derive(Debug, Clone, Copy)]
pub(crate) enum When {
    Later(u64),
    /// Past every claim deadline set so far.
    PastClaimDeadlines,
    /// Past every lease expiry set so far.
    PastLeaseTtl,
    /// A leader with a slower clock: the state must keep its max.
    Earlier(u64),
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// One round entry with requests in arrival order.
    Round {
        key: usize,
        when: When,
        requests: Vec<RequestPlan>,
    },
    Sync {
        key: usize,
        when: When,
        client: usize,
        reports: ReportPlan,
        /// Picks a stale report from the client's history (idempotence property).
        stale: Index,
    },
    /// The leader's claim-deadline timer.
    Reclaim {
        key: usize,
        when: When,
    },
    /// Client-local work between messages: no log entry.
    Work {
        client: usize,
        key: usize,
        steps: Vec<Work>,
    },
    SetLimit {
        key: usize,
        limit: u64,
    },
    SetGroup {
        key: usize,
        group: usize,
        limit: Option<u64>,
        permitted: bool,
    },
    RemoveGroup {
        key: usize,
        group: usize,
    },
    /// Switches the key's lease policy (only where the property allows it).
    SetLeases {
        key: usize,
        leases: Option<LeasePolicy>,
    },
    /// An operator drops one client's footprint; the client, not dead after
    /// all, keeps working and reporting the grants and leases it knew.
    ForceRelease {
        key: usize,
        client: usize,
        when: When,
    },
    /// An operator deletes the key (forced or not); it follows the defaults
    /// after, and its clients, not dead after all, keep reporting what they knew.
    DeleteKey {
        key: usize,
        force: bool,
        when: When,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct RequestPlan {
    pub(crate) client: usize,
    /// (group, count, age of the oldest queued item in ms).
    pub(crate) demand: Vec<(usize, u64, u64)>,
    pub(crate) reports: ReportPlan,
    pub(crate) request_id: RequestIdPlan,
    /// The reply never reaches the client (honoured for clients without leases).
    pub(crate) lose_reply: bool,
    /// The same message arrives twice in this round.
    pub(crate) duplicate: bool,
}

#[derive(Debug, Clone)]
pub(crate) enum RequestIdPlan {
    None,
    Fresh,
    /// Reuses one of the client's earlier requestIds (a retry), with today's body.
    Retry(Index),
}

#[derive(Debug, Clone)]
pub(crate) struct ReportPlan {
    pub(crate) kind: ReportKind,
    pub(crate) noise: Vec<Noise>,
}

#[derive(Debug, Clone)]
pub(crate) enum ReportKind {
    /// The client's current cumulative counts.
    Current,
    /// A report the client sent earlier, replayed (a delayed or retried message).
    Stale(Index),
    /// No reports at all.
    Nothing,
}

/// Reports no honest client of this key would send about its own holdings.
#[derive(Debug, Clone)]
pub(crate) enum Noise {
    /// A well-formed id the holder never minted.
    UnknownGrant(u32, u64, u64),
    UnknownLease(u32, u64, u64),
    /// Not a UUID at all.
    NotAnId,
    /// Another client's live grant, with made-up counts.
    OthersGrant(Index, u64, u64),
    /// Another client's live lease, with made-up counts.
    OthersLease(Index, u64, u64),
}

#[derive(Debug, Clone)]
pub(crate) enum Work {
    Claim(Index, u64),
    Release(Index, u64),
    Draw(Index, u64),
    ReturnDrawn(Index, u64),
    Retire(Index),
}
