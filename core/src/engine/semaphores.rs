//! Every key's state, the cluster defaults and the replicated clock.
//!
//! This is what the storage crate's state machine holds and what each log entry
//! changes. Each operation takes the entry's `now` and passes on
//! `max(now, last now)`, so time never runs backwards across leader changes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::{GroupConfig, KeyConfig, KeyConfigUpdate};
use crate::contract::protocol::{PermitRequest, PermitSync};
use crate::contract::validate::{validate_group_config, validate_key_config, InvalidInput};
use crate::engine::delete_key::RememberedDeletes;
use crate::engine::lifecycle::Event;
use crate::engine::permit_sync::{run_sync, SyncOutcome};
use crate::engine::reclaim::reclaim_expired;
use crate::engine::round::{run_round, RoundOutcome};
use crate::engine::state::{Changes, KeyState};
use crate::engine::usage::{counts, usage, Usage, UsageCounts};
use crate::ids::IdAllocator;
use crate::limits::{MAX_CONFIGURED_GROUPS_PER_KEY, MAX_KEYS};

/// The whole replicated semaphore state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Semaphores {
    /// Configuration of keys that have none of their own.
    defaults: KeyConfig,
    /// The largest `now` applied so far.
    last_now_ms: u64,
    /// Behind an `Arc`: a B-tree node holds eleven slots, mostly empty, and a
    /// slot of a pointer costs less than an inline state; and a clone of the
    /// whole state (a snapshot's copy, taken under the node's state lock)
    /// shares every key instead of copying it: ~7 ms at 100,000 keys where
    /// deep copies took ~100 ms, a stall of every apply meanwhile. A key
    /// changed while a copy still holds it is copied then ([`Arc::make_mut`]).
    keys: BTreeMap<Arc<str>, Arc<KeyState>>,
    /// Some `SetDefaults` was applied: `/cluster/init`'s, or an operator's.
    /// Until then every new leader proposes its own `[defaults]` (the node's
    /// defaults task), so a failed write after init is retried. States saved
    /// before this field existed come from clusters whose init wrote them.
    #[serde(default = "written_by_older_versions")]
    defaults_written: bool,
    /// Answers of deletes with a `requestId`, for replays
    /// ([`crate::engine::delete_key`]). Left out when empty, so a state that never saw
    /// one encodes as before this field existed.
    #[serde(default, skip_serializing_if = "RememberedDeletes::is_empty")]
    deletes: RememberedDeletes,
    /// Most keys this state holds ([`MAX_KEYS`]; smaller only in tests). Not
    /// replicated: every replica runs the same build, so every replica refuses alike.
    #[serde(skip, default = "max_keys_default")]
    max_keys: usize,
    #[serde(skip)]
    dirty: Dirty,
}

fn max_keys_default() -> usize {
    MAX_KEYS
}

fn written_by_older_versions() -> bool {
    true
}

impl Default for Semaphores {
    fn default() -> Self {
        Self {
            defaults: KeyConfig::default(),
            last_now_ms: 0,
            keys: BTreeMap::new(),
            defaults_written: false,
            deletes: RememberedDeletes::new(),
            max_keys: MAX_KEYS,
            dirty: Dirty::default(),
        }
    }
}

/// Creating the keys asked for would push the state past its key limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the cluster already holds {max} keys")]
pub struct KeyLimitReached {
    pub max: usize,
}

/// What changed since the last [`Semaphores::take_changes`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Dirty {
    cluster: bool,
    keys: BTreeSet<String>,
    /// Pending changes of keys dropped in this window (emptied or removed).
    dropped: BTreeMap<String, Changes>,
}

/// The rows to persist after applying entries.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StateChanges {
    /// The defaults or the clock changed.
    pub cluster: bool,
    /// Changed keys with the rows to write or delete (a row absent from the
    /// key's state is deleted); `None` when the key no longer holds anything and
    /// was dropped, so all of its rows go.
    pub keys: Vec<(String, Option<Changes>)>,
}

impl Semaphores {
    /// An empty state with the given defaults.
    pub fn new(defaults: KeyConfig) -> Result<Self, InvalidInput> {
        validate_key_config(&defaults)?;
        Ok(Self {
            defaults,
            ..Self::default()
        })
    }

    /// Rebuilds the state from its persisted parts.
    pub fn from_parts(
        defaults: KeyConfig,
        last_now_ms: u64,
        keys: BTreeMap<String, KeyState>,
    ) -> Self {
        Self {
            defaults,
            last_now_ms,
            keys: keys
                .into_iter()
                .map(|(key, state)| (Arc::from(key), Arc::new(state)))
                .collect(),
            ..Self::default()
        }
    }

    /// The same state, marked as having had its defaults written (or not).
    pub fn with_defaults_written(mut self, written: bool) -> Self {
        self.defaults_written = written;
        self
    }

    /// Whether a `SetDefaults` was ever applied to this state.
    pub fn defaults_written(&self) -> bool {
        self.defaults_written
    }

    /// The same state with a smaller key limit, so tests can reach it.
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.min(MAX_KEYS);
        self
    }

    /// Whether the keys named (repeats allowed) fit: keys held already always do,
    /// new ones only while the state stays within its key limit. Apply checks this
    /// before any call that may create a key, so the limit holds on every replica
    /// whatever the leader checked before proposing.
    pub fn room_for<'a>(
        &self,
        keys: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), KeyLimitReached> {
        let new: BTreeSet<&str> = keys
            .into_iter()
            .filter(|key| !self.keys.contains_key(*key))
            .collect();
        if self.keys.len() + new.len() > self.max_keys {
            return Err(KeyLimitReached { max: self.max_keys });
        }
        Ok(())
    }

    pub fn defaults(&self) -> &KeyConfig {
        &self.defaults
    }

    pub fn last_now_ms(&self) -> u64 {
        self.last_now_ms
    }

    pub fn keys(&self) -> &BTreeMap<Arc<str>, Arc<KeyState>> {
        &self.keys
    }

    /// Keys in order after `after` (from the first with `None`): a cursor for
    /// walks that read the keys a slice at a time (listings, scans, sums).
    pub fn keys_after(
        &self,
        after: Option<&str>,
    ) -> std::collections::btree_map::Range<'_, Arc<str>, Arc<KeyState>> {
        use std::ops::Bound::{Excluded, Unbounded};
        let start = after.map_or(Unbounded, Excluded);
        self.keys.range::<str, _>((start, Unbounded))
    }

    pub fn key(&self, key: &str) -> Option<&KeyState> {
        self.keys.get(key).map(Arc::as_ref)
    }

    /// The configuration a key runs with: its own, or the defaults.
    pub fn config(&self, key: &str) -> &KeyConfig {
        self.keys
            .get(key)
            .and_then(|state| state.meta().config.as_deref())
            .unwrap_or(&self.defaults)
    }

    /// A key's usage at `now_ms` (the serving node's clock); zero for unknown keys.
    pub fn usage(&self, key: &str, now_ms: u64) -> Usage {
        let empty = KeyState::default();
        usage(self.key(key).unwrap_or(&empty), self.config(key), now_ms)
    }

    /// The usage counts of up to `max_keys` keys after `after` (from the first
    /// key with `None`), added up, and where to go on from: the last key
    /// counted, `None` once a slice came out short (the walk is done). Lets a
    /// caller add up every key a slice at a time, releasing the state's lock
    /// between slices.
    pub fn add_up_usage(
        &self,
        after: Option<&str>,
        max_keys: usize,
        now_ms: u64,
    ) -> (UsageCounts, Option<Arc<str>>) {
        let mut sum = UsageCounts::default();
        let mut counted = 0;
        let mut last = None;
        for (key, state) in self.keys_after(after).take(max_keys) {
            let config = state.meta().config.as_deref().unwrap_or(&self.defaults);
            sum += counts(state, config, now_ms);
            counted += 1;
            last = Some(key);
        }
        let next = last.filter(|_| counted == max_keys).cloned();
        (sum, next)
    }

    /// When a reclaim entry of `key` would next change it (see
    /// [`KeyState::next_deadline_ms`]).
    pub fn next_deadline_ms(&self, key: &str) -> Option<u64> {
        self.key(key).and_then(KeyState::next_deadline_ms)
    }

    /// The answers of deletes kept for their `requestId`s.
    pub fn deletes(&self) -> &RememberedDeletes {
        &self.deletes
    }

    /// The remembered deletes, to change: the cluster row is dirty.
    pub(crate) fn deletes_mut(&mut self) -> &mut RememberedDeletes {
        self.dirty.cluster = true;
        &mut self.deletes
    }

    pub(crate) fn advance_clock(&mut self, now_ms: u64) -> u64 {
        if now_ms > self.last_now_ms {
            self.last_now_ms = now_ms;
            self.dirty.cluster = true;
        }
        self.last_now_ms
    }

    /// Runs `change` on a key's state (created empty if new) with its configuration,
    /// then drops the key if it holds nothing.
    pub(crate) fn with_key<T>(
        &mut self,
        key: &str,
        change: impl FnOnce(&mut KeyState, &KeyConfig) -> T,
    ) -> T {
        if !self.keys.contains_key(key) {
            // A key dropped earlier in this change window: its deleted rows must
            // still reach storage through the re-created state.
            let mut state = KeyState::default();
            state.carry_changes(self.dirty.dropped.remove(key).unwrap_or_default());
            self.keys.insert(Arc::from(key), Arc::new(state));
        }
        let shared = self.keys.get_mut(key).expect("inserted above");
        let state = Arc::make_mut(shared);
        let config = state
            .meta()
            .config
            .as_deref()
            .cloned()
            .unwrap_or_else(|| self.defaults.clone());
        let result = change(state, &config);
        if state.is_empty() {
            let changes = state.take_changes();
            self.keys.remove(key);
            self.dirty.dropped.insert(key.to_owned(), changes);
        }
        self.dirty.keys.insert(key.to_owned());
        result
    }

    /// One allocation round of `key`.
    pub fn round(
        &mut self,
        key: &str,
        ids: &mut IdAllocator,
        now_ms: u64,
        requests: &[PermitRequest],
    ) -> RoundOutcome {
        let now_ms = self.advance_clock(now_ms);
        self.with_key(key, |state, config| {
            run_round(state, config, ids, now_ms, requests)
        })
    }

    /// A sync of `key`.
    pub fn sync(&mut self, key: &str, now_ms: u64, sync: &PermitSync) -> SyncOutcome {
        let now_ms = self.advance_clock(now_ms);
        self.with_key(key, |state, config| run_sync(state, config, now_ms, sync))
    }

    /// A reclaim pass over `key` (the leader's deadline timer): reclaims what
    /// passed its claim deadline and forgets answers past their time.
    pub fn reclaim(&mut self, key: &str, now_ms: u64) -> Vec<Event> {
        let now_ms = self.advance_clock(now_ms);
        self.with_key(key, |state, _| {
            let mut events = Vec::new();
            reclaim_expired(state, now_ms, &mut events);
            events
        })
    }

    /// Replaces a key's configuration; omitted fields take the defaults. Returns the
    /// effective configuration. Leases are re-checked at the key's next round.
    pub fn set_key_config(
        &mut self,
        key: &str,
        update: &KeyConfigUpdate,
    ) -> Result<KeyConfig, InvalidInput> {
        let config = update.resolve(&self.defaults);
        validate_key_config(&config)?;
        self.with_key(key, |state, _| {
            let meta = state.meta_mut();
            meta.config = Some(Box::new(config.clone()));
            meta.recheck_leases = true;
        });
        Ok(config)
    }

    /// Sets one group's cap and permission.
    pub fn set_group(
        &mut self,
        key: &str,
        group: &str,
        config: GroupConfig,
    ) -> Result<(), InvalidInput> {
        validate_group_config(&config)?;
        let groups = self
            .keys
            .get(key)
            .map_or(0, |state| state.meta().groups.len());
        let known = self
            .keys
            .get(key)
            .is_some_and(|state| state.meta().groups.contains_key(group));
        if !known && groups >= MAX_CONFIGURED_GROUPS_PER_KEY {
            return Err(InvalidInput::TooMany {
                field: "groups".into(),
                len: groups + 1,
                max: MAX_CONFIGURED_GROUPS_PER_KEY,
            });
        }
        self.with_key(key, |state, _| {
            let meta = state.meta_mut();
            meta.groups.insert(group.to_owned(), config);
            meta.recheck_leases = true;
        });
        Ok(())
    }

    /// Removes a group's settings: no cap, permitted. A key or group without
    /// settings is left alone: removing nothing creates nothing.
    pub fn remove_group(&mut self, key: &str, group: &str) {
        let configured = self
            .keys
            .get(key)
            .is_some_and(|state| state.meta().groups.contains_key(group));
        if !configured {
            return;
        }
        self.with_key(key, |state, _| {
            let meta = state.meta_mut();
            meta.groups.remove(group);
            meta.recheck_leases = true;
        });
    }

    /// Replaces the cluster defaults. Keys that follow them re-check their leases.
    pub fn set_defaults(&mut self, defaults: KeyConfig) -> Result<(), InvalidInput> {
        validate_key_config(&defaults)?;
        self.defaults = defaults;
        self.defaults_written = true;
        self.dirty.cluster = true;
        let following: Vec<Arc<str>> = self
            .keys
            .iter()
            .filter(|(_, state)| state.meta().config.is_none() && !state.leases().is_empty())
            .map(|(key, _)| key.clone())
            .collect();
        for key in following {
            self.with_key(&key, |state, _| state.meta_mut().recheck_leases = true);
        }
        Ok(())
    }

    /// Drops everything kept for a key: settings, grants, leases and answers.
    pub fn remove_key(&mut self, key: &str) {
        if let Some(state) = self.keys.remove(key) {
            let mut state = Arc::unwrap_or_clone(state);
            let mut removed = state.take_changes();
            removed.merge(state.all_rows());
            self.dirty.dropped.insert(key.to_owned(), removed);
            self.dirty.keys.insert(key.to_owned());
        }
    }

    /// The rows changed since the last call, for the storage layer to persist.
    pub fn take_changes(&mut self) -> StateChanges {
        let dirty = std::mem::take(&mut self.dirty);
        let keys = dirty
            .keys
            .into_iter()
            .map(|key| {
                // Changed in this window, so already this state's own copy.
                let changes = self
                    .keys
                    .get_mut(key.as_str())
                    .map(|state| Arc::make_mut(state).take_changes());
                (key, changes)
            })
            .collect();
        StateChanges {
            cluster: dirty.cluster,
            keys,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capped() -> GroupConfig {
        GroupConfig {
            limit: Some(5),
            permitted: true,
        }
    }

    #[test]
    fn removing_a_group_of_an_unknown_key_creates_nothing() {
        let mut semaphores = Semaphores::default();
        for index in 0..50 {
            semaphores.remove_group(&format!("never-{index}"), "g");
        }
        assert!(semaphores.keys().is_empty());
        assert!(
            semaphores.take_changes().keys.is_empty(),
            "no rows to write"
        );
    }

    #[test]
    fn removing_an_unconfigured_group_of_a_known_key_changes_nothing() {
        let mut semaphores = Semaphores::default();
        semaphores.set_group("k", "a", capped()).unwrap();
        semaphores.take_changes();
        let before = semaphores.clone();
        semaphores.remove_group("k", "b");
        assert_eq!(semaphores, before);
        assert!(semaphores.take_changes().keys.is_empty());
        semaphores.remove_group("k", "a");
        assert!(semaphores.key("k").unwrap().meta().groups.is_empty());
    }

    #[test]
    fn a_copy_shares_keys_until_one_side_changes_them() {
        let mut semaphores = Semaphores::default();
        semaphores.set_group("a", "g", capped()).unwrap();
        semaphores.set_group("b", "g", capped()).unwrap();
        semaphores.take_changes();
        let copy = semaphores.clone();
        let shares = |original: &Semaphores, copy: &Semaphores, key: &str| {
            Arc::ptr_eq(&original.keys()[key], &copy.keys()[key])
        };
        assert!(shares(&semaphores, &copy, "a") && shares(&semaphores, &copy, "b"));

        semaphores.remove_group("a", "g");
        semaphores.set_group("b", "h", capped()).unwrap();
        assert!(semaphores.key("a").unwrap().meta().groups.is_empty());
        assert_eq!(
            copy.key("a").unwrap().meta().groups.len(),
            1,
            "copy keeps a"
        );
        assert!(!shares(&semaphores, &copy, "b"), "b copied on change");
        assert_eq!(semaphores.key("b").unwrap().meta().groups.len(), 2);
        assert_eq!(copy.key("b").unwrap().meta().groups.len(), 1);
        let changes = semaphores.take_changes();
        assert_eq!(changes.keys.len(), 2, "both keys' rows reach storage");
    }

    #[test]
    fn defaults_count_as_written_once_set_and_in_states_saved_before_the_flag() {
        let mut fresh = Semaphores::default();
        assert!(!fresh.defaults_written());
        fresh.set_defaults(KeyConfig::default()).unwrap();
        assert!(fresh.defaults_written());
        let mut saved = serde_json::to_value(Semaphores::default()).unwrap();
        saved.as_object_mut().unwrap().remove("defaultsWritten");
        let older: Semaphores = serde_json::from_value(saved).unwrap();
        assert!(
            older.defaults_written(),
            "an older cluster's init wrote them"
        );
    }

    #[test]
    fn room_for_counts_only_new_distinct_keys() {
        let mut semaphores = Semaphores::default().with_max_keys(2);
        semaphores.set_group("a", "g", capped()).unwrap();
        assert_eq!(semaphores.room_for(["a", "b", "b"]), Ok(()));
        assert_eq!(
            semaphores.room_for(["b", "c"]),
            Err(KeyLimitReached { max: 2 })
        );
        semaphores.set_group("b", "g", capped()).unwrap();
        assert_eq!(
            semaphores.room_for(["a", "b"]),
            Ok(()),
            "held keys always fit"
        );
        assert_eq!(semaphores.room_for(["c"]), Err(KeyLimitReached { max: 2 }));
    }
}
