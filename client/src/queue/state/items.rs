//! Items: what the application enqueues, how each stands, and the indexes that
//! keep queued items in order per key and group.
//!
//! Invariants:
//! - an item is in the queued index exactly while its phase is `Queued`;
//! - the index holds no empty group and no empty key;
//! - a released id is in `released` and `released_by_seq` alike, at most
//!   [`MAX_RELEASED_REMEMBERED`] of them, the oldest forgotten first.

use std::collections::{BTreeMap, BTreeSet};

use permitd_core::limits::{MAX_GROUP_BYTES, MAX_KEY_BYTES};
use serde::{Deserialize, Serialize};

use super::QueueState;
use crate::error::QueueError;

/// Longest item id, in bytes of UTF-8.
pub const MAX_ITEM_ID_BYTES: usize = 256;
/// Ids of released items remembered for `status` and no-op re-enqueues.
pub const MAX_RELEASED_REMEMBERED: usize = 100_000;

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
pub enum ItemPermit {
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
    pub permit: ItemPermit,
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

impl<T: Clone> ItemRecord<T> {
    /// The item as the application's `admit` receives it.
    pub(super) fn admitted(&self, permit: ItemPermit) -> AdmittedItem<T> {
        AdmittedItem {
            id: self.id.clone(),
            key: self.key.clone(),
            group: self.group.clone(),
            body: self.body.clone(),
            permit,
        }
    }
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
        permit: ItemPermit,
    },
}

/// Ordering of queued items within a group: oldest enqueue time, then order.
pub(super) type QueuedOrder = (u64, u64);

impl<T: Clone> QueueState<T> {
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
            self.dirty.item(&record.id);
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
                self.dirty.item(id);
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

    /// Items per state and permits held, in time linear in keys, groups, grants
    /// and leases (never in items: runners poll this while thousands queue).
    /// Every item is exactly one of: in the queued index, in a grant's
    /// `claiming` list, or admitted.
    pub fn counts(&self, now_ms: u64) -> QueueCounts {
        let queued: usize = self
            .queued
            .values()
            .flat_map(|groups| groups.values())
            .map(BTreeMap::len)
            .sum();
        let claiming: usize = self
            .keys
            .values()
            .flat_map(|record| record.grants.values())
            .map(|grant| grant.claiming.len())
            .sum();
        let mut counts = QueueCounts {
            released: self.released.len(),
            queued: queued + claiming,
            claiming,
            admitted: self.items.len() - queued - claiming,
            ..QueueCounts::default()
        };
        self.count_permits(&mut counts, now_ms);
        counts
    }

    /// [`Self::counts`] by a scan of every item: what the tests hold it to.
    #[cfg(test)]
    pub(super) fn counts_by_scan(&self, now_ms: u64) -> QueueCounts {
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
        self.count_permits(&mut counts, now_ms);
        counts
    }

    fn count_permits(&self, counts: &mut QueueCounts, now_ms: u64) {
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

    pub(super) fn has_queued(&self, key: &str) -> bool {
        self.queued
            .get(key)
            .is_some_and(|groups| !groups.is_empty())
    }

    /// The key's groups with queued items.
    pub(super) fn queued_groups(&self, key: &str) -> BTreeSet<String> {
        self.queued
            .get(key)
            .map(|groups| groups.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub(super) fn index_queued(&mut self, item: &ItemRecord<T>) {
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

    pub(super) fn prune_queued(&mut self, key: &str, group: &str) {
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
    pub(super) fn return_permit(&mut self, key: &str, permit: &ItemPermit) {
        let Some(record) = self.keys.get_mut(key) else {
            return;
        };
        match permit {
            ItemPermit::Grant { grant_id, .. } => {
                if let Some(grant) = record.grants.get_mut(grant_id) {
                    grant.released = (grant.released + 1).min(grant.claimed);
                }
            }
            ItemPermit::Lease { lease_id } => {
                if let Some(lease) = record.leases.get_mut(lease_id) {
                    lease.released = (lease.released + 1).min(lease.drawn);
                }
            }
        }
        self.dirty.key(key);
    }

    /// Drops an item's record and remembers its id as released.
    pub(super) fn forget_item(&mut self, id: &str) {
        self.items.remove(id);
        self.dirty.item(id);
        let seq = self.next_released_seq;
        self.next_released_seq += 1;
        self.released.insert(id.to_string(), seq);
        self.released_by_seq.insert(seq, id.to_string());
        self.dirty.released(seq, id);
        while self.released.len() > MAX_RELEASED_REMEMBERED {
            let (oldest, forgotten) = self.released_by_seq.pop_first().expect("non-empty");
            self.released.remove(&forgotten);
            self.dirty.forgotten(oldest, forgotten);
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
    use super::super::test_support::*;
    use super::*;

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
}
