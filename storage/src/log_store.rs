//! The Raft log and vote, in the `log` and `raft` sled trees.
//!
//! Invariants:
//! - a saved vote, an appended entry, a truncation and a purge are on disk
//!   (a [`crate::durable::flush`] returned) before openraft is told they happened: sled by itself
//!   only flushes every 500 ms, which would let a node forget a vote it cast or an
//!   entry it acknowledged to the leader;
//! - entries are consecutive: appends, truncations (a suffix) and purges (a
//!   prefix) never leave a hole;
//! - `last_purged` is written before the purged entries are removed, so a crash in
//!   between leaves entries that are merely redundant, never a hole.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::durable::DurableDb;
use crate::error::{read_logs, read_vote, write_logs, write_vote, RaftError};
use crate::{codec, keys};
use crate::{NodeId, StorageError, TypeConfig};

/// Most entries one `limited_get_log_entries` call returns.
const MAX_ENTRIES_PER_READ: usize = 1_024;
/// Most entry bytes one `limited_get_log_entries` call returns (at least one entry).
const MAX_BYTES_PER_READ: usize = 8 * 1024 * 1024;

/// The Raft log store. Cloning is cheap: sled trees are shared handles and need no
/// lock of ours, because openraft serialises all writes through one task and sled
/// makes every single write and batch atomic for readers.
#[derive(Debug, Clone)]
pub struct LogStore {
    /// The whole database: a flush of it makes every tree durable.
    db: DurableDb,
    /// Entries by index ([`keys::log_key`]).
    log: sled::Tree,
    /// Vote, committed and last purged log ids.
    raft: sled::Tree,
}

impl LogStore {
    pub(crate) fn new(db: DurableDb, log: sled::Tree, raft: sled::Tree) -> Self {
        Self { db, log, raft }
    }

    fn read_raft_row<T: DeserializeOwned>(&self, name: &[u8]) -> Result<Option<T>, StorageError> {
        match self.raft.get(name)? {
            Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
            None => Ok(None),
        }
    }

    fn write_raft_row<T: Serialize>(&self, name: &[u8], value: &T) -> Result<(), StorageError> {
        self.raft.insert(name, codec::encode(value)?)?;
        Ok(())
    }

    async fn flush(&self) -> Result<(), StorageError> {
        self.db.flush().await
    }

    /// Entries in `range`, stopping after `max_entries` or once `max_bytes` are read.
    fn read_entries(
        &self,
        range: impl RangeBounds<u64>,
        max_entries: usize,
        max_bytes: usize,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let to_key = |bound: Bound<&u64>| match bound {
            Bound::Included(index) => Bound::Included(keys::log_key(*index)),
            Bound::Excluded(index) => Bound::Excluded(keys::log_key(*index)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let range = (to_key(range.start_bound()), to_key(range.end_bound()));
        let mut entries = Vec::new();
        let mut bytes_read = 0;
        for row in self.log.range(range) {
            let (_, value) = row?;
            bytes_read += value.len();
            entries.push(codec::decode(&value)?);
            if entries.len() >= max_entries || bytes_read >= max_bytes {
                break;
            }
        }
        Ok(entries)
    }

    fn last_log_id(&self) -> Result<Option<LogId<NodeId>>, StorageError> {
        match self.log.last()? {
            Some((_, value)) => {
                let entry: Entry<TypeConfig> = codec::decode(&value)?;
                Ok(Some(entry.log_id))
            }
            None => Ok(None),
        }
    }

    /// Removes the entries in `range` in one atomic batch.
    fn remove_entries(&self, range: impl RangeBounds<[u8; 8]>) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for row in self.log.range(range) {
            let (key, _) = row?;
            batch.remove(key);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }

    fn append_batch(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        let mut previous: Option<u64> = None;
        for entry in entries {
            let index = entry.log_id.index;
            assert!(
                previous.map_or(true, |previous| previous + 1 == index),
                "appended entries must be consecutive: {previous:?} then {index}"
            );
            previous = Some(index);
            batch.insert(&keys::log_key(index), codec::encode(&entry)?);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, RaftError> {
        self.read_entries(range, usize::MAX, usize::MAX)
            .map_err(read_logs)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, RaftError> {
        self.read_entries(start..end, MAX_ENTRIES_PER_READ, MAX_BYTES_PER_READ)
            .map_err(read_logs)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftError> {
        let last_purged_log_id: Option<LogId<NodeId>> =
            self.read_raft_row(keys::LAST_PURGED).map_err(read_logs)?;
        let last_log_id = self.last_log_id().map_err(read_logs)?;
        Ok(LogState {
            last_purged_log_id,
            // A crash between writing `last_purged` and removing the entries can
            // leave only entries at or below it: the purge point is then the last.
            last_log_id: last_log_id.max(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), RaftError> {
        self.write_raft_row(keys::VOTE, vote).map_err(write_vote)?;
        self.flush().await.map_err(write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, RaftError> {
        self.read_raft_row(keys::VOTE).map_err(read_vote)
    }

    /// Not flushed: a committed id that is lost in a crash is learned again from
    /// the leader; it only lets a restarted node apply sooner.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), RaftError> {
        self.write_raft_row(keys::COMMITTED, &committed)
            .map_err(write_logs)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, RaftError> {
        let committed: Option<Option<LogId<NodeId>>> =
            self.read_raft_row(keys::COMMITTED).map_err(read_logs)?;
        Ok(committed.flatten())
    }

    /// Writes the entries in one batch, then flushes, then fires the callback: an
    /// entry is acknowledged only once it is on disk.
    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), RaftError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.append_batch(entries).map_err(write_logs)?;
        match self.flush().await {
            Ok(_) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                callback.log_io_completed(Err(std::io::Error::other(error.to_string())));
                Err(write_logs(error))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), RaftError> {
        tracing::debug!(%log_id, "truncating the log from this entry on");
        self.remove_entries(keys::log_key(log_id.index)..)
            .map_err(write_logs)?;
        self.flush().await.map_err(write_logs)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), RaftError> {
        tracing::debug!(%log_id, "purging the log up to this entry");
        self.write_raft_row(keys::LAST_PURGED, &log_id)
            .map_err(write_logs)?;
        self.remove_entries(..=keys::log_key(log_id.index))
            .map_err(write_logs)?;
        self.flush().await.map_err(write_logs)
    }
}
