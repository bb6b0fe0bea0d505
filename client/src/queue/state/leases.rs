//! Leases: permits the holder lent this client to draw from locally.
//!
//! A new lease is claimed like a grant: the holder reclaims a lease its client
//! has not reported by the lease's claim deadline (`grantTimeoutMs` after the
//! round that lent it), since a lent lease whose answer was lost would otherwise
//! be held forever. So a lease starts unconfirmed, is reported at once, and is
//! drawn from only after the holder echoed that report live: a draw before then
//! could run work under permits the holder is about to hand to someone else.
//! An unconfirmed lease echoed stopped with `permits: 0` (reclaimed, unknown or
//! settled) is dropped.
//!
//! Each queued item of the lease's group draws one permit, oldest first, while
//! the lease is live; a drawn permit is one-shot. Every report of a lease is a
//! heartbeat, sent at the latest at half its lifetime while permits are in use.
//! A lease stops being drawn from (is retired) when it expires, when the holder
//! says `contended` and its group has nothing queued, when its group stayed idle
//! for the configured time, or at shutdown; the retired lease is reported until
//! the holder settles it (echoes `permits <= released`).

use permitd_core::contract::protocol::{LeaseGrant, LeaseReport};
use permitd_core::limits::MAX_LEASE_REPORTS;
use serde::{Deserialize, Serialize};

use super::messages::InFlight;
use super::{ItemPermit, Phase, QueueState};

/// A lease this client holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseHolding {
    pub group: String,
    pub permits: u64,
    pub expires_at_ms: u64,
    /// The lease's lifetime as first seen (`expiresAt` minus arrival time).
    pub ttl_ms: u64,
    pub drawn: u64,
    pub released: u64,
    /// No more draws: retired by this client or by the holder.
    pub retired: bool,
    /// The holder echoed a report of this lease live, so it will not reclaim it
    /// at the claim deadline: only then may permits be drawn. Absent in files
    /// written before leases were claimed (see `restored`).
    #[serde(default)]
    pub confirmed: bool,
    /// The last report the holder acknowledged.
    pub acked: Option<LeaseReport>,
    /// Since when its group has had nothing queued.
    pub idle_since_ms: Option<u64>,
}

impl LeaseHolding {
    /// A lease the holder just lent: unconfirmed, and no report of it has been
    /// acknowledged, so one is due at once (before its claim deadline).
    fn lent(echo: LeaseGrant, now_ms: u64) -> Self {
        Self {
            group: echo.group,
            permits: echo.permits,
            expires_at_ms: echo.expires_at_ms,
            ttl_ms: echo.expires_at_ms - now_ms,
            drawn: 0,
            released: 0,
            retired: false,
            confirmed: false,
            acked: None,
            idle_since_ms: None,
        }
    }

    /// A lease read back from the queue file. A file from before leases were
    /// claimed has no `confirmed` flag (it reads `false`), but a lease that was
    /// drawn from was held under the old rules, where the holder never reclaims
    /// a lease: it must stay drawable, or its undrawn permits would idle until
    /// it is retired. An undrawn one is claimed like a new lease.
    pub(super) fn restored(mut self) -> Self {
        self.confirmed |= self.drawn > 0;
        self
    }

    fn report(&self, lease_id: &str) -> LeaseReport {
        LeaseReport {
            lease_id: lease_id.to_string(),
            drawn: self.drawn,
            released: self.released,
            retired: self.retired,
        }
    }

    pub(super) fn drawable(&self, now_ms: u64) -> bool {
        self.confirmed && !self.retired && self.drawn < self.permits && now_ms < self.expires_at_ms
    }

    /// Draws wait on this lease until the holder confirms it. A retired lease
    /// is never drawn from again, so there is nothing to wait for: it is
    /// reported until settled like any retired lease.
    pub(super) fn awaits_confirmation(&self) -> bool {
        !self.confirmed && !self.retired
    }

    /// When a lease with permits in use must be heartbeated: half its lifetime.
    pub(super) fn heartbeat_due_ms(&self) -> Option<u64> {
        (!self.retired && self.drawn > self.released)
            .then(|| self.expires_at_ms.saturating_sub(self.ttl_ms / 2))
    }

    /// Whether the lease awaits confirmation, or changed since the holder last
    /// acknowledged a report of it.
    pub(super) fn needs_report(&self) -> bool {
        if self.awaits_confirmation() {
            return true;
        }
        match &self.acked {
            None => true,
            Some(acked) => {
                (acked.drawn, acked.released, acked.retired)
                    != (self.drawn, self.released, self.retired)
            }
        }
    }
}

impl<T: Clone> QueueState<T> {
    /// For shutdown: stop drawing from every lease, so the next reports return
    /// all undrawn permits, and report every holding once more.
    pub fn retire_all_leases(&mut self) {
        for (key, record) in &mut self.keys {
            let mut changed = false;
            for lease in record.leases.values_mut() {
                changed |= !lease.retired;
                lease.retired = true;
            }
            if changed {
                self.dirty.key(key);
            }
            let runtime = self.runtime.entry(key.clone()).or_default();
            runtime.force_report = !record.is_empty();
            runtime.report_retry_at_ms = 0;
        }
    }

    /// Lease reports: every lease (each report is a heartbeat), capped.
    /// Unconfirmed leases go first: one left out of every report until its claim
    /// deadline is reclaimed, while a confirmed one left out only misses a
    /// heartbeat.
    pub(super) fn lease_reports(&self, key: &str) -> Vec<LeaseReport> {
        let Some(record) = self.keys.get(key) else {
            return Vec::new();
        };
        let (unconfirmed, confirmed): (Vec<_>, Vec<_>) = record
            .leases
            .iter()
            .partition(|(_, lease)| !lease.confirmed);
        unconfirmed
            .into_iter()
            .chain(confirmed)
            .take(MAX_LEASE_REPORTS)
            .map(|(lease_id, lease)| lease.report(lease_id))
            .collect()
    }

    /// Takes in the holder's view of the key's leases: new leases are held
    /// (unconfirmed), settled ones forgotten, acknowledged reports noted, leases
    /// echoed live to a report confirmed, and leases the holder cut short retired.
    pub(super) fn apply_lease_echoes(
        &mut self,
        key: &str,
        sent: &InFlight,
        echoes: Vec<LeaseGrant>,
        now_ms: u64,
    ) {
        let record = self.keys.entry(key.to_string()).or_default();
        for echo in echoes {
            let Some(lease) = record.leases.get_mut(&echo.lease_id) else {
                let live =
                    echo.permits > 0 && !echo.group.is_empty() && echo.expires_at_ms > now_ms;
                if live && !sent.leases.contains_key(&echo.lease_id) {
                    let lease_id = echo.lease_id.clone();
                    record
                        .leases
                        .insert(lease_id, LeaseHolding::lent(echo, now_ms));
                }
                continue;
            };
            let report = sent.leases.get(&echo.lease_id);
            let settled = report.is_some_and(|report| {
                echo.permits <= report.released
                    && report.released >= report.drawn
                    && lease.drawn == report.drawn
            });
            if settled {
                record.leases.remove(&echo.lease_id);
                continue;
            }
            if let Some(report) = report {
                lease.acked = Some(report.clone());
            }
            let live = echo.permits > 0 && !echo.group.is_empty() && echo.expires_at_ms > now_ms;
            // Only an echo of this client's own report acknowledges the lease: an
            // unsolicited echo (a lease the holder retired this round) does not.
            if live && report.is_some() {
                lease.confirmed = true;
            }
            // An unconfirmed lease echoed stopped with permits left (retired by
            // the holder, who saw the report, so will not reclaim it) is not
            // dropped here: the holder keeps its footprint until this client's
            // own retired report, which the retirement below sends.
            let retired_by_holder = echo.group.is_empty()
                || echo.expires_at_ms <= now_ms
                || echo.expires_at_ms < lease.expires_at_ms;
            if retired_by_holder {
                lease.retired = true;
            } else {
                lease.expires_at_ms = echo.expires_at_ms;
            }
        }
    }

    /// `contended`: stop drawing from leases whose group has nothing queued, so
    /// their undrawn permits go back with the next report.
    pub(super) fn return_idle_leases(&mut self, key: &str) {
        let queued_groups = self.queued_groups(key);
        if let Some(record) = self.keys.get_mut(key) {
            for lease in record.leases.values_mut() {
                if !queued_groups.contains(&lease.group) {
                    lease.retired = true;
                }
            }
        }
    }

    /// Retires leases past their expiry, and leases whose group had nothing
    /// queued for the configured idle time.
    pub(super) fn retire_stale_leases(&mut self, key: &str, now_ms: u64) {
        let idle_ms = self.config.idle_lease_return_ms;
        let Some(record) = self.keys.get_mut(key) else {
            return;
        };
        // Runs every poll: looks groups up instead of copying their names.
        let queued_groups = self.queued.get(key);
        for lease in record.leases.values_mut().filter(|lease| !lease.retired) {
            if queued_groups.is_some_and(|groups| groups.contains_key(&lease.group)) {
                lease.idle_since_ms = None;
            } else {
                lease.idle_since_ms.get_or_insert(now_ms);
            }
            let idle_expired = match (lease.idle_since_ms, idle_ms) {
                (Some(since), Some(idle)) => now_ms >= since.saturating_add(idle),
                _ => false,
            };
            if now_ms >= lease.expires_at_ms || idle_expired {
                lease.retired = true;
                self.dirty.key(key);
            }
        }
    }

    /// Admits queued items of the key under drawable lease permits, oldest first
    /// per group, one permit per item. Returns whether it drew any.
    pub(super) fn draw(&mut self, key: &str, now_ms: u64) -> bool {
        let Some(record) = self.keys.get_mut(key) else {
            return false;
        };
        let Some(groups) = self.queued.get_mut(key) else {
            return false;
        };
        let mut drew = false;
        for (lease_id, lease) in record.leases.iter_mut() {
            let Some(items) = groups.get_mut(&lease.group) else {
                continue;
            };
            while lease.drawable(now_ms) {
                let Some((_, id)) = items.pop_first() else {
                    break;
                };
                lease.drawn += 1;
                drew = true;
                let permit = ItemPermit::Lease {
                    lease_id: lease_id.clone(),
                };
                let item = self.items.get_mut(&id).expect("queued items exist");
                item.phase = Phase::Admitted {
                    permit: permit.clone(),
                };
                self.dirty.item(&id);
                self.admits.push(item.admitted(permit));
            }
        }
        if drew {
            groups.retain(|_, items| !items.is_empty());
            if groups.is_empty() {
                self.queued.remove(key);
            }
            self.dirty.key(key);
        }
        drew
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{ItemStatus, StateConfig};
    use super::*;

    /// The report of lease `L` as a sync carries it.
    fn lease_report(drawn: u64, released: u64, retired: bool) -> LeaseReport {
        LeaseReport {
            lease_id: "L".into(),
            drawn,
            released,
            retired,
        }
    }

    #[test]
    fn a_new_lease_is_claimed_at_once_and_not_drawn_from_before_confirmation() {
        let mut state = queue();
        state
            .enqueue(
                vec![item("a", "wf"), item("b", "wf"), item("x", "other")],
                100,
            )
            .unwrap();
        as_request(only(state.poll(100)));
        // nextRequestAt has already come (x is still queued), yet the claim goes first.
        state.on_answer(
            KEY,
            grant_answer(vec![], vec![lease("L", "wf", 2, 60_100)], 100),
            100,
        );
        assert!(
            admitted_ids(&mut state).is_empty(),
            "no draw before confirmation"
        );
        assert_eq!(state.status("a"), ItemStatus::Queued);
        assert_eq!(state.counts(100).drawable, 0);
        assert!(!state.key_record(KEY).unwrap().leases["L"].confirmed);
        assert_eq!(state.next_wakeup_ms(100), Some(100), "the claim is due now");
        let claim = as_sync(only(state.poll(100)));
        assert_eq!(claim.leases.unwrap(), [lease_report(0, 0, false)]);
        assert!(admitted_ids(&mut state).is_empty());
        // A lost claim is sent again after the failure wait, still undrawn.
        state.on_failure(KEY, Lane::Report, 200);
        assert!(state.poll(1_199).is_empty());
        let claim = as_sync(only(state.poll(1_200)));
        assert_eq!(claim.leases.unwrap(), [lease_report(0, 0, false)]);
        assert!(admitted_ids(&mut state).is_empty());
    }

    #[test]
    fn a_live_echo_of_the_claim_confirms_the_lease_and_draws_start() {
        let mut state = queue();
        lent(&mut state, &["a", "b", "c"], 2, 60_100, 100);
        as_sync(only(state.poll(100)));
        answer_lease(&mut state, 2, 60_300, 300);
        assert_eq!(admitted_ids(&mut state), ["a", "b"]);
        let lease = &state.key_record(KEY).unwrap().leases["L"];
        assert!(lease.confirmed && lease.drawn == 2);
        assert_eq!(lease.expires_at_ms, 60_300, "the echo refreshed it");
        // The draws are reported next, as for any confirmed lease.
        let sync = as_sync(only(state.poll(300)));
        assert_eq!(sync.leases.unwrap(), [lease_report(2, 0, false)]);
    }

    #[test]
    fn an_unconfirmed_lease_echoed_stopped_is_dropped_and_its_items_wait() {
        let mut state = queue();
        lent(&mut state, &["a", "b"], 2, 60_100, 100);
        as_sync(only(state.poll(100)));
        // Reclaimed at its claim deadline (or unknown): permits 0, expiresAt now.
        state.on_answer(
            KEY,
            synced(vec![], vec![lease("L", "", 0, 20_000)], false),
            20_000,
        );
        assert!(admitted_ids(&mut state).is_empty());
        assert_eq!(state.counts(20_000).leases, 0);
        assert_eq!(state.status("a"), ItemStatus::Queued);
        // The items are asked for again; the dropped lease is not reported.
        let request = as_request(only(state.poll(20_000)));
        assert_eq!(request.demand[0].count, 2);
        assert_eq!(request.leases, Some(vec![]));
    }

    #[test]
    fn an_unconfirmed_lease_the_holder_retired_is_returned_undrawn_until_settled() {
        let mut state = queue();
        lent(&mut state, &["a"], 2, 60_100, 100);
        as_sync(only(state.poll(100)));
        // The holder saw the claim but retired the lease (expiresAt = its now):
        // it keeps the footprint until this client's retired report.
        answer_lease(&mut state, 2, 200, 200);
        assert!(admitted_ids(&mut state).is_empty());
        let lease = &state.key_record(KEY).unwrap().leases["L"];
        assert!(lease.retired && !lease.confirmed);
        let sync = as_sync(only(state.poll(200)));
        assert_eq!(sync.leases.unwrap(), [lease_report(0, 0, true)]);
        assert!(admitted_ids(&mut state).is_empty());
        // Shrunk to nothing drawn and deleted: settled.
        answer_lease(&mut state, 0, 300, 300);
        assert_eq!(state.counts(300).leases, 0);
        assert!(
            state.poll(300).is_empty(),
            "next request waits for nextRequestAt"
        );
        assert_eq!(as_request(only(state.poll(2_100))).demand[0].count, 1);
    }

    #[test]
    fn lease_permits_are_drawn_locally_one_per_item_and_are_one_shot() {
        let mut state = queue();
        leased(&mut state, &["a", "b", "c"], 2, 60_100, 100);
        assert_eq!(admitted_ids(&mut state), ["a", "b"]);
        assert_eq!(state.status("c"), ItemStatus::Queued);
        state.release("a");
        // A released permit is not drawable again: c waits for the next round.
        let sync = as_sync(only(state.poll(200)));
        assert_eq!(sync.leases.unwrap(), [lease_report(2, 1, false)]);
        assert!(admitted_ids(&mut state).is_empty());
        answer_lease(&mut state, 2, 60_200, 300);
        assert!(
            state.poll(300).is_empty(),
            "the next request waits for nextRequestAt"
        );
        let request = as_request(only(state.poll(2_100)));
        assert_eq!(request.demand[0].count, 1);
        assert_eq!(request.leases, Some(vec![]), "reports travel in syncs only");
    }

    #[test]
    fn contended_returns_undrawn_permits_of_idle_groups_until_settled() {
        let mut state = queue();
        leased(&mut state, &["a"], 8, 60_100, 100);
        assert_eq!(admitted_ids(&mut state), ["a"]);
        state.release("a");
        as_sync(only(state.poll(200)));
        // The holder says others wait: the idle lease is retired with what it drew.
        state.on_answer(
            KEY,
            synced(vec![], vec![lease("L", "wf", 8, 60_200)], true),
            300,
        );
        let sync = as_sync(only(state.poll(300)));
        assert_eq!(sync.leases.unwrap(), [lease_report(1, 1, true)]);
        assert_eq!(
            state.counts(300).drawable,
            0,
            "a retired lease is not drawn from"
        );
        // Settled: the holder echoes permits = released.
        answer_lease(&mut state, 1, 300, 400);
        assert_eq!(state.counts(400).leases, 0);
        assert!(state.poll(500).is_empty());
    }

    #[test]
    fn a_retired_lease_is_reported_until_the_holder_settles_it() {
        let mut state = queue();
        leased(&mut state, &["a", "b"], 2, 60_100, 100);
        assert_eq!(admitted_ids(&mut state).len(), 2);
        // Retired by the holder (expiresAt = its now): stop drawing, report it.
        state.enqueue(vec![item("c", "wf")], 150).unwrap();
        // The draws are reported while c's request waits for its round.
        let messages = state.poll(2_100);
        assert_eq!(messages.len(), 2, "{messages:?}");
        answer_lease(&mut state, 2, 60_100, 2_100);
        state.on_answer(
            KEY,
            grant_answer(vec![], vec![lease("L", "wf", 2, 2_100)], 4_100),
            2_100,
        );
        assert!(
            admitted_ids(&mut state).is_empty(),
            "no draw from a retired lease"
        );
        let sync = as_sync(only(state.poll(2_200)));
        let report = &sync.leases.unwrap()[0];
        assert!(report.retired && report.drawn == 2 && report.released == 0);
        // The holder shrinks it to what was drawn; work still runs.
        answer_lease(&mut state, 2, 2_200, 2_200);
        assert_eq!(state.counts(2_200).leases, 1);
        state.release("a");
        state.release("b");
        let sync = as_sync(only(state.poll(2_300)));
        assert_eq!(sync.leases.unwrap()[0].released, 2);
        answer_lease(&mut state, 2, 2_300, 2_300);
        assert_eq!(state.counts(2_300).leases, 0);
    }

    #[test]
    fn leases_in_use_heartbeat_at_half_their_lifetime() {
        let mut state = queue();
        leased(&mut state, &["a"], 1, 10_000, 0);
        assert_eq!(admitted_ids(&mut state), ["a"]);
        let sync = as_sync(only(state.poll(1)));
        answer_lease(&mut state, 1, 10_001, 1);
        assert_eq!(sync.leases.unwrap()[0].drawn, 1);
        assert!(state.poll(4_999).is_empty());
        assert_eq!(state.next_wakeup_ms(4_999), Some(5_001));
        let heartbeat = as_sync(only(state.poll(5_001)));
        assert_eq!(heartbeat.leases.unwrap()[0].lease_id, "L");
        answer_lease(&mut state, 1, 15_001, 5_001);
        assert!(state.poll(5_002).is_empty());
    }

    #[test]
    fn an_idle_lease_is_returned_after_the_idle_time() {
        let config = StateConfig {
            idle_lease_return_ms: Some(1_000),
            ..StateConfig::default()
        };
        let mut state = QueueState::<u32>::new("runner-1", config);
        leased(&mut state, &["a"], 4, 600_000, 0);
        state.release("a");
        as_sync(only(state.poll(10)));
        answer_lease(&mut state, 4, 600_010, 10);
        assert!(state.poll(500).is_empty());
        let sync = as_sync(only(state.poll(1_600)));
        assert!(sync.leases.unwrap()[0].retired);
    }

    #[test]
    fn shutdown_retires_every_lease_and_reports_it() {
        let mut state = queue();
        leased(&mut state, &["a"], 4, 600_000, 0);
        state.take_admits();
        state.retire_all_leases();
        let sync = as_sync(only(state.poll_reports(10)));
        let report = &sync.leases.unwrap()[0];
        assert!(report.retired && report.drawn == 1);
    }
}
