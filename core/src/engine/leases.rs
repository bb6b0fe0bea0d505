//! Leases: blocks of permits a client draws from locally, one per item.
//!
//! Two passes per round, after the grants:
//! - [`apply_lease_reports`] (per request, with the grant reports) heartbeats live
//!   leases, advances the released and drawn high-water marks, settles leases the
//!   client retired, and charges the live footprint of leases the holder does not
//!   know against this round.
//! - [`allocate_leases`] retires expired and no-longer-eligible leases (never
//!   sweeps them: their work may still be running), retires the newest leases with
//!   undrawn headroom while the footprint is over budget, then shares what is left
//!   equally among the oldest candidates that hold no usable headroom.
//!
//! A retired lease keeps its whole footprint until its client's own retired report
//! shrinks it to what was drawn, and is deleted once all of that is released.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::{GroupPolicy, LeasePolicy};
use crate::contract::protocol::{LeaseGrant, LeaseReport};
use crate::engine::lifecycle::Event;
use crate::engine::state::{KeyState, Lease};
use crate::ids::{IdAllocator, LeaseId};

/// What one round learned from lease reports.
#[derive(Debug, Default)]
pub struct LeaseReports {
    /// Live footprint of reported leases the holder does not know, charged this round.
    pub unknown_debt: u64,
    /// Drawn high-water mark of each lease its owner reported this round.
    pub drawn: BTreeMap<LeaseId, u64>,
}

/// The echo of a lease; a retired lease reads as expired so the client stops drawing.
fn echo(id: LeaseId, lease: &Lease, now_ms: u64) -> LeaseGrant {
    LeaseGrant {
        lease_id: id.to_string(),
        group: lease.group.clone(),
        permits: lease.permits,
        expires_at_ms: if lease.retired {
            now_ms
        } else {
            lease.expires_at_ms
        },
    }
}

fn retired_event(id: LeaseId, lease: &Lease, undrawn: u64, now_ms: u64) -> Event {
    Event::LeaseRetired {
        timestamp_ms: now_ms,
        lease_id: id,
        client_id: lease.client_id.clone(),
        group: lease.group.clone(),
        permits: undrawn,
    }
}

/// Applies one client's lease reports; returns one echo per report. `policy` is
/// `None` when leases are off for the key: known leases are then retired.
pub fn apply_lease_reports(
    state: &mut KeyState,
    policy: Option<&LeasePolicy>,
    client_id: &str,
    reports: &[LeaseReport],
    now_ms: u64,
    seen: &mut LeaseReports,
    events: &mut Vec<Event>,
) -> Vec<LeaseGrant> {
    let mut reporting = Reporting {
        state,
        policy,
        now_ms,
        seen,
        events,
    };
    reports
        .iter()
        .map(|report| reporting.apply(client_id, report))
        .collect()
}

/// What applying one client's lease reports reads and writes, report after
/// report: the key's state, its lease policy, the entry's clock, what the
/// round has seen so far and its events.
struct Reporting<'a> {
    state: &'a mut KeyState,
    policy: Option<&'a LeasePolicy>,
    now_ms: u64,
    seen: &'a mut LeaseReports,
    events: &'a mut Vec<Event>,
}

impl Reporting<'_> {
    /// One report: an unknown lease (or another client's) is charged as debt
    /// and echoed as gone; a known one is applied.
    fn apply(&mut self, client_id: &str, report: &LeaseReport) -> LeaseGrant {
        let owned = LeaseId::parse(&report.lease_id)
            .and_then(|id| {
                self.state
                    .leases()
                    .get(&id)
                    .map(|lease| (id, lease.clone()))
            })
            .filter(|(_, lease)| lease.client_id == client_id);
        let Some((id, lease)) = owned else {
            // Client-reported usage is untrusted: clamp it before it touches a budget.
            let live = report.drawn.saturating_sub(report.released);
            self.seen.unknown_debt +=
                live.min(self.policy.map_or(0, |policy| policy.permits_per_lease));
            return LeaseGrant {
                lease_id: report.lease_id.clone(),
                group: String::new(),
                permits: 0,
                expires_at_ms: self.now_ms,
            };
        };
        self.apply_known(id, lease, report)
    }

    fn apply_known(&mut self, id: LeaseId, lease: Lease, report: &LeaseReport) -> LeaseGrant {
        let now_ms = self.now_ms;
        if !lease.acknowledged && lease.claim_deadline_ms <= now_ms && report.drawn == 0 {
            // Acknowledged too late: the client has drawn nothing, so the reclaim the
            // claim deadline called for is safe now. A report with draws keeps the
            // lease instead (below): its permits may be running.
            return reclaim_unacknowledged(self.state, id, now_ms, self.events);
        }
        let drawn = lease.drawn.max(report.drawn.min(lease.permits));
        self.seen.drawn.insert(id, drawn);
        let released = lease.released.max(report.released.min(drawn));
        let expired = lease.expires_at_ms <= now_ms;
        let retired = lease.retired || report.retired || expired || self.policy.is_none();
        if retired && !lease.retired && !report.retired {
            self.events
                .push(retired_event(id, &lease, lease.permits - drawn, now_ms));
        }
        // Only the client's own retired report shrinks a lease to what it drew: until
        // then it may still be drawing, whoever asked it to stop.
        let permits = if report.retired {
            released.max(drawn)
        } else {
            lease.permits
        };
        if released >= permits {
            self.state.put_lease(id, None);
            // Echoed as settled (permits = released) so the client can drop the lease.
            return LeaseGrant {
                lease_id: id.to_string(),
                group: lease.group,
                permits: released,
                expires_at_ms: now_ms,
            };
        }
        let expires_at_ms = match (retired, self.policy) {
            (false, Some(policy)) => now_ms + policy.ttl_ms,
            _ => lease.expires_at_ms,
        };
        let refreshed = Lease {
            permits,
            released,
            drawn,
            retired,
            expires_at_ms,
            acknowledged: true,
            ..lease
        };
        let answer = echo(id, &refreshed, now_ms);
        self.state.put_lease(id, Some(refreshed));
        answer
    }
}

/// Deletes a lease its client never acknowledged; returns the echo that tells the
/// client to drop it (stopped, nothing left).
pub(crate) fn reclaim_unacknowledged(
    state: &mut KeyState,
    id: LeaseId,
    now_ms: u64,
    events: &mut Vec<Event>,
) -> LeaseGrant {
    let lease = state.leases()[&id].clone();
    debug_assert!(!lease.acknowledged && lease.drawn == 0);
    events.push(Event::LeaseReclaimed {
        timestamp_ms: now_ms,
        lease_id: id,
        client_id: lease.client_id.clone(),
        group: lease.group.clone(),
        permits: lease.permits,
    });
    state.put_lease(id, None);
    LeaseGrant {
        lease_id: id.to_string(),
        group: lease.group,
        permits: 0,
        expires_at_ms: now_ms,
    }
}

/// A (client, group) with queued demand that may receive a lease.
#[derive(Debug, Clone)]
pub struct LeaseCandidate<'a> {
    pub client_id: &'a str,
    pub group: &'a str,
    pub oldest_at_ms: u64,
}

/// The inputs of one round's lease pass.
#[derive(Debug)]
pub struct LeaseRound<'a> {
    /// `None` when leases are off: live leases are retired, none are issued.
    pub policy: Option<&'a LeasePolicy>,
    /// Gross lease capacity; the pass nets out live footprint and unknown debt.
    pub budget: u64,
    pub reports: &'a LeaseReports,
    /// How long a new lease may go unacknowledged: the key's `grantTimeoutMs`.
    pub claim_timeout_ms: u64,
    /// In arrival order, then demand order.
    pub candidates: Vec<LeaseCandidate<'a>>,
    pub now_ms: u64,
}

/// What the lease pass did.
#[derive(Debug, Default)]
pub struct LeaseAllocation {
    /// New and retired leases per client.
    pub echoes: BTreeMap<String, Vec<LeaseGrant>>,
    /// Some eligible candidate received no lease.
    pub unserved: bool,
}

impl LeaseAllocation {
    fn push(&mut self, id: LeaseId, lease: &Lease, now_ms: u64) {
        self.echoes
            .entry(lease.client_id.clone())
            .or_default()
            .push(echo(id, lease, now_ms));
    }
}

fn eligible(policy: Option<&LeasePolicy>, group: &GroupPolicy) -> bool {
    policy.is_some_and(|policy| policy.admits(group))
}

/// One round's lease pass. See the module docs.
pub fn allocate_leases(
    state: &mut KeyState,
    round: LeaseRound<'_>,
    ids: &mut IdAllocator,
    events: &mut Vec<Event>,
) -> LeaseAllocation {
    let mut outcome = LeaseAllocation::default();
    retire_expired(state, &round, &mut outcome, events);
    if state.meta().recheck_leases {
        retire_ineligible(state, &round, &mut outcome, events);
        state.meta_mut().recheck_leases = false;
    }
    let Some(policy) = round.policy else {
        return outcome;
    };
    let (chosen, eligible_count) = choose_candidates(state, policy, &round);
    retire_for_lowered_budget(state, &round, &mut outcome, events);
    let issued = issue_leases(state, policy, &round, &chosen, ids, &mut outcome, events);
    outcome.unserved = issued < eligible_count;
    outcome
}

fn retire(
    state: &mut KeyState,
    id: LeaseId,
    undrawn: u64,
    round: &LeaseRound<'_>,
    outcome: &mut LeaseAllocation,
    events: &mut Vec<Event>,
) {
    let lease = Lease {
        retired: true,
        ..state.leases()[&id].clone()
    };
    outcome.push(id, &lease, round.now_ms);
    events.push(retired_event(id, &lease, undrawn, round.now_ms));
    state.put_lease(id, Some(lease));
}

/// An unreported lease is assumed fully drawn: its undrawn headroom is unknown.
fn undrawn(state: &KeyState, round: &LeaseRound<'_>, id: LeaseId) -> u64 {
    let permits = state.leases()[&id].permits;
    permits
        - round
            .reports
            .drawn
            .get(&id)
            .copied()
            .unwrap_or(permits)
            .min(permits)
}

/// An unreported lease is retired, not swept: its client may be cut off with work
/// still running, so its footprint stays until it reports.
fn retire_expired(
    state: &mut KeyState,
    round: &LeaseRound<'_>,
    outcome: &mut LeaseAllocation,
    events: &mut Vec<Event>,
) {
    while let Some(&(expires_at_ms, id)) = state.tally().lease_expiries.first() {
        if expires_at_ms > round.now_ms {
            break;
        }
        let undrawn = undrawn(state, round, id);
        retire(state, id, undrawn, round, outcome, events);
    }
}

/// After a settings change: leases of groups that may no longer hold leases stop.
fn retire_ineligible(
    state: &mut KeyState,
    round: &LeaseRound<'_>,
    outcome: &mut LeaseAllocation,
    events: &mut Vec<Event>,
) {
    let stale: Vec<LeaseId> = state
        .leases()
        .iter()
        .filter(|(_, lease)| {
            !lease.retired && !eligible(round.policy, &state.meta().group_policy(&lease.group))
        })
        .map(|(id, _)| *id)
        .collect();
    for id in stale {
        let undrawn = undrawn(state, round, id);
        retire(state, id, undrawn, round, outcome, events);
    }
}

/// The candidates that may receive a lease, oldest demand first, within
/// `maxClientsPerGroup` and `maxGroups`; and how many were eligible in all.
fn choose_candidates<'a>(
    state: &KeyState,
    policy: &LeasePolicy,
    round: &LeaseRound<'a>,
) -> (Vec<LeaseCandidate<'a>>, usize) {
    // A client still holding undrawn permits of a group gets no second lease there.
    let usable: BTreeSet<(&str, &str)> = round
        .reports
        .drawn
        .iter()
        .filter_map(|(id, drawn)| state.leases().get(id).map(|lease| (lease, *drawn)))
        .filter(|(lease, drawn)| !lease.retired && *drawn < lease.permits)
        .map(|(lease, _)| (lease.client_id.as_str(), lease.group.as_str()))
        .collect();
    let mut by_group: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for candidate in &round.candidates {
        if usable.contains(&(candidate.client_id, candidate.group))
            || !policy.admits(&state.meta().group_policy(candidate.group))
        {
            continue;
        }
        let oldest = by_group
            .entry(candidate.group)
            .or_default()
            .entry(candidate.client_id)
            .or_insert(u64::MAX);
        *oldest = (*oldest).min(candidate.oldest_at_ms);
    }
    let eligible_count = by_group.values().map(BTreeMap::len).sum();
    let mut groups: Vec<(u64, &str, Vec<LeaseCandidate<'a>>)> = by_group
        .into_iter()
        .map(|(group, clients)| {
            let mut clients: Vec<LeaseCandidate<'a>> = clients
                .into_iter()
                .map(|(client_id, oldest_at_ms)| LeaseCandidate {
                    client_id,
                    group,
                    oldest_at_ms,
                })
                .collect();
            clients
                .sort_by(|a, b| (a.oldest_at_ms, a.client_id).cmp(&(b.oldest_at_ms, b.client_id)));
            clients.truncate(policy.max_clients_per_group as usize);
            (clients[0].oldest_at_ms, group, clients)
        })
        .collect();
    groups.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    groups.truncate(policy.max_groups as usize);
    (
        groups
            .into_iter()
            .flat_map(|(_, _, clients)| clients)
            .collect(),
        eligible_count,
    )
}

/// A lowered budget retires leases with undrawn headroom, newest first, until the
/// headroom their clients reported covers the excess. Only leases reported this
/// round have known headroom. Their footprint stays until each client settles.
fn retire_for_lowered_budget(
    state: &mut KeyState,
    round: &LeaseRound<'_>,
    outcome: &mut LeaseAllocation,
    events: &mut Vec<Event>,
) {
    let mut excess =
        (state.tally().leased + round.reports.unknown_debt) as i64 - round.budget as i64;
    if excess <= 0 {
        return;
    }
    let mut live: Vec<(u64, LeaseId, u64)> = round
        .reports
        .drawn
        .iter()
        .filter_map(|(id, drawn)| {
            let lease = state.leases().get(id)?;
            let headroom =
                !lease.retired && lease.expires_at_ms > round.now_ms && *drawn < lease.permits;
            headroom.then_some((lease.created_at_ms, *id, lease.permits - drawn))
        })
        .collect();
    live.sort_by_key(|&(created_at_ms, id, _)| std::cmp::Reverse((created_at_ms, id)));
    for (_, id, undrawn) in live {
        if excess <= 0 {
            break;
        }
        retire(state, id, undrawn, round, outcome, events);
        excess -= undrawn as i64;
    }
}

/// Shares the remaining budget equally: min(permitsPerLease, max(1, remaining /
/// candidates)), so with fewer permits than candidates the oldest get one each.
/// Returns how many leases were issued.
fn issue_leases(
    state: &mut KeyState,
    policy: &LeasePolicy,
    round: &LeaseRound<'_>,
    chosen: &[LeaseCandidate<'_>],
    ids: &mut IdAllocator,
    outcome: &mut LeaseAllocation,
    events: &mut Vec<Event>,
) -> usize {
    let netted = state.tally().leased + round.reports.unknown_debt;
    let mut remaining = round.budget.saturating_sub(netted);
    let share = policy
        .permits_per_lease
        .min((remaining / chosen.len().max(1) as u64).max(1));
    let mut issued = 0;
    for candidate in chosen {
        if remaining == 0 {
            break;
        }
        let permits = share
            .min(remaining)
            .min(group_room(state, candidate.group, share));
        if permits == 0 {
            continue;
        }
        remaining -= permits;
        issued += 1;
        let id = ids.lease_id();
        let lease = Lease {
            client_id: candidate.client_id.to_owned(),
            group: candidate.group.to_owned(),
            permits,
            released: 0,
            drawn: 0,
            created_at_ms: round.now_ms,
            expires_at_ms: round.now_ms + policy.ttl_ms,
            retired: false,
            acknowledged: false,
            claim_deadline_ms: round.now_ms + round.claim_timeout_ms,
        };
        outcome.push(id, &lease, round.now_ms);
        events.push(Event::LeaseGranted {
            timestamp_ms: round.now_ms,
            lease_id: id,
            client_id: lease.client_id.clone(),
            group: lease.group.clone(),
            permits,
        });
        state.put_lease(id, Some(lease));
    }
    issued
}

/// What a capped group's cap leaves after its grants and lease footprint.
fn group_room(state: &KeyState, group: &str, share: u64) -> u64 {
    let Some(limit) = state.meta().group_policy(group).limit else {
        return share;
    };
    let used = state
        .tally()
        .groups
        .get(group)
        .map_or(0, |tally| tally.granted + tally.leased);
    limit.saturating_sub(used)
}
