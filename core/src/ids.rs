//! Identifiers derived from the Raft log, never from a random source.
//!
//! A grant or lease id is a UUID (version 8, "custom") whose bits are the log index
//! of the entry that created it and an ordinal within that entry. Every replica
//! applying the same entry therefore mints the same ids, and ids never repeat: log
//! indexes are unique and the ordinal counts up across all keys of one entry.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Index of a Raft log entry. Also the `fence` of the grants a round creates.
pub type LogIndex = u64;

/// Log indexes must fit the 48 bits an id reserves for them.
const MAX_ID_LOG_INDEX: LogIndex = (1 << 48) - 1;

/// Mints the ids of one log entry, in apply order.
#[derive(Debug)]
pub struct IdAllocator {
    log_index: LogIndex,
    next_ordinal: u64,
}

impl IdAllocator {
    /// An allocator for the entry at `log_index`.
    ///
    /// # Panics
    /// If `log_index` needs more than 48 bits: at a million entries a second that
    /// is nine years of log, and ids must never wrap.
    pub fn new(log_index: LogIndex) -> Self {
        assert!(
            log_index <= MAX_ID_LOG_INDEX,
            "log index {log_index} exceeds 48 bits"
        );
        Self {
            log_index,
            next_ordinal: 0,
        }
    }

    /// The entry's log index.
    pub fn log_index(&self) -> LogIndex {
        self.log_index
    }

    fn next_uuid(&mut self) -> Uuid {
        let ordinal = self.next_ordinal;
        self.next_ordinal += 1;
        let index = self.log_index.to_be_bytes();
        let ordinal = ordinal.to_be_bytes();
        // Bytes 6 and 8 carry the version and variant bits: keep ours out of them.
        let mut bytes = [0u8; 16];
        bytes[0..6].copy_from_slice(&index[2..8]);
        bytes[9..16].copy_from_slice(&ordinal[1..8]);
        Uuid::new_v8(bytes)
    }

    /// The next grant id of this entry.
    pub fn grant_id(&mut self) -> GrantId {
        GrantId(self.next_uuid())
    }

    /// The next lease id of this entry.
    pub fn lease_id(&mut self) -> LeaseId {
        LeaseId(self.next_uuid())
    }
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
            utoipa::ToSchema,
        )]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// Parses an id a client reported; `None` when it is not a UUID, which
            /// the engine answers as unknown.
            pub fn parse(text: &str) -> Option<Self> {
                Uuid::try_parse(text).ok().map(Self)
            }

            /// The log index of the entry that minted this id.
            pub fn log_index(&self) -> LogIndex {
                let bytes = self.0.as_bytes();
                let mut index = [0u8; 8];
                index[2..8].copy_from_slice(&bytes[0..6]);
                LogIndex::from_be_bytes(index)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }
    };
}

uuid_id!(
    /// Identifies one grant: permits handed to one client for one group in one round.
    GrantId
);
uuid_id!(
    /// Identifies one lease: a block of permits a client draws from locally.
    LeaseId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_one_entry_are_distinct_and_reproducible() {
        let mut first = IdAllocator::new(42);
        let mut second = IdAllocator::new(42);
        let a: Vec<GrantId> = (0..3).map(|_| first.grant_id()).collect();
        let b: Vec<GrantId> = (0..3).map(|_| second.grant_id()).collect();
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
        assert_ne!(IdAllocator::new(43).grant_id(), a[0]);
    }

    #[test]
    fn ids_order_by_log_index_then_ordinal() {
        let mut early = IdAllocator::new(7);
        let first = early.lease_id();
        let second = early.lease_id();
        let later = IdAllocator::new(8).lease_id();
        assert!(first < second && second < later);
    }

    #[test]
    fn ids_round_trip_through_text() {
        let id = IdAllocator::new(MAX_ID_LOG_INDEX).grant_id();
        assert_eq!(GrantId::parse(&id.to_string()), Some(id));
        assert_eq!(GrantId::parse("not-a-uuid"), None);
    }

    #[test]
    fn an_id_names_the_entry_that_minted_it() {
        for log_index in [0, 1, 77, MAX_ID_LOG_INDEX] {
            let mut ids = IdAllocator::new(log_index);
            ids.grant_id();
            assert_eq!(ids.lease_id().log_index(), log_index);
        }
    }
}
