//! The queue's accounting: a synchronous, deterministic state machine.
//!
//! No IO, no clock, no randomness: time comes in as `now_ms`, the holder's
//! answers come in as protocol values, and out come the next messages per key
//! ([`QueueState::poll`]) and the items to admit ([`QueueState::take_admits`]).
//! The async loop in [`crate::queue`] only carries values between this, the
//! network, the application and the store (`crate::queue::store`).
//!
//! One item's life: `Queued` → (a permit of a confirmed lease is drawn:
//! `Admitted`) or (a
//! grant arrives: `Claiming` → the claim is confirmed: `Admitted`, or came back
//! `expired`/`not_found`: `Queued` again) → `release(id)` → `Released`.
//!
//! Per key, two lanes each carry at most one message in flight (see
//! `messages`): `request`s with demand, and `sync`s with every report
//! (claims, releases, heartbeats) as soon as it exists, so a freed permit never
//! waits behind a request parked for its round. Releases leaving in the same
//! poll as a request ride in it instead (the holder applies them with its next
//! entry, not the round).
//!
//! Invariants:
//! - an item is admitted only under a confirmed grant claim or a permit drawn
//!   from a confirmed lease, and each permit admits at most one item (a drawn
//!   permit is one-shot: releasing returns footprint, never drawability);
//! - a grant's `claimed` is fixed when it arrives (clamped down by an `expired`
//!   claim), `released <= claimed`; a lease's `released <= drawn <= permits`;
//! - reports are cumulative high-water marks: resending one is harmless;
//! - a grant is forgotten only once all its claimed permits are released and the
//!   holder acknowledged that; a lease only once the holder settled it;
//! - ids of released items are remembered (up to [`MAX_RELEASED_REMEMBERED`]), so a
//!   repeated enqueue or release of them is a no-op.
//!
//! Where each part lives (every file adds its own `impl` of [`QueueState`]):
//! - `items`: enqueue, release, status and counts; the queued index and the
//!   memory of released ids;
//! - `grants`: claiming a new grant, confirming or requeueing its claim, and
//!   reporting its releases until the holder acknowledged them;
//! - `leases`: confirming a new lease, drawing permits locally, heartbeats,
//!   retiring on `contended`, expiry or idleness, and reporting until the holder
//!   settled the lease;
//! - `messages`: per key, which message is due, what it reports, and applying
//!   the holder's answer to it.

mod grants;
mod items;
#[cfg(test)]
mod lane_properties;
mod leases;
mod messages;
#[cfg(test)]
mod test_support;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use grants::GrantHolding;
pub use items::{
    AdmittedItem, EnqueueOutcome, ItemPermit, ItemRecord, ItemStatus, Phase, QueueCounts,
    QueueItem, ReleaseOutcome, MAX_ITEM_ID_BYTES, MAX_RELEASED_REMEMBERED,
};
pub use leases::LeaseHolding;
pub use messages::{Lane, Outgoing};

use items::QueuedOrder;
use messages::KeyRuntime;

/// Default wait after a failed message before the key's next one, in ms.
pub const DEFAULT_FAILURE_RETRY_MS: u64 = 1_000;
/// Default `waitMs` of a demand request. Short enough that the demand a held
/// request carries (its counts, its oldest item) is never long out of date.
pub const DEFAULT_REQUEST_WAIT_MS: u64 = 1_000;
/// Default time a lease may sit with nothing queued in its group before its
/// undrawn permits are returned, in ms.
pub const DEFAULT_IDLE_LEASE_RETURN_MS: u64 = 30_000;

/// Tunables of the accounting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// Wait after a failed message before the key's next one, in ms.
    pub failure_retry_ms: u64,
    /// Return undrawn lease permits of a group that had nothing queued for this
    /// long, in ms. Without it headroom goes back only on `contended` or at the
    /// lease's TTL, and an idle runner never hears `contended`. `None` keeps
    /// leases until then.
    pub idle_lease_return_ms: Option<u64>,
    /// `waitMs` of each demand request: how long the leader may hold it when a
    /// round has nothing for it, so that the runner is answered when a permit
    /// frees instead of asking again after every round. Keep it well under the
    /// client's attempt timeout; 0 asks for an answer from every round.
    pub request_wait_ms: u64,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            failure_retry_ms: DEFAULT_FAILURE_RETRY_MS,
            idle_lease_return_ms: Some(DEFAULT_IDLE_LEASE_RETURN_MS),
            request_wait_ms: DEFAULT_REQUEST_WAIT_MS,
        }
    }
}

/// One key's permits, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyRecord {
    pub grants: BTreeMap<String, GrantHolding>,
    pub leases: BTreeMap<String, LeaseHolding>,
    pub next_request_at_ms: u64,
}

impl KeyRecord {
    fn is_empty(&self) -> bool {
        self.grants.is_empty() && self.leases.is_empty()
    }
}

/// Records changed since the store last saw them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Dirty {
    pub items: BTreeSet<String>,
    pub keys: BTreeSet<String>,
    /// Released ids to remember, with their sequence numbers.
    pub released_added: Vec<(u64, String)>,
    /// Released ids forgotten.
    pub released_removed: Vec<(u64, String)>,
    /// Changes are not recorded: the queue has no store (see
    /// [`QueueState::without_change_tracking`]).
    untracked: bool,
}

impl Dirty {
    pub(super) fn item(&mut self, id: &str) {
        if !self.untracked {
            self.items.insert(id.to_string());
        }
    }

    pub(super) fn key(&mut self, key: &str) {
        if !self.untracked {
            self.keys.insert(key.to_string());
        }
    }

    pub(super) fn released(&mut self, seq: u64, id: &str) {
        if !self.untracked {
            self.released_added.push((seq, id.to_string()));
        }
    }

    pub(super) fn forgotten(&mut self, seq: u64, id: String) {
        if !self.untracked {
            self.released_removed.push((seq, id));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
            && self.keys.is_empty()
            && self.released_added.is_empty()
            && self.released_removed.is_empty()
    }
}

/// The whole accounting of one queue.
#[derive(Debug)]
pub struct QueueState<T> {
    client_id: String,
    config: StateConfig,
    items: BTreeMap<String, ItemRecord<T>>,
    /// key → group → queued items in order.
    queued: BTreeMap<String, BTreeMap<String, BTreeMap<QueuedOrder, String>>>,
    keys: BTreeMap<String, KeyRecord>,
    runtime: BTreeMap<String, KeyRuntime>,
    /// Released id → sequence number, and the reverse for eviction.
    released: BTreeMap<String, u64>,
    released_by_seq: BTreeMap<u64, String>,
    next_order: u64,
    next_released_seq: u64,
    admits: Vec<AdmittedItem<T>>,
    dirty: Dirty,
}

impl<T: Clone> QueueState<T> {
    /// An empty queue for `client_id`.
    pub fn new(client_id: impl Into<String>, config: StateConfig) -> Self {
        Self {
            client_id: client_id.into(),
            config,
            items: BTreeMap::new(),
            queued: BTreeMap::new(),
            keys: BTreeMap::new(),
            runtime: BTreeMap::new(),
            released: BTreeMap::new(),
            released_by_seq: BTreeMap::new(),
            next_order: 0,
            next_released_seq: 0,
            admits: Vec::new(),
            dirty: Dirty::default(),
        }
    }

    /// A queue rebuilt from stored records. Items that were admitted are handed
    /// to `admit` again (the application's admit is a no-op for a known id),
    /// every held grant and lease is reported once, and leases from older files
    /// get their `confirmed` flag (`LeaseHolding::restored`).
    pub fn restore(
        client_id: impl Into<String>,
        config: StateConfig,
        items: Vec<ItemRecord<T>>,
        keys: Vec<(String, KeyRecord)>,
        released: Vec<(u64, String)>,
    ) -> Self {
        let mut state = Self::new(client_id, config);
        for (seq, id) in released {
            state.next_released_seq = state.next_released_seq.max(seq + 1);
            state.released.insert(id.clone(), seq);
            state.released_by_seq.insert(seq, id);
        }
        for (key, mut record) in keys {
            record.leases = std::mem::take(&mut record.leases)
                .into_iter()
                .map(|(lease_id, lease)| (lease_id, lease.restored()))
                .collect();
            if !record.is_empty() {
                state.runtime.entry(key.clone()).or_default().force_report = true;
            }
            state.keys.insert(key, record);
        }
        let mut items = items;
        items.sort_by_key(|item| item.order);
        for item in items {
            state.next_order = state.next_order.max(item.order + 1);
            match &item.phase {
                Phase::Queued => state.index_queued(&item),
                Phase::Admitted { permit } => state.admits.push(item.admitted(permit.clone())),
                Phase::Claiming { .. } => {}
            }
            state.items.insert(item.id.clone(), item);
        }
        state
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Items to hand to the application, in admission order.
    pub fn take_admits(&mut self) -> Vec<AdmittedItem<T>> {
        std::mem::take(&mut self.admits)
    }

    /// Records changed since the last call.
    pub fn take_dirty(&mut self) -> Dirty {
        let untracked = self.dirty.untracked;
        let dirty = std::mem::take(&mut self.dirty);
        self.dirty.untracked = untracked;
        dirty
    }

    /// Stops recording changed records, for a queue without a store: nothing
    /// would read them, and recording costs a copy of every id it touches.
    pub fn without_change_tracking(mut self) -> Self {
        self.dirty = Dirty {
            untracked: true,
            ..Dirty::default()
        };
        self
    }

    pub fn item(&self, id: &str) -> Option<&ItemRecord<T>> {
        self.items.get(id)
    }

    pub fn key_record(&self, key: &str) -> Option<&KeyRecord> {
        self.keys.get(key)
    }

    /// A change set naming every live record: what a store compacting its
    /// file writes.
    pub fn all_records(&self) -> Dirty {
        Dirty {
            items: self.items.keys().cloned().collect(),
            keys: self.keys.keys().cloned().collect(),
            released_added: self
                .released_by_seq
                .iter()
                .map(|(seq, id)| (*seq, id.clone()))
                .collect(),
            ..Dirty::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use permitd_core::contract::protocol::GrantStatus;

    use super::test_support::*;
    use super::*;

    #[test]
    fn a_restored_queue_readmits_and_reports_what_it_held() {
        let mut state = queue();
        granted_and_claiming(&mut state, &["a", "b", "c"], 2);
        answer_claim(&mut state, 2, GrantStatus::Ok, 1_200);
        state.take_admits();
        state.release("a");
        let items: Vec<ItemRecord<u32>> = state.items.values().cloned().collect();
        let keys: Vec<(String, KeyRecord)> = state.keys.clone().into_iter().collect();
        let released: Vec<(u64, String)> = state.released_by_seq.clone().into_iter().collect();
        let mut restored =
            QueueState::restore("runner-1", StateConfig::default(), items, keys, released);
        assert_eq!(
            admitted_ids(&mut restored),
            ["b"],
            "admit again: the application dedups"
        );
        assert_eq!(restored.status("a"), ItemStatus::Released);
        assert_eq!(restored.status("c"), ItemStatus::Queued);
        // The first message reports the grant (claimed 2, released 1) at once ...
        let sync = as_sync(only(restored.poll(1_300)));
        assert_eq!((sync.grants[0].claimed, sync.grants[0].released), (2, 1));
        answer_claim(&mut restored, 2, GrantStatus::Ok, 1_300);
        // ... and c is asked for when nextRequestAt comes.
        assert!(restored.poll(2_000).is_empty());
        let request = as_request(only(restored.poll(2_100)));
        assert_eq!(request.demand[0].count, 1);
    }

    /// A key record as files from before leases were claimed hold it: leases
    /// without `confirmed`.
    fn key_record_of_an_older_file(drawn: u64) -> KeyRecord {
        serde_json::from_value(serde_json::json!({
            "grants": {},
            "leases": {"L": {
                "group": "wf", "permits": 4, "expiresAtMs": 60_000, "ttlMs": 60_000,
                "drawn": drawn, "released": 0, "retired": false,
                "acked": {"leaseId": "L", "drawn": drawn, "released": 0, "retired": false},
                "idleSinceMs": null
            }},
            "nextRequestAtMs": 0
        }))
        .expect("older key records still decode")
    }

    fn restored_with_queued_item(record: KeyRecord) -> QueueState<u32> {
        let mut state = queue();
        state.enqueue(vec![item("q", "wf")], 50).unwrap();
        let items: Vec<ItemRecord<u32>> = state.items.values().cloned().collect();
        QueueState::restore(
            "runner-1",
            StateConfig::default(),
            items,
            vec![(KEY.to_string(), record)],
            vec![],
        )
    }

    #[test]
    fn a_restored_lease_that_was_drawn_from_stays_drawable() {
        let record = key_record_of_an_older_file(1);
        assert!(!record.leases["L"].confirmed, "the flag defaults to false");
        let mut restored = restored_with_queued_item(record);
        assert!(restored.key_record(KEY).unwrap().leases["L"].confirmed);
        let sync = as_sync(only(restored.poll(100)));
        assert_eq!(admitted_ids(&mut restored), ["q"], "drawn without a claim");
        assert_eq!(sync.leases.unwrap()[0].drawn, 2);
    }

    #[test]
    fn a_restored_undrawn_lease_is_claimed_before_it_is_drawn_from() {
        let mut restored = restored_with_queued_item(key_record_of_an_older_file(0));
        let claim = as_sync(only(restored.poll(100)));
        assert!(admitted_ids(&mut restored).is_empty());
        let report = &claim.leases.unwrap()[0];
        assert_eq!(
            (report.drawn, report.released, report.retired),
            (0, 0, false)
        );
        // An answer without a live echo of it leaves it unconfirmed (though its
        // stored `acked` matches): the claim is sent again.
        restored.on_answer(KEY, synced(vec![], vec![], false), 200);
        let claim = as_sync(only(restored.poll(200)));
        assert_eq!(claim.leases.unwrap()[0].lease_id, "L");
        assert!(admitted_ids(&mut restored).is_empty());
        answer_lease(&mut restored, 4, 60_200, 200);
        assert_eq!(admitted_ids(&mut restored), ["q"]);
        // The confirmed flag is stored from now on.
        let stored = serde_json::to_value(restored.key_record(KEY).unwrap()).unwrap();
        assert_eq!(stored["leases"]["L"]["confirmed"], true);
    }
}
