//! Who holds what on one key: the answer of `GET /v1/semaphores/{key}/holders`.
//!
//! Per clientId, in byte order: its grants (permits, claimed, released, claim
//! deadline, fence), its leases (permits, drawn, released, expiry, retired) and
//! the demand it has waiting for the key's next round. Grants and leases come
//! from the replicated state through [`KeyState::grants`] and
//! [`KeyState::leases`] only; waiting demand lives on the leader, outside the
//! state, and is passed in.
//!
//! The view is as big as the state it shows: the grants and leases of one key
//! (bounded by the key's limit and the leases' permits) and one waiting entry per
//! (client, group) (bounded by the pending requests per key times their demand).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::contract::protocol::PermitRequest;
use crate::engine::state::KeyState;
use crate::ids::{GrantId, LeaseId, LogIndex};

/// Every client's footprint and waiting demand on one key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyHolders {
    pub key: String,
    /// By clientId, in byte order.
    pub clients: BTreeMap<String, ClientHolding>,
}

/// One client's grants, leases and waiting demand on a key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientHolding {
    pub grants: Vec<HeldGrant>,
    pub leases: Vec<HeldLease>,
    /// Demand parked on the leader for the next round, summed per group.
    pub waiting: Vec<WaitingDemand>,
}

// Its schema keeps the name the API has always described it by; the Rust
// name differs from the client queue's own `GrantHolding`.
/// One grant as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = GrantHolding)]
pub struct HeldGrant {
    pub grant_id: GrantId,
    pub group: String,
    pub permits: u64,
    pub claimed: u64,
    pub released: u64,
    pub claim_deadline_ms: u64,
    pub fence: LogIndex,
}

// Its schema keeps the name the API has always described it by; the Rust
// name differs from the client queue's own `LeaseHolding`.
/// One lease as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = LeaseHolding)]
pub struct HeldLease {
    pub lease_id: LeaseId,
    pub group: String,
    pub permits: u64,
    pub drawn: u64,
    pub released: u64,
    pub expires_at_ms: u64,
    pub retired: bool,
    pub acknowledged: bool,
}

/// Permits of one group a client waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitingDemand {
    pub group: String,
    /// Summed over the client's parked requests.
    pub count: u64,
    /// Requests of this client naming this group.
    pub requests: u64,
}

/// The holders of `key`: the state's grants and leases (none when the state
/// holds nothing for it) plus the demand of the requests `waiting` for a round.
pub fn holders(key: &str, state: Option<&KeyState>, waiting: &[PermitRequest]) -> KeyHolders {
    let mut clients: BTreeMap<String, ClientHolding> = BTreeMap::new();
    for (grant_id, grant) in state.into_iter().flat_map(|state| state.grants()) {
        let holding = clients.entry(grant.client_id.clone()).or_default();
        holding.grants.push(HeldGrant {
            grant_id: *grant_id,
            group: grant.group.clone(),
            permits: grant.permits,
            claimed: grant.claimed,
            released: grant.released,
            claim_deadline_ms: grant.claim_deadline_ms,
            fence: grant.fence,
        });
    }
    for (lease_id, lease) in state.into_iter().flat_map(|state| state.leases()) {
        let holding = clients.entry(lease.client_id.clone()).or_default();
        holding.leases.push(HeldLease {
            lease_id: *lease_id,
            group: lease.group.clone(),
            permits: lease.permits,
            drawn: lease.drawn,
            released: lease.released,
            expires_at_ms: lease.expires_at_ms,
            retired: lease.retired,
            acknowledged: lease.acknowledged,
        });
    }
    let mut demand: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    for request in waiting {
        for wanted in request.demand.iter().filter(|wanted| wanted.count > 0) {
            let entry = demand
                .entry((request.client_id.as_str(), wanted.group.as_str()))
                .or_default();
            entry.0 = entry.0.saturating_add(wanted.count);
            entry.1 += 1;
        }
    }
    for ((client_id, group), (count, requests)) in demand {
        let holding = clients.entry(client_id.to_owned()).or_default();
        holding.waiting.push(WaitingDemand {
            group: group.to_owned(),
            count,
            requests,
        });
    }
    KeyHolders {
        key: key.to_owned(),
        clients,
    }
}
