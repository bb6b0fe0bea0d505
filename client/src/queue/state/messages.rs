//! Messages: per key, what is due to the holder, and what its answer changes.
//!
//! Each key has two independent lanes to the holder, each with at most one
//! message in flight:
//! - the **demand** lane carries `request`s: demand only, no reports, sent when
//!   items are queued, the key's `nextRequestAt` has come, no lease of the key
//!   awaits confirmation (its permits will serve the queued items; asking again
//!   could bring a second lease for the same items), and the same poll drew no
//!   lease permits and hands out no admits of the key confirmed since the last
//!   poll (the demand it would carry just changed);
//! - the **report** lane carries `sync`s: grant claims, lease claims, releases
//!   and heartbeats, sent as soon as they exist, never behind a demand request
//!   waiting for its round.
//!
//! When a poll sends both, and the reports only return permits (grant releases
//! of confirmed claims; no claim, no lease), the releases ride in the request
//! instead: the holder applies a request's grant reports with its next entry,
//! as a sync's (docs/protocol.md, "Early reports"), so nothing waits and one
//! message is saved. The report lane stays free: a later report leaves at once
//! on it. Claims always go in syncs: an item is admitted only once its claim is
//! confirmed, and a request is answered only after its round.
//!
//! Reports are cumulative high-water marks, so the two lanes may be answered in
//! any order. What a sync reported is kept ([`InFlight`]) so its answer is
//! matched against what the holder saw, not against what changed since. A failed
//! message frees its lane after `failure_retry_ms`.

use std::collections::BTreeMap;

use permitd_core::contract::protocol::{
    Demand, GrantReport, LeaseReport, PermitGrant, PermitRequest, PermitSync, SemaphoreRequest,
    SemaphoreResponse, V1,
};
use permitd_core::limits::MAX_DEMAND_ENTRIES;

use super::{KeyRecord, QueueState};
use crate::client::believed_next_request_at;

/// What a sync in flight reported, to match the holder's answer against.
#[derive(Debug, Clone, Default)]
pub(super) struct InFlight {
    pub(super) grants: BTreeMap<String, GrantReport>,
    pub(super) leases: BTreeMap<String, LeaseReport>,
}

/// One of a key's two lanes to the holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// `request`s: demand, answered by the key's next round.
    Demand,
    /// `sync`s: claims, releases and heartbeats, applied with the next entry.
    Report,
}

impl Lane {
    /// The lane a message travels on.
    pub fn of(message: &SemaphoreRequest) -> Self {
        match message {
            SemaphoreRequest::Request(_) => Self::Demand,
            SemaphoreRequest::Sync(_) => Self::Report,
        }
    }
}

/// Per-key state that is not stored.
#[derive(Debug, Clone, Default)]
pub(super) struct KeyRuntime {
    /// A request is in flight.
    pub(super) demand_in_flight: bool,
    /// The releases riding in that request, to match its answer against.
    pub(super) riding: Option<InFlight>,
    /// A sync is in flight, with what it reported.
    pub(super) report_in_flight: Option<InFlight>,
    pub(super) demand_retry_at_ms: u64,
    pub(super) report_retry_at_ms: u64,
    /// Report every holding once (after a restart, or at shutdown).
    pub(super) force_report: bool,
}

impl KeyRuntime {
    /// The released count riding in the request in flight for `grant_id`.
    fn riding_released(&self, grant_id: &str) -> u64 {
        self.riding
            .as_ref()
            .and_then(|riding| riding.grants.get(grant_id))
            .map_or(0, |report| report.released)
    }

    fn busy(&self) -> bool {
        self.demand_in_flight || self.report_in_flight.is_some()
    }

    fn in_flight(&self) -> usize {
        usize::from(self.demand_in_flight) + usize::from(self.report_in_flight.is_some())
    }
}

/// A message to send for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub key: String,
    pub message: SemaphoreRequest,
    /// Permits this message reports released that no acknowledged report
    /// did (instrumentation: the bench's reuse gap starts here).
    pub releases: u64,
}

impl<T: Clone> QueueState<T> {
    /// Messages in flight, over every key and lane.
    pub fn in_flight(&self) -> usize {
        self.runtime.values().map(KeyRuntime::in_flight).sum()
    }

    /// Advances time: draws lease permits for queued items, retires expired and
    /// idle leases, and returns the messages now due (each takes its key's lane
    /// until [`Self::on_answer`] or [`Self::on_failure`]).
    pub fn poll(&mut self, now_ms: u64) -> Vec<Outgoing> {
        let keys: Vec<String> = self.active_keys();
        // Keys with admits since the last `take_admits` (claims an answer
        // confirmed, permits it let us draw): with those drawn in this poll,
        // the admits this poll hands out. The demand a request would carry has
        // just changed, so it waits for the next poll.
        let mut admitted: Vec<String> = Vec::new();
        for item in &self.admits {
            if admitted.last() != Some(&item.key) {
                admitted.push(item.key.clone());
            }
        }
        let mut outgoing = Vec::new();
        for key in keys {
            let drew = self.draw(&key, now_ms) || admitted.contains(&key);
            self.retire_stale_leases(&key, now_ms);
            let report = self.report_lane_free(&key, now_ms) && self.reports_due(&key, now_ms);
            let demand = !drew && self.demand_due(&key, now_ms);
            let ride = report && demand && self.only_releases(&key);
            if report && !ride {
                outgoing.push(self.take_sync(&key));
            }
            if demand {
                outgoing.push(self.take_request(&key, ride));
            }
        }
        outgoing
    }

    /// Whether everything the key has to report returns permits: releases of
    /// confirmed grant claims, nothing forced, no lease (leases report every
    /// sync, and a request's lease reports wait for its round).
    fn only_releases(&self, key: &str) -> bool {
        let forced = self
            .runtime
            .get(key)
            .is_some_and(|runtime| runtime.force_report);
        let Some(record) = self.keys.get(key) else {
            return false;
        };
        !forced
            && record.leases.is_empty()
            && record
                .grants
                .values()
                .all(|grant| !grant.awaits_confirmation())
    }

    /// When [`Self::poll`] may next have something to do, if ever (absent new
    /// items, releases or answers).
    pub fn next_wakeup_ms(&self, now_ms: u64) -> Option<u64> {
        let mut wakeup: Option<u64> = None;
        let mut consider = |at: u64| wakeup = Some(wakeup.map_or(at, |known| known.min(at)));
        let idle = KeyRuntime::default();
        for key in self.active_keys() {
            let runtime = self.runtime.get(&key).unwrap_or(&idle);
            let record = self.keys.get(&key);
            if !runtime.demand_in_flight && self.has_queued(&key) {
                let lease_claims = record.is_some_and(|record| {
                    record
                        .leases
                        .values()
                        .any(|lease| lease.awaits_confirmation())
                });
                if !lease_claims {
                    consider(
                        self.next_request_at_ms(&key)
                            .max(runtime.demand_retry_at_ms),
                    );
                }
            }
            let Some(record) = record else {
                continue;
            };
            let report_at = |at: u64| at.max(runtime.report_retry_at_ms);
            let reports_free = runtime.report_in_flight.is_none();
            if reports_free && (runtime.force_report && !record.is_empty()) {
                consider(report_at(now_ms));
            }
            if reports_free && grants_need_report(record, runtime) {
                consider(report_at(now_ms));
            }
            for lease in record.leases.values() {
                if reports_free && lease.needs_report() {
                    consider(report_at(now_ms));
                }
                if let (true, Some(due)) = (reports_free, lease.heartbeat_due_ms()) {
                    consider(report_at(due));
                }
                if !lease.retired {
                    consider(lease.expires_at_ms);
                    if let (Some(since), Some(idle)) =
                        (lease.idle_since_ms, self.config.idle_lease_return_ms)
                    {
                        consider(since.saturating_add(idle));
                    }
                }
            }
        }
        wakeup.map(|at| at.max(now_ms))
    }

    /// The holder answered the key's message in flight on the answer's lane.
    pub fn on_answer(&mut self, key: &str, answer: SemaphoreResponse, now_ms: u64) {
        let Some(runtime) = self.runtime.get_mut(key) else {
            debug_assert!(
                false,
                "an answer for key {key:?} without a message in flight"
            );
            return;
        };
        let sent = match &answer {
            SemaphoreResponse::Grant(_) => {
                debug_assert!(runtime.demand_in_flight, "a grant answer without a request");
                runtime.demand_in_flight = false;
                runtime.riding.take().unwrap_or_default()
            }
            SemaphoreResponse::Synced(_) => {
                let Some(sent) = runtime.report_in_flight.take() else {
                    debug_assert!(false, "a synced answer for key {key:?} without a sync");
                    return;
                };
                sent
            }
        };
        self.dirty.key(key);
        let (results, leases, contended) = match answer {
            SemaphoreResponse::Grant(grant) => {
                let PermitGrant {
                    grants,
                    grant_results,
                    leases,
                    contended,
                    next_request_at_ms,
                    ..
                } = grant;
                for granted in grants {
                    self.accept_grant(key, granted);
                }
                let record = self.keys.entry(key.to_string()).or_default();
                let believed = believed_next_request_at(next_request_at_ms, now_ms);
                record.next_request_at_ms = record.next_request_at_ms.max(believed);
                (grant_results, leases, contended)
            }
            SemaphoreResponse::Synced(synced) => {
                (synced.grant_results, synced.leases, synced.contended)
            }
        };
        self.apply_grant_results(key, &sent, results);
        self.apply_lease_echoes(key, &sent, leases.unwrap_or_default(), now_ms);
        if contended {
            self.return_idle_leases(key);
        }
        self.draw(key, now_ms);
        self.drop_if_empty(key);
    }

    /// The key's message in flight on `lane` failed (deadline passed, or rejected).
    pub fn on_failure(&mut self, key: &str, lane: Lane, now_ms: u64) {
        let retry_at_ms = now_ms.saturating_add(self.config.failure_retry_ms);
        if let Some(runtime) = self.runtime.get_mut(key) {
            match lane {
                Lane::Demand => {
                    runtime.demand_in_flight = false;
                    // Its releases are reported again, on the report lane.
                    runtime.riding = None;
                    runtime.demand_retry_at_ms = retry_at_ms;
                }
                Lane::Report => {
                    runtime.report_in_flight = None;
                    runtime.report_retry_at_ms = retry_at_ms;
                }
            }
        }
    }

    /// Reports only (never demand) for every key with something to report: what
    /// shutdown sends.
    pub fn poll_reports(&mut self, now_ms: u64) -> Vec<Outgoing> {
        let keys: Vec<String> = self.keys.keys().cloned().collect();
        let mut outgoing = Vec::new();
        for key in keys {
            let free = self
                .runtime
                .get(&key)
                .is_none_or(|runtime| runtime.report_in_flight.is_none());
            if free && self.reports_due(&key, now_ms) {
                outgoing.push(self.take_sync(&key));
            }
        }
        outgoing
    }

    /// Keys with holdings or queued items, in order.
    fn active_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.keys.keys().cloned().collect();
        let queued = self
            .queued
            .iter()
            .filter(|(key, groups)| !groups.is_empty() && !self.keys.contains_key(*key))
            .map(|(key, _)| key.clone());
        keys.extend(queued);
        keys.sort_unstable();
        keys
    }

    /// Whether the key has a message in flight on either lane.
    fn busy(&self, key: &str) -> bool {
        self.runtime.get(key).is_some_and(KeyRuntime::busy)
    }

    fn next_request_at_ms(&self, key: &str) -> u64 {
        self.keys
            .get(key)
            .map_or(0, |record| record.next_request_at_ms)
    }

    fn report_lane_free(&self, key: &str, now_ms: u64) -> bool {
        self.runtime.get(key).is_none_or(|runtime| {
            runtime.report_in_flight.is_none() && now_ms >= runtime.report_retry_at_ms
        })
    }

    /// Whether a request may leave now (see the module's rules for the lane).
    fn demand_due(&self, key: &str, now_ms: u64) -> bool {
        let lane_free = self.runtime.get(key).is_none_or(|runtime| {
            !runtime.demand_in_flight && now_ms >= runtime.demand_retry_at_ms
        });
        let lease_claims = self.keys.get(key).is_some_and(|record| {
            record
                .leases
                .values()
                .any(|lease| lease.awaits_confirmation())
        });
        lane_free && !lease_claims && self.has_queued(key) && self.next_request_at_ms(key) <= now_ms
    }

    pub(super) fn reports_due(&self, key: &str, now_ms: u64) -> bool {
        let Some(record) = self.keys.get(key) else {
            return false;
        };
        if record.is_empty() {
            return false;
        }
        let idle = KeyRuntime::default();
        let runtime = self.runtime.get(key).unwrap_or(&idle);
        runtime.force_report
            || grants_need_report(record, runtime)
            || record.leases.values().any(|lease| {
                lease.needs_report() || lease.heartbeat_due_ms().is_some_and(|due| due <= now_ms)
            })
    }

    /// The key's request, with its releases riding if `ride` (see the module).
    fn take_request(&mut self, key: &str, ride: bool) -> Outgoing {
        let mut request = self.demand_request(key);
        let mut releases = 0;
        if ride {
            request.grants = self.grant_reports(key, false);
            releases = self.unacknowledged_releases(key, &request.grants, &[]);
            let riding = InFlight {
                grants: by_grant_id(&request.grants),
                leases: BTreeMap::new(),
            };
            self.runtime.entry(key.to_string()).or_default().riding = Some(riding);
        }
        Outgoing {
            key: key.to_string(),
            message: SemaphoreRequest::Request(request),
            releases,
        }
    }

    fn demand_request(&mut self, key: &str) -> PermitRequest {
        let mut demand: Vec<Demand> = self
            .queued
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|(group, items)| {
                let ((oldest_at_ms, _), _) = items.first_key_value()?;
                Some(Demand {
                    group: group.clone(),
                    count: items.len() as u64,
                    oldest_at_ms: *oldest_at_ms,
                })
            })
            .collect();
        demand.sort_by(|a, b| (a.oldest_at_ms, &a.group).cmp(&(b.oldest_at_ms, &b.group)));
        demand.truncate(MAX_DEMAND_ENTRIES);
        self.runtime
            .entry(key.to_string())
            .or_default()
            .demand_in_flight = true;
        let wait_ms = self.config.request_wait_ms;
        PermitRequest {
            v: V1,
            client_id: self.client_id.clone(),
            request_id: None,
            demand,
            grants: Vec::new(),
            // Present, though empty: this client takes leases.
            leases: Some(Vec::new()),
            wait_ms: (wait_ms > 0).then_some(wait_ms),
        }
    }

    fn take_sync(&mut self, key: &str) -> Outgoing {
        let runtime = self.runtime.entry(key.to_string()).or_default();
        let forced = std::mem::take(&mut runtime.force_report);
        let grants = self.grant_reports(key, forced);
        let leases = self.lease_reports(key);
        let releases = self.unacknowledged_releases(key, &grants, &leases);
        let in_flight = InFlight {
            grants: by_grant_id(&grants),
            leases: leases
                .iter()
                .map(|report| (report.lease_id.clone(), report.clone()))
                .collect(),
        };
        self.runtime
            .entry(key.to_string())
            .or_default()
            .report_in_flight = Some(in_flight);
        Outgoing {
            key: key.to_string(),
            message: SemaphoreRequest::Sync(PermitSync {
                v: V1,
                client_id: self.client_id.clone(),
                grants,
                leases: Some(leases),
            }),
            releases,
        }
    }

    /// Permits `grants` and `leases` report released beyond what the holder
    /// acknowledged.
    fn unacknowledged_releases(
        &self,
        key: &str,
        grants: &[GrantReport],
        leases: &[LeaseReport],
    ) -> u64 {
        let Some(record) = self.keys.get(key) else {
            return 0;
        };
        let of_grants: u64 = grants
            .iter()
            .filter_map(|report| {
                let acked = record.grants.get(&report.grant_id)?.acked_released;
                Some(report.released.saturating_sub(acked))
            })
            .sum();
        let of_leases: u64 = leases
            .iter()
            .filter_map(|report| {
                let lease = record.leases.get(&report.lease_id)?;
                let acked = lease.acked.as_ref().map_or(0, |acked| acked.released);
                Some(report.released.saturating_sub(acked))
            })
            .sum();
        of_grants + of_leases
    }

    fn drop_if_empty(&mut self, key: &str) {
        let idle = self.keys.get(key).is_some_and(KeyRecord::is_empty)
            && !self.has_queued(key)
            && !self.busy(key);
        if idle {
            // The client keeps honouring the key's nextRequestAt on its own.
            self.keys.remove(key);
            self.runtime.remove(key);
            self.dirty.key(key);
        }
    }
}

/// Grant reports by grant id, to match an answer's results against.
fn by_grant_id(grants: &[GrantReport]) -> BTreeMap<String, GrantReport> {
    grants
        .iter()
        .map(|report| (report.grant_id.clone(), report.clone()))
        .collect()
}

/// Whether a grant of the key has something the holder has not been sent:
/// an unconfirmed claim, or releases beyond those acknowledged and those
/// riding in the request in flight.
fn grants_need_report(record: &KeyRecord, runtime: &KeyRuntime) -> bool {
    record
        .grants
        .iter()
        .any(|(grant_id, grant)| grant.needs_report_beyond(runtime.riding_released(grant_id)))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;

    #[test]
    fn a_request_carries_demand_per_group_with_its_oldest_time() {
        let mut state = queue();
        state
            .enqueue(vec![item("a", "wf-1"), item("b", "wf-2")], 100)
            .unwrap();
        state.enqueue(vec![item("c", "wf-1")], 200).unwrap();
        let request = as_request(only(state.poll(300)));
        let demand: Vec<(String, u64, u64)> = request
            .demand
            .iter()
            .map(|demand| (demand.group.clone(), demand.count, demand.oldest_at_ms))
            .collect();
        assert_eq!(demand, [("wf-1".into(), 2, 100), ("wf-2".into(), 1, 100)]);
        assert_eq!(request.client_id, "runner-1");
        assert_eq!(
            request.leases,
            Some(vec![]),
            "the queue always supports leases"
        );
        assert!(state.poll(300).is_empty(), "one request in flight per key");
    }

    #[test]
    fn next_request_at_is_honoured_and_failures_back_off() {
        let mut state = queue();
        state
            .enqueue(vec![item("a", "wf"), item("b", "wf")], 0)
            .unwrap();
        as_request(only(state.poll(0)));
        state.on_answer(KEY, grant_answer(vec![], vec![], 2_000), 1_000);
        assert!(state.poll(1_999).is_empty());
        assert_eq!(state.next_wakeup_ms(1_000), Some(2_000));
        as_request(only(state.poll(2_000)));
        state.on_failure(KEY, Lane::Demand, 2_500);
        assert!(state.poll(3_000).is_empty());
        as_request(only(state.poll(3_500)));
    }

    #[test]
    fn a_next_request_at_far_ahead_is_believed_only_so_far() {
        let mut state = queue();
        state.enqueue(vec![item("a", "wf")], 0).unwrap();
        as_request(only(state.poll(0)));
        // A node whose clock runs a day ahead.
        let a_day_ahead = 1_000 + 86_400_000;
        state.on_answer(KEY, grant_answer(vec![], vec![], a_day_ahead), 1_000);
        let believed = 1_000 + crate::client::MAX_NEXT_REQUEST_AHEAD_MS;
        assert_eq!(state.next_wakeup_ms(1_000), Some(believed));
        assert!(state.poll(believed - 1).is_empty());
        as_request(only(state.poll(believed)));
    }

    #[test]
    fn no_request_in_the_poll_that_hands_out_confirmed_claims() {
        let mut state = queue();
        granted_and_claiming(&mut state, &["a", "b", "c"], 2);
        // nextRequestAt (2,100) has passed when the claim is confirmed.
        answer_claim(
            &mut state,
            2,
            permitd_core::contract::protocol::GrantStatus::Ok,
            2_200,
        );
        assert!(state.poll(2_200).is_empty(), "c waits for the next poll");
        assert_eq!(admitted_ids(&mut state), ["a", "b"]);
        assert_eq!(state.next_wakeup_ms(2_200), Some(2_200));
        let request = as_request(only(state.poll(2_200)));
        assert_eq!(request.demand[0].count, 1);
    }

    #[test]
    fn a_release_is_reported_while_a_request_waits_for_its_round() {
        let mut state = queue();
        granted_and_claiming(&mut state, &["a", "b", "c"], 2);
        answer_claim(
            &mut state,
            2,
            permitd_core::contract::protocol::GrantStatus::Ok,
            1_200,
        );
        assert_eq!(admitted_ids(&mut state), ["a", "b"]);
        // c is asked for once nextRequestAt comes; the request waits for its round.
        let request = as_request(only(state.poll(2_100)));
        assert!(request.grants.is_empty(), "requests carry demand only");
        state.release("a");
        let sync = as_sync(only(state.poll(2_101)));
        assert_eq!((sync.grants[0].claimed, sync.grants[0].released), (2, 1));
        // One message per lane: the second release waits for the first's answer.
        state.release("b");
        assert!(state.poll(2_102).is_empty());
        assert_eq!(state.in_flight(), 2);
        // The lanes are answered in either order.
        answer_claim(
            &mut state,
            2,
            permitd_core::contract::protocol::GrantStatus::Ok,
            2_103,
        );
        let sync = as_sync(only(state.poll(2_103)));
        assert_eq!(sync.grants[0].released, 2);
        state.on_answer(KEY, grant_answer(vec![], vec![], 4_000), 2_104);
        assert_eq!(state.in_flight(), 1);
    }

    #[test]
    fn both_lanes_leave_in_one_poll_and_fail_apart() {
        let mut state = queue();
        granted_with_demand_due(&mut state, &["a", "b"], 1);
        let messages = state.poll(1_100);
        let lanes: Vec<Lane> = messages.iter().map(|out| Lane::of(&out.message)).collect();
        assert_eq!(lanes, [Lane::Report, Lane::Demand]);
        state.on_failure(KEY, Lane::Report, 2_200);
        assert!(
            state.poll(2_300).is_empty(),
            "the report lane waits out its retry"
        );
        assert_eq!(state.next_wakeup_ms(2_300), Some(3_200));
        as_sync(only(state.poll(3_200)));
    }

    #[test]
    fn a_claim_never_rides_in_a_request() {
        let mut state = queue();
        granted_with_demand_due(&mut state, &["a", "b"], 1);
        let messages = state.poll(1_100);
        let claim = as_sync(messages[0].message.clone());
        assert_eq!((claim.grants[0].claimed, claim.grants[0].released), (1, 0));
        let request = as_request(messages[1].message.clone());
        assert!(request.grants.is_empty(), "admission waits for no round");
        assert_eq!(request.demand[0].count, 1);
    }

    /// Grant 1 of `permits` claimed and confirmed for the first of `ids`,
    /// `released` of them released by 2,100, when the next request is due.
    fn confirmed_then_released(
        ids: &[&str],
        permits: u64,
        released: &[&str],
    ) -> super::QueueState<u32> {
        let mut state = queue();
        granted_and_claiming(&mut state, ids, permits);
        answer_claim(
            &mut state,
            permits,
            permitd_core::contract::protocol::GrantStatus::Ok,
            1_200,
        );
        assert_eq!(admitted_ids(&mut state).len() as u64, permits);
        for id in released {
            state.release(id);
        }
        state
    }

    #[test]
    fn releases_ride_in_the_request_that_leaves_in_the_same_poll() {
        let mut state = confirmed_then_released(&["a", "b"], 1, &["a"]);
        let messages = state.poll(2_100);
        assert_eq!(messages[0].releases, 1, "the bench times reuse from here");
        let request = as_request(only(messages));
        assert_eq!(request.demand[0].count, 1);
        let report = &request.grants[0];
        assert_eq!((report.claimed, report.released), (1, 1));
        assert_eq!(state.in_flight(), 1, "the report lane stays free");
        assert!(state.poll(2_101).is_empty(), "the release is on its way");
        assert_ne!(state.next_wakeup_ms(2_101), Some(2_101));
        answer_request_reports(&mut state, 1, 2_102);
        assert!(
            state
                .key_record(KEY)
                .is_none_or(|record| record.grants.is_empty()),
            "the holder acknowledged every release: the grant is forgotten"
        );
    }

    #[test]
    fn a_release_after_riding_ones_leaves_at_once_as_a_sync() {
        let mut state = confirmed_then_released(&["a", "b", "c"], 2, &["a"]);
        let request = as_request(only(state.poll(2_100)));
        assert_eq!(request.grants[0].released, 1);
        state.release("b");
        let sync = as_sync(only(state.poll(2_101)));
        assert_eq!((sync.grants[0].claimed, sync.grants[0].released), (2, 2));
        assert_eq!(state.in_flight(), 2);
    }

    #[test]
    fn the_releases_of_a_failed_request_go_out_on_the_report_lane() {
        let mut state = confirmed_then_released(&["a", "b"], 1, &["a"]);
        as_request(only(state.poll(2_100)));
        state.on_failure(KEY, Lane::Demand, 2_200);
        let sync = as_sync(only(state.poll(2_200)));
        assert_eq!(sync.grants[0].released, 1);
    }

    #[test]
    fn releases_of_a_key_with_a_lease_do_not_ride() {
        let mut state = queue();
        leased(&mut state, &["a"], 1, 60_000, 100);
        as_sync(only(state.poll(100)));
        answer_lease(&mut state, 1, 60_000, 100);
        assert_eq!(admitted_ids(&mut state), ["a"]);
        state.enqueue(vec![item("b", "wf")], 200).unwrap();
        state.release("a");
        let messages = state.poll(3_000);
        let lanes: Vec<Lane> = messages.iter().map(|out| Lane::of(&out.message)).collect();
        assert_eq!(lanes, [Lane::Report, Lane::Demand]);
        assert!(as_request(messages[1].message.clone()).grants.is_empty());
    }

    #[test]
    fn no_request_while_a_lease_awaits_confirmation() {
        let mut state = queue();
        lent(&mut state, &["a", "b", "c"], 2, 60_000, 100);
        // nextRequestAt passes, but the lease's permits may serve the items.
        as_sync(only(state.poll(5_000)));
        assert!(state.poll(5_001).is_empty());
        answer_lease(&mut state, 2, 60_000, 5_002);
        assert_eq!(admitted_ids(&mut state), ["a", "b"]);
        let messages = state.poll(5_003);
        let lanes: Vec<Lane> = messages.iter().map(|out| Lane::of(&out.message)).collect();
        assert_eq!(
            lanes,
            [Lane::Report, Lane::Demand],
            "the draws, and c's demand"
        );
        let request = as_request(messages[1].message.clone());
        assert_eq!(request.demand[0].count, 1);
    }

    #[test]
    fn no_request_in_the_poll_that_drew_lease_permits() {
        let mut state = queue();
        leased(&mut state, &["a"], 2, 60_000, 100);
        assert_eq!(admitted_ids(&mut state), ["a"]);
        as_sync(only(state.poll(100)));
        answer_lease(&mut state, 2, 60_000, 100);
        state
            .enqueue(vec![item("b", "wf"), item("c", "wf")], 3_000)
            .unwrap();
        // b draws the last permit; c's request waits for the next poll.
        let drawn = state.poll(3_000);
        assert_eq!(admitted_ids(&mut state), ["b"]);
        assert!(drawn
            .iter()
            .all(|out| Lane::of(&out.message) == Lane::Report));
        let request = state
            .poll(3_001)
            .into_iter()
            .find(|out| Lane::of(&out.message) == Lane::Demand)
            .expect("a request in the next poll");
        assert_eq!(as_request(request.message).demand[0].count, 1);
    }
}
