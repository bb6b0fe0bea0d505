//! Values and steps the accounting tests share: one key, one runner, grant 1
//! and lease `L` in group `wf`.

use permitd_core::contract::protocol::{
    GrantResult, GrantStatus, GrantedPermits, LeaseGrant, PermitGrant, PermitRequest, PermitSync,
    PermitSyncResult, SemaphoreRequest, SemaphoreResponse, V1,
};
use permitd_core::GrantId;

pub use super::Lane;
use super::{Outgoing, QueueItem, QueueState, StateConfig};

pub const KEY: &str = "acct-1";
/// The holder's `nextRequestAt` after a granting answer, from the answer's time.
const NEXT_REQUEST_AFTER_MS: u64 = 2_000;

pub fn queue() -> QueueState<u32> {
    QueueState::new("runner-1", StateConfig::default())
}

pub fn item(id: &str, group: &str) -> QueueItem<u32> {
    QueueItem {
        id: id.into(),
        key: KEY.into(),
        group: group.into(),
        body: 0,
    }
}

pub fn grant_id(n: u128) -> GrantId {
    GrantId(uuid::Uuid::from_u128(n))
}

fn granted(n: u128, group: &str, permits: u64) -> GrantedPermits {
    GrantedPermits {
        grant_id: grant_id(n),
        group: group.into(),
        permits,
        fence: n as u64,
    }
}

pub fn grant_answer(
    grants: Vec<GrantedPermits>,
    leases: Vec<LeaseGrant>,
    next: u64,
) -> SemaphoreResponse {
    SemaphoreResponse::Grant(PermitGrant {
        v: V1,
        grants,
        blocked: vec![],
        grant_results: vec![],
        leases: Some(leases),
        contended: false,
        next_request_at_ms: next,
    })
}

pub fn synced(
    results: Vec<GrantResult>,
    leases: Vec<LeaseGrant>,
    contended: bool,
) -> SemaphoreResponse {
    SemaphoreResponse::Synced(PermitSyncResult {
        v: V1,
        grant_results: results,
        leases: Some(leases),
        contended,
    })
}

fn result(n: u128, claimed: u64, status: GrantStatus) -> GrantResult {
    GrantResult {
        grant_id: grant_id(n).to_string(),
        claimed,
        status,
    }
}

pub fn lease(id: &str, group: &str, permits: u64, expires_at_ms: u64) -> LeaseGrant {
    LeaseGrant {
        lease_id: id.into(),
        group: group.into(),
        permits,
        expires_at_ms,
    }
}

pub fn only(messages: Vec<Outgoing>) -> SemaphoreRequest {
    assert_eq!(messages.len(), 1, "{messages:?}");
    messages.into_iter().next().unwrap().message
}

pub fn as_request(message: SemaphoreRequest) -> PermitRequest {
    match message {
        SemaphoreRequest::Request(request) => request,
        other => panic!("expected a request, got {other:?}"),
    }
}

pub fn as_sync(message: SemaphoreRequest) -> PermitSync {
    match message {
        SemaphoreRequest::Sync(sync) => sync,
        other => panic!("expected a sync, got {other:?}"),
    }
}

pub fn admitted_ids(state: &mut QueueState<u32>) -> Vec<String> {
    state
        .take_admits()
        .into_iter()
        .map(|item| item.id)
        .collect()
}

/// Enqueues `ids` in group `wf` at time 100 and answers the first request
/// with a grant of `permits` (grant 1), then returns the claim sync.
pub fn granted_and_claiming(state: &mut QueueState<u32>, ids: &[&str], permits: u64) -> PermitSync {
    granted_at_1_100(state, ids, permits, 2_100);
    as_sync(only(state.poll(1_100)))
}

/// Enqueues `ids` in group `wf` at time 100 and answers the first request
/// at 1,100 with a grant of `permits` (grant 1) and `next_request_at_ms`.
fn granted_at_1_100(
    state: &mut QueueState<u32>,
    ids: &[&str],
    permits: u64,
    next_request_at_ms: u64,
) {
    let items = ids.iter().map(|id| item(id, "wf")).collect();
    state.enqueue(items, 100).unwrap();
    as_request(only(state.poll(100)));
    let answer = grant_answer(vec![granted(1, "wf", permits)], vec![], next_request_at_ms);
    state.on_answer(KEY, answer, 1_100);
}

/// Answers the sync in flight with the holder's result for grant 1's claim.
pub fn answer_claim(state: &mut QueueState<u32>, claimed: u64, status: GrantStatus, now_ms: u64) {
    state.on_answer(
        KEY,
        synced(vec![result(1, claimed, status)], vec![], false),
        now_ms,
    );
}

/// Answers the request in flight with no permits and the holder's result for
/// the reports of grant 1 it carried (`claimed` confirmed).
pub fn answer_request_reports(state: &mut QueueState<u32>, claimed: u64, now_ms: u64) {
    let mut answer = grant_answer(vec![], vec![], now_ms + NEXT_REQUEST_AFTER_MS);
    if let SemaphoreResponse::Grant(grant) = &mut answer {
        grant.grant_results = vec![result(1, claimed, GrantStatus::Ok)];
    }
    state.on_answer(KEY, answer, now_ms);
}

/// Enqueues `ids` in group `wf` at time 100 and answers the first request
/// with a grant of `permits` (grant 1) whose `nextRequestAt` has passed, so
/// that the next poll both claims it and asks for the rest.
pub fn granted_with_demand_due(state: &mut QueueState<u32>, ids: &[&str], permits: u64) {
    granted_at_1_100(state, ids, permits, 1_000);
}

/// Enqueues `ids` in group `wf` at `now_ms` and answers the first request at
/// once with lease `L` of `permits`, which is then unconfirmed.
pub fn lent(
    state: &mut QueueState<u32>,
    ids: &[&str],
    permits: u64,
    expires_at_ms: u64,
    now_ms: u64,
) {
    let items = ids.iter().map(|id| item(id, "wf")).collect();
    state.enqueue(items, now_ms).unwrap();
    as_request(only(state.poll(now_ms)));
    let lent = lease("L", "wf", permits, expires_at_ms);
    let next_request_at_ms = now_ms + NEXT_REQUEST_AFTER_MS;
    state.on_answer(
        KEY,
        grant_answer(vec![], vec![lent], next_request_at_ms),
        now_ms,
    );
}

/// [`lent`], then the claim sync of `L` is answered live at once (same
/// `expiresAt`), which confirms the lease and draws from it for the items.
pub fn leased(
    state: &mut QueueState<u32>,
    ids: &[&str],
    permits: u64,
    expires_at_ms: u64,
    now_ms: u64,
) {
    lent(state, ids, permits, expires_at_ms, now_ms);
    let claim = as_sync(only(state.poll(now_ms)));
    let reported: Vec<(&str, u64, u64)> = claim
        .leases
        .iter()
        .flatten()
        .map(|report| (report.lease_id.as_str(), report.drawn, report.released))
        .collect();
    assert_eq!(reported, [("L", 0, 0)], "the claim of a new lease");
    answer_lease(state, permits, expires_at_ms, now_ms);
}

/// Answers the sync in flight with the holder's echo of lease `L`, not contended.
pub fn answer_lease(state: &mut QueueState<u32>, permits: u64, expires_at_ms: u64, now_ms: u64) {
    state.on_answer(
        KEY,
        synced(
            vec![],
            vec![lease("L", "wf", permits, expires_at_ms)],
            false,
        ),
        now_ms,
    );
}
