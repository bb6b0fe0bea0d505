//! The write-ahead log: the Raft log, the vote, the committed and purged log
//! ids, in append-only segment files of our own, made durable by group commit.
//!
//! One log holds every shard of the node (each shard is a Raft group of its
//! own, with its own entries, vote, committed and purged ids): every record
//! carries its shard, and one `fdatasync` covers every shard's records
//! written before it started. Reads, truncations, purges and votes are per
//! shard; segments are shared, so a segment is deleted only once no shard has
//! a live entry in it.
//!
//! # Why our own
//!
//! sled's flush ends in `sync_file_range` on Linux: no fsync, no file-size
//! metadata, no device cache flush. A power cut could make a node forget an
//! entry it acknowledged or a vote it cast, which Raft cannot survive. And each
//! flush cost more than the append it covered. Here every acknowledgement waits
//! for an `fdatasync`, and one `fdatasync` covers every append since the last.
//!
//! # On disk
//!
//! `<data dir>/wal/` holds segment files named by a sequence number, zero-padded
//! so that lexical order is numeric order (`00000000000000000001.wal`,
//! [`segment`]). A segment is a sequence of records ([`record`]):
//!
//! ```text
//! len: u32 LE | crc32: u32 LE (of kind + payload) | kind: u8 | payload (len bytes)
//! ```
//!
//! | kind | payload | replay |
//! |---|---|---|
//! | Entry | `Entry<TypeConfig>`, MessagePack; its command is the byte string the leader encoded ([`crate::EncodedCommand`]) | drops entries at or after its index, then is the entry at its index |
//! | Vote | `Option<Vote>` | the vote |
//! | Committed | `Option<LogId>` | the committed log id |
//! | Purged | `Option<LogId>` | the purge point (only moves up); drops entries at or below it |
//! | Truncate | u64 LE index | drops entries at or after the index |
//!
//! A segment starts with a Vote, a Committed and a Purged record for every
//! shard, restating the Raft state as of its creation ("the head"). The writer rolls to a new
//! segment once the next write would take the active one past
//! [`SEGMENT_MAX_BYTES`]; every open starts a new segment too, so recovery
//! never appends after a cut. A record's payload is at most
//! [`record::MAX_RECORD_PAYLOAD_BYTES`].
//!
//! # Invariants
//!
//! - **An entry, a vote or a truncation is acknowledged only once it is on
//!   disk**: after an `fdatasync` of its segment that started after the write
//!   (run by the group commit, [`group_commit`], before any completion it
//!   holds), and an fsync of the dir that made its segment's creation durable
//!   (run when the segment is created, before anything is written to it).
//! - **The segments on disk are a run of consecutive sequence numbers**: a
//!   segment is created only once its predecessor's creation is durable, and
//!   deleted only as a prefix. A gap means a segment was lost: corrupt.
//! - **Acknowledged means every earlier byte is durable too**: a group
//!   commit syncs every segment written since the last one, so a segment's records
//!   are acknowledged only once every earlier segment is entirely on disk.
//! - **A torn tail is cut at open** ([`recovery`]): the first record that is
//!   short or fails its CRC ends the log; it and everything after it were never
//!   acknowledged (by the invariant above), so cutting loses nothing promised.
//!   The zero-filled space ahead of the active segment's records (below) reads
//!   as such a record and is cut the same way.
//! - **Only the active segment has space ahead of its records**: a segment is
//!   cut to its records' length when the writer rolls past it, and that cut is
//!   synced by the group commit that makes the next segment's first records durable.
//! - **The active segment restates the whole Raft state**: its head plus its
//!   own records give every shard's vote, committed and purge point, so any
//!   older segment in which no shard has a live entry can be deleted.
//! - **Only a prefix of segments is deleted**, oldest first with a dir fsync
//!   after each unlink, so the run stays contiguous even when a crash loses an
//!   unlink (the segment just comes back, and its entries are at or below the
//!   purge point a later segment records, so replay skips them).
//! - **Readers get what the segment files hold**: the newest entries are
//!   also kept decoded ([`recent`]), always a suffix of the log equal to what
//!   was written, so a read served from them returns what a read of the
//!   files would.
//! - **Readers see every entry whose `append` returned**: the bytes are in the
//!   page cache and the index points at them before `append` returns; segment
//!   bytes are never rewritten in place, so a location stays valid until its
//!   segment is deleted (and a reader's open handle outlives even that).
//! - **The first failed write or fsync is final**: the log refuses every later
//!   write, and openraft stops the node.
//!
//! # Zero-filled space ahead
//!
//! An `fdatasync` after a write that grows the file must also write the inode
//! (the new size), a second device write and wait per sync. So the writer keeps
//! the active segment zero-filled [`ZERO_AHEAD_BYTES`] past its records: a
//! record lands inside the file, and the sync covering it writes data only. The
//! zeros go to the page cache with the record that needed them, and become
//! durable, with the new size, in that record's sync: one larger sync per MiB.
//! On this project's test VM (ext4), a 600-byte append and `fdatasync` took
//! 119 µs (p50) and 54 µs of CPU growing the file, 81 µs and 35 µs inside
//! zero-filled space. A zero header is never a record (kind 0 does not exist and
//! fails the CRC), so recovery ends the log there.
//!
//! # Why group commit is safe
//!
//! `append` returns once the entries are in the page cache and openraft may
//! call it again at once; the completion that tells openraft "flushed" runs
//! only after an `fdatasync` that began after the write. Batching only delays
//! completions; it never runs one early. Completions run in the order their
//! writes were made, so openraft never hears of a later flush before an earlier
//! one. A crash before the sync loses only unacknowledged writes, which Raft
//! allows (the leader re-sends them; a candidate re-votes).
//!
//! # Files and threads
//!
//! Every file operation goes through the [`Disk`] of [`WalOptions`]
//! ([`crate::disk`]; the real file system by default), and the group commit
//! and segment deletions run as its [`Exec`] says: a thread and tokio's
//! blocking pool by default, inline for a simulator.

mod group_commit;
mod metrics;
mod recent;
mod record;
mod recovery;
mod segment;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use openraft::{Entry, LogId, Vote};

pub(crate) use group_commit::{Completion, SyncFailed};
pub use metrics::{describe_wal_metrics, WAL_SYNCS, WAL_SYNC_BATCH_ENTRIES, WAL_SYNC_DURATION};

use crate::disk::{Disk, FileKind, OsDisk};
use crate::fsync::durable_create_dir_all_on;
use crate::{Exec, NodeId, StorageError, TypeConfig};
use group_commit::{SyncQueue, Waiter};
use recent::Recent;
use segment::{io_error, Segment};

/// A segment is closed, and a new one started, once the next write would take
/// it past this many bytes (a single batch larger than this gets a segment of
/// its own).
pub const SEGMENT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// The name of the log's dir inside the data dir.
pub const WAL_DIR: &str = "wal";

/// How far past its records the active segment is kept zero-filled (see the
/// module's "Zero-filled space ahead"); never past the segment limit.
const ZERO_AHEAD_BYTES: u64 = 1024 * 1024;

/// A shard: one Raft group's part of the log. A data dir of storage format 4
/// holds shard 0 only.
pub type ShardId = u32;

/// Whether opening may create the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// A brand-new store: create the dir and the first segment.
    CreateIfMissing,
    /// The store was initialised before: a missing dir or no segment at all
    /// means the log was lost, which is reported as corrupt.
    MustExist,
}

/// How the log is opened.
#[derive(Debug, Clone)]
pub struct WalOptions {
    /// See [`SEGMENT_MAX_BYTES`]; tests use a few hundred bytes to roll often.
    pub segment_max_bytes: u64,
    pub presence: Presence,
    /// The file system the segments live on.
    pub disk: Arc<dyn Disk>,
    /// Where the group commit and segment deletions run.
    pub exec: Exec,
}

impl WalOptions {
    /// On the real file system, with the sync thread.
    pub fn new(presence: Presence) -> Self {
        Self {
            segment_max_bytes: SEGMENT_MAX_BYTES,
            presence,
            disk: Arc::new(OsDisk),
            exec: Exec::Threads,
        }
    }
}

/// The Raft state besides the entries, as the records written so far say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RaftState {
    pub(crate) vote: Option<Vote<NodeId>>,
    pub(crate) committed: Option<LogId<NodeId>>,
    pub(crate) purged: Option<LogId<NodeId>>,
}

/// Where an entry's record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    /// The segment's sequence number.
    pub(crate) segment: u64,
    /// Of the record's first byte (its header) in the segment.
    pub(crate) offset: u64,
    /// Of the whole record, header included.
    pub(crate) len: u64,
    pub(crate) log_id: LogId<NodeId>,
}

/// The segment being written.
#[derive(Debug)]
struct Active {
    segment: Arc<Segment>,
    /// Bytes written to it so far: the offset of the next record.
    len: u64,
    /// The file's length: records, then zeros up to here.
    zeroed: u64,
    /// Bytes of its head records: a segment holding only its head never rolls.
    head_len: u64,
}

/// One shard's part of the log.
#[derive(Debug, Default)]
pub(crate) struct ShardLog {
    pub(crate) raft: RaftState,
    /// Every live entry, by index: consecutive, all above the purge point.
    pub(crate) index: BTreeMap<u64, Location>,
    /// The newest entries, decoded: a suffix of `index` ([`recent`]).
    pub(crate) recent: Recent,
}

/// Everything the writer and the readers share, behind [`Inner::state`].
#[derive(Debug)]
struct State {
    /// Every shard the log has records of, and shard 0 always.
    shards: BTreeMap<ShardId, ShardLog>,
    /// Every segment on disk, by sequence; the last is the active one.
    segments: BTreeMap<u64, Arc<Segment>>,
    active: Active,
    /// The shards whose committed id changed since their last Committed
    /// record ([`Wal::save_committed`]): at most one per shard. The records go
    /// ahead of the next write's, so a commit costs no `pwrite` of its own.
    committed_unwritten: BTreeSet<ShardId>,
}

impl State {
    /// `shard`'s part, created empty at its first write.
    fn shard_mut(&mut self, shard: ShardId) -> &mut ShardLog {
        self.shards.entry(shard).or_default()
    }

    /// `shard`'s part, if it has one.
    fn shard(&self, shard: ShardId) -> Option<&ShardLog> {
        self.shards.get(&shard)
    }

    /// A Committed record for each shard in [`State::committed_unwritten`],
    /// with its committed id as of now.
    fn unwritten_committed_records(&self) -> Result<Vec<u8>, StorageError> {
        let mut bytes = Vec::new();
        for &shard in &self.committed_unwritten {
            let committed = self.shard(shard).and_then(|log| log.raft.committed);
            record::push_committed(&mut bytes, shard, &committed)?;
        }
        Ok(bytes)
    }
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    disk: Arc<dyn Disk>,
    exec: Exec,
    segment_max_bytes: u64,
    /// A std mutex: held for a `pwrite` into the page cache and index updates,
    /// never across an fsync or an await; readers hold it only to copy locations.
    state: Mutex<State>,
    sync: Arc<SyncQueue>,
    /// Joined on drop, after the thread synced what was pending (`None`
    /// inline: the task drains on its own).
    sync_thread: Mutex<Option<JoinHandle<()>>>,
}

impl Inner {
    /// Writes `bytes` at the end of the active segment (rolling first if they
    /// would take it past the limit), after the committed ids not yet written
    /// ([`State::committed_unwritten`]). Returns the segment and the offset of
    /// `bytes`. Any failure is final for the log.
    fn write_records(&self, state: &mut State, bytes: &[u8]) -> Result<(u64, u64), StorageError> {
        self.sync.check()?;
        let committed = state.unwritten_committed_records()?;
        let joined;
        let records = if committed.is_empty() {
            bytes
        } else {
            joined = [committed.as_slice(), bytes].concat();
            joined.as_slice()
        };
        let written = self
            .roll_if_full(state, records.len() as u64)
            .and_then(|()| {
                let offset = state.active.len;
                self.zero_ahead(&mut state.active, offset + records.len() as u64)?;
                state.active.segment.write_at(records, offset)?;
                Ok((
                    state.active.segment.sequence,
                    offset + committed.len() as u64,
                ))
            });
        match written {
            Ok(written) => {
                state.active.len += records.len() as u64;
                state.committed_unwritten.clear();
                Ok(written)
            }
            Err(error) => {
                self.sync.fail(&error);
                Err(error)
            }
        }
    }

    /// At close: the committed ids no write carried yet go to the page cache,
    /// so a clean restart applies as far as this run did (unsynced, as they
    /// would have been until the next append's sync).
    fn write_unwritten_committed(&self) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        // A failed log writes nothing more; its failure was reported.
        if state.committed_unwritten.is_empty() || self.sync.check().is_err() {
            return;
        }
        if let Err(error) = self.write_records(&mut state, &[]) {
            tracing::warn!(%error, "the committed ids were not written at close");
        }
    }

    /// Makes sure the file is zero-filled up to `end` (the end of the record
    /// about to be written), extending it by up to [`ZERO_AHEAD_BYTES`] more.
    fn zero_ahead(&self, active: &mut Active, end: u64) -> Result<(), StorageError> {
        if end <= active.zeroed {
            return Ok(());
        }
        let target = (end + ZERO_AHEAD_BYTES).min(self.segment_max_bytes.max(end));
        let zeros = vec![0u8; (target - active.zeroed) as usize];
        active.segment.write_at(&zeros, active.zeroed)?;
        active.zeroed = target;
        Ok(())
    }

    fn roll_if_full(&self, state: &mut State, incoming: u64) -> Result<(), StorageError> {
        let active = &state.active;
        if active.len == active.head_len || active.len + incoming <= self.segment_max_bytes {
            return Ok(());
        }
        // The segment left behind ends at its records: recovery reads zeros as
        // the end of the log, and later segments must not look cut off. The
        // group commit syncs the cut with the next batch, before anything
        // written to the next segment is acknowledged.
        active.segment.cut_unsynced(active.len)?;
        self.sync.written(&active.segment, None);
        let sequence = active.segment.sequence + 1;
        let next = start_segment_unsynced(&*self.disk, &self.dir, sequence, &state.shards)?;
        // Its creation is durable before anything is written to it, so that a
        // crash can never keep a segment and lose its predecessor's creation:
        // the segments on disk are always a run of consecutive sequence numbers
        // (one dir fsync per segment, i.e. per 64 MiB).
        self.disk
            .sync_dir(&self.dir)
            .map_err(io_error("fsync", &self.dir))?;
        self.sync.written(&next.segment, None);
        state.segments.insert(sequence, Arc::clone(&next.segment));
        state.active = next;
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.write_unwritten_committed();
        self.sync.stop();
        let thread = self.sync_thread.get_mut().map(Option::take);
        if let Ok(Some(thread)) = thread {
            if thread.join().is_err() {
                tracing::error!("the write-ahead log's sync thread panicked");
            }
        }
    }
}

/// The write-ahead log; cloning shares it.
#[derive(Debug, Clone)]
pub struct Wal {
    inner: Arc<Inner>,
}

/// How `append` hears that its entries are durable.
pub(crate) type AppendDone = Completion;

impl Wal {
    /// Opens (or creates) the log in `dir`: recovers what is on disk, then
    /// starts a new active segment and the group commit. Blocking IO; with
    /// [`Exec::Inline`], call it inside a tokio runtime (the group commit is
    /// a task of it).
    pub fn open(dir: &Path, options: WalOptions) -> Result<Self, StorageError> {
        let disk = &*options.disk;
        let existed = disk.kind(dir).is_ok_and(|kind| kind == FileKind::Dir);
        if !existed && options.presence == Presence::MustExist {
            return Err(lost(dir, "its dir is missing"));
        }
        durable_create_dir_all_on(disk, dir).map_err(|source| StorageError::CreateDir {
            dir: dir.to_owned(),
            source,
        })?;
        let mut recovered = recovery::recover(disk, dir)?;
        if recovered.segments.is_empty() && options.presence == Presence::MustExist {
            return Err(lost(dir, "its dir holds no segment"));
        }
        let sequence = recovered
            .segments
            .keys()
            .next_back()
            .map_or(1, |last| last + 1);
        recovered.shards.entry(0).or_default();
        let active = start_segment(disk, dir, sequence, &recovered.shards)?;
        disk.sync_dir(dir).map_err(io_error("fsync", dir))?;
        let mut segments = recovered.segments;
        segments.insert(sequence, Arc::clone(&active.segment));
        for (shard, log) in &recovered.shards {
            tracing::info!(
                dir = %dir.display(),
                shard,
                segments = segments.len(),
                entries = log.index.len(),
                first = ?log.index.keys().next(),
                last = ?log.index.keys().next_back(),
                purged = ?log.raft.purged,
                "write-ahead log opened"
            );
        }
        let sync = SyncQueue::new(dir.to_owned(), options.exec);
        let thread = sync.start()?;
        let state = State {
            shards: recovered.shards,
            segments,
            active,
            committed_unwritten: BTreeSet::new(),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                dir: dir.to_owned(),
                segment_max_bytes: options.segment_max_bytes,
                state: Mutex::new(state),
                sync,
                sync_thread: Mutex::new(thread),
                disk: options.disk,
                exec: options.exec,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .expect("the write-ahead log's lock is poisoned: a thread panicked holding it")
    }

    /// `shard`'s vote, committed log id and purge point.
    pub(crate) fn raft_state(&self, shard: ShardId) -> RaftState {
        self.lock()
            .shard(shard)
            .map(|log| log.raft)
            .unwrap_or_default()
    }

    /// `shard`'s last entry's log id, or its purge point when no entry is left.
    pub(crate) fn last_log_id(&self, shard: ShardId) -> Option<LogId<NodeId>> {
        let state = self.lock();
        let log = state.shard(shard)?;
        let last = log
            .index
            .last_key_value()
            .map(|(_, location)| location.log_id);
        last.max(log.raft.purged)
    }

    /// Group-commit batches and fdatasyncs run so far (for tests and the bench).
    pub fn sync_counts(&self) -> (u64, u64) {
        let counts = &self.inner.sync.counts;
        (
            counts.batches.load(Ordering::Relaxed),
            counts.fdatasyncs.load(Ordering::Relaxed),
        )
    }

    /// Writes `shard`'s `entries` to the page cache and the index, and
    /// returns; `done` runs once they are durable. Readers see them as soon as
    /// this returns.
    pub(crate) fn append(
        &self,
        shard: ShardId,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
        done: AppendDone,
    ) -> Result<(), StorageError> {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let (bytes, placed) = match encode_entries(shard, &entries) {
            Ok(encoded) => encoded,
            Err(error) => {
                done(Err(SyncFailed(error.to_string())));
                return Err(error);
            }
        };
        let mut state = self.lock();
        // Entries at or below the purge point are committed and in a snapshot
        // already: they are not stored again (openraft's suite sends some).
        let purged = state
            .shard(shard)
            .and_then(|log| log.raft.purged)
            .map(|purged| purged.index);
        let skipped = placed
            .iter()
            .take_while(|placed| purged.is_some_and(|purged| placed.log_id.index <= purged))
            .count();
        let placed = &placed[skipped..];
        let bytes = &bytes[placed
            .first()
            .map_or(bytes.len(), |first| first.offset as usize)..];
        let written = check_order(state.shard(shard), placed)
            .and_then(|()| self.inner.write_records(&mut state, bytes));
        let (sequence, base) = match written {
            Ok(written) => written,
            Err(error) => {
                drop(state);
                done(Err(SyncFailed(error.to_string())));
                return Err(error);
            }
        };
        let active = Arc::clone(&state.active.segment);
        let log = state.shard_mut(shard);
        if let Some(first) = placed.first() {
            drop(log.index.split_off(&first.log_id.index));
        }
        let kept = entries.into_iter().skip(skipped);
        log.recent
            .appended(kept.zip(placed.iter().map(|placed| placed.len)));
        let batch_start = placed.first().map_or(0, |first| first.offset);
        for placed in placed {
            let location = Location {
                segment: sequence,
                offset: base + placed.offset - batch_start,
                len: placed.len,
                log_id: placed.log_id,
            };
            log.index.insert(placed.log_id.index, location);
        }
        let waiter = Waiter {
            entries: placed.len() as u64,
            completion: done,
        };
        self.inner.sync.written(&active, Some(waiter));
        Ok(())
    }

    /// Writes `shard`'s vote and returns once it is durable.
    pub(crate) async fn save_vote(
        &self,
        shard: ShardId,
        vote: Vote<NodeId>,
    ) -> Result<(), StorageError> {
        let mut bytes = Vec::new();
        record::push_vote(&mut bytes, shard, &Some(vote))?;
        let synced = self.write_and_wait(&bytes, |state| {
            state.shard_mut(shard).raft.vote = Some(vote);
        })?;
        synced.await
    }

    /// Sends of the entries about to be appended were started (a leader's
    /// early appends): the group commit lets them leave before it blocks the
    /// runtime's worker in its next inline `fdatasync`.
    pub(crate) fn sends_first(&self) {
        self.inner.sync.sends_first();
    }

    /// Records `shard`'s committed log id. Its record is written ahead of the
    /// log's next write (an append, a vote, a truncation, a purge; or the
    /// log's close), and is durable with that write's sync: every commit of a
    /// busy shard rides the next entry instead of costing a `pwrite` on the
    /// path from the quorum's answer to apply. A committed id lost in a crash
    /// is learned again from the leader; it only lets a restarted node apply
    /// sooner.
    pub(crate) fn save_committed(
        &self,
        shard: ShardId,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError> {
        self.inner.sync.check()?;
        let mut state = self.lock();
        state.shard_mut(shard).raft.committed = committed;
        state.committed_unwritten.insert(shard);
        Ok(())
    }

    /// Drops `shard`'s entries at or after `index`; returns once that is durable.
    pub(crate) async fn truncate(&self, shard: ShardId, index: u64) -> Result<(), StorageError> {
        let mut bytes = Vec::new();
        record::push_truncate(&mut bytes, shard, index)?;
        let synced = self.write_and_wait(&bytes, |state| {
            let log = state.shard_mut(shard);
            drop(log.index.split_off(&index));
            log.recent.drop_from(index);
        })?;
        synced.await
    }

    /// Moves `shard`'s purge point up to `log_id` (durably), drops its
    /// entries at or below it, then deletes the old segments in which no shard
    /// has a live entry.
    pub(crate) async fn purge(
        &self,
        shard: ShardId,
        log_id: LogId<NodeId>,
    ) -> Result<(), StorageError> {
        if self.raft_state(shard).purged >= Some(log_id) {
            return Ok(());
        }
        let mut bytes = Vec::new();
        record::push_purged(&mut bytes, shard, &Some(log_id))?;
        let synced = self.write_and_wait(&bytes, |state| {
            state.shard_mut(shard).raft.purged = Some(log_id);
        })?;
        synced.await?;
        let deletable = {
            let mut state = self.lock();
            let log = state.shard_mut(shard);
            log.index = log.index.split_off(&(log_id.index + 1));
            log.recent.drop_through(log_id.index);
            take_deletable(&mut state)
        };
        if deletable.is_empty() {
            return Ok(());
        }
        let (dir, disk) = (self.inner.dir.clone(), Arc::clone(&self.inner.disk));
        let delete = move || delete_segments(&*disk, &dir, &deletable);
        match self.inner.exec.blocking(delete).await {
            Ok(deleted) => deleted,
            Err(error) => Err(StorageError::WalFailed(format!(
                "segment deletion task: {error}"
            ))),
        }
    }

    /// Writes `bytes`, applies `update` to the state under the same lock, and
    /// returns a future that resolves once the bytes are durable.
    fn write_and_wait(
        &self,
        bytes: &[u8],
        update: impl FnOnce(&mut State),
    ) -> Result<impl std::future::Future<Output = Result<(), StorageError>>, StorageError> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let waiter = Waiter {
            entries: 0,
            completion: Box::new(move |result| {
                // The receiver is gone only if the caller stopped waiting.
                let _ = sender.send(result);
            }),
        };
        let mut state = self.lock();
        self.inner.write_records(&mut state, bytes)?;
        update(&mut state);
        self.inner.sync.written(&state.active.segment, Some(waiter));
        drop(state);
        Ok(async move {
            match receiver.await {
                Ok(synced) => synced.map_err(StorageError::from),
                Err(_) => Err(StorageError::WalFailed(
                    "the group commit stopped before the write was durable".to_owned(),
                )),
            }
        })
    }

    /// `shard`'s entries in `range`, at most `max_entries`, stopping once
    /// `max_bytes` of records are read (at least one entry).
    pub(crate) fn read(
        &self,
        shard: ShardId,
        range: impl RangeBounds<u64>,
        max_entries: usize,
        max_bytes: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let located = self.locate(shard, range, max_entries, max_bytes);
        let mut entries = Vec::with_capacity(located.on_disk.len() + located.cached.len());
        for run in contiguous_runs(&located.on_disk) {
            self.read_run(shard, run, &mut entries)?;
        }
        metrics::read(located.on_disk.len(), located.cached.len());
        entries.extend(located.cached);
        Ok(entries)
    }

    /// The entries `read` returns: where to read the older ones, and clones
    /// of the newer ones the cache holds (which come after: it is a suffix).
    fn locate(
        &self,
        shard: ShardId,
        range: impl RangeBounds<u64>,
        max_entries: usize,
        max_bytes: u64,
    ) -> Located {
        let state = self.lock();
        let mut located = Located::default();
        let Some(log) = state.shard(shard) else {
            return located;
        };
        let mut bytes = 0;
        for location in log.index.range(range).map(|(_, location)| *location) {
            let count = located.on_disk.len() + located.cached.len();
            if count >= max_entries || (bytes >= max_bytes && count > 0) {
                break;
            }
            bytes += location.len;
            if let Some(entry) = log.recent.get(location.log_id.index) {
                located.cached.push(entry.clone());
                continue;
            }
            // The cache is a suffix of the log: once an entry came from it,
            // every later one does. A miss would be our bug; the read stops.
            if !located.cached.is_empty() {
                break;
            }
            // The index only points into segments it holds (an invariant of
            // `take_deletable`); a miss would be our bug too.
            let Some(segment) = state.segments.get(&location.segment) else {
                break;
            };
            located.on_disk.push((Arc::clone(segment), location));
        }
        located
    }

    /// Reads one run of adjacent records of `shard` with one `pread`, and
    /// decodes them.
    fn read_run(
        &self,
        shard: ShardId,
        run: &[(Arc<Segment>, Location)],
        entries: &mut Vec<Entry<TypeConfig>>,
    ) -> Result<(), StorageError> {
        let (Some((segment, first)), Some((_, last))) = (run.first(), run.last()) else {
            return Ok(());
        };
        let mut buffer = vec![0u8; (last.offset + last.len - first.offset) as usize];
        segment.read_at(&mut buffer, first.offset)?;
        for (_, location) in run {
            let start = (location.offset - first.offset) as usize;
            let bytes = &buffer[start..start + location.len as usize];
            let (holder, entry) =
                record::decode_entry(bytes).map_err(|error| self.unreadable(location, &error))?;
            if (holder, entry.log_id) != (shard, location.log_id) {
                let error = format!(
                    "it holds shard {holder}'s entry {} instead of shard {shard}'s",
                    entry.log_id
                );
                return Err(self.unreadable(location, &error));
            }
            entries.push(entry);
        }
        Ok(())
    }

    fn unreadable(&self, location: &Location, error: &dyn std::fmt::Display) -> StorageError {
        StorageError::Corrupt {
            dir: self.inner.dir.clone(),
            detail: format!(
                "entry {} in segment {} at offset {}: {error}",
                location.log_id, location.segment, location.offset
            ),
        }
    }
}

/// What one read returns, found under the lock: records to read, in log
/// order, then the cached entries that follow them.
#[derive(Debug, Default)]
struct Located {
    on_disk: Vec<(Arc<Segment>, Location)>,
    cached: Vec<Entry<TypeConfig>>,
}

/// An encoded entry's place in the batch's bytes.
#[derive(Debug)]
struct Placed {
    log_id: LogId<NodeId>,
    offset: u64,
    len: u64,
}

/// Encodes a batch of consecutive entries into one buffer of records.
fn encode_entries(
    shard: ShardId,
    entries: &[Entry<TypeConfig>],
) -> Result<(Vec<u8>, Vec<Placed>), StorageError> {
    let mut bytes = Vec::new();
    let mut placed: Vec<Placed> = Vec::new();
    for entry in entries {
        if let Some(previous) = placed.last() {
            if previous.log_id.index + 1 != entry.log_id.index {
                return Err(StorageError::OutOfOrder(format!(
                    "a batch holds entry {} then {}",
                    previous.log_id, entry.log_id
                )));
            }
        }
        let offset = bytes.len() as u64;
        record::push_entry(&mut bytes, shard, entry)?;
        placed.push(Placed {
            log_id: entry.log_id,
            offset,
            len: bytes.len() as u64 - offset,
        });
    }
    Ok((bytes, placed))
}

/// A batch (its entries above the purge point) must continue its shard's
/// log: start at most one past the last entry (lower is an overwrite).
/// Recovery refuses anything else as a hole. On an empty log any start is
/// accepted, as openraft's suite expects.
fn check_order(log: Option<&ShardLog>, placed: &[Placed]) -> Result<(), StorageError> {
    let Some(first) = placed.first().map(|placed| placed.log_id.index) else {
        return Ok(());
    };
    let last = log.and_then(|log| log.index.keys().next_back().copied());
    if last.is_none_or(|last| first <= last + 1) {
        return Ok(());
    }
    Err(StorageError::OutOfOrder(format!(
        "entry {first} cannot follow the log (its last entry is {last:?})"
    )))
}

/// The head: every shard's Raft state restated at the start of every segment.
fn head_records(shards: &BTreeMap<ShardId, ShardLog>) -> Result<Vec<u8>, StorageError> {
    let mut bytes = Vec::new();
    for (&shard, log) in shards {
        record::push_vote(&mut bytes, shard, &log.raft.vote)?;
        record::push_committed(&mut bytes, shard, &log.raft.committed)?;
        record::push_purged(&mut bytes, shard, &log.raft.purged)?;
    }
    Ok(bytes)
}

/// Creates segment `sequence` with its head, unsynced (the caller fsyncs the dir).
fn start_segment_unsynced(
    disk: &dyn Disk,
    dir: &Path,
    sequence: u64,
    shards: &BTreeMap<ShardId, ShardLog>,
) -> Result<Active, StorageError> {
    let head = head_records(shards)?;
    let segment = Segment::create(disk, dir, sequence)?;
    segment.write_at(&head, 0)?;
    Ok(Active {
        segment: Arc::new(segment),
        len: head.len() as u64,
        zeroed: head.len() as u64,
        head_len: head.len() as u64,
    })
}

/// Creates segment `sequence` with its head, synced (the caller fsyncs the dir).
fn start_segment(
    disk: &dyn Disk,
    dir: &Path,
    sequence: u64,
    shards: &BTreeMap<ShardId, ShardLog>,
) -> Result<Active, StorageError> {
    let active = start_segment_unsynced(disk, dir, sequence, shards)?;
    let segment = &active.segment;
    segment
        .sync_data()
        .map_err(io_error("fdatasync", &segment.path))?;
    Ok(active)
}

/// Takes out of `state` the segments older than every shard's live entries
/// and than the active segment: no live entry is in them, and the active
/// segment restates the Raft state they held.
fn take_deletable(state: &mut State) -> Vec<Arc<Segment>> {
    let active = state.active.segment.sequence;
    let oldest_live = state
        .shards
        .values()
        .filter_map(|log| log.index.first_key_value())
        .map(|(_, location)| location.segment)
        .fold(active, u64::min);
    let kept = state.segments.split_off(&oldest_live);
    let deletable = std::mem::replace(&mut state.segments, kept);
    deletable.into_values().collect()
}

/// Deletes `segments`, oldest first, fsyncing the dir after each unlink so
/// that a crash can only bring back the newest of them (never leave a gap).
fn delete_segments(
    disk: &dyn Disk,
    dir: &Path,
    segments: &[Arc<Segment>],
) -> Result<(), StorageError> {
    for segment in segments {
        disk.remove_file(&segment.path)
            .map_err(io_error("delete", &segment.path))?;
        disk.sync_dir(dir).map_err(io_error("fsync", dir))?;
        tracing::debug!(segment = %segment.path.display(), "purged write-ahead log segment deleted");
    }
    Ok(())
}

fn lost(dir: &Path, what: &str) -> StorageError {
    StorageError::Corrupt {
        dir: dir.to_owned(),
        detail: format!("the store was initialised but its write-ahead log is lost: {what}"),
    }
}

/// Splits `wanted` into runs of records adjacent in one segment.
fn contiguous_runs(
    wanted: &[(Arc<Segment>, Location)],
) -> impl Iterator<Item = &[(Arc<Segment>, Location)]> {
    wanted.chunk_by(|(_, previous), (_, next)| {
        previous.segment == next.segment && previous.offset + previous.len == next.offset
    })
}

#[cfg(test)]
mod shard_tests;
#[cfg(test)]
mod tests;
