//! The replicated state machine: the in-memory [`Semaphores`] and token
//! registry, and their snapshots.
//!
//! Nothing is written to disk per apply. What survives a crash is the Raft log
//! (`wal/`) and the newest snapshot file (`snapshot.rs`); at start-up the state
//! is the snapshot's, and openraft applies the committed entries after it again
//! (`get_initial_state` in openraft's storage helper). Why not a database of
//! applied rows: see "What is synced when" in docs/architecture.md.
//!
//! Invariants:
//! - the current snapshot only moves forward (a slow builder never replaces a
//!   newer installed snapshot), and its file is complete and durable (written,
//!   synced, renamed, folder synced) before openraft hears of it, because
//!   openraft purges the log behind it;
//! - after a crash the newest complete file is the current snapshot, and the log
//!   holds every entry after it: a purge only follows a durable snapshot;
//! - building a snapshot holds the state lock only to clone the state (which
//!   shares every key, see `Semaphores`): encoding and writing the file run on a
//!   blocking thread while applies go on, so a snapshot never stalls a round for
//!   longer than the clone (with `Exec::Inline`, in the builder's own task
//!   instead: a simulator has one thread).

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::storage::RaftStateMachine;
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StoredMembership,
};
use permitd_core::tokens::TokenRegistry;
use permitd_core::{Event, Semaphores};
use tokio::sync::broadcast;

use crate::apply::apply_command;
use crate::disk::Disk;
use crate::error::{read_snapshot, read_state_machine, write_snapshot, RaftError};
use crate::lock::DirLock;
use crate::snapshot::{SnapshotFiles, SnapshotImage, StoredSnapshot};
use crate::snapshot_reach::SnapshotReach;
use crate::{snapshot, CommandResult, Exec, NodeId, PeerNode, ShardId, StorageError, TypeConfig};

/// Apply notices kept for subscribers that fall behind; a lagging subscriber gets
/// `RecvError::Lagged` and should re-read the state.
const APPLIED_CHANNEL_CAPACITY: usize = 4_096;

/// What one applied log entry did, for the node (reclaim timers, events, metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub log_index: u64,
    /// Keys whose state the entry changed, in apply order. After a snapshot is
    /// installed: every key held.
    pub keys: Vec<String>,
    pub events: Vec<(String, Event)>,
    /// A snapshot replaced the state: the events of the entries it covers were
    /// never applied here, so a stream of events has a gap before `log_index`.
    pub installed_snapshot: bool,
}

/// The applied state: what readers see.
#[derive(Debug, Default)]
pub(crate) struct AppliedState {
    pub semaphores: Semaphores,
    /// The API tokens (hashes only), replicated like the semaphores.
    pub tokens: TokenRegistry,
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, PeerNode>,
    /// The keys this node saw deleted lately, for the leader's rounds
    /// ([`SharedState::deleted_after`]). This node's memory, not replicated.
    pub recent_deletes: RecentDeletes,
}

impl From<SnapshotImage> for AppliedState {
    fn from(image: SnapshotImage) -> Self {
        Self {
            semaphores: image.semaphores,
            tokens: image.tokens,
            last_applied: image.last_applied,
            membership: image.membership,
            recent_deletes: RecentDeletes::default(),
        }
    }
}

/// Deletes applied here lately: `(key, log index)`, oldest first.
///
/// A round's answers reach its callers after its entry applied, and a delete
/// of the key may apply in between (both committed together, say). The grants
/// in those answers were released by the delete: handed out, they would admit
/// work the key no longer counts. So the leader asks, under the same lock
/// applies take, whether the key was deleted after the round's entry, and if
/// so fails those answers instead (the callers ask again). The answers wait
/// moments, so the last [`RECENT_DELETES`] deletes are plenty to remember.
#[derive(Debug, Default)]
pub(crate) struct RecentDeletes {
    deletes: std::collections::VecDeque<(String, u64)>,
}

/// Deletes remembered by [`RecentDeletes`]; operators' calls, rare.
const RECENT_DELETES: usize = 1_024;

impl RecentDeletes {
    /// Notes the deletes among an applied entry's events.
    fn note(&mut self, applied: &Applied) {
        for (key, event) in &applied.events {
            if matches!(event, Event::KeyDeleted { .. }) {
                if self.deletes.len() == RECENT_DELETES {
                    self.deletes.pop_front();
                }
                self.deletes.push_back((key.clone(), applied.log_index));
            }
        }
    }

    fn deleted_after(&self, key: &str, log_index: u64) -> Option<u64> {
        self.deletes
            .iter()
            .find(|(deleted, at)| deleted == key && *at > log_index)
            .map(|(_, at)| *at)
    }
}

/// Read access to the applied state, shared with the node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SharedState {
    /// A std lock, not a tokio one: it is only held for in-memory work (an
    /// apply's engine calls, or a reader's closure) and never across an await,
    /// so readers never wait on IO and no async lock is needed.
    state: Arc<RwLock<AppliedState>>,
    /// One notice per applied entry, sent after the entry is applied.
    notices: broadcast::Sender<Arc<Applied>>,
}

impl SharedState {
    fn new(state: AppliedState) -> Self {
        let (notices, _) = broadcast::channel(APPLIED_CHANNEL_CAPACITY);
        Self {
            state: Arc::new(RwLock::new(state)),
            notices,
        }
    }

    /// Runs `f` on the applied semaphores. Keep `f` short: applies wait for it.
    pub fn read<T>(&self, f: impl FnOnce(&Semaphores) -> T) -> T {
        f(&self.lock_read().semaphores)
    }

    /// Runs `f` on the applied token registry. Keep `f` short: applies wait for it.
    pub fn read_tokens<T>(&self, f: impl FnOnce(&TokenRegistry) -> T) -> T {
        f(&self.lock_read().tokens)
    }

    pub fn last_applied(&self) -> Option<LogId<NodeId>> {
        self.lock_read().last_applied
    }

    /// The membership as of the last applied entry that changed it.
    pub fn membership(&self) -> StoredMembership<NodeId, PeerNode> {
        self.lock_read().membership.clone()
    }

    /// The log index of a delete of `key` this node applied after entry
    /// `log_index`, if any (among its last deletes: [`RecentDeletes`]).
    pub fn deleted_after(&self, key: &str, log_index: u64) -> Option<u64> {
        self.lock_read()
            .recent_deletes
            .deleted_after(key, log_index)
    }

    /// Notices of entries applied from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Applied>> {
        self.notices.subscribe()
    }

    // A poisoned lock means an apply panicked halfway: the state in memory is not
    // trustworthy and continuing would serve or snapshot it.
    fn lock_read(&self) -> RwLockReadGuard<'_, AppliedState> {
        self.state.read().expect("applied state lock poisoned")
    }

    fn lock_write(&self) -> RwLockWriteGuard<'_, AppliedState> {
        self.state.write().expect("applied state lock poisoned")
    }

    fn publish(&self, notices: Vec<Applied>) {
        for notice in notices {
            // No subscriber is fine: the node may not listen (tests, tools).
            let _ = self.notices.send(Arc::new(notice));
        }
    }
}

/// The current snapshot and its files, shared by the state machine and its
/// builders. The mutex serialises builders (openraft runs them in their own
/// tasks, concurrently with applies), installs and readers: a file is removed
/// only under it.
#[derive(Debug, Clone)]
struct Snapshots {
    files: SnapshotFiles,
    current: Arc<Mutex<Option<StoredSnapshot>>>,
    /// Where encoding, writing and decoding run.
    exec: Exec,
    /// Moved whenever a newer snapshot is durable and current.
    reach: SnapshotReach,
}

impl Snapshots {
    fn lock(&self) -> MutexGuard<'_, Option<StoredSnapshot>> {
        self.current.lock().expect("snapshot lock poisoned")
    }

    /// Makes `stored` (whose file is durable) current unless a newer one is;
    /// removes every other file. Returns the current snapshot's metadata.
    fn make_current(&self, stored: StoredSnapshot) -> StoredSnapshot {
        let current = Self::make_current_locked(&self.files, &mut self.lock(), stored);
        self.reach
            .covered(current.meta.last_log_id.map(|log_id| log_id.index));
        current
    }

    /// Writes an installed snapshot's file durably and makes it current, in one
    /// hold of the lock: a builder finishing meanwhile must not remove the file
    /// as "older" before it is current. Blocking.
    fn install_file(&self, stored: StoredSnapshot, data: &[u8]) -> Result<(), StorageError> {
        let mut current = self.lock();
        self.files.write(&stored.file, data)?;
        let current = Self::make_current_locked(&self.files, &mut current, stored);
        self.reach
            .covered(current.meta.last_log_id.map(|log_id| log_id.index));
        Ok(())
    }

    fn make_current_locked(
        files: &SnapshotFiles,
        current: &mut Option<StoredSnapshot>,
        stored: StoredSnapshot,
    ) -> StoredSnapshot {
        match &*current {
            Some(newer) if newer.meta.last_log_id > stored.meta.last_log_id => {}
            _ => *current = Some(stored),
        }
        let current = current.clone().expect("a current snapshot was just set");
        if let Err(error) = files.remove_all_but(&current.file) {
            tracing::warn!(%error, "cannot remove old snapshot files");
        }
        current
    }
}

/// The openraft state machine.
#[derive(Debug)]
pub struct StateMachineStore {
    /// Named in errors.
    dir: PathBuf,
    /// Held while the store lives (shared by a data dir's shards): one
    /// process per data dir.
    _lock: Arc<DirLock>,
    shared: SharedState,
    snapshots: Snapshots,
}

impl StateMachineStore {
    /// The state machine of `shard` in data dir `dir`, at its newest
    /// snapshot (or empty).
    pub(crate) fn open(
        dir: PathBuf,
        shard: ShardId,
        lock: Arc<DirLock>,
        disk: Arc<dyn Disk>,
        exec: Exec,
    ) -> Result<Self, StorageError> {
        let files = SnapshotFiles::new(disk, &dir, shard);
        let (current, state) = match files.load_newest(&dir)? {
            Some((stored, image)) => (Some(stored), AppliedState::from(image)),
            None => (None, AppliedState::default()),
        };
        let reach = SnapshotReach::new(
            current
                .as_ref()
                .and_then(|stored: &StoredSnapshot| stored.meta.last_log_id)
                .map(|log_id| log_id.index),
        );
        Ok(Self {
            dir,
            _lock: lock,
            shared: SharedState::new(state),
            snapshots: Snapshots {
                files,
                current: Arc::new(Mutex::new(current)),
                exec,
                reach,
            },
        })
    }

    /// How far the durable snapshot reaches, for the log store's purge.
    pub(crate) fn snapshot_reach(&self) -> SnapshotReach {
        self.snapshots.reach.clone()
    }

    /// A handle for readers.
    pub fn shared(&self) -> SharedState {
        self.shared.clone()
    }

    /// Applies entries in memory, under the write lock.
    fn apply_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> (Vec<CommandResult>, Vec<Applied>) {
        let mut results = Vec::new();
        let mut notices = Vec::new();
        let mut state = self.shared.lock_write();
        for entry in entries {
            if let Some(last) = state.last_applied {
                assert!(
                    last.index < entry.log_id.index,
                    "entry {} applied after {last}",
                    entry.log_id
                );
            }
            state.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => results.push(CommandResult::Done),
                EntryPayload::Membership(membership) => {
                    state.membership = StoredMembership::new(Some(entry.log_id), membership);
                    results.push(CommandResult::Done);
                }
                EntryPayload::Normal(command) => {
                    let state = &mut *state;
                    let (result, notice) = apply_command(
                        &mut state.semaphores,
                        &mut state.tokens,
                        entry.log_id.index,
                        &command,
                    );
                    state.recent_deletes.note(&notice);
                    results.push(result);
                    notices.push(notice);
                }
            }
        }
        (results, notices)
    }

    fn read_snapshot(&self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let current = self.snapshots.lock();
        let Some(stored) = &*current else {
            return Ok(None);
        };
        let data =
            self.snapshots
                .files
                .read(&stored.file)
                .map_err(|error| StorageError::Corrupt {
                    dir: self.dir.clone(),
                    detail: format!("the current snapshot's file: {error}"),
                })?;
        Ok(Some(Snapshot {
            meta: stored.meta.clone(),
            snapshot: Box::new(Cursor::new(data)),
        }))
    }

    /// Replaces the whole state by the snapshot's: the file (durably), then
    /// memory. Decoding and writing run on a blocking thread (inline with
    /// `Exec::Inline`).
    async fn install(
        &self,
        meta: &SnapshotMeta<NodeId, PeerNode>,
        data: Vec<u8>,
    ) -> Result<(), StorageError> {
        let prepare = {
            let (meta, snapshots) = (meta.clone(), self.snapshots.clone());
            move || prepare_install(&meta, &snapshots, &data)
        };
        let image = self
            .snapshots
            .exec
            .blocking(prepare)
            .await
            .map_err(|error| StorageError::Snapshot(format!("install task: {error}")))
            .and_then(|prepared| prepared)
            .inspect_err(|error| self.snapshots.reach.failed(error.to_string()))?;
        self.snapshots.reach.installed();
        let notice = Applied {
            log_index: image.last_applied.map_or(0, |log_id| log_id.index),
            keys: image
                .semaphores
                .keys()
                .keys()
                .map(|key| key.to_string())
                .collect(),
            events: Vec::new(),
            installed_snapshot: true,
        };
        *self.shared.lock_write() = AppliedState::from(image);
        self.shared.publish(vec![notice]);
        Ok(())
    }
}

/// Decodes an installed snapshot and makes its file, durably, the current
/// one. Blocking.
fn prepare_install(
    meta: &SnapshotMeta<NodeId, PeerNode>,
    snapshots: &Snapshots,
    data: &[u8],
) -> Result<SnapshotImage, StorageError> {
    let image = snapshot::decode(data)?;
    if image.last_applied != meta.last_log_id || image.membership != meta.last_membership {
        return Err(StorageError::Snapshot(format!(
            "snapshot {} holds state at {:?}, its metadata says {:?}",
            meta.snapshot_id, image.last_applied, meta.last_log_id
        )));
    }
    let stored = StoredSnapshot {
        meta: meta.clone(),
        file: SnapshotFiles::name_of(&meta.snapshot_id),
    };
    snapshots.install_file(stored, data)?;
    Ok(image)
}

/// Entries applied between two yields to the runtime (a contended round
/// entry applies in ~20 µs; a large one, 1 MiB of reports, in a few ms).
const APPLY_SLICE_ENTRIES: usize = 64;

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, PeerNode>), RaftError> {
        let state = self.shared.lock_read();
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, RaftError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // In slices, yielding between them: the Raft runtime has one worker,
        // and a follower catching up may be handed thousands of entries at
        // once; heartbeats and appends are answered between two slices.
        let mut entries = entries.into_iter().peekable();
        let mut results = Vec::new();
        while entries.peek().is_some() {
            let slice = entries.by_ref().take(APPLY_SLICE_ENTRIES);
            let (slice_results, notices) = self.apply_entries(slice);
            results.extend(slice_results);
            self.shared.publish(notices);
            if entries.peek().is_some() {
                tokio::task::yield_now().await;
            }
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            shared: self.shared.clone(),
            snapshots: self.snapshots.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, RaftError> {
        // From now until it is installed, a purge past the durable snapshot
        // waits for it (`snapshot_reach.rs`).
        self.snapshots.reach.receiving();
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, PeerNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), RaftError> {
        tracing::info!(snapshot = %meta.snapshot_id, last_log_id = ?meta.last_log_id, "installing snapshot");
        self.install(meta, snapshot.into_inner())
            .await
            .map_err(write_snapshot)
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, RaftError> {
        self.read_snapshot().map_err(read_snapshot)
    }
}

/// Builds a snapshot from a copy of the applied state taken under the read lock.
#[derive(Debug)]
pub struct SnapshotBuilder {
    shared: SharedState,
    snapshots: Snapshots,
}

impl SnapshotBuilder {
    async fn build(&self) -> Result<Snapshot<TypeConfig>, StorageError> {
        // Under the read lock only the clone: one consistent view, and applies
        // wait for a memory copy, not for encoding or IO.
        let (last_applied, membership, semaphores, tokens) = {
            let state = self.shared.lock_read();
            (
                state.last_applied,
                state.membership.clone(),
                state.semaphores.clone(),
                state.tokens.clone(),
            )
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership.clone(),
            snapshot_id: snapshot_id(last_applied),
        };
        let file = SnapshotFiles::name_of(&meta.snapshot_id);
        let write_file = {
            let (files, file) = (self.snapshots.files.clone(), file.clone());
            move || {
                // Durable before openraft hears of it: it purges the log behind it.
                files.write_with(&file, |out| {
                    snapshot::encode_into(out, &last_applied, &membership, &semaphores, &tokens)
                })?;
                // The copy goes before the file is read back for openraft: a
                // build holds at most one of the two (each ~350 B per key).
                drop((semaphores, tokens));
                files.read(&file)
            }
        };
        let data = self
            .snapshots
            .exec
            .blocking(write_file)
            .await
            .map_err(|error| StorageError::Snapshot(format!("snapshot task: {error}")))??;
        let current = self.snapshots.make_current(StoredSnapshot {
            meta: meta.clone(),
            file,
        });
        if current.meta.snapshot_id != meta.snapshot_id {
            tracing::info!(snapshot = %meta.snapshot_id, newer = %current.meta.snapshot_id, "snapshot built, a newer one was installed meanwhile");
        }
        tracing::info!(snapshot = %meta.snapshot_id, bytes = data.len(), "snapshot built");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

/// Unique per build: the log id it covers plus the build time.
fn snapshot_id(last_applied: Option<LogId<NodeId>>) -> String {
    let built_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis());
    match last_applied {
        Some(log_id) => format!("{log_id}-{built_at_ms}"),
        None => format!("empty-{built_at_ms}"),
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, RaftError> {
        let started = std::time::Instant::now();
        let snapshot = self.build().await.map_err(read_state_machine)?;
        let bytes = snapshot.snapshot.get_ref().len();
        crate::snapshot_metrics::snapshot_built(bytes, started.elapsed());
        Ok(snapshot)
    }
}
