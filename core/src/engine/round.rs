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

use crate::config::KeyConfig;
use crate::contract::protocol::{
    Blocked, BlockedReason, Demand, GrantResult, GrantedPermits, LeaseGrant, PermitGrant,
    PermitRequest, V1,
};
use crate::engine::leases::{
    allocate_leases, apply_lease_reports, LeaseCandidate, LeaseReports, LeaseRound,
};
use crate::engine::lifecycle::Event;
use crate::engine::reclaim::{forget_answers, reclaim_expired};
use crate::engine::replay::{dispositions, remember, worth_remembering, Disposition};
use crate::engine::reports::apply_grant_reports;
use crate::engine::state::{Grant, KeyState};
use crate::engine::usage::{usage, Usage};
use crate::ids::IdAllocator;

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

/// What the steps of one round share: the key's state and configuration, the
/// entry's id source and clock, the requests in arrival order, and what the
/// round builds up as it goes. One value the steps borrow, instead of the same
/// seven arguments handed from step to step.
struct Round<'a> {
    state: &'a mut KeyState,
    config: &'a KeyConfig,
    ids: &'a mut IdAllocator,
    now_ms: u64,
    requests: &'a [PermitRequest],
    /// Each fresh request's answer, by position, while the round builds it.
    allocations: BTreeMap<usize, Allocation>,
    /// What this round's lease reports said (the lease pass reads it).
    lease_reports: LeaseReports,
    events: Vec<Event>,
}

/// Runs one round of `requests` (in arrival order) at `now_ms`.
pub fn run_round(
    state: &mut KeyState,
    config: &KeyConfig,
    ids: &mut IdAllocator,
    now_ms: u64,
    requests: &[PermitRequest],
) -> RoundOutcome {
    // Forget answers past their time first, so a retry after the claim deadline
    // is a new request.
    forget_answers(state, now_ms);
    let plan = dispositions(state, requests);
    let mut round = Round {
        state,
        config,
        ids,
        now_ms,
        requests,
        allocations: BTreeMap::new(),
        lease_reports: LeaseReports::default(),
        events: Vec::new(),
    };
    round.apply_reports(&plan);
    reclaim_expired(round.state, now_ms, &mut round.events);
    let grants_pass = round.allocate_grants();
    let contended = round.lease_pass()
        || (config.leases.is_some() && grants_pass.blocked_by_limit && config.budgets().shared);
    if round.state.meta().contended != contended {
        round.state.meta_mut().contended = contended;
    }
    let usage = usage(round.state, config, now_ms);
    round.events.push(Event::Round {
        timestamp_ms: now_ms,
        requested: grants_pass.requested,
        granted: grants_pass.granted,
        usage: usage.clone(),
    });
    let blocked = round.blocked_events();
    round.events.extend(blocked);
    let (answers, events) = round.answer_all(plan, contended);
    RoundOutcome {
        answers,
        events,
        requested: grants_pass.requested,
        granted: grants_pass.granted,
        usage,
        contended,
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

impl<'a> Round<'a> {
    /// Applies every fresh request's grant and lease reports, in arrival order,
    /// and starts its answer with their results.
    fn apply_reports(&mut self, plan: &[Disposition]) {
        let requests = self.requests;
        for (position, request) in requests.iter().enumerate() {
            if plan[position] != Disposition::Fresh {
                continue;
            }
            let allocation = self.apply_request_reports(request);
            self.allocations.insert(position, allocation);
        }
    }

    fn apply_request_reports(&mut self, request: &PermitRequest) -> Allocation {
        let grant_results = apply_grant_reports(
            self.state,
            &request.client_id,
            &request.grants,
            self.now_ms,
            &mut self.events,
        );
        let leases = match &request.leases {
            Some(reports) => apply_lease_reports(
                self.state,
                self.config.leases.as_ref(),
                &request.client_id,
                reports,
                self.now_ms,
                &mut self.lease_reports,
                &mut self.events,
            ),
            None => Vec::new(),
        };
        Allocation {
            grant_results,
            leases,
            ..Allocation::default()
        }
    }

    /// Grants demand oldest first: the group gate, then the key's room.
    fn allocate_grants(&mut self) -> GrantsPass {
        let tally = self.state.tally();
        let mut room = self
            .config
            .budgets()
            .grant_room(tally.granted, tally.leased);
        let mut pass = GrantsPass::default();
        for (position, request, demand) in self.demands_oldest_first() {
            pass.requested += demand.count;
            let policy = self.state.meta().group_policy(&demand.group);
            if let Some(reason) = policy.blocked {
                self.block(position, &demand.group, reason);
                continue;
            }
            let group_room = self.group_room(&demand.group, policy.limit);
            let give = (demand.count as i64).min(group_room).min(room).max(0) as u64;
            if give > 0 {
                self.grant(position, request, &demand.group, give);
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
                self.block(position, &demand.group, reason);
            }
        }
        pass
    }

    /// Every fresh request's demand, oldest first (by `oldestAt`, then
    /// clientId as bytes); stable, so equal ones keep arrival order.
    fn demands_oldest_first(&self) -> Vec<(usize, &'a PermitRequest, &'a Demand)> {
        let requests = self.requests;
        let mut demands: Vec<(usize, &PermitRequest, &Demand)> = self
            .allocations
            .keys()
            .flat_map(|&position| {
                requests[position]
                    .demand
                    .iter()
                    .map(move |demand| (position, &requests[position], demand))
            })
            .collect();
        demands.sort_by(|a, b| {
            (a.2.oldest_at_ms, a.1.client_id.as_bytes())
                .cmp(&(b.2.oldest_at_ms, b.1.client_id.as_bytes()))
        });
        demands
    }

    /// What a group's cap leaves. A capped group's room counts its lease
    /// footprint too, so grants plus leases never pass the cap.
    fn group_room(&self, group: &str, limit: Option<u64>) -> i64 {
        limit.map_or(i64::MAX, |limit| {
            let used = self
                .state
                .tally()
                .groups
                .get(group)
                .map_or(0, |group| group.granted + group.leased);
            limit as i64 - used as i64
        })
    }

    /// Creates a grant of `permits` for the request at `position`.
    fn grant(&mut self, position: usize, request: &PermitRequest, group: &str, permits: u64) {
        let id = self.ids.grant_id();
        let grant = Grant {
            client_id: request.client_id.clone(),
            group: group.to_owned(),
            permits,
            claimed: 0,
            released: 0,
            created_at_ms: self.now_ms,
            claim_deadline_ms: self.now_ms + self.config.grant_timeout_ms,
            fence: self.ids.log_index(),
        };
        self.state.put_grant(id, Some(grant));
        let fence = self.ids.log_index();
        self.allocation(position).grants.push(GrantedPermits {
            grant_id: id,
            group: group.to_owned(),
            permits,
            fence,
        });
    }

    fn block(&mut self, position: usize, group: &str, reason: BlockedReason) {
        self.allocation(position).blocked.push(Blocked {
            group: group.to_owned(),
            reason,
        });
    }

    fn allocation(&mut self, position: usize) -> &mut Allocation {
        self.allocations.get_mut(&position).expect("fresh request")
    }

    /// Runs the lease pass and merges its echoes into the answers of lease
    /// clients. Returns whether lease demand went unserved.
    fn lease_pass(&mut self) -> bool {
        let policy = self.config.leases.as_ref();
        if policy.is_none() && self.state.leases().is_empty() {
            return false;
        }
        let requests = self.requests;
        let candidates = self
            .allocations
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
        let lease_round = LeaseRound {
            policy,
            budget: self
                .config
                .budgets()
                .lease_budget(self.state.tally().granted),
            reports: &self.lease_reports,
            claim_timeout_ms: self.config.grant_timeout_ms,
            candidates,
            now_ms: self.now_ms,
        };
        let outcome = allocate_leases(self.state, lease_round, self.ids, &mut self.events);
        for (&position, allocation) in self.allocations.iter_mut() {
            if let Some(echoes) = outcome.echoes.get(&requests[position].client_id) {
                merge_echoes(&mut allocation.leases, echoes);
            }
        }
        outcome.unserved
    }

    /// Permits left queued per (group, reason) across the round's answers.
    fn blocked_events(&self) -> Vec<Event> {
        let mut counts: BTreeMap<(&str, BlockedReason), u64> = BTreeMap::new();
        for (&position, allocation) in &self.allocations {
            for blocked in &allocation.blocked {
                let demanded = self.requests[position]
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
                timestamp_ms: self.now_ms,
                group: group.to_owned(),
                reason,
                count,
            })
            .collect()
    }

    /// Builds every request's answer and remembers those with a requestId that
    /// matter (see [`worth_remembering`]); hands back the answers and the
    /// round's events.
    fn answer_all(
        mut self,
        plan: Vec<Disposition>,
        contended: bool,
    ) -> (Vec<PermitGrant>, Vec<Event>) {
        let log_index = self.ids.log_index();
        let mut answers: Vec<PermitGrant> = Vec::with_capacity(self.requests.len());
        for (position, disposition) in plan.into_iter().enumerate() {
            let answer = match disposition {
                Disposition::Replay(answer) => answer,
                Disposition::SameAs(first) => answers[first].clone(),
                Disposition::Fresh => self.answer_fresh(position, contended, log_index),
            };
            answers.push(answer);
        }
        (answers, self.events)
    }

    fn answer_fresh(&mut self, position: usize, contended: bool, log_index: u64) -> PermitGrant {
        let request = &self.requests[position];
        let allocation = self.allocations.remove(&position).expect("fresh request");
        let answer = PermitGrant {
            v: V1,
            grants: allocation.grants,
            blocked: allocation.blocked,
            grant_results: allocation.grant_results,
            contended: request.leases.is_some() && contended,
            leases: request.leases.is_some().then_some(allocation.leases),
            next_request_at_ms: self.now_ms + self.config.round_period_ms,
        };
        if worth_remembering(&answer, log_index) {
            let deadline_ms = self.now_ms + self.config.grant_timeout_ms;
            remember(self.state, request, &answer, deadline_ms);
        }
        answer
    }
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
