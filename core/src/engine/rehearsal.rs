//! A round run on a copy of a key, changing nothing: how a leader learns,
//! before spending a log entry on it, that a round now would serve nobody
//! (docs/protocol.md, "Held requests").
//!
//! The copy runs the very [`run_round`] that apply runs, so the rehearsal
//! cannot drift from the rules. It is advice to the leader's schedule, never
//! state: whatever the schedule decides, what a round grants is still decided
//! at apply, from the log.

use crate::contract::protocol::{PermitGrant, PermitRequest};
use crate::engine::lifecycle::Event;
use crate::engine::round::run_round;
use crate::engine::semaphores::Semaphores;
use crate::ids::IdAllocator;

/// What a round of some requests would do if it ran now.
#[derive(Debug, Clone, PartialEq)]
pub struct Rehearsal {
    /// One answer per request, in request order.
    pub answers: Vec<PermitGrant>,
    /// The round would change the key beyond its own record of running: it
    /// would reclaim, retire, grant or lease something, or flip the key's
    /// `contended` flag (which tells lease holders to hand back headroom).
    pub changes_key: bool,
}

impl Semaphores {
    /// Rehearses a round of `requests` (in arrival order) of `key` at `now_ms`
    /// on a copy of the key; the state is untouched.
    pub fn rehearse_round(&self, key: &str, now_ms: u64, requests: &[PermitRequest]) -> Rehearsal {
        let now_ms = now_ms.max(self.last_now_ms());
        let mut state = self.key(key).cloned().unwrap_or_default();
        let contended_before = state.meta().contended;
        // Ids of a copy are never seen outside it.
        let mut ids = IdAllocator::new(0);
        let outcome = run_round(&mut state, self.config(key), &mut ids, now_ms, requests);
        let changes_key = outcome.granted > 0
            || outcome.contended != contended_before
            || outcome.events.iter().any(|event| !records_running(event));
        Rehearsal {
            answers: outcome.answers,
            changes_key,
        }
    }
}

/// The events every round emits about itself, whatever it did: that it ran,
/// and what stayed queued. (Grants have no event of their own: the outcome's
/// `granted` counts them.)
fn records_running(event: &Event) -> bool {
    matches!(event, Event::Round { .. } | Event::Blocked { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::protocol::{Demand, V1};
    use crate::KeyConfig;

    fn semaphores(limit: u64) -> Semaphores {
        let defaults = KeyConfig {
            limit,
            ..KeyConfig::default()
        };
        Semaphores::new(defaults).expect("valid defaults")
    }

    fn asks(client: &str, count: u64) -> PermitRequest {
        PermitRequest {
            v: V1,
            client_id: client.to_owned(),
            request_id: None,
            demand: vec![Demand {
                group: "g".to_owned(),
                count,
                oldest_at_ms: 1,
            }],
            grants: Vec::new(),
            leases: None,
            wait_ms: Some(1_000),
        }
    }

    #[test]
    fn a_rehearsal_answers_as_the_round_would_and_changes_nothing() {
        let sem = semaphores(2);
        let before = (format!("{:?}", sem.key("k")), sem.last_now_ms());
        let rehearsal = sem.rehearse_round("k", 10, &[asks("a", 1)]);
        assert_eq!(rehearsal.answers.len(), 1);
        assert_eq!(rehearsal.answers[0].grants.len(), 1);
        assert!(rehearsal.changes_key, "a grant changes the key");
        assert_eq!((format!("{:?}", sem.key("k")), sem.last_now_ms()), before);
    }

    /// The copy shares the key's remembered answers until it changes them:
    /// a rehearsal that forgets one and remembers another leaves the key's own.
    #[test]
    fn a_rehearsal_that_remembers_and_forgets_answers_leaves_the_keys_alone() {
        let mut sem = semaphores(3);
        let mut ids = IdAllocator::new(1);
        let retried = PermitRequest {
            request_id: Some("r1".to_owned()),
            ..asks("a", 1)
        };
        sem.round("k", &mut ids, 10, &[retried]);
        let remembered = sem.key("k").expect("the key").answers().clone();
        assert!(remembered.contains_key("a"), "a's answer is remembered");
        let before = format!("{:?}", sem.key("k"));
        let forget_at = 10 + sem.config("k").grant_timeout_ms + 1;
        let fresh = PermitRequest {
            request_id: Some("r2".to_owned()),
            ..asks("b", 1)
        };
        let rehearsal = sem.rehearse_round("k", forget_at, &[fresh]);
        assert_eq!(rehearsal.answers[0].grants.len(), 1);
        assert_eq!(format!("{:?}", sem.key("k")), before);
        assert_eq!(sem.key("k").expect("the key").answers(), &remembered);
    }

    #[test]
    fn a_full_key_rehearses_a_round_that_changes_nothing() {
        let mut sem = semaphores(2);
        let mut ids = IdAllocator::new(1);
        let first = sem.round("k", &mut ids, 10, &[asks("a", 2), asks("b", 1)]);
        assert_eq!(first.granted, 2);
        let rehearsal = sem.rehearse_round("k", 20, &[asks("b", 1), asks("c", 3)]);
        assert!(rehearsal
            .answers
            .iter()
            .all(|answer| answer.grants.is_empty()));
        assert!(!rehearsal.changes_key);
    }

    #[test]
    fn a_passed_claim_deadline_is_a_change_the_rehearsal_sees() {
        let mut sem = semaphores(2);
        let mut ids = IdAllocator::new(1);
        sem.round("k", &mut ids, 10, &[asks("a", 2), asks("b", 1)]);
        let later = 10 + sem.config("k").grant_timeout_ms + 1;
        let rehearsal = sem.rehearse_round("k", later, &[asks("b", 1)]);
        assert_eq!(
            rehearsal.answers[0].grants.len(),
            1,
            "b gets a's reclaimed permit"
        );
        assert!(rehearsal.changes_key);
    }
}
