//! `requestId` de-duplication: a retried request gets the original answer.
//!
//! A holder cannot tell a lost reply from a slow client: without help, a retry
//! after a lost reply gets new grants while the old ones stay reserved until
//! their claim deadline. So the state remembers, per (key, clientId), the answers to its
//! latest requestIds until every grant in them is claimed or past its deadline;
//! a retry with the same requestId takes part in no round and gets that answer.
//!
//! Bounded twice: [`MAX_REMEMBERED_ANSWERS_PER_CLIENT`] per (key, clientId) and
//! [`MAX_REMEMBERED_ANSWERS_PER_KEY`] per key, the answer due to be forgotten
//! first going first. And aged by time alone: an answer's forget time counts as
//! one of the key's deadlines ([`KeyState::next_deadline_ms`]), so the leader's
//! reclaim timer proposes a reclaim entry for it even if the key sees no later
//! round; applying that entry forgets it at the entry's `now`.
//!
//! Only answers that hand something out are remembered: grants, or leases the
//! round minted. A retry of any other answer (blocked, or only echoes and report
//! results) is harmless as a fresh request: its reports are cumulative high-water
//! marks, so applying them again changes nothing, and its demand is simply asked
//! again. A contended key would otherwise write an answer row per blocked
//! request on every node, every round.

use std::collections::BTreeMap;

use crate::contract::protocol::{LeaseGrant, PermitGrant, PermitRequest};
use crate::engine::state::{KeyState, RememberedAnswer};
use crate::ids::{LeaseId, LogIndex};
use crate::limits::{MAX_REMEMBERED_ANSWERS_PER_CLIENT, MAX_REMEMBERED_ANSWERS_PER_KEY};

/// How a request of a round is answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Disposition {
    /// Takes part in the round.
    Fresh,
    /// A retry of an answered request: gets the remembered answer.
    Replay(PermitGrant),
    /// A duplicate of the request at this earlier position of the same round.
    SameAs(usize),
}

/// Decides, in arrival order, which requests of a round are retries.
pub fn dispositions(state: &KeyState, requests: &[PermitRequest]) -> Vec<Disposition> {
    let mut plan = Vec::with_capacity(requests.len());
    let mut first_seen: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for (position, request) in requests.iter().enumerate() {
        let Some(request_id) = &request.request_id else {
            plan.push(Disposition::Fresh);
            continue;
        };
        let remembered = state
            .answers()
            .get(&request.client_id)
            .and_then(|answers| answers.get(request_id));
        let earlier = *first_seen
            .entry((&request.client_id, request_id))
            .or_insert(position);
        let earlier = (earlier != position).then_some(earlier);
        plan.push(match (remembered, earlier) {
            (Some(remembered), _) => Disposition::Replay(remembered.answer.clone()),
            (None, Some(first)) => Disposition::SameAs(first),
            (None, None) => Disposition::Fresh,
        });
    }
    plan
}

/// Whether a fresh answer must be kept for a retry: it carries grants, or a
/// lease minted by this entry (`log_index`); a lost copy of either would leave
/// permits reserved for nobody until their claim deadline.
pub fn worth_remembering(answer: &PermitGrant, log_index: LogIndex) -> bool {
    let minted_here = |lease: &LeaseGrant| {
        LeaseId::parse(&lease.lease_id).is_some_and(|id| id.log_index() == log_index)
    };
    !answer.grants.is_empty() || answer.leases.iter().flatten().any(minted_here)
}

/// Remembers a fresh request's answer, forgetting the client's oldest beyond
/// its cap, then the key's oldest beyond the key's cap.
pub fn remember(
    state: &mut KeyState,
    request: &PermitRequest,
    answer: &PermitGrant,
    forget_at_ms: u64,
) {
    let Some(request_id) = &request.request_id else {
        return;
    };
    let remembered = RememberedAnswer {
        answer: answer.clone(),
        forget_at_ms,
    };
    state.put_answer(&request.client_id, request_id, Some(remembered));
    let answers = &state.answers()[&request.client_id];
    if answers.len() > MAX_REMEMBERED_ANSWERS_PER_CLIENT {
        let oldest = answers
            .iter()
            .min_by_key(|(request_id, answer)| (answer.forget_at_ms, (*request_id).clone()))
            .map(|(request_id, _)| request_id.clone())
            .expect("over the cap, so not empty");
        state.put_answer(&request.client_id, &oldest, None);
    }
    if state.tally().answer_expiries.len() > MAX_REMEMBERED_ANSWERS_PER_KEY {
        let (_, client_id, request_id) = state
            .tally()
            .answer_expiries
            .first()
            .cloned()
            .expect("over the cap, so not empty");
        state.put_answer(&client_id, &request_id, None);
    }
}
