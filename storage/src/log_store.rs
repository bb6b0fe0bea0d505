//! The openraft log storage: a thin adapter over the write-ahead log
//! ([`crate::wal`], whose docs give the format and the invariants).
//!
//! - `append` writes the entries into the page cache and returns at once; the
//!   `LogFlushed` callback fires from the sync thread after the `fdatasync`
//!   that covers them (group commit), so openraft pipelines appends;
//! - `save_vote`, `truncate` and `purge` return once their record is durable;
//!   `save_committed` rides along with the next sync;
//! - reads come from the in-memory index and positioned reads of the segment
//!   files, and see every entry whose `append` returned, synced or not.

use std::fmt::Debug;
use std::ops::RangeBounds;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, Vote};

use crate::error::{read_logs, write_logs, write_vote, RaftError};
use crate::wal::Wal;
use crate::{NodeId, TypeConfig};

/// Most entries one `limited_get_log_entries` call returns.
const MAX_ENTRIES_PER_READ: usize = 1_024;
/// Most entry bytes one `limited_get_log_entries` call returns (at least one entry).
const MAX_BYTES_PER_READ: u64 = 8 * 1024 * 1024;

/// The Raft log store. Cloning is cheap and shares the log: openraft's log
/// readers are clones, and read while the store appends.
#[derive(Debug, Clone)]
pub struct LogStore {
    wal: Wal,
}

impl LogStore {
    pub(crate) fn new(wal: Wal) -> Self {
        Self { wal }
    }

    /// Group-commit counts so far: (sync rounds, fdatasyncs). For tests and
    /// the bench; the node reads the `permitd_wal_*` metrics instead.
    pub fn wal_sync_counts(&self) -> (u64, u64) {
        self.wal.sync_counts()
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, RaftError> {
        self.wal
            .read(range, usize::MAX, u64::MAX)
            .map_err(read_logs)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, RaftError> {
        self.wal
            .read(start..end, MAX_ENTRIES_PER_READ, MAX_BYTES_PER_READ)
            .map_err(read_logs)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftError> {
        Ok(LogState {
            last_purged_log_id: self.wal.raft_state().purged,
            last_log_id: self.wal.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), RaftError> {
        self.wal.save_vote(*vote).await.map_err(write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, RaftError> {
        Ok(self.wal.raft_state().vote)
    }

    /// Not waited for: a committed id that is lost in a crash is learned again
    /// from the leader; it only lets a restarted node apply sooner.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), RaftError> {
        self.wal.save_committed(committed).map_err(write_logs)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, RaftError> {
        Ok(self.wal.raft_state().committed)
    }

    /// Writes the entries and returns; the callback fires once they are on disk.
    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), RaftError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let done = Box::new(move |synced: Result<(), crate::wal::SyncFailed>| {
            callback.log_io_completed(synced.map_err(std::io::Error::from));
        });
        self.wal.append(entries, done).map_err(write_logs)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), RaftError> {
        tracing::debug!(%log_id, "truncating the log from this entry on");
        self.wal.truncate(log_id.index).await.map_err(write_logs)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), RaftError> {
        tracing::debug!(%log_id, "purging the log up to this entry");
        self.wal.purge(log_id).await.map_err(write_logs)
    }
}
