//! What a key holds right now: the answer of `GET .../usage` and of each round.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::KeyConfig;
use crate::engine::state::{Grant, KeyState};

/// A key's limit, outstanding permits, lease footprint and room left for grants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub limit: u64,
    /// Permits granted and not released, unclaimed ones included. May exceed
    /// `limit` after it was lowered: running work is never evicted.
    pub granted: u64,
    /// Live lease footprint: lease permits not yet released.
    pub leased: u64,
    /// Permits grants may still receive under the provisioning mode.
    pub available: u64,
    /// Groups with live grants.
    pub groups: BTreeMap<String, GroupUsage>,
}

/// One group's outstanding grant permits and its cap, if it has one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupUsage {
    pub granted: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// The counts of a key's [`Usage`], without its groups: what the node's
/// all-keys gauges add up, with no allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageCounts {
    pub granted: u64,
    pub leased: u64,
    pub available: u64,
}

impl std::ops::AddAssign for UsageCounts {
    fn add_assign(&mut self, other: Self) {
        self.granted += other.granted;
        self.leased += other.leased;
        self.available += other.available;
    }
}

/// Usage of `state` at `now_ms`, counting unclaimed permits past their claim
/// deadline as already reclaimed, and unacknowledged leases
/// past theirs likewise. Costs the number of groups
/// plus the number of such overdue grants, not the number of grants.
pub fn usage(state: &KeyState, config: &KeyConfig, now_ms: u64) -> Usage {
    let tally = state.tally();
    let mut groups: BTreeMap<String, GroupUsage> = tally
        .groups
        .iter()
        .filter(|(_, group)| group.grants > 0)
        .map(|(name, group)| {
            let limit = state.meta().group_policy(name).limit;
            (
                name.clone(),
                GroupUsage {
                    granted: group.granted,
                    limit,
                },
            )
        })
        .collect();
    for (grant, overdue) in overdue_grants(state, now_ms) {
        if let Some(group) = groups.get_mut(&grant.group) {
            group.granted -= overdue;
        }
    }
    let counts = counts(state, config, now_ms);
    Usage {
        limit: config.limit,
        granted: counts.granted,
        leased: counts.leased,
        available: counts.available,
        groups,
    }
}

/// [`usage`] less the groups. Costs the number of overdue grants and leases.
pub fn counts(state: &KeyState, config: &KeyConfig, now_ms: u64) -> UsageCounts {
    let tally = state.tally();
    let mut granted = tally.granted;
    for (_, overdue) in overdue_grants(state, now_ms) {
        granted -= overdue;
    }
    let mut leased = tally.leased;
    let overdue_leases = ..=(now_ms, crate::ids::LeaseId(uuid::Uuid::max()));
    for (_, id) in tally.lease_claim_deadlines.range(overdue_leases) {
        leased -= state.leases()[id].footprint();
    }
    UsageCounts {
        granted,
        leased,
        available: grant_room(config, granted, leased),
    }
}

/// Grants past their claim deadline at `now_ms`, with their unclaimed permits.
fn overdue_grants(state: &KeyState, now_ms: u64) -> impl Iterator<Item = (&Grant, u64)> {
    let overdue = ..=(now_ms, crate::ids::GrantId(uuid::Uuid::max()));
    state.tally().claim_deadlines.range(overdue).map(|(_, id)| {
        let grant = &state.grants()[id];
        (grant, grant.permits - grant.claimed)
    })
}

/// Permits grants may still receive given what is granted and leased.
pub fn grant_room(config: &KeyConfig, granted: u64, leased: u64) -> u64 {
    config.budgets().grant_room(granted, leased).max(0) as u64
}
