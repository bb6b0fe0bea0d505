//! Grants: permits the holder assigned in a round, claimed by this client.
//!
//! A new grant is claimed at once by the oldest queued items of its group (they
//! go `Claiming`); the next `sync` reports the claim, and the holder's answer
//! confirms it (`ok`: admit), clamps it (`expired`: admit what it confirmed,
//! requeue the rest) or denies it (`not_found`: requeue all). Releases are then
//! reported until the holder acknowledged all claimed permits back, and only
//! then is the grant forgotten.

use permitd_core::contract::protocol::{GrantReport, GrantResult, GrantStatus, GrantedPermits};
use permitd_core::limits::MAX_GRANT_REPORTS;
use serde::{Deserialize, Serialize};

use super::messages::InFlight;
use super::{ItemPermit, Phase, QueueState};

/// A grant this client holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantHolding {
    pub group: String,
    pub permits: u64,
    pub fence: u64,
    /// Permits claimed: items assigned at arrival, clamped by an `expired` claim.
    pub claimed: u64,
    pub claim_confirmed: bool,
    /// Items waiting for the claim's confirmation, oldest first.
    pub claiming: Vec<String>,
    pub released: u64,
    /// The highest `released` the holder acknowledged.
    pub acked_released: u64,
}

impl GrantHolding {
    /// Items wait on this grant until the holder confirms its claim.
    pub(super) fn awaits_confirmation(&self) -> bool {
        !self.claim_confirmed && self.claimed > 0
    }

    /// The holder has not yet seen the claim, or all of the releases.
    pub(super) fn needs_report(&self) -> bool {
        self.needs_report_beyond(0)
    }

    /// As [`Self::needs_report`], when releases up to `riding` are on their
    /// way in the key's request (`messages`: releases ride with demand).
    pub(super) fn needs_report_beyond(&self, riding: u64) -> bool {
        self.awaits_confirmation() || self.released > self.acked_released.max(riding)
    }
}

impl<T: Clone> QueueState<T> {
    /// Grant reports: every grant that needs one (every grant when forced), capped.
    pub(super) fn grant_reports(&self, key: &str, forced: bool) -> Vec<GrantReport> {
        let Some(record) = self.keys.get(key) else {
            return Vec::new();
        };
        record
            .grants
            .iter()
            .filter(|(_, grant)| forced || grant.needs_report())
            .take(MAX_GRANT_REPORTS)
            .map(|(grant_id, grant)| GrantReport {
                grant_id: grant_id.clone(),
                claimed: grant.claimed,
                released: grant.released,
            })
            .collect()
    }

    /// Applies the holder's answers to the grant reports of `sent`; results for
    /// grants that were not reported are ignored.
    pub(super) fn apply_grant_results(
        &mut self,
        key: &str,
        sent: &InFlight,
        results: Vec<GrantResult>,
    ) {
        for result in results {
            let Some(report) = sent.grants.get(&result.grant_id) else {
                continue;
            };
            self.apply_grant_result(key, report, &result);
        }
    }

    fn apply_grant_result(&mut self, key: &str, report: &GrantReport, result: &GrantResult) {
        let Some(record) = self.keys.get_mut(key) else {
            return;
        };
        let Some(grant) = record.grants.get_mut(&report.grant_id) else {
            return;
        };
        let grant_id = report.grant_id.clone();
        if result.status == GrantStatus::NotFound {
            let grant = record.grants.remove(&grant_id).expect("present above");
            if !grant.claim_confirmed {
                self.settle_claims(key, &grant_id, &grant, 0);
            }
            return;
        }
        if !grant.claim_confirmed && report.claimed == grant.claimed {
            let confirmed = result.claimed.min(grant.claimed);
            let snapshot = grant.clone();
            grant.claimed = confirmed;
            grant.claim_confirmed = true;
            grant.claiming.clear();
            self.settle_claims(key, &grant_id, &snapshot, confirmed);
        }
        let record = self.keys.get_mut(key).expect("present above");
        let grant = record.grants.get_mut(&grant_id).expect("present above");
        grant.acked_released = grant.acked_released.max(report.released.min(grant.claimed));
        if grant.claim_confirmed
            && grant.released >= grant.claimed
            && grant.acked_released >= grant.claimed
        {
            record.grants.remove(&grant_id);
        }
    }

    /// Admits the first `confirmed` claiming items of a grant and requeues the
    /// rest; items released while claiming are released instead of admitted.
    fn settle_claims(&mut self, key: &str, grant_id: &str, grant: &GrantHolding, confirmed: u64) {
        let permit = ItemPermit::Grant {
            grant_id: grant_id.to_string(),
            fence: grant.fence,
        };
        for (index, id) in grant.claiming.iter().enumerate() {
            let Some(item) = self.items.get_mut(id) else {
                continue;
            };
            let Phase::Claiming {
                release_requested, ..
            } = item.phase
            else {
                continue;
            };
            self.dirty.item(id);
            if (index as u64) < confirmed {
                item.phase = Phase::Admitted {
                    permit: permit.clone(),
                };
                if release_requested {
                    self.return_permit(key, &permit);
                    self.forget_item(id);
                } else {
                    self.admits.push(item.admitted(permit.clone()));
                }
            } else if release_requested {
                self.forget_item(id);
            } else {
                item.phase = Phase::Queued;
                let item = item.clone();
                self.index_queued(&item);
            }
        }
    }

    /// A new grant: the oldest queued items of its group claim its permits.
    pub(super) fn accept_grant(&mut self, key: &str, granted: GrantedPermits) {
        let grant_id = granted.grant_id.to_string();
        let mut claiming = Vec::new();
        if let Some(items) = self
            .queued
            .get_mut(key)
            .and_then(|groups| groups.get_mut(&granted.group))
        {
            while (claiming.len() as u64) < granted.permits {
                let Some((_, id)) = items.pop_first() else {
                    break;
                };
                claiming.push(id);
            }
        }
        self.prune_queued(key, &granted.group);
        if claiming.is_empty() {
            // Nothing to claim: the holder reclaims the permits at the deadline.
            return;
        }
        for id in &claiming {
            let item = self.items.get_mut(id).expect("queued items exist");
            item.phase = Phase::Claiming {
                grant_id: grant_id.clone(),
                release_requested: false,
            };
            self.dirty.item(id);
        }
        let holding = GrantHolding {
            group: granted.group,
            permits: granted.permits,
            fence: granted.fence,
            claimed: claiming.len() as u64,
            claim_confirmed: false,
            claiming,
            released: 0,
            acked_released: 0,
        };
        let record = self.keys.entry(key.to_string()).or_default();
        record.grants.insert(grant_id, holding);
    }
}

#[cfg(test)]
mod tests {
    use permitd_core::contract::protocol::GrantStatus;

    use super::super::test_support::*;
    use super::super::{ItemStatus, ReleaseOutcome};
    use super::*;

    #[test]
    fn a_grant_is_claimed_first_and_admitted_once_confirmed() {
        let mut state = queue();
        let sync = granted_and_claiming(&mut state, &["a", "b", "c"], 2);
        assert_eq!(
            sync.grants,
            [GrantReport {
                grant_id: grant_id(1).to_string(),
                claimed: 2,
                released: 0
            }]
        );
        assert!(
            admitted_ids(&mut state).is_empty(),
            "nothing runs before the claim is confirmed"
        );
        assert_eq!(state.status("a"), ItemStatus::Queued);
        answer_claim(&mut state, 2, GrantStatus::Ok, 1_200);
        assert_eq!(admitted_ids(&mut state), ["a", "b"]);
        assert_eq!(state.status("b"), ItemStatus::Admitted);
        assert_eq!(state.status("c"), ItemStatus::Queued);
        let counts = state.counts(1_200);
        assert_eq!(
            (
                counts.queued,
                counts.claiming,
                counts.admitted,
                counts.grants
            ),
            (1, 0, 2, 1)
        );
    }

    #[test]
    fn an_expired_claim_admits_the_clamped_count_and_requeues_the_rest() {
        let mut state = queue();
        granted_and_claiming(&mut state, &["a", "b", "c"], 3);
        answer_claim(&mut state, 1, GrantStatus::Expired, 20_000);
        assert_eq!(admitted_ids(&mut state), ["a"]);
        assert_eq!(state.status("b"), ItemStatus::Queued);
        let request = as_request(only(state.poll(20_000)));
        assert_eq!(request.demand[0].count, 2);
        assert_eq!(
            request.demand[0].oldest_at_ms, 100,
            "requeued items keep their age"
        );
        assert!(
            request.grants.is_empty(),
            "the clamped claim was acknowledged"
        );
    }

    #[test]
    fn a_claim_on_an_unknown_grant_requeues_everything() {
        let mut state = queue();
        granted_and_claiming(&mut state, &["a", "b"], 2);
        answer_claim(&mut state, 0, GrantStatus::NotFound, 1_200);
        assert!(admitted_ids(&mut state).is_empty());
        assert_eq!(state.counts(1_200).queued, 2);
        assert_eq!(state.counts(1_200).grants, 0);
    }

    #[test]
    fn releases_are_reported_cumulatively_and_the_grant_is_forgotten_once_acknowledged() {
        let mut state = queue();
        granted_and_claiming(&mut state, &["a", "b"], 2);
        answer_claim(&mut state, 2, GrantStatus::Ok, 1_200);
        assert_eq!(state.release("a"), ReleaseOutcome::Released);
        assert_eq!(state.release("a"), ReleaseOutcome::AlreadyReleased);
        assert_eq!(state.release("zzz"), ReleaseOutcome::Unknown);
        let sync = as_sync(only(state.poll(1_300)));
        assert_eq!((sync.grants[0].claimed, sync.grants[0].released), (2, 1));
        answer_claim(&mut state, 2, GrantStatus::Ok, 1_400);
        assert!(
            state.poll(1_400).is_empty(),
            "nothing changed since the acknowledgement"
        );
        state.release("b");
        let sync = as_sync(only(state.poll(1_500)));
        assert_eq!(sync.grants[0].released, 2);
        answer_claim(&mut state, 2, GrantStatus::Ok, 1_600);
        assert_eq!(state.counts(1_600).grants, 0);
        assert!(state.poll(1_700).is_empty());
        assert_eq!(state.status("b"), ItemStatus::Released);
    }

    #[test]
    fn a_release_while_claiming_is_never_admitted() {
        let mut state = queue();
        granted_and_claiming(&mut state, &["a", "b"], 2);
        assert_eq!(state.release("b"), ReleaseOutcome::Released);
        answer_claim(&mut state, 2, GrantStatus::Ok, 1_200);
        assert_eq!(admitted_ids(&mut state), ["a"]);
        assert_eq!(state.status("b"), ItemStatus::Released);
        let sync = as_sync(only(state.poll(1_300)));
        assert_eq!((sync.grants[0].claimed, sync.grants[0].released), (2, 1));
    }
}
