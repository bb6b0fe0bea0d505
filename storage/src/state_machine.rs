//! The replicated state machine: the in-memory [`Semaphores`] written through to
//! the `state` sled tree, and its snapshots.
//!
//! Invariants:
//! - one `apply` call is one `sled::Batch` on the `state` tree: the changed rows of
//!   every entry in it, the last applied log id and the membership land together
//!   or not at all, so a restart never sees half an entry or rows without the id
//!   that produced them;
//! - the in-memory state equals what the `state` tree holds, except after a failed
//!   write, which openraft treats as fatal (the node stops and reloads from disk);
//! - the stored snapshot only moves forward (a slow builder never overwrites a
//!   newer installed snapshot), and it is on disk before openraft learns of it,
//!   together with the state it covers, because openraft purges the log behind it;
//! - building a snapshot holds the state lock only to clone the state (which
//!   shares every key, see `Semaphores`): encoding
//!   and writing the file run on a blocking thread while applies go on, so a
//!   snapshot never stalls a round for longer than the clone.

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::storage::RaftStateMachine;
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StoredMembership,
};
use permitd_core::tokens::TokenRegistry;
use permitd_core::{Event, Semaphores};
use tokio::sync::broadcast;

use crate::apply::apply_command;
use crate::durable::DurableDb;
use crate::error::{
    read_snapshot, read_state_machine, write_snapshot, write_state_machine, RaftError,
};
use crate::rows::{Loaded, WriteSet};
use crate::snapshot::{SnapshotFiles, StoredSnapshot};
use crate::{codec, keys, snapshot, CommandResult, NodeId, PeerNode, StorageError, TypeConfig};

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
#[derive(Debug)]
pub(crate) struct AppliedState {
    pub semaphores: Semaphores,
    /// The API tokens (hashes only), replicated like the semaphores.
    pub tokens: TokenRegistry,
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, PeerNode>,
}

/// Read access to the applied state, shared with the node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SharedState {
    /// A std lock, not a tokio one: it is only held for in-memory work (an apply's
    /// engine calls and batch write, or a reader's closure) and never across an
    /// await, so readers never wait on IO and no async lock is needed.
    state: Arc<RwLock<AppliedState>>,
    /// One notice per applied entry, sent after the entry is written.
    notices: broadcast::Sender<Arc<Applied>>,
    /// For [`SharedState::flush`] at shutdown.
    db: DurableDb,
}

impl SharedState {
    fn new(loaded: Loaded, db: DurableDb) -> Self {
        let state = AppliedState {
            semaphores: loaded.semaphores,
            tokens: loaded.tokens,
            last_applied: loaded.last_applied,
            membership: loaded.membership,
        };
        let (notices, _) = broadcast::channel(APPLIED_CHANNEL_CAPACITY);
        Self {
            state: Arc::new(RwLock::new(state)),
            notices,
            db,
        }
    }

    /// Makes the applied state durable (sled's buffers written, its files
    /// synced). The log holds every entry the state may lose; this makes a
    /// clean stop leave the applied state on disk too, so the next start
    /// replays nothing.
    pub async fn flush(&self) -> Result<(), StorageError> {
        self.db.flush().await
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

    /// Notices of entries applied from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Applied>> {
        self.notices.subscribe()
    }

    // A poisoned lock means an apply panicked halfway: the state in memory is not
    // trustworthy and continuing would serve or persist it.
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

/// The openraft state machine over the `state` tree.
#[derive(Debug)]
pub struct StateMachineStore {
    /// Named in errors.
    dir: PathBuf,
    /// For flushes (durability covers every tree).
    db: DurableDb,
    state_tree: sled::Tree,
    shared: SharedState,
    files: SnapshotFiles,
    /// Serialises the snapshot row and files between snapshot builders (openraft
    /// runs them in their own tasks, concurrently with applies), installs and
    /// readers (a file is removed only under it).
    snapshot_lock: Arc<Mutex<()>>,
}

impl StateMachineStore {
    pub(crate) fn new(dir: PathBuf, db: DurableDb, state_tree: sled::Tree, loaded: Loaded) -> Self {
        Self {
            files: SnapshotFiles::new(&dir),
            dir,
            shared: SharedState::new(loaded, db.clone()),
            db,
            state_tree,
            snapshot_lock: Arc::new(Mutex::new(())),
        }
    }

    /// A handle for readers.
    pub fn shared(&self) -> SharedState {
        self.shared.clone()
    }

    /// Applies entries in memory and writes them as one batch, under the write lock
    /// so that readers never see state that is not on its way to disk.
    fn apply_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> Result<(Vec<CommandResult>, Vec<Applied>), StorageError> {
        let mut write = WriteSet::default();
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
                        &self.state_tree,
                        &mut write,
                        entry.log_id.index,
                        &command,
                    )?;
                    results.push(result);
                    notices.push(notice);
                }
            }
        }
        if results.is_empty() {
            return Ok((results, notices));
        }
        write.put(keys::LAST_APPLIED, &state.last_applied)?;
        write.put(keys::MEMBERSHIP, &state.membership)?;
        self.state_tree.apply_batch(write.into_batch())?;
        Ok((results, notices))
    }

    fn read_snapshot(&self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let _snapshot = self.snapshot_lock.lock().expect("snapshot lock poisoned");
        let Some(stored) = read_stored_snapshot(&self.state_tree)? else {
            return Ok(None);
        };
        let data = self
            .files
            .read(&stored.file)
            .map_err(|error| StorageError::Corrupt {
                dir: self.dir.clone(),
                detail: format!("the current snapshot's file: {error}"),
            })?;
        Ok(Some(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }

    /// Replaces the whole state by the snapshot's: the file, then the rows (one
    /// batch), then memory. Decoding and preparing the rows run on a blocking
    /// thread.
    async fn install(
        &self,
        meta: &SnapshotMeta<NodeId, PeerNode>,
        data: Vec<u8>,
    ) -> Result<(), StorageError> {
        let prepare = {
            let (meta, tree, files) = (meta.clone(), self.state_tree.clone(), self.files.clone());
            move || prepare_install(&meta, &tree, &files, &data)
        };
        let (image, write, file) = tokio::task::spawn_blocking(prepare)
            .await
            .map_err(|error| StorageError::Snapshot(format!("install task: {error}")))??;
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
        {
            let _snapshot = self.snapshot_lock.lock().expect("snapshot lock poisoned");
            let mut state = self.shared.lock_write();
            self.state_tree.apply_batch(write.into_batch())?;
            *state = AppliedState {
                semaphores: image.semaphores,
                tokens: image.tokens,
                last_applied: image.last_applied,
                membership: image.membership,
            };
        }
        self.db.flush().await?;
        self.remove_old_files(&file);
        self.shared.publish(vec![notice]);
        Ok(())
    }

    fn remove_old_files(&self, keep: &str) {
        let _snapshot = self.snapshot_lock.lock().expect("snapshot lock poisoned");
        if let Err(error) = self.files.remove_all_but(keep) {
            tracing::warn!(%error, "cannot remove old snapshot files");
        }
    }
}

/// Decodes an installed snapshot, writes its file and prepares the batch that
/// replaces every row. Blocking.
fn prepare_install(
    meta: &SnapshotMeta<NodeId, PeerNode>,
    tree: &sled::Tree,
    files: &SnapshotFiles,
    data: &[u8],
) -> Result<(snapshot::SnapshotImage, WriteSet, String), StorageError> {
    let image = snapshot::decode(data)?;
    if image.last_applied != meta.last_log_id || image.membership != meta.last_membership {
        return Err(StorageError::Snapshot(format!(
            "snapshot {} holds state at {:?}, its metadata says {:?}",
            meta.snapshot_id, image.last_applied, meta.last_log_id
        )));
    }
    let file = SnapshotFiles::name_of(&meta.snapshot_id);
    files.write(&file, data)?;
    let mut write = WriteSet::default();
    write.delete_all(tree)?;
    write.record_all(&image.semaphores)?;
    write.put(crate::token_state::TOKENS, &image.tokens)?;
    write.put(keys::LAST_APPLIED, &image.last_applied)?;
    write.put(keys::MEMBERSHIP, &image.membership)?;
    let stored = StoredSnapshot {
        meta: meta.clone(),
        file: file.clone(),
    };
    write.put(keys::SNAPSHOT_META, &stored)?;
    Ok((image, write, file))
}

fn read_stored_snapshot(tree: &sled::Tree) -> Result<Option<StoredSnapshot>, StorageError> {
    match tree.get(keys::SNAPSHOT_META)? {
        Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
        None => Ok(None),
    }
}

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
        let (results, notices) = self.apply_entries(entries).map_err(write_state_machine)?;
        self.shared.publish(notices);
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            state_tree: self.state_tree.clone(),
            shared: self.shared.clone(),
            files: self.files.clone(),
            snapshot_lock: self.snapshot_lock.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, RaftError> {
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
    db: DurableDb,
    state_tree: sled::Tree,
    shared: SharedState,
    files: SnapshotFiles,
    snapshot_lock: Arc<Mutex<()>>,
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
            let (files, file) = (self.files.clone(), file.clone());
            move || {
                files.write_with(&file, |out| {
                    snapshot::encode_into(out, &last_applied, &membership, &semaphores, &tokens)
                })?;
                // The copy goes before the file is read back for openraft: a
                // build holds at most one of the two (each ~350 B per key).
                drop((semaphores, tokens));
                files.read(&file)
            }
        };
        let data = tokio::task::spawn_blocking(write_file)
            .await
            .map_err(|error| StorageError::Snapshot(format!("snapshot task: {error}")))??;
        let stored = self.store(&meta, &file)?;
        // openraft purges the log behind the snapshot: the snapshot and the state
        // it covers must be durable first.
        self.db.flush().await?;
        let _snapshot = self.snapshot_lock.lock().expect("snapshot lock poisoned");
        if let Err(error) = self.files.remove_all_but(&stored) {
            tracing::warn!(%error, "cannot remove old snapshot files");
        }
        tracing::info!(snapshot = %meta.snapshot_id, bytes = data.len(), "snapshot built");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }

    /// Names `file` as the current snapshot unless a newer one (installed
    /// meanwhile) is stored; returns the file that is current afterwards.
    fn store(
        &self,
        meta: &SnapshotMeta<NodeId, PeerNode>,
        file: &str,
    ) -> Result<String, StorageError> {
        let _snapshot = self.snapshot_lock.lock().expect("snapshot lock poisoned");
        if let Some(stored) = read_stored_snapshot(&self.state_tree)? {
            if stored.meta.last_log_id > meta.last_log_id {
                return Ok(stored.file);
            }
        }
        let stored = StoredSnapshot {
            meta: meta.clone(),
            file: file.to_owned(),
        };
        self.state_tree
            .insert(keys::SNAPSHOT_META, codec::encode(&stored)?)?;
        Ok(stored.file)
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
