//! The newest entries of the log, kept decoded, so that replication and apply
//! do not read back what was just written.
//!
//! openraft reads every entry again after appending it: the leader once per
//! follower to replicate it, and every node once to apply it. From the segment
//! files that is a `pread` and a decode each time, 9.7 % of the leader's CPU
//! and 13.9 % of a follower's in the contended bench's profile
//! (docs/scaling.md, "Where an entry's CPU goes"). Those reads almost always
//! ask for entries appended a moment ago, so the log keeps its newest entries
//! here, as appended. An entry's command sits behind an `Arc`
//! ([`crate::EncodedCommand`]), so handing out a clone copies pointers.
//!
//! The cache is always a suffix of the log: entries `first..=last` where
//! `last` is the log's last entry, each the same as the one on disk. An append
//! replaces what it overwrites, a truncation or a purge drops what it drops, and
//! the oldest entries leave once the cache holds more than
//! [`MAX_RECENT_RECORD_BYTES`] of records or [`MAX_RECENT_ENTRIES`] entries.
//! A read of anything older goes to the segment files as before.

use std::collections::VecDeque;

use openraft::Entry;

use crate::TypeConfig;

/// Most record bytes the cache holds (the entries' encoded size; decoded, an
/// entry takes its bytes plus its command, about three times that).
pub(crate) const MAX_RECENT_RECORD_BYTES: u64 = 4 * 1024 * 1024;

/// Most entries the cache holds.
pub(crate) const MAX_RECENT_ENTRIES: usize = 8 * 1024;

/// One cached entry and the size of its record.
#[derive(Debug)]
struct Cached {
    entry: Entry<TypeConfig>,
    record_len: u64,
}

/// The newest entries of the log, a suffix of it (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Recent {
    entries: VecDeque<Cached>,
    /// Record bytes of `entries`.
    record_bytes: u64,
}

impl Recent {
    /// The log index of the first cached entry.
    fn first(&self) -> Option<u64> {
        self.entries.front().map(|cached| cached.entry.log_id.index)
    }

    /// The entry at `index`, if cached.
    pub(crate) fn get(&self, index: u64) -> Option<&Entry<TypeConfig>> {
        let offset = index.checked_sub(self.first()?)?;
        let cached = self.entries.get(usize::try_from(offset).ok()?)?;
        Some(&cached.entry)
    }

    /// Takes in entries just written at the end of the log, each with its
    /// record's length, consecutive from the first; they replace whatever the
    /// cache held at or after the first one's index.
    pub(crate) fn appended(&mut self, entries: impl IntoIterator<Item = (Entry<TypeConfig>, u64)>) {
        let mut entries = entries.into_iter().peekable();
        let Some((next, _)) = entries.peek() else {
            return;
        };
        let start = next.log_id.index;
        self.drop_from(start);
        // The cache must stay a suffix without holes: an append that does not
        // continue it (the first after an open, or after a purge past the end)
        // starts it afresh.
        let continues = self
            .entries
            .back()
            .is_some_and(|last| last.entry.log_id.index + 1 == start);
        if !continues {
            self.clear();
        }
        for (entry, record_len) in entries {
            self.record_bytes += record_len;
            self.entries.push_back(Cached { entry, record_len });
        }
        self.evict();
    }

    /// Drops the entries at or after `index` (a truncation, or an append
    /// that overwrites them).
    pub(crate) fn drop_from(&mut self, index: u64) {
        while self
            .entries
            .back()
            .is_some_and(|last| last.entry.log_id.index >= index)
        {
            self.pop_back();
        }
    }

    /// Drops the entries at or before `index` (a purge).
    pub(crate) fn drop_through(&mut self, index: u64) {
        while self
            .entries
            .front()
            .is_some_and(|first| first.entry.log_id.index <= index)
        {
            self.pop_front();
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.record_bytes = 0;
    }

    /// Drops the oldest entries while over either limit.
    fn evict(&mut self) {
        while self.entries.len() > MAX_RECENT_ENTRIES || self.record_bytes > MAX_RECENT_RECORD_BYTES
        {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        let popped = self.entries.pop_front();
        self.forget(popped);
    }

    fn pop_back(&mut self) {
        let popped = self.entries.pop_back();
        self.forget(popped);
    }

    fn forget(&mut self, popped: Option<Cached>) {
        if let Some(cached) = popped {
            self.record_bytes -= cached.record_len;
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload, LogId};
    use proptest::prelude::*;

    use super::*;

    fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    /// What the cache does to a log, replayed on a plain model of the log.
    #[derive(Debug, Clone)]
    enum Step {
        /// Appends `count` entries of `term` from `back` entries before the end.
        Append { back: u64, count: u64, term: u64 },
        /// Truncates `back` entries before the end.
        Truncate { back: u64 },
        /// Purges through `ahead` entries after the log's first.
        Purge { ahead: u64 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..4u64, 1..600u64, 1..4u64)
                .prop_map(|(back, count, term)| Step::Append { back, count, term }),
            1 => (0..50u64).prop_map(|back| Step::Truncate { back }),
            1 => (0..900u64).prop_map(|ahead| Step::Purge { ahead }),
        ]
    }

    proptest! {
        /// Whatever the steps, every entry the cache holds is the log's entry
        /// at that index, the cache ends at the log's end, and it stays within
        /// its limits.
        #[test]
        fn the_cache_is_always_a_bounded_suffix_of_the_log(
            steps in proptest::collection::vec(step(), 1..60)
        ) {
            // The log: consecutive entries from `first`.
            let mut log: Vec<Entry<TypeConfig>> = Vec::new();
            let mut first = 1u64;
            let mut recent = Recent::default();
            for step in steps {
                let end = first + log.len() as u64;
                match step {
                    Step::Append { back, count, term } => {
                        let start = end.saturating_sub(back).max(first);
                        log.truncate((start - first) as usize);
                        let batch: Vec<_> = (start..start + count).map(|i| blank(term, i)).collect();
                        log.extend(batch.iter().cloned());
                        recent.appended(batch.into_iter().map(|entry| (entry, 1_000)));
                    }
                    Step::Truncate { back } => {
                        let at = end.saturating_sub(back).max(first);
                        log.truncate((at - first) as usize);
                        recent.drop_from(at);
                    }
                    Step::Purge { ahead } => {
                        let through = first + ahead;
                        let dropped = (through + 1 - first).min(log.len() as u64);
                        log.drain(..dropped as usize);
                        first = through + 1;
                        if !log.is_empty() {
                            first = log[0].log_id.index;
                        }
                        recent.drop_through(through);
                    }
                }
                prop_assert!(recent.entries.len() <= MAX_RECENT_ENTRIES);
                prop_assert!(recent.record_bytes <= MAX_RECENT_RECORD_BYTES);
                prop_assert_eq!(recent.record_bytes, 1_000 * recent.entries.len() as u64);
                for cached in &recent.entries {
                    let index = cached.entry.log_id.index;
                    prop_assert!(index >= first);
                    prop_assert_eq!(Some(&cached.entry), log.get((index - first) as usize));
                }
                if let Some(last) = recent.entries.back() {
                    prop_assert_eq!(Some(&last.entry), log.last());
                }
                let cached: Vec<u64> = recent.entries.iter().map(|c| c.entry.log_id.index).collect();
                for pair in cached.windows(2) {
                    prop_assert_eq!(pair[0] + 1, pair[1]);
                }
                if let Some(&index) = cached.first() {
                    prop_assert_eq!(recent.get(index), log.get((index - first) as usize));
                }
                prop_assert!(recent.get(first + log.len() as u64).is_none());
            }
        }
    }
}
