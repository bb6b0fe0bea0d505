//! Property tests of the two lanes per key (see `messages`): random runs of
//! enqueues, releases, polls, answers and failures against a small holder that
//! grants, lends and echoes what it is told, checking after every poll:
//! - at most one request and one sync in flight per key, and a message leaves
//!   only on a free lane;
//! - requests carry demand, and reports only when these return permits
//!   (releases of confirmed claims, no lease held);
//! - a report never waits behind a request: after a poll, a key whose report
//!   lane is free (and not waiting out a failure) has nothing left to report;
//! - no request leaves in a poll that hands out admits of its key;
//! - the state's in-flight count is the driver's;
//! - never more items admitted than permits handed out;
//! - the queue's counts, kept without a scan of the items, are a scan's.

use std::collections::BTreeMap;

use permitd_core::contract::protocol::{
    GrantReport, GrantResult, GrantStatus, GrantedPermits, LeaseGrant, PermitSyncResult,
    SemaphoreRequest, SemaphoreResponse, V1,
};
use permitd_core::GrantId;
use proptest::prelude::*;

use super::test_support::{grant_answer, lease};
use super::{Lane, QueueItem, QueueState, StateConfig};

const KEYS: [&str; 2] = ["acct-1", "acct-2"];
const GROUPS: [&str; 2] = ["wf-a", "wf-b"];
const LEASE_TTL_MS: u64 = 60_000;

#[derive(Debug, Clone)]
enum Step {
    Enqueue {
        key: usize,
        group: usize,
        count: u64,
    },
    /// Releases the admitted item at this index (modulo), if any.
    Release(usize),
    Poll {
        after_ms: u64,
    },
    /// Answers the key's request: nothing, a grant, or a lease of `permits`.
    AnswerDemand {
        key: usize,
        lease: bool,
        permits: u64,
        period_ms: u64,
    },
    /// Answers the key's sync: every claim confirmed, every lease echoed.
    AnswerReport {
        key: usize,
        contended: bool,
    },
    Fail {
        key: usize,
        demand: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (0..2usize, 0..2usize, 1..5u64)
            .prop_map(|(key, group, count)| Step::Enqueue { key, group, count }),
        3 => any::<usize>().prop_map(Step::Release),
        4 => (0..30u64).prop_map(|after_ms| Step::Poll { after_ms }),
        3 => (0..2usize, any::<bool>(), 0..4u64, 0..20u64).prop_map(
            |(key, lease, permits, period_ms)| Step::AnswerDemand { key, lease, permits, period_ms }
        ),
        3 => (0..2usize, any::<bool>())
            .prop_map(|(key, contended)| Step::AnswerReport { key, contended }),
        1 => (0..2usize, any::<bool>()).prop_map(|(key, demand)| Step::Fail { key, demand }),
    ]
}

/// The test's side: what is in flight per key and lane, and a small holder.
#[derive(Default)]
struct Driver {
    now_ms: u64,
    next_item: u64,
    next_grant: u128,
    /// Per key: the request in flight (its demanded groups, its grant reports).
    demand: BTreeMap<usize, (Vec<String>, Vec<GrantReport>)>,
    /// Per key: the sync in flight.
    report: BTreeMap<usize, permitd_core::contract::protocol::PermitSync>,
    /// Per key and lane: the report lane's retry time after a failure.
    report_retry_at_ms: BTreeMap<usize, u64>,
    /// Per lease id: what was lent.
    leases: BTreeMap<String, LeaseGrant>,
    admitted: Vec<String>,
    permits_handed_out: u64,
    admits_seen: u64,
}

impl Driver {
    fn run(&mut self, state: &mut QueueState<u32>, step: Step) -> Result<(), TestCaseError> {
        match step {
            Step::Enqueue { key, group, count } => {
                let items = (0..count)
                    .map(|_| {
                        self.next_item += 1;
                        QueueItem {
                            id: format!("item-{}", self.next_item),
                            key: KEYS[key].into(),
                            group: GROUPS[group].into(),
                            body: 0,
                        }
                    })
                    .collect();
                state.enqueue(items, self.now_ms).expect("valid items");
            }
            Step::Release(index) => {
                if !self.admitted.is_empty() {
                    let id = self.admitted.remove(index % self.admitted.len());
                    state.release(&id);
                }
            }
            Step::Poll { after_ms } => {
                self.now_ms += after_ms;
                self.poll(state)?;
            }
            Step::AnswerDemand {
                key,
                lease: as_lease,
                permits,
                period_ms,
            } => {
                let Some((groups, reports)) = self.demand.remove(&key) else {
                    return Ok(());
                };
                let mut grants = Vec::new();
                let mut leases = Vec::new();
                if let (Some(group), true) = (groups.first(), permits > 0) {
                    self.permits_handed_out += permits;
                    self.next_grant += 1;
                    if as_lease {
                        let lease_id = format!("lease-{}", self.next_grant);
                        let lent = lease(&lease_id, group, permits, self.now_ms + LEASE_TTL_MS);
                        self.leases.insert(lease_id, lent.clone());
                        leases.push(lent);
                    } else {
                        grants.push(GrantedPermits {
                            grant_id: GrantId(uuid::Uuid::from_u128(self.next_grant)),
                            group: group.clone(),
                            permits,
                            fence: self.next_grant as u64,
                        });
                    }
                }
                let mut answer = grant_answer(grants, leases, self.now_ms + period_ms);
                if let SemaphoreResponse::Grant(grant) = &mut answer {
                    grant.grant_results = confirmed(&reports);
                }
                state.on_answer(KEYS[key], answer, self.now_ms);
            }
            Step::AnswerReport { key, contended } => {
                let Some(sync) = self.report.remove(&key) else {
                    return Ok(());
                };
                let grant_results = confirmed(&sync.grants);
                let leases = sync
                    .leases
                    .iter()
                    .flatten()
                    .map(|report| {
                        let lent = &self.leases[&report.lease_id];
                        LeaseGrant {
                            // A retired lease keeps only its drawn permits.
                            permits: match report.retired {
                                true => report.drawn,
                                false => lent.permits,
                            },
                            ..lent.clone()
                        }
                    })
                    .collect::<Vec<_>>();
                let answer = SemaphoreResponse::Synced(PermitSyncResult {
                    v: V1,
                    grant_results,
                    leases: Some(leases),
                    contended,
                });
                state.on_answer(KEYS[key], answer, self.now_ms);
            }
            Step::Fail { key, demand } => {
                let lane = match demand {
                    true => self.demand.remove(&key).map(|_| Lane::Demand),
                    false => self.report.remove(&key).map(|_| Lane::Report),
                };
                if let Some(lane) = lane {
                    state.on_failure(KEYS[key], lane, self.now_ms);
                    if lane == Lane::Report {
                        let retry = self.now_ms + state.config.failure_retry_ms;
                        self.report_retry_at_ms.insert(key, retry);
                    }
                }
            }
        }
        Ok(())
    }

    fn poll(&mut self, state: &mut QueueState<u32>) -> Result<(), TestCaseError> {
        let messages = state.poll(self.now_ms);
        let admits = state.take_admits();
        for outgoing in messages {
            let key = KEYS
                .iter()
                .position(|key| *key == outgoing.key)
                .expect("a known key");
            match outgoing.message {
                SemaphoreRequest::Request(request) => {
                    prop_assert!(!self.demand.contains_key(&key), "two requests in flight");
                    let record = state.key_record(&outgoing.key);
                    for report in &request.grants {
                        let grant = record.and_then(|record| record.grants.get(&report.grant_id));
                        prop_assert!(
                            grant.is_some_and(|grant| grant.claim_confirmed),
                            "a request carries a claim"
                        );
                    }
                    prop_assert!(
                        request.grants.is_empty()
                            || record.is_some_and(|record| record.leases.is_empty()),
                        "a request carries reports of a key with leases"
                    );
                    prop_assert!(
                        admits.iter().all(|item| item.key != outgoing.key),
                        "a request left in a poll that admitted items of its key"
                    );
                    let groups = request
                        .demand
                        .into_iter()
                        .map(|demand| demand.group)
                        .collect();
                    self.demand.insert(key, (groups, request.grants));
                }
                SemaphoreRequest::Sync(sync) => {
                    prop_assert!(!self.report.contains_key(&key), "two syncs in flight");
                    self.report.insert(key, sync);
                }
            }
        }
        self.admits_seen += admits.len() as u64;
        self.admitted.extend(admits.into_iter().map(|item| item.id));
        prop_assert!(
            self.admits_seen <= self.permits_handed_out,
            "{} admitted under {} permits",
            self.admits_seen,
            self.permits_handed_out
        );
        prop_assert_eq!(state.in_flight(), self.demand.len() + self.report.len());
        for (index, key) in KEYS.iter().enumerate() {
            let report_free = !self.report.contains_key(&index)
                && self
                    .report_retry_at_ms
                    .get(&index)
                    .is_none_or(|at| self.now_ms >= *at);
            prop_assert!(
                !report_free || !state.reports_due(key, self.now_ms),
                "a report of {key} waits with its lane free"
            );
        }
        Ok(())
    }
}

/// The holder's answer to grant reports: every claim confirmed as sent.
fn confirmed(reports: &[GrantReport]) -> Vec<GrantResult> {
    reports
        .iter()
        .map(|report| GrantResult {
            grant_id: report.grant_id.clone(),
            claimed: report.claimed,
            status: GrantStatus::Ok,
        })
        .collect()
}

proptest! {
    #[test]
    fn lanes_keep_their_rules(steps in proptest::collection::vec(step(), 1..120)) {
        let mut state = QueueState::new("runner-1", StateConfig::default());
        let mut driver = Driver::default();
        for step in steps {
            driver.run(&mut state, step)?;
            prop_assert_eq!(state.counts(driver.now_ms), state.counts_by_scan(driver.now_ms));
        }
    }
}
