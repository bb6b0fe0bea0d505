//! The queue's accounting: a synchronous, deterministic state machine.
//!
//! No IO, no clock, no randomness: time comes in as `now_ms`, the holder's
//! answers come in as protocol values, and out come the next messages per key
//! ([`QueueState::poll`]) and the items to admit ([`QueueState::take_admits`]).
//! The async loop in [`crate::queue`] only carries values between this, the
//! network, the application and the sled store.
//!
//! One item's life: `Queued` → (a lease permit is drawn: `Admitted`) or (a
//! grant arrives: `Claiming` → the claim is confirmed: `Admitted`, or came back
//! `expired`/`not_found`: `Queued` again) → `release(id)` → `Released`.
//!
//! Per key, at most one message is in flight. What is due is sent in this order:
//! a `sync` while grant claims wait for confirmation (admission waits on it); a
//! `request` when items are queued and the key's `nextRequestAt` has come; a
//! `sync` when a report changed or a lease in use is at half its lifetime.
//!
//! Invariants:
//! - an item is admitted only under a confirmed grant claim or a drawn lease
//!   permit, and each permit admits at most one item (a drawn permit is one-shot:
//!   releasing returns footprint, never drawability);
//! - a grant's `claimed` is fixed when it arrives (clamped down by an `expired`
//!   claim), `released <= claimed`; a lease's `released <= drawn <= permits`;
//! - reports are cumulative high-water marks: resending one is harmless;
//! - a grant is forgotten only once all its claimed permits are released and the
//!   holder acknowledged that; a lease only once the holder settled it;
//! - ids of released items are remembered (up to [`MAX_RELEASED_REMEMBERED`]), so a
//!   repeated enqueue or release of them is a no-op.

use std::collections::{BTreeMap, BTreeSet};

use permitd_core::limits::{
    MAX_DEMAND_ENTRIES, MAX_GRANT_REPORTS, MAX_GROUP_BYTES, MAX_KEY_BYTES, MAX_LEASE_REPORTS,
};
use permitd_core::protocol::{
    Demand, GrantReport, GrantResult, GrantStatus, GrantedPermits, LeaseGrant, LeaseReport,
    PermitGrant, PermitRequest, PermitSync, SemaphoreRequest, SemaphoreResponse, V1,
};
use serde::{Deserialize, Serialize};

use crate::error::QueueError;

/// Longest item id, in bytes of UTF-8.
pub const MAX_ITEM_ID_BYTES: usize = 256;
/// Ids of released items remembered for `status` and no-op re-enqueues.
pub const MAX_RELEASED_REMEMBERED: usize = 100_000;
/// Default wait after a failed message before the key's next one, in ms.
pub const DEFAULT_FAILURE_RETRY_MS: u64 = 1_000;
/// Default time a lease may sit with nothing queued in its group before its
/// undrawn permits are returned, in ms.
pub const DEFAULT_IDLE_LEASE_RETURN_MS: u64 = 30_000;

/// An item the application enqueues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueItem<T> {
    /// Unique per queue; enqueueing a known id is a no-op.
    pub id: String,
    /// The semaphore key (an account, say).
    pub key: String,
    /// The group within the key (a workflow, say).
    pub group: String,
    pub body: T,
}

/// The permit an item was admitted under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Permit {
    /// A confirmed grant claim; `fence` orders grants of one key.
    #[serde(rename_all = "camelCase")]
    Grant { grant_id: String, fence: u64 },
    /// A permit drawn locally from a lease.
    #[serde(rename_all = "camelCase")]
    Lease { lease_id: String },
}

/// An item handed to the application's `admit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmittedItem<T> {
    pub id: String,
    pub key: String,
    pub group: String,
    pub body: T,
    pub permit: Permit,
}

/// Where an item stands, as `status(id)` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    /// Waiting for a permit (or for its claim to be confirmed).
    Queued,
    /// Handed to the application under a permit.
    Admitted,
    /// Released (or cancelled while queued).
    Released,
    /// Never enqueued, or released so long ago it was forgotten.
    Unknown,
}

/// What `enqueue` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnqueueOutcome {
    pub added: usize,
    /// Items whose id was already known (queued, admitted or released).
    pub known: usize,
}

/// What `release` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The item's permit returns to the holder with the next report.
    Released,
    /// The item was queued and is now dropped without having run.
    Cancelled,
    AlreadyReleased,
    Unknown,
}

/// Items per state, and permits held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueCounts {
    pub queued: usize,
    /// Of `queued`: waiting for a grant claim to be confirmed.
    pub claiming: usize,
    pub admitted: usize,
    /// Released ids still remembered.
    pub released: usize,
    pub grants: usize,
    pub leases: usize,
    /// Undrawn permits of live leases.
    pub drawable: u64,
}

/// Tunables of the accounting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateConfig {
    /// Wait after a failed message before the key's next one, in ms.
    pub failure_retry_ms: u64,
    /// Return undrawn lease permits of a group that had nothing queued for this
    /// long, in ms (beyond the seed, which waits for `contended` or the TTL: an
    /// idle runner never hears `contended`). `None` keeps leases until then.
    pub idle_lease_return_ms: Option<u64>,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            failure_retry_ms: DEFAULT_FAILURE_RETRY_MS,
            idle_lease_return_ms: Some(DEFAULT_IDLE_LEASE_RETURN_MS),
        }
    }
}

/// One item as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemRecord<T> {
    pub id: String,
    pub key: String,
    pub group: String,
    pub body: T,
    pub enqueued_at_ms: u64,
    /// Enqueue order, unique per queue: breaks ties of `enqueued_at_ms`.
    pub order: u64,
    pub phase: Phase,
}

/// An item's phase before release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "camelCase")]
pub enum Phase {
    Queued,
    /// Assigned to a grant whose claim is not confirmed yet. `release_requested`:
    /// the application released it meanwhile; it is never admitted.
    #[serde(rename_all = "camelCase")]
    Claiming {
        grant_id: String,
        release_requested: bool,
    },
    Admitted {
        permit: Permit,
    },
}

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
    /// The last report the holder acknowledged.
    pub acked: Option<LeaseReport>,
    /// Since when its group has had nothing queued.
    pub idle_since_ms: Option<u64>,
}

impl LeaseHolding {
    fn report(&self, lease_id: &str) -> LeaseReport {
        LeaseReport {
            lease_id: lease_id.to_string(),
            drawn: self.drawn,
            released: self.released,
            retired: self.retired,
        }
    }

    fn drawable(&self, now_ms: u64) -> bool {
        !self.retired && self.drawn < self.permits && now_ms < self.expires_at_ms
    }

    /// When a lease with permits in use must be heartbeated: half its lifetime.
    fn heartbeat_due_ms(&self) -> Option<u64> {
        (!self.retired && self.drawn > self.released)
            .then(|| self.expires_at_ms.saturating_sub(self.ttl_ms / 2))
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

/// What a message in flight reported, to match the holder's answer against.
#[derive(Debug, Clone, Default)]
struct InFlight {
    grants: BTreeMap<String, GrantReport>,
    leases: BTreeMap<String, LeaseReport>,
}

/// Per-key state that is not stored.
#[derive(Debug, Clone, Default)]
struct KeyRuntime {
    in_flight: Option<InFlight>,
    retry_at_ms: u64,
    /// Report every holding once (after a restart, or at shutdown).
    force_report: bool,
}

/// A message to send for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub key: String,
    pub message: SemaphoreRequest,
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
}

impl Dirty {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
            && self.keys.is_empty()
            && self.released_added.is_empty()
            && self.released_removed.is_empty()
    }
}

/// Ordering of queued items within a group: oldest enqueue time, then order.
type QueuedOrder = (u64, u64);

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
    /// to `admit` again (the application's admit is a no-op for a known id) and
    /// every held grant and lease is reported once.
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
        for (key, record) in keys {
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
                Phase::Admitted { permit } => state.admits.push(AdmittedItem {
                    id: item.id.clone(),
                    key: item.key.clone(),
                    group: item.group.clone(),
                    body: item.body.clone(),
                    permit: permit.clone(),
                }),
                Phase::Claiming { .. } => {}
            }
            state.items.insert(item.id.clone(), item);
        }
        state
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Adds items; ids already known are skipped. All or nothing: an invalid item
    /// rejects the whole batch.
    pub fn enqueue(
        &mut self,
        items: Vec<QueueItem<T>>,
        now_ms: u64,
    ) -> Result<EnqueueOutcome, QueueError> {
        for item in &items {
            validate_item(item)?;
        }
        let mut outcome = EnqueueOutcome::default();
        for item in items {
            if self.items.contains_key(&item.id) || self.released.contains_key(&item.id) {
                outcome.known += 1;
                continue;
            }
            let record = ItemRecord {
                id: item.id,
                key: item.key,
                group: item.group,
                body: item.body,
                enqueued_at_ms: now_ms,
                order: self.next_order,
                phase: Phase::Queued,
            };
            self.next_order += 1;
            self.index_queued(&record);
            self.dirty.items.insert(record.id.clone());
            self.items.insert(record.id.clone(), record);
            outcome.added += 1;
        }
        Ok(outcome)
    }

    /// The application reports that an item reached a terminal state (or no
    /// longer wants to run, if it is still queued).
    pub fn release(&mut self, id: &str) -> ReleaseOutcome {
        let Some(item) = self.items.get_mut(id) else {
            return if self.released.contains_key(id) {
                ReleaseOutcome::AlreadyReleased
            } else {
                ReleaseOutcome::Unknown
            };
        };
        match &mut item.phase {
            Phase::Queued => {
                let order = (item.enqueued_at_ms, item.order);
                let (key, group) = (item.key.clone(), item.group.clone());
                self.unindex_queued(&key, &group, order);
                self.forget_item(id);
                ReleaseOutcome::Cancelled
            }
            Phase::Claiming {
                release_requested, ..
            } => {
                *release_requested = true;
                self.dirty.items.insert(id.to_string());
                ReleaseOutcome::Released
            }
            Phase::Admitted { permit } => {
                let permit = permit.clone();
                let key = item.key.clone();
                self.return_permit(&key, &permit);
                self.forget_item(id);
                ReleaseOutcome::Released
            }
        }
    }

    /// Where an item stands.
    pub fn status(&self, id: &str) -> ItemStatus {
        match self.items.get(id).map(|item| &item.phase) {
            Some(Phase::Queued | Phase::Claiming { .. }) => ItemStatus::Queued,
            Some(Phase::Admitted { .. }) => ItemStatus::Admitted,
            None if self.released.contains_key(id) => ItemStatus::Released,
            None => ItemStatus::Unknown,
        }
    }

    /// Items per state and permits held.
    pub fn counts(&self, now_ms: u64) -> QueueCounts {
        let mut counts = QueueCounts {
            released: self.released.len(),
            ..QueueCounts::default()
        };
        for item in self.items.values() {
            match item.phase {
                Phase::Queued => counts.queued += 1,
                Phase::Claiming { .. } => {
                    counts.queued += 1;
                    counts.claiming += 1;
                }
                Phase::Admitted { .. } => counts.admitted += 1,
            }
        }
        for record in self.keys.values() {
            counts.grants += record.grants.len();
            counts.leases += record.leases.len();
            counts.drawable += record
                .leases
                .values()
                .filter(|lease| lease.drawable(now_ms))
                .map(|lease| lease.permits - lease.drawn)
                .sum::<u64>();
        }
        counts
    }

    /// Ids of admitted items, oldest first, at most `limit`: what to ask the
    /// application's `finished` about.
    pub fn admitted_ids(&self, limit: usize) -> Vec<String> {
        let mut admitted: Vec<(u64, &String)> = self
            .items
            .values()
            .filter(|item| matches!(item.phase, Phase::Admitted { .. }))
            .map(|item| (item.order, &item.id))
            .collect();
        admitted.sort_unstable();
        admitted
            .into_iter()
            .take(limit)
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// Items to hand to the application, in admission order.
    pub fn take_admits(&mut self) -> Vec<AdmittedItem<T>> {
        std::mem::take(&mut self.admits)
    }

    /// Records changed since the last call.
    pub fn take_dirty(&mut self) -> Dirty {
        std::mem::take(&mut self.dirty)
    }

    pub fn item(&self, id: &str) -> Option<&ItemRecord<T>> {
        self.items.get(id)
    }

    pub fn key_record(&self, key: &str) -> Option<&KeyRecord> {
        self.keys.get(key)
    }

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
            let record = self.keys.get(&key);
            let has_queued = self.has_queued(&key);
            if has_queued || runtime.force_report {
                let next_request = record.map_or(0, |record| record.next_request_at_ms);
                consider(next_request.max(runtime.retry_at_ms));
            }
            let Some(record) = record else { continue };
            if record.grants.values().any(|grant| self.grant_dirty(grant)) {
                consider(runtime.retry_at_ms);
            }
            for lease in record.leases.values() {
                if lease_dirty(lease) {
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
            self.return_idle_leases(key, now_ms);
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
                self.dirty.keys.insert(key.clone());
            }
            let runtime = self.runtime.entry(key.clone()).or_default();
            runtime.force_report = !record.is_empty();
            runtime.retry_at_ms = 0;
        }
    }

    /// Reports only (never demand) for every key with something to report: what
    /// shutdown sends.
    pub fn poll_reports(&mut self, now_ms: u64) -> Vec<Outgoing> {
        let keys: Vec<String> = self.keys.keys().cloned().collect();
        let mut outgoing = Vec::new();
        for key in keys {
            let busy = self
                .runtime
                .get(&key)
                .is_some_and(|runtime| runtime.in_flight.is_some());
            if !busy && self.reports_due(&key, now_ms) {
                outgoing.push(Outgoing {
                    message: self.take_sync(&key),
                    key,
                });
            }
        }
        outgoing
    }

    // ----- private: messages -----

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

    fn has_queued(&self, key: &str) -> bool {
        self.queued
            .get(key)
            .is_some_and(|groups| !groups.is_empty())
    }

    fn due_message(&mut self, key: &str, now_ms: u64) -> Option<SemaphoreRequest> {
        let runtime = self.runtime.entry(key.to_string()).or_default();
        if runtime.in_flight.is_some() || now_ms < runtime.retry_at_ms {
            return None;
        }
        let record = self.keys.get(key);
        let claims_waiting = record.is_some_and(|record| {
            record
                .grants
                .values()
                .any(|grant| !grant.claim_confirmed && grant.claimed > 0)
        });
        let request_due =
            self.has_queued(key) && record.map_or(0, |record| record.next_request_at_ms) <= now_ms;
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
            || record.grants.values().any(|grant| self.grant_dirty(grant))
            || record.leases.values().any(|lease| {
                lease_dirty(lease) || lease.heartbeat_due_ms().is_some_and(|due| due <= now_ms)
            })
    }

    fn grant_dirty(&self, grant: &GrantHolding) -> bool {
        (!grant.claim_confirmed && grant.claimed > 0) || grant.released > grant.acked_released
    }

    /// Grant reports: every dirty grant (every grant when forced), capped.
    fn grant_reports(&self, key: &str, forced: bool) -> Vec<GrantReport> {
        let Some(record) = self.keys.get(key) else {
            return Vec::new();
        };
        record
            .grants
            .iter()
            .filter(|(_, grant)| forced || self.grant_dirty(grant))
            .take(MAX_GRANT_REPORTS)
            .map(|(grant_id, grant)| GrantReport {
                grant_id: grant_id.clone(),
                claimed: grant.claimed,
                released: grant.released,
            })
            .collect()
    }

    /// Lease reports: every lease (each report is a heartbeat), capped.
    fn lease_reports(&self, key: &str) -> Vec<LeaseReport> {
        let Some(record) = self.keys.get(key) else {
            return Vec::new();
        };
        record
            .leases
            .iter()
            .take(MAX_LEASE_REPORTS)
            .map(|(lease_id, lease)| lease.report(lease_id))
            .collect()
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

    // ----- private: answers -----

    fn apply_grant_results(&mut self, key: &str, sent: &InFlight, results: Vec<GrantResult>) {
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
        let permit = Permit::Grant {
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
            self.dirty.items.insert(id.clone());
            if (index as u64) < confirmed {
                item.phase = Phase::Admitted {
                    permit: permit.clone(),
                };
                if release_requested {
                    self.return_permit(key, &permit);
                    self.forget_item(id);
                } else {
                    self.admits.push(AdmittedItem {
                        id: item.id.clone(),
                        key: item.key.clone(),
                        group: item.group.clone(),
                        body: item.body.clone(),
                        permit: permit.clone(),
                    });
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
    fn accept_grant(&mut self, key: &str, granted: GrantedPermits) {
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
            self.dirty.items.insert(id.clone());
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

    fn apply_lease_echoes(
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
                    let report = LeaseReport {
                        lease_id: echo.lease_id.clone(),
                        drawn: 0,
                        released: 0,
                        retired: false,
                    };
                    let holding = LeaseHolding {
                        group: echo.group,
                        permits: echo.permits,
                        expires_at_ms: echo.expires_at_ms,
                        ttl_ms: echo.expires_at_ms - now_ms,
                        drawn: 0,
                        released: 0,
                        retired: false,
                        acked: Some(report),
                        idle_since_ms: None,
                    };
                    record.leases.insert(echo.lease_id, holding);
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
    fn return_idle_leases(&mut self, key: &str, _now_ms: u64) {
        let queued_groups: BTreeSet<String> = self
            .queued
            .get(key)
            .map(|groups| groups.keys().cloned().collect())
            .unwrap_or_default();
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
    fn retire_stale_leases(&mut self, key: &str, now_ms: u64) {
        let queued_groups: BTreeSet<String> = self
            .queued
            .get(key)
            .map(|groups| groups.keys().cloned().collect())
            .unwrap_or_default();
        let idle_ms = self.config.idle_lease_return_ms;
        let Some(record) = self.keys.get_mut(key) else {
            return;
        };
        for lease in record.leases.values_mut().filter(|lease| !lease.retired) {
            if queued_groups.contains(&lease.group) {
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
                self.dirty.keys.insert(key.to_string());
            }
        }
    }

    /// Admits queued items of the key under drawable lease permits, oldest first
    /// per group, one permit per item.
    fn draw(&mut self, key: &str, now_ms: u64) {
        let Some(record) = self.keys.get_mut(key) else {
            return;
        };
        let Some(groups) = self.queued.get_mut(key) else {
            return;
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
                let permit = Permit::Lease {
                    lease_id: lease_id.clone(),
                };
                let item = self.items.get_mut(&id).expect("queued items exist");
                item.phase = Phase::Admitted {
                    permit: permit.clone(),
                };
                self.dirty.items.insert(id.clone());
                self.admits.push(AdmittedItem {
                    id,
                    key: item.key.clone(),
                    group: item.group.clone(),
                    body: item.body.clone(),
                    permit,
                });
            }
        }
        if drew {
            groups.retain(|_, items| !items.is_empty());
            if groups.is_empty() {
                self.queued.remove(key);
            }
            self.dirty.keys.insert(key.to_string());
        }
    }

    // ----- private: items and indexes -----

    fn index_queued(&mut self, item: &ItemRecord<T>) {
        self.queued
            .entry(item.key.clone())
            .or_default()
            .entry(item.group.clone())
            .or_default()
            .insert((item.enqueued_at_ms, item.order), item.id.clone());
    }

    fn unindex_queued(&mut self, key: &str, group: &str, order: QueuedOrder) {
        if let Some(items) = self
            .queued
            .get_mut(key)
            .and_then(|groups| groups.get_mut(group))
        {
            items.remove(&order);
        }
        self.prune_queued(key, group);
    }

    fn prune_queued(&mut self, key: &str, group: &str) {
        if let Some(groups) = self.queued.get_mut(key) {
            if groups.get(group).is_some_and(BTreeMap::is_empty) {
                groups.remove(group);
            }
            if groups.is_empty() {
                self.queued.remove(key);
            }
        }
    }

    /// Counts a released permit against its grant or lease.
    fn return_permit(&mut self, key: &str, permit: &Permit) {
        let Some(record) = self.keys.get_mut(key) else {
            return;
        };
        match permit {
            Permit::Grant { grant_id, .. } => {
                if let Some(grant) = record.grants.get_mut(grant_id) {
                    grant.released = (grant.released + 1).min(grant.claimed);
                }
            }
            Permit::Lease { lease_id } => {
                if let Some(lease) = record.leases.get_mut(lease_id) {
                    lease.released = (lease.released + 1).min(lease.drawn);
                }
            }
        }
        self.dirty.keys.insert(key.to_string());
    }

    /// Drops an item's record and remembers its id as released.
    fn forget_item(&mut self, id: &str) {
        self.items.remove(id);
        self.dirty.items.insert(id.to_string());
        let seq = self.next_released_seq;
        self.next_released_seq += 1;
        self.released.insert(id.to_string(), seq);
        self.released_by_seq.insert(seq, id.to_string());
        self.dirty.released_added.push((seq, id.to_string()));
        while self.released.len() > MAX_RELEASED_REMEMBERED {
            let (oldest, forgotten) = self.released_by_seq.pop_first().expect("non-empty");
            self.released.remove(&forgotten);
            self.dirty.released_removed.push((oldest, forgotten));
        }
    }

    fn drop_if_empty(&mut self, key: &str) {
        let idle = self.keys.get(key).is_some_and(KeyRecord::is_empty)
            && !self.has_queued(key)
            && self
                .runtime
                .get(key)
                .map_or(true, |runtime| runtime.in_flight.is_none());
        if idle {
            // The client keeps honouring the key's nextRequestAt on its own.
            self.keys.remove(key);
            self.runtime.remove(key);
            self.dirty.keys.insert(key.to_string());
        }
    }
}

/// Whether the lease changed since the holder last acknowledged a report of it.
fn lease_dirty(lease: &LeaseHolding) -> bool {
    match &lease.acked {
        None => true,
        Some(acked) => {
            (acked.drawn, acked.released, acked.retired)
                != (lease.drawn, lease.released, lease.retired)
        }
    }
}

fn validate_item<T>(item: &QueueItem<T>) -> Result<(), QueueError> {
    let invalid = |reason: &str| QueueError::InvalidItem {
        id: item.id.chars().take(64).collect(),
        reason: reason.to_string(),
    };
    if item.id.is_empty() || item.id.len() > MAX_ITEM_ID_BYTES {
        return Err(invalid("id must be 1 to 256 bytes"));
    }
    if item.key.is_empty() || item.key.len() > MAX_KEY_BYTES {
        return Err(invalid("key must be 1 to 256 bytes"));
    }
    if item.group.len() > MAX_GROUP_BYTES {
        return Err(invalid("group must be at most 256 bytes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use permitd_core::protocol::{PermitSyncResult, SemaphoreResponse};
    use permitd_core::GrantId;

    use super::*;

    const KEY: &str = "acct-1";

    fn queue() -> QueueState<u32> {
        QueueState::new("runner-1", StateConfig::default())
    }

    fn item(id: &str, group: &str) -> QueueItem<u32> {
        QueueItem {
            id: id.into(),
            key: KEY.into(),
            group: group.into(),
            body: 0,
        }
    }

    fn grant_id(n: u128) -> GrantId {
        GrantId(uuid::Uuid::from_u128(n))
    }

    fn granted(n: u128, group: &str, permits: u64) -> GrantedPermits {
        GrantedPermits {
            grant_id: grant_id(n),
            group: group.into(),
            permits,
            fence: n as u64,
        }
    }

    fn grant_answer(
        grants: Vec<GrantedPermits>,
        leases: Vec<LeaseGrant>,
        next: u64,
    ) -> SemaphoreResponse {
        SemaphoreResponse::Grant(PermitGrant {
            v: V1,
            grants,
            blocked: vec![],
            grant_results: vec![],
            leases: Some(leases),
            contended: false,
            next_request_at_ms: next,
        })
    }

    fn synced(
        results: Vec<GrantResult>,
        leases: Vec<LeaseGrant>,
        contended: bool,
    ) -> SemaphoreResponse {
        SemaphoreResponse::Synced(PermitSyncResult {
            v: V1,
            grant_results: results,
            leases: Some(leases),
            contended,
        })
    }

    fn result(n: u128, claimed: u64, status: GrantStatus) -> GrantResult {
        GrantResult {
            grant_id: grant_id(n).to_string(),
            claimed,
            status,
        }
    }

    fn lease(id: &str, group: &str, permits: u64, expires_at_ms: u64) -> LeaseGrant {
        LeaseGrant {
            lease_id: id.into(),
            group: group.into(),
            permits,
            expires_at_ms,
        }
    }

    fn only(messages: Vec<Outgoing>) -> SemaphoreRequest {
        assert_eq!(messages.len(), 1, "{messages:?}");
        messages.into_iter().next().unwrap().message
    }

    fn as_request(message: SemaphoreRequest) -> PermitRequest {
        match message {
            SemaphoreRequest::Request(request) => request,
            other => panic!("expected a request, got {other:?}"),
        }
    }

    fn as_sync(message: SemaphoreRequest) -> PermitSync {
        match message {
            SemaphoreRequest::Sync(sync) => sync,
            other => panic!("expected a sync, got {other:?}"),
        }
    }

    fn admitted_ids(state: &mut QueueState<u32>) -> Vec<String> {
        state
            .take_admits()
            .into_iter()
            .map(|item| item.id)
            .collect()
    }

    /// Enqueues `ids` in group `wf` at time 100 and answers the first request
    /// with a grant of `permits` (grant 1), then returns the claim sync.
    fn granted_and_claiming(state: &mut QueueState<u32>, ids: &[&str], permits: u64) -> PermitSync {
        let items = ids.iter().map(|id| item(id, "wf")).collect();
        state.enqueue(items, 100).unwrap();
        as_request(only(state.poll(100)));
        state.on_answer(
            KEY,
            grant_answer(vec![granted(1, "wf", permits)], vec![], 2_100),
            1_100,
        );
        as_sync(only(state.poll(1_100)))
    }

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
        state.on_answer(
            KEY,
            synced(vec![result(1, 2, GrantStatus::Ok)], vec![], false),
            1_200,
        );
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
        state.on_answer(
            KEY,
            synced(vec![result(1, 1, GrantStatus::Expired)], vec![], false),
            20_000,
        );
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
        state.on_answer(
            KEY,
            synced(vec![result(1, 0, GrantStatus::NotFound)], vec![], false),
            1_200,
        );
        assert!(admitted_ids(&mut state).is_empty());
        assert_eq!(state.counts(1_200).queued, 2);
        assert_eq!(state.counts(1_200).grants, 0);
    }

    #[test]
    fn releases_are_reported_cumulatively_and_the_grant_is_forgotten_once_acknowledged() {
        let mut state = queue();
        granted_and_claiming(&mut state, &["a", "b"], 2);
        state.on_answer(
            KEY,
            synced(vec![result(1, 2, GrantStatus::Ok)], vec![], false),
            1_200,
        );
        assert_eq!(state.release("a"), ReleaseOutcome::Released);
        assert_eq!(state.release("a"), ReleaseOutcome::AlreadyReleased);
        assert_eq!(state.release("zzz"), ReleaseOutcome::Unknown);
        let sync = as_sync(only(state.poll(1_300)));
        assert_eq!((sync.grants[0].claimed, sync.grants[0].released), (2, 1));
        state.on_answer(
            KEY,
            synced(vec![result(1, 2, GrantStatus::Ok)], vec![], false),
            1_400,
        );
        assert!(
            state.poll(1_400).is_empty(),
            "nothing changed since the acknowledgement"
        );
        state.release("b");
        let sync = as_sync(only(state.poll(1_500)));
        assert_eq!(sync.grants[0].released, 2);
        state.on_answer(
            KEY,
            synced(vec![result(1, 2, GrantStatus::Ok)], vec![], false),
            1_600,
        );
        assert_eq!(state.counts(1_600).grants, 0);
        assert!(state.poll(1_700).is_empty());
        assert_eq!(state.status("b"), ItemStatus::Released);
    }

    #[test]
    fn a_release_while_claiming_is_never_admitted() {
        let mut state = queue();
        granted_and_claiming(&mut state, &["a", "b"], 2);
        assert_eq!(state.release("b"), ReleaseOutcome::Released);
        state.on_answer(
            KEY,
            synced(vec![result(1, 2, GrantStatus::Ok)], vec![], false),
            1_200,
        );
        assert_eq!(admitted_ids(&mut state), ["a"]);
        assert_eq!(state.status("b"), ItemStatus::Released);
        let sync = as_sync(only(state.poll(1_300)));
        assert_eq!((sync.grants[0].claimed, sync.grants[0].released), (2, 1));
    }

    #[test]
    fn lease_permits_are_drawn_locally_one_per_item_and_are_one_shot() {
        let mut state = queue();
        state
            .enqueue(vec![item("a", "wf"), item("b", "wf"), item("c", "wf")], 100)
            .unwrap();
        as_request(only(state.poll(100)));
        state.on_answer(
            KEY,
            grant_answer(vec![], vec![lease("L", "wf", 2, 60_100)], 2_100),
            100,
        );
        assert_eq!(admitted_ids(&mut state), ["a", "b"]);
        assert_eq!(state.status("c"), ItemStatus::Queued);
        state.release("a");
        // A released permit is not drawable again: c waits for the next round.
        let sync = as_sync(only(state.poll(200)));
        assert_eq!(
            sync.leases.unwrap(),
            [LeaseReport {
                lease_id: "L".into(),
                drawn: 2,
                released: 1,
                retired: false
            }]
        );
        assert!(admitted_ids(&mut state).is_empty());
        state.on_answer(
            KEY,
            synced(vec![], vec![lease("L", "wf", 2, 60_200)], false),
            300,
        );
        assert!(
            state.poll(300).is_empty(),
            "the next request waits for nextRequestAt"
        );
        let request = as_request(only(state.poll(2_100)));
        assert_eq!(request.demand[0].count, 1);
        assert_eq!(request.leases.unwrap()[0].drawn, 2);
    }

    #[test]
    fn contended_returns_undrawn_permits_of_idle_groups_until_settled() {
        let mut state = queue();
        state.enqueue(vec![item("a", "wf")], 100).unwrap();
        as_request(only(state.poll(100)));
        state.on_answer(
            KEY,
            grant_answer(vec![], vec![lease("L", "wf", 8, 60_100)], 2_100),
            100,
        );
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
        assert_eq!(
            sync.leases.unwrap(),
            [LeaseReport {
                lease_id: "L".into(),
                drawn: 1,
                released: 1,
                retired: true
            }]
        );
        assert_eq!(
            state.counts(300).drawable,
            0,
            "a retired lease is not drawn from"
        );
        // Settled: the holder echoes permits = released.
        state.on_answer(
            KEY,
            synced(vec![], vec![lease("L", "wf", 1, 300)], false),
            400,
        );
        assert_eq!(state.counts(400).leases, 0);
        assert!(state.poll(500).is_empty());
    }

    #[test]
    fn a_retired_lease_is_reported_until_the_holder_settles_it() {
        let mut state = queue();
        state
            .enqueue(vec![item("a", "wf"), item("b", "wf")], 100)
            .unwrap();
        as_request(only(state.poll(100)));
        state.on_answer(
            KEY,
            grant_answer(vec![], vec![lease("L", "wf", 2, 60_100)], 2_100),
            100,
        );
        assert_eq!(admitted_ids(&mut state).len(), 2);
        // Retired by the holder (expiresAt = its now): stop drawing, report it.
        state.enqueue(vec![item("c", "wf")], 150).unwrap();
        as_request(only(state.poll(2_100)));
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
        state.on_answer(
            KEY,
            synced(vec![], vec![lease("L", "wf", 2, 2_200)], false),
            2_200,
        );
        assert_eq!(state.counts(2_200).leases, 1);
        state.release("a");
        state.release("b");
        let sync = as_sync(only(state.poll(2_300)));
        assert_eq!(sync.leases.unwrap()[0].released, 2);
        state.on_answer(
            KEY,
            synced(vec![], vec![lease("L", "wf", 2, 2_300)], false),
            2_300,
        );
        assert_eq!(state.counts(2_300).leases, 0);
    }

    #[test]
    fn leases_in_use_heartbeat_at_half_their_lifetime() {
        let mut state = queue();
        state.enqueue(vec![item("a", "wf")], 0).unwrap();
        as_request(only(state.poll(0)));
        state.on_answer(
            KEY,
            grant_answer(vec![], vec![lease("L", "wf", 1, 10_000)], 2_000),
            0,
        );
        assert_eq!(admitted_ids(&mut state), ["a"]);
        let sync = as_sync(only(state.poll(1)));
        state.on_answer(
            KEY,
            synced(vec![], vec![lease("L", "wf", 1, 10_001)], false),
            1,
        );
        assert_eq!(sync.leases.unwrap()[0].drawn, 1);
        assert!(state.poll(4_999).is_empty());
        assert_eq!(state.next_wakeup_ms(4_999), Some(5_001));
        let heartbeat = as_sync(only(state.poll(5_001)));
        assert_eq!(heartbeat.leases.unwrap()[0].lease_id, "L");
        state.on_answer(
            KEY,
            synced(vec![], vec![lease("L", "wf", 1, 15_001)], false),
            5_001,
        );
        assert!(state.poll(5_002).is_empty());
    }

    #[test]
    fn an_idle_lease_is_returned_after_the_idle_time() {
        let config = StateConfig {
            idle_lease_return_ms: Some(1_000),
            ..StateConfig::default()
        };
        let mut state = QueueState::<u32>::new("runner-1", config);
        state.enqueue(vec![item("a", "wf")], 0).unwrap();
        as_request(only(state.poll(0)));
        state.on_answer(
            KEY,
            grant_answer(vec![], vec![lease("L", "wf", 4, 600_000)], 2_000),
            0,
        );
        state.release("a");
        as_sync(only(state.poll(10)));
        state.on_answer(
            KEY,
            synced(vec![], vec![lease("L", "wf", 4, 600_010)], false),
            10,
        );
        assert!(state.poll(500).is_empty());
        let sync = as_sync(only(state.poll(1_600)));
        assert!(sync.leases.unwrap()[0].retired);
    }

    #[test]
    fn known_ids_are_not_enqueued_twice_and_bad_items_are_refused() {
        let mut state = queue();
        let outcome = state
            .enqueue(vec![item("a", "wf"), item("a", "wf")], 0)
            .unwrap();
        assert_eq!((outcome.added, outcome.known), (1, 1));
        state.release("a");
        assert_eq!(state.enqueue(vec![item("a", "wf")], 1).unwrap().known, 1);
        let mut bad = item("b", "wf");
        bad.key = String::new();
        assert!(state.enqueue(vec![item("c", "wf"), bad], 2).is_err());
        assert_eq!(state.status("c"), ItemStatus::Unknown, "all or nothing");
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

    #[test]
    fn a_restored_queue_readmits_and_reports_what_it_held() {
        let mut state = queue();
        granted_and_claiming(&mut state, &["a", "b", "c"], 2);
        state.on_answer(
            KEY,
            synced(vec![result(1, 2, GrantStatus::Ok)], vec![], false),
            1_200,
        );
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
        restored.on_answer(
            KEY,
            synced(vec![result(1, 2, GrantStatus::Ok)], vec![], false),
            1_300,
        );
        // ... and c is asked for when nextRequestAt comes.
        assert!(restored.poll(2_000).is_empty());
        let request = as_request(only(restored.poll(2_100)));
        assert_eq!(request.demand[0].count, 1);
    }

    #[test]
    fn shutdown_retires_every_lease_and_reports_it() {
        let mut state = queue();
        state.enqueue(vec![item("a", "wf")], 0).unwrap();
        as_request(only(state.poll(0)));
        state.on_answer(
            KEY,
            grant_answer(vec![], vec![lease("L", "wf", 4, 600_000)], 2_000),
            0,
        );
        state.take_admits();
        state.retire_all_leases();
        let sync = as_sync(only(state.poll_reports(10)));
        let report = &sync.leases.unwrap()[0];
        assert!(report.retired && report.drawn == 1);
    }
}
