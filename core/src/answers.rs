//! `requestId` de-duplication: a retried request gets the original answer.
//!
//! A holder cannot tell a lost reply from a slow client: without help, a retry
//! after a lost reply gets new grants while the old ones stay reserved until
//! their claim deadline. So the state remembers, per (key, clientId), the answers to its
//! latest requestIds until every grant in them is claimed or past its deadline;
//! a retry with the same requestId takes part in no round and gets that answer.

use std::collections::BTreeMap;

use crate::limits::MAX_REMEMBERED_ANSWERS_PER_CLIENT;
use crate::protocol::{PermitGrant, PermitRequest};
use crate::state::{KeyState, RememberedAnswer};

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

/// Remembers a fresh request's answer, forgetting the client's oldest beyond the cap.
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
}
