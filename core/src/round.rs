//! One allocation round of one key, as a pure function (docs/protocol.md, "A
//! round, in order").
//!
//! In order: requests that retry a remembered `requestId` are set aside; every
//! other request's grant and lease reports are applied in arrival order; grants
//! past their claim deadline are reclaimed; demand is granted oldest first (by
//! `oldestAt`, then clientId as bytes) under the group gate and then the key's
//! room; leases share what is left. Time and ids come from the caller (the log
//! entry), iteration is ordered, and nothing else is read: the same state and
//! inputs always give the same state and answers.

use std::collections::BTreeMap;

use crate::answers::{dispositions, remember, worth_remembering, Disposition};
use crate::config::KeyConfig;
use crate::events::Event;
use crate::ids::IdAllocator;
use crate::leases::{
    allocate_leases, apply_lease_reports, LeaseCandidate, LeaseReports, LeaseRound,
};
use crate::protocol::{
    Blocked, BlockedReason, GrantResult, GrantedPermits, LeaseGrant, PermitGrant, PermitRequest, V1,
};
use crate::reclaim::{forget_answers, reclaim_expired};
use crate::reports::apply_grant_reports;
use crate::state::{Grant, KeyState};
use crate::usage::{usage, Usage};

/// What a round did: one answer per request, in request order, and its events.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundOutcome {
    pub answers: Vec<PermitGrant>,
    pub events: Vec<Event>,
    /// Permits asked for and handed out by grants in this round.
    pub requested: u64,
    pub granted: u64,
    pub usage: Usage,
    pub contended: bool,
}

/// One fresh request's answer while the round builds it.
#[derive(Debug, Default)]
struct Allocation {
    grants: Vec<GrantedPermits>,
    blocked: Vec<Blocked>,
    grant_results: Vec<GrantResult>,
    leases: Vec<LeaseGrant>,
}

/// Runs one round of `requests` (in arrival order) at `now_ms`.
pub fn run_round(
    state: &mut KeyState,
    config: &KeyConfig,
    ids: &mut IdAllocator,
    now_ms: u64,
    requests: &[PermitRequest],
) -> RoundOutcome {
    let mut events = Vec::new();
    // Forget answers past their time first, so a retry after the claim deadline
    // is a new request.
    forget_answers(state, now_ms);
    let plan = dispositions(state, requests);
    let mut allocations: BTreeMap<usize, Allocation> = BTreeMap::new();
    let mut lease_reports = LeaseReports::default();
    for (position, request) in requests.iter().enumerate() {
        if plan[position] != Disposition::Fresh {
            continue;
        }
        let allocation = apply_reports(
            state,
            config,
            request,
            now_ms,
            &mut lease_reports,
            &mut events,
        );
        allocations.insert(position, allocation);
    }
    reclaim_expired(state, now_ms, &mut events);

    let grants_pass = allocate_grants(state, config, ids, now_ms, requests, &mut allocations);
    let contended =
        lease_pass(
            state,
            config,
            ids,
            now_ms,
            requests,
            &lease_reports,
            &mut allocations,
            &mut events,
        ) || (config.leases.is_some() && grants_pass.blocked_by_limit && config.budgets().shared);
    if state.meta().contended != contended {
        state.meta_mut().contended = contended;
    }

    let usage = usage(state, config, now_ms);
    events.push(Event::Round {
        timestamp_ms: now_ms,
        requested: grants_pass.requested,
        granted: grants_pass.granted,
        usage: usage.clone(),
    });
    events.extend(blocked_events(requests, &allocations, now_ms));
    let answers = answer_all(
        state,
        config,
        now_ms,
        ids.log_index(),
        requests,
        plan,
        allocations,
        contended,
    );
    RoundOutcome {
        answers,
        events,
        requested: grants_pass.requested,
        granted: grants_pass.granted,
        usage,
        contended,
    }
}

fn apply_reports(
    state: &mut KeyState,
    config: &KeyConfig,
    request: &PermitRequest,
    now_ms: u64,
    lease_reports: &mut LeaseReports,
    events: &mut Vec<Event>,
) -> Allocation {
    let grant_results =
        apply_grant_reports(state, &request.client_id, &request.grants, now_ms, events);
    let leases = match &request.leases {
        Some(reports) => apply_lease_reports(
            state,
            config.leases.as_ref(),
            &request.client_id,
            reports,
            now_ms,
            lease_reports,
            events,
        ),
        None => Vec::new(),
    };
    Allocation {
        grant_results,
        leases,
        ..Allocation::default()
    }
}

/// Totals of the grant pass.
#[derive(Debug, Default)]
struct GrantsPass {
    requested: u64,
    granted: u64,
    /// Some demand was held back by the key's limit (not a group's).
    blocked_by_limit: bool,
}

/// Grants demand oldest first: the group gate, then the key's room.
fn allocate_grants(
    state: &mut KeyState,
    config: &KeyConfig,
    ids: &mut IdAllocator,
    now_ms: u64,
    requests: &[PermitRequest],
    allocations: &mut BTreeMap<usize, Allocation>,
) -> GrantsPass {
    let mut room = config
        .budgets()
        .grant_room(state.tally().granted, state.tally().leased);

    let mut demands: Vec<(usize, &PermitRequest, &crate::protocol::Demand)> = allocations
        .keys()
        .flat_map(|&position| {
            requests[position]
                .demand
                .iter()
                .map(move |demand| (position, &requests[position], demand))
        })
        .collect();
    // Stable: equal (oldestAt, clientId) keep arrival order.
    demands.sort_by(|a, b| {
        (a.2.oldest_at_ms, a.1.client_id.as_bytes())
            .cmp(&(b.2.oldest_at_ms, b.1.client_id.as_bytes()))
    });

    let mut pass = GrantsPass::default();
    for (position, request, demand) in demands {
        pass.requested += demand.count;
        let allocation = allocations.get_mut(&position).expect("fresh request");
        let policy = state.meta().group_policy(&demand.group);
        if let Some(reason) = policy.blocked {
            allocation.blocked.push(Blocked {
                group: demand.group.clone(),
                reason,
            });
            continue;
        }
        // A capped group's room counts its lease footprint too, so grants plus
        // leases never pass the cap.
        let group_room = policy.limit.map_or(i64::MAX, |limit| {
            let used = state
                .tally()
                .groups
                .get(&demand.group)
                .map_or(0, |group| group.granted + group.leased);
            limit as i64 - used as i64
        });
        let give = (demand.count as i64).min(group_room).min(room).max(0) as u64;
        if give > 0 {
            let id = ids.grant_id();
            let grant = Grant {
                client_id: request.client_id.clone(),
                group: demand.group.clone(),
                permits: give,
                claimed: 0,
                released: 0,
                created_at_ms: now_ms,
                claim_deadline_ms: now_ms + config.grant_timeout_ms,
                fence: ids.log_index(),
            };
            state.put_grant(id, Some(grant));
            allocation.grants.push(GrantedPermits {
                grant_id: id,
                group: demand.group.clone(),
                permits: give,
                fence: ids.log_index(),
            });
            room -= give as i64;
            pass.granted += give;
        }
        if give < demand.count {
            // The group gate is checked first so attribution names the tighter one.
            let reason = if group_room - give as i64 <= 0 {
                BlockedReason::GroupLimit
            } else {
                BlockedReason::Limit
            };
            pass.blocked_by_limit |= reason == BlockedReason::Limit;
            allocation.blocked.push(Blocked {
                group: demand.group.clone(),
                reason,
            });
        }
    }
    pass
}

/// Runs the lease pass and merges its echoes into the answers of lease clients.
/// Returns whether lease demand went unserved.
#[allow(clippy::too_many_arguments)]
fn lease_pass(
    state: &mut KeyState,
    config: &KeyConfig,
    ids: &mut IdAllocator,
    now_ms: u64,
    requests: &[PermitRequest],
    lease_reports: &LeaseReports,
    allocations: &mut BTreeMap<usize, Allocation>,
    events: &mut Vec<Event>,
) -> bool {
    let policy = config.leases.as_ref();
    if policy.is_none() && state.leases().is_empty() {
        return false;
    }
    let budget = config.budgets().lease_budget(state.tally().granted);
    let candidates = allocations
        .keys()
        .map(|&position| &requests[position])
        .filter(|request| request.leases.is_some())
        .flat_map(|request| {
            request
                .demand
                .iter()
                .filter(|demand| demand.count > 0)
                .map(|demand| LeaseCandidate {
                    client_id: &request.client_id,
                    group: &demand.group,
                    oldest_at_ms: demand.oldest_at_ms,
                })
        })
        .collect();
    let round = LeaseRound {
        policy,
        budget,
        reports: lease_reports,
        claim_timeout_ms: config.grant_timeout_ms,
        candidates,
        now_ms,
    };
    let outcome = allocate_leases(state, round, ids, events);
    for (&position, allocation) in allocations.iter_mut() {
        if let Some(echoes) = outcome.echoes.get(&requests[position].client_id) {
            merge_echoes(&mut allocation.leases, echoes);
        }
    }
    outcome.unserved
}

/// One echo per lease: the allocator's view (e.g. retired) supersedes the report's.
fn merge_echoes(answer: &mut Vec<LeaseGrant>, echoes: &[LeaseGrant]) {
    let mut index: BTreeMap<String, usize> = answer
        .iter()
        .enumerate()
        .map(|(position, lease)| (lease.lease_id.clone(), position))
        .collect();
    for echo in echoes {
        match index.get(&echo.lease_id) {
            Some(&position) => answer[position] = echo.clone(),
            None => {
                index.insert(echo.lease_id.clone(), answer.len());
                answer.push(echo.clone());
            }
        }
    }
}

/// Permits left queued per (group, reason) across the round's answers.
fn blocked_events(
    requests: &[PermitRequest],
    allocations: &BTreeMap<usize, Allocation>,
    now_ms: u64,
) -> Vec<Event> {
    let mut counts: BTreeMap<(&str, BlockedReason), u64> = BTreeMap::new();
    for (&position, allocation) in allocations {
        for blocked in &allocation.blocked {
            let demanded = requests[position]
                .demand
                .iter()
                .find(|demand| demand.group == blocked.group)
                .map_or(0, |demand| demand.count);
            let given: u64 = allocation
                .grants
                .iter()
                .filter(|grant| grant.group == blocked.group)
                .map(|grant| grant.permits)
                .sum();
            *counts.entry((&blocked.group, blocked.reason)).or_default() +=
                demanded.saturating_sub(given);
        }
    }
    counts
        .into_iter()
        .map(|((group, reason), count)| Event::Blocked {
            timestamp_ms: now_ms,
            group: group.to_owned(),
            reason,
            count,
        })
        .collect()
}

/// Builds every request's answer and remembers those with a requestId that
/// matter (see [`worth_remembering`]).
#[allow(clippy::too_many_arguments)]
fn answer_all(
    state: &mut KeyState,
    config: &KeyConfig,
    now_ms: u64,
    log_index: u64,
    requests: &[PermitRequest],
    plan: Vec<Disposition>,
    mut allocations: BTreeMap<usize, Allocation>,
    contended: bool,
) -> Vec<PermitGrant> {
    let mut answers: Vec<PermitGrant> = Vec::with_capacity(requests.len());
    for (position, disposition) in plan.into_iter().enumerate() {
        let answer = match disposition {
            Disposition::Replay(answer) => answer,
            Disposition::SameAs(first) => answers[first].clone(),
            Disposition::Fresh => {
                let request = &requests[position];
                let allocation = allocations.remove(&position).expect("fresh request");
                let answer = PermitGrant {
                    v: V1,
                    grants: allocation.grants,
                    blocked: allocation.blocked,
                    grant_results: allocation.grant_results,
                    contended: request.leases.is_some() && contended,
                    leases: request.leases.is_some().then_some(allocation.leases),
                    next_request_at_ms: now_ms + config.round_period_ms,
                };
                if worth_remembering(&answer, log_index) {
                    remember(state, request, &answer, now_ms + config.grant_timeout_ms);
                }
                answer
            }
        };
        answers.push(answer);
    }
    answers
}
