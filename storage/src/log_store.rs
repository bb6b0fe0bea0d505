//! The openraft log storage: a thin adapter over the write-ahead log
//! ([`crate::wal`], whose docs give the format and the invariants).
//!
//! - `append` writes the entries into the page cache and returns at once; the
//!   `LogFlushed` callback fires from the group commit (the sync thread, or
//!   its task with `Exec::Inline`) after the `fdatasync` that covers them, so
//!   openraft pipelines appends;
//! - `save_vote`, `truncate` and `purge` return once their record is durable;
//!   `save_committed` writes nothing: its record goes ahead of the next
//!   write, and is durable with that write's sync;
//! - reads come from the in-memory index and positioned reads of the segment
//!   files, and see every entry whose `append` returned, synced or not;
//! - an [`AppendObserver`], when the node sets one, hears of each append
//!   before it is written: the leader's network sends new entries to idle
//!   followers from there, not after this node's sync
//!   (`node/src/raft/early_appends.rs`).

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, Vote};

use crate::error::{read_logs, write_logs, write_vote, RaftError};
use crate::snapshot_reach::SnapshotReach;
use crate::wal::{ShardId, Wal};
use crate::{NodeId, TypeConfig};

/// Most entries one `limited_get_log_entries` call returns.
const MAX_ENTRIES_PER_READ: usize = 1_024;
/// Most entry bytes one `limited_get_log_entries` call returns (at least one entry).
const MAX_BYTES_PER_READ: u64 = 8 * 1024 * 1024;

/// Most entry bytes `try_get_log_entries` reads between two yields.
const MAX_BYTES_PER_YIELD: u64 = 1024 * 1024;

/// `range` as `start..end`.
fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    use std::ops::Bound;
    let start = match range.start_bound() {
        Bound::Included(&index) => index,
        Bound::Excluded(&index) => index.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&index) => index.saturating_add(1),
        Bound::Excluded(&index) => index,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

/// Hears of the entries openraft appends, before they are written.
pub trait AppendObserver: Send + Sync + Debug {
    /// `entries` are about to be written to this shard's log; whether it
    /// started sends of them. Called before the write. When it did, the group
    /// commit lets those sends leave before it blocks the runtime's worker in
    /// an inline `fdatasync` ([`crate::wal::Wal::sends_first`]).
    fn appending(&self, entries: &[Entry<TypeConfig>]) -> bool;
}

/// The Raft log store. Cloning is cheap and shares the log: openraft's log
/// readers are clones, and read while the store appends.
#[derive(Debug, Clone)]
pub struct LogStore {
    wal: Wal,
    /// The Raft group this store is the log of, in the node's one log.
    shard: ShardId,
    /// A purge waits until a durable snapshot covers its point.
    snapshot_reach: SnapshotReach,
    /// Told of each append first, if set.
    observer: Option<Arc<dyn AppendObserver>>,
}

impl LogStore {
    pub(crate) fn new(wal: Wal, shard: ShardId, snapshot_reach: SnapshotReach) -> Self {
        Self {
            wal,
            shard,
            snapshot_reach,
            observer: None,
        }
    }

    /// This store, telling `observer` of each append before writing it.
    pub fn observed_by(mut self, observer: Arc<dyn AppendObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Group-commit counts so far: (group-commit batches, fdatasyncs). For tests and
    /// the bench; the node reads the `permitd_wal_*` metrics instead.
    pub fn wal_sync_counts(&self) -> (u64, u64) {
        self.wal.sync_counts()
    }

    /// The entries in `range`, read `slice_bytes` at a time, yielding between
    /// slices: openraft reads every entry it applies through here, possibly
    /// thousands at once, on the Raft runtime's one worker.
    async fn read_in_slices(
        &self,
        range: impl RangeBounds<u64>,
        slice_bytes: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, RaftError> {
        let (mut start, end) = bounds(&range);
        let mut entries = Vec::new();
        while start < end {
            let slice = self
                .wal
                .read(self.shard, start..end, usize::MAX, slice_bytes)
                .map_err(read_logs)?;
            let Some(last) = slice.last() else { break };
            start = last.log_id.index + 1;
            entries.extend(slice);
            if start < end {
                tokio::task::yield_now().await;
            }
        }
        Ok(entries)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, RaftError> {
        self.read_in_slices(range, MAX_BYTES_PER_YIELD).await
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, RaftError> {
        self.wal
            .read(
                self.shard,
                start..end,
                MAX_ENTRIES_PER_READ,
                MAX_BYTES_PER_READ,
            )
            .map_err(read_logs)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftError> {
        Ok(LogState {
            last_purged_log_id: self.wal.raft_state(self.shard).purged,
            last_log_id: self.wal.last_log_id(self.shard),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), RaftError> {
        self.wal
            .save_vote(self.shard, *vote)
            .await
            .map_err(write_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, RaftError> {
        Ok(self.wal.raft_state(self.shard).vote)
    }

    /// Not waited for: a committed id that is lost in a crash is learned again
    /// from the leader; it only lets a restarted node apply sooner.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), RaftError> {
        self.wal
            .save_committed(self.shard, committed)
            .map_err(write_logs)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, RaftError> {
        Ok(self.wal.raft_state(self.shard).committed)
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
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        if let Some(observer) = &self.observer {
            if observer.appending(&entries) {
                self.wal.sends_first();
            }
        }
        self.wal
            .append(self.shard, entries, done)
            .map_err(write_logs)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), RaftError> {
        tracing::debug!(%log_id, "truncating the log from this entry on");
        self.wal
            .truncate(self.shard, log_id.index)
            .await
            .map_err(write_logs)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), RaftError> {
        tracing::debug!(%log_id, "purging the log up to this entry");
        // Never ahead of the durable snapshot (`snapshot_reach.rs`): an
        // install from the leader is still being written when this is asked.
        self.snapshot_reach
            .wait_for(log_id.index)
            .await
            .map_err(write_logs)?;
        self.wal.purge(self.shard, log_id).await.map_err(write_logs)
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::wal::{Presence, WalOptions};

    fn blank(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn indexes(entries: &[Entry<TypeConfig>]) -> Vec<u64> {
        entries.iter().map(|entry| entry.log_id.index).collect()
    }

    #[tokio::test]
    async fn a_read_in_slices_returns_what_one_read_does_for_every_kind_of_range() {
        let dir = tempfile::tempdir().unwrap();
        let options = WalOptions {
            segment_max_bytes: 256,
            ..WalOptions::new(Presence::CreateIfMissing)
        };
        let wal = Wal::open(dir.path(), options).unwrap();
        let (sender, synced) = tokio::sync::oneshot::channel();
        let done: crate::wal::AppendDone = Box::new(move |result| {
            let _ = sender.send(result);
        });
        wal.append(0, (1..=40).map(blank).collect::<Vec<_>>(), done)
            .unwrap();
        synced.await.unwrap().unwrap();
        let store = LogStore::new(wal, 0, SnapshotReach::new(Some(u64::MAX)));
        // One byte per slice: every entry is a slice of its own.
        assert_eq!(
            indexes(&store.read_in_slices(.., 1).await.unwrap()),
            (1..=40).collect::<Vec<_>>()
        );
        assert_eq!(
            indexes(&store.read_in_slices(5..=9, 1).await.unwrap()),
            vec![5, 6, 7, 8, 9]
        );
        assert_eq!(
            indexes(&store.read_in_slices(38.., 1).await.unwrap()),
            vec![38, 39, 40]
        );
        assert_eq!(
            indexes(&store.read_in_slices(..3, 1).await.unwrap()),
            vec![1, 2]
        );
        assert!(store.read_in_slices(41.., 1).await.unwrap().is_empty());
        assert_eq!(
            indexes(&store.read_in_slices(.., MAX_BYTES_PER_YIELD).await.unwrap()),
            (1..=40).collect::<Vec<_>>()
        );
    }
}
