//! The claim deadline: unclaimed permits return to the pool.
//!
//! Runs at the start of every round and as its own log entry when the leader's
//! timer for the earliest claim deadline fires. Uses the claim
//! deadline index, so its cost is the number of grants reclaimed, not held.
//!
//! Leases have a claim deadline too: a lease its client never
//! reported by then is deleted. The client draws from a lease only once a report
//! of it was answered, so nothing can be running under such a lease; without
//! this, a lease whose reply was lost would hold its footprint forever.

use crate::engine::leases::reclaim_unacknowledged;
use crate::engine::lifecycle::Event;
use crate::engine::reports::reclaimed_event;
use crate::engine::state::{Grant, KeyState};

/// Shrinks every grant whose claim deadline has passed to its claimed count,
/// deleting it when that is all released. Also forgets remembered answers whose
/// grants can no longer be claimed.
pub fn reclaim_expired(state: &mut KeyState, now_ms: u64, events: &mut Vec<Event>) {
    while let Some(&(deadline_ms, id)) = state.tally().claim_deadlines.first() {
        if deadline_ms > now_ms {
            break;
        }
        let grant = state.grants()[&id].clone();
        events.push(reclaimed_event(id, &grant, now_ms));
        let shrunk = Grant {
            permits: grant.claimed,
            ..grant
        };
        let keep = shrunk.released < shrunk.permits;
        state.put_grant(id, keep.then_some(shrunk));
    }
    while let Some(&(deadline_ms, id)) = state.tally().lease_claim_deadlines.first() {
        if deadline_ms > now_ms {
            break;
        }
        reclaim_unacknowledged(state, id, now_ms, events);
    }
    forget_answers(state, now_ms);
}

/// Forgets remembered answers whose grants can no longer be claimed.
pub(crate) fn forget_answers(state: &mut KeyState, now_ms: u64) {
    while let Some((forget_at_ms, client_id, request_id)) =
        state.tally().answer_expiries.first().cloned()
    {
        if forget_at_ms > now_ms {
            break;
        }
        state.put_answer(&client_id, &request_id, None);
    }
}
