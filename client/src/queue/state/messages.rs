//! Messages: per key, what is due to the holder, and what its answer changes.
//!
//! Each key has at most one message in flight; what it reported is kept
//! ([`InFlight`]) so the answer is matched against what the holder saw, not
//! against what changed since. A failed message frees the key after
//! `failure_retry_ms`.

use std::collections::{BTreeMap, BTreeSet};

use permitd_core::limits::MAX_DEMAND_ENTRIES;
use permitd_core::protocol::{
    Demand, GrantReport, LeaseReport, PermitGrant, PermitRequest, PermitSync, SemaphoreRequest,
    SemaphoreResponse, V1,
};

use super::{KeyRecord, QueueState};

/// What a message in flight reported, to match the holder's answer against.
#[derive(Debug, Clone, Default)]
pub(super) struct InFlight {
    pub(super) grants: BTreeMap<String, GrantReport>,
    pub(super) leases: BTreeMap<String, LeaseReport>,
}

/// Per-key state that is not stored.
#[derive(Debug, Clone, Default)]
pub(super) struct KeyRuntime {
    pub(super) in_flight: Option<InFlight>,
    pub(super) retry_at_ms: u64,
    /// Report every holding once (after a restart, or at shutdown).
    pub(super) force_report: bool,
}

/// A message to send for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub key: String,
    pub message: SemaphoreRequest,
}

impl<T: Clone> QueueState<T> {
    /// Keys with a message in flight.
    pub fn in_flight(&self) -> usize {
        self.runtime
            .values()
            .filter(|runtime| runtime.in_flight.is_some())
            .count()
    }

    /// Advances time: draws lease permits for queued items, retires expired and
    /// idle leases, and returns the messages now due (each key's in-flight slot
    /// is taken until [`Self::on_answer`] or [`Self::on_failure`]).
    pub fn poll(&mut self, now_ms: u64) -> Vec<Outgoing> {
        let keys: Vec<String> = self.active_keys();
        let mut outgoing = Vec::new();
        for key in keys {
            self.draw(&key, now_ms);
            self.retire_stale_leases(&key, now_ms);
            if let Some(message) = self.due_message(&key, now_ms) {
                outgoing.push(Outgoing { key, message });
            }
        }
        outgoing
    }

    /// When [`Self::poll`] may next have something to do, if ever (absent new
    /// items, releases or answers).
    pub fn next_wakeup_ms(&self, now_ms: u64) -> Option<u64> {
        let mut wakeup: Option<u64> = None;
        let mut consider = |at: u64| wakeup = Some(wakeup.map_or(at, |known| known.min(at)));
        for key in self.active_keys() {
            let runtime = self.runtime.get(&key).cloned().unwrap_or_default();
            if runtime.in_flight.is_some() {
                continue;
            }
            if self.has_queued(&key) || runtime.force_report {
                consider(self.next_request_at_ms(&key).max(runtime.retry_at_ms));
            }
            let Some(record) = self.keys.get(&key) else {
                continue;
            };
            if record.grants.values().any(|grant| grant.needs_report()) {
                consider(runtime.retry_at_ms);
            }
            for lease in record.leases.values() {
                if lease.needs_report() {
                    consider(runtime.retry_at_ms);
                }
                if let Some(due) = lease.heartbeat_due_ms() {
                    consider(due.max(runtime.retry_at_ms));
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

    /// The holder answered the key's message in flight.
    pub fn on_answer(&mut self, key: &str, answer: SemaphoreResponse, now_ms: u64) {
        let Some(sent) = self
            .runtime
            .get_mut(key)
            .and_then(|runtime| runtime.in_flight.take())
        else {
            debug_assert!(
                false,
                "an answer for key {key:?} without a message in flight"
            );
            return;
        };
        self.dirty.keys.insert(key.to_string());
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
                self.apply_grant_results(key, &sent, grant_results);
                for granted in grants {
                    self.accept_grant(key, granted);
                }
                let record = self.keys.entry(key.to_string()).or_default();
                record.next_request_at_ms = record.next_request_at_ms.max(next_request_at_ms);
                (Vec::new(), leases, contended)
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

    /// The key's message in flight failed (deadline passed, or rejected).
    pub fn on_failure(&mut self, key: &str, now_ms: u64) {
        if let Some(runtime) = self.runtime.get_mut(key) {
            runtime.in_flight = None;
            runtime.retry_at_ms = now_ms.saturating_add(self.config.failure_retry_ms);
        }
    }

    /// Reports only (never demand) for every key with something to report: what
    /// shutdown sends.
    pub fn poll_reports(&mut self, now_ms: u64) -> Vec<Outgoing> {
        let keys: Vec<String> = self.keys.keys().cloned().collect();
        let mut outgoing = Vec::new();
        for key in keys {
            if !self.busy(&key) && self.reports_due(&key, now_ms) {
                outgoing.push(Outgoing {
                    message: self.take_sync(&key),
                    key,
                });
            }
        }
        outgoing
    }

    fn active_keys(&self) -> Vec<String> {
        let mut keys: BTreeSet<&String> = self.keys.keys().collect();
        keys.extend(
            self.queued
                .iter()
                .filter(|(_, groups)| !groups.is_empty())
                .map(|(key, _)| key),
        );
        keys.into_iter().cloned().collect()
    }

    /// Whether the key has a message in flight.
    fn busy(&self, key: &str) -> bool {
        self.runtime
            .get(key)
            .is_some_and(|runtime| runtime.in_flight.is_some())
    }

    fn next_request_at_ms(&self, key: &str) -> u64 {
        self.keys
            .get(key)
            .map_or(0, |record| record.next_request_at_ms)
    }

    fn due_message(&mut self, key: &str, now_ms: u64) -> Option<SemaphoreRequest> {
        let runtime = self.runtime.entry(key.to_string()).or_default();
        if runtime.in_flight.is_some() || now_ms < runtime.retry_at_ms {
            return None;
        }
        // Claims first: a sync is not held back by nextRequestAt, and the holder
        // reclaims grants and leases not confirmed by their claim deadline.
        let claims_waiting = self.keys.get(key).is_some_and(|record| {
            record
                .grants
                .values()
                .any(|grant| grant.awaits_confirmation())
                || record
                    .leases
                    .values()
                    .any(|lease| lease.awaits_confirmation())
        });
        let request_due = self.has_queued(key) && self.next_request_at_ms(key) <= now_ms;
        if !claims_waiting && request_due {
            return Some(self.take_request(key));
        }
        if self.reports_due(key, now_ms) {
            return Some(self.take_sync(key));
        }
        None
    }

    fn reports_due(&self, key: &str, now_ms: u64) -> bool {
        let Some(record) = self.keys.get(key) else {
            return false;
        };
        if record.is_empty() {
            return false;
        }
        let forced = self
            .runtime
            .get(key)
            .is_some_and(|runtime| runtime.force_report);
        forced
            || record.grants.values().any(|grant| grant.needs_report())
            || record.leases.values().any(|lease| {
                lease.needs_report() || lease.heartbeat_due_ms().is_some_and(|due| due <= now_ms)
            })
    }

    fn take_reports(&mut self, key: &str) -> (Vec<GrantReport>, Vec<LeaseReport>) {
        let runtime = self.runtime.entry(key.to_string()).or_default();
        let forced = std::mem::take(&mut runtime.force_report);
        let grants = self.grant_reports(key, forced);
        let leases = self.lease_reports(key);
        let in_flight = InFlight {
            grants: grants
                .iter()
                .map(|report| (report.grant_id.clone(), report.clone()))
                .collect(),
            leases: leases
                .iter()
                .map(|report| (report.lease_id.clone(), report.clone()))
                .collect(),
        };
        self.runtime.entry(key.to_string()).or_default().in_flight = Some(in_flight);
        (grants, leases)
    }

    fn take_request(&mut self, key: &str) -> SemaphoreRequest {
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
        let (grants, leases) = self.take_reports(key);
        SemaphoreRequest::Request(PermitRequest {
            v: V1,
            client_id: self.client_id.clone(),
            request_id: None,
            demand,
            grants,
            leases: Some(leases),
        })
    }

    fn take_sync(&mut self, key: &str) -> SemaphoreRequest {
        let (grants, leases) = self.take_reports(key);
        SemaphoreRequest::Sync(PermitSync {
            v: V1,
            client_id: self.client_id.clone(),
            grants,
            leases: Some(leases),
        })
    }

    fn drop_if_empty(&mut self, key: &str) {
        let idle = self.keys.get(key).is_some_and(KeyRecord::is_empty)
            && !self.has_queued(key)
            && !self.busy(key);
        if idle {
            // The client keeps honouring the key's nextRequestAt on its own.
            self.keys.remove(key);
            self.runtime.remove(key);
            self.dirty.keys.insert(key.to_string());
        }
    }
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
        assert!(state.poll(300).is_empty(), "one message in flight per key");
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
        state.on_failure(KEY, 2_500);
        assert!(state.poll(3_000).is_empty());
        as_request(only(state.poll(3_500)));
    }
}
