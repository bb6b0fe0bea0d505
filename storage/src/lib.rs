//! permitd's Raft log (a write-ahead log of our own) and replicated state
//! machine (in memory, with snapshot files).
//!
//! [`open`] locks the data dir, opens the write-ahead log at `<dir>/wal` and
//! loads the newest snapshot of `<dir>/snapshots`, and hands back the openraft
//! [`LogStore`], the [`StateMachineStore`] and a [`SharedState`] through which
//! the node reads the applied state and hears of every applied entry.
//! [`open_shards`] does the same for several shards (Raft groups) sharing the
//! one log: a store per shard, each with its own snapshots.
//!
//! # On disk
//!
//! | path | what | written |
//! |---|---|---|
//! | `<dir>/format_version` | the on-disk format version ([`STORAGE_FORMAT_VERSION`]); says "this dir holds a store" (`format.rs`) | once, after the log, durably |
//! | `<dir>/wal/<sequence, 20 digits>.wal` | the Raft log, vote, committed and last purged ids: CRC-framed records, one `fdatasync` per group of appends, torn tail cut at open (`wal/mod.rs`) | every append |
//! | `<dir>/snapshots/<id>.snap` | the applied state at a log id: one [`codec`] document (`snapshot.rs`) | every `snapshot_every_logs` entries, or when installed from the leader; durably before openraft purges the log behind it |
//! | `<dir>/shards/<k>/snapshots/<id>.snap` | the same, of shard k ≥ 1 (shard 0's are the row above) | as above, per shard |
//! | `<dir>/lock` | an advisory lock: one process per dir | at open |
//!
//! Every value is encoded by [`codec`] (MessagePack); the Raft RPC bodies too.
//!
//! Every file above is read and written through the [`Disk`] of [`Options`]
//! (`disk/`): the real file system ([`OsDisk`]) in production, a simulated
//! one in a deterministic simulator, whose crash drops what was not synced.
//!
//! # Data flow
//!
//! openraft appends entries to the write-ahead log (told once an `fdatasync`
//! covers them), and once they commit hands them to [`StateMachineStore`]'s
//! apply, which runs the deterministic engine (`permitd_core::Semaphores`) in
//! memory and writes nothing. On start-up the state is the newest snapshot's,
//! and openraft applies the committed entries after it again (they are in the
//! log: a purge only follows a durable snapshot). Apply is a pure function of
//! (state, entry), so the replay rebuilds exactly the state that was lost.
//!
//! Blocking work (the log's group commit, opening, snapshot files, segment
//! deletion) runs as [`Exec`] says: on threads in production, inline on the
//! current tokio runtime for a simulator, which must never see a thread.
//!
//! A data dir that lacks or has a different format version, whose log was
//! lost, or whose snapshot does not decode fails [`open`] with an error naming
//! the dir, never with a panic.

mod apply;
#[cfg(test)]
mod apply_fuzz;
pub mod audit;
pub mod bugs;
pub mod codec;
pub mod command;
mod command_decode;
pub mod disk;
mod encoded_command;
mod error;
mod exec;
mod format;
pub mod fsync;
mod lock;
mod log_store;
mod shard_count;
mod snapshot;
mod snapshot_metrics;
mod snapshot_reach;
mod state_machine;
pub mod token_state;
mod wal;

use std::path::PathBuf;
use std::sync::Arc;

pub use command::{Command, CommandResult, KeyRound, KeySync, Refused};
pub use disk::{Disk, DiskFile, OsDisk};
pub use encoded_command::EncodedCommand;
pub use error::StorageError;
pub use exec::Exec;
pub use format::STORAGE_FORMAT_VERSION;
pub use log_store::{AppendObserver, LogStore};
pub use snapshot::SNAPSHOT_FORMAT_VERSION;
pub use snapshot_metrics::{describe_snapshot_metrics, SNAPSHOT_BYTES, SNAPSHOT_DURATION};
pub use state_machine::{Applied, SharedState, SnapshotBuilder, StateMachineStore};
pub use wal::{
    describe_wal_metrics, Presence, ShardId, Wal, WalOptions, SEGMENT_MAX_BYTES, WAL_DIR,
    WAL_SYNCS, WAL_SYNC_BATCH_ENTRIES, WAL_SYNC_DURATION,
};

use serde::{Deserialize, Serialize};

/// A cluster member's addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerNode {
    /// `host:port` of the public v1 API.
    pub api_addr: String,
    /// `host:port` of the internal `/raft/` and `/cluster/` endpoints.
    pub raft_addr: String,
}

impl std::fmt::Display for PeerNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "api={} raft={}", self.api_addr, self.raft_addr)
    }
}

/// Raft node ids: the contract's, so a status answer and the Raft group agree.
pub use permitd_core::contract::cluster::NodeId;

openraft::declare_raft_types!(
    /// permitd's openraft type configuration.
    pub TypeConfig:
        D = EncodedCommand,
        R = CommandResult,
        NodeId = NodeId,
        Node = PeerNode,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

/// Where the store lives, on what disk, and where its blocking work runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The node's data dir.
    pub dir: PathBuf,
    /// The file system it is on.
    pub disk: Arc<dyn Disk>,
    /// Where its blocking work runs.
    pub exec: Exec,
}

impl Options {
    /// A store in `dir` on the real file system, its blocking work on threads.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_disk(dir, Arc::new(OsDisk), Exec::Threads)
    }

    /// A store in `dir` on `disk`, its blocking work run as `exec` says: a
    /// simulator passes its simulated disk and [`Exec::Inline`].
    pub fn with_disk(dir: impl Into<PathBuf>, disk: Arc<dyn Disk>, exec: Exec) -> Self {
        Self {
            dir: dir.into(),
            disk,
            exec,
        }
    }
}

/// An opened store: give `log` and `state_machine` to `openraft::Raft::new`.
#[derive(Debug)]
pub struct Opened {
    pub log: LogStore,
    pub state_machine: StateMachineStore,
    pub state: SharedState,
}

/// Most shards one store holds: as many as a cluster may (`permitd_core::shard`).
pub use permitd_core::shard::MAX_SHARDS;

/// Opens (or creates) the store in `options.dir` and loads the applied state:
/// one Raft group, shard 0. Inside a tokio runtime (with [`Exec::Inline`],
/// the log's group commit becomes a task of it).
pub async fn open(options: &Options) -> Result<Opened, StorageError> {
    let mut shards = open_shards(options, 1).await?;
    Ok(shards.swap_remove(0))
}

/// Opens (or creates) the store in `options.dir` with `count` shards, each a
/// Raft group of its own over the one write-ahead log, and loads each one's
/// applied state. Shard k is at position k.
pub async fn open_shards(options: &Options, count: u32) -> Result<Vec<Opened>, StorageError> {
    if !(1..=MAX_SHARDS).contains(&count) {
        return Err(StorageError::ShardCount {
            asked: count,
            max: MAX_SHARDS,
        });
    }
    let dir = options.dir.clone();
    // Reading the log and decoding the snapshots: blocking IO.
    let task = options.exec.blocking({
        let options = options.clone();
        move || open_blocking(&options, count)
    });
    match task.await {
        Ok(opened) => opened,
        // A panic while reading damaged files is the dir's problem.
        Err(error) => Err(StorageError::Corrupt {
            dir,
            detail: format!("opening the store failed: {error}"),
        }),
    }
}

fn open_blocking(options: &Options, count: u32) -> Result<Vec<Opened>, StorageError> {
    let dir = options.dir.as_path();
    let disk = &*options.disk;
    // Durably: a data dir whose own directory entry is lost in a power cut
    // would come back empty, and the node would start a new cluster.
    let created = if bugs::data_dir_parent_not_synced() {
        disk.create_dir_all(dir).and_then(|()| disk.sync_dir(dir))
    } else {
        fsync::durable_create_dir_all_on(disk, dir)
    };
    created.map_err(|source| StorageError::CreateDir {
        dir: dir.to_owned(),
        source,
    })?;
    let lock = Arc::new(lock::DirLock::acquire(disk, dir)?);
    shard_count::check_or_record(disk, dir, count, format::is_initialised(disk, dir)?)?;
    let wal = open_wal(options)?;
    (0..count)
        .map(|shard| open_shard(options, shard, &lock, &wal))
        .collect()
}

/// One shard's store: its view of the log, and its state machine at its newest
/// snapshot.
fn open_shard(
    options: &Options,
    shard: ShardId,
    lock: &Arc<lock::DirLock>,
    wal: &Wal,
) -> Result<Opened, StorageError> {
    let dir = options.dir.as_path();
    let state_machine = StateMachineStore::open(
        dir.to_owned(),
        shard,
        Arc::clone(lock),
        Arc::clone(&options.disk),
        options.exec,
    )?;
    let state = state_machine.shared();
    tracing::info!(
        dir = %dir.display(),
        shard,
        snapshot = ?state.last_applied(),
        keys = state.read(|semaphores| semaphores.keys().len()),
        "storage opened"
    );
    Ok(Opened {
        log: LogStore::new(wal.clone(), shard, state_machine.snapshot_reach()),
        state,
        state_machine,
    })
}

/// Checks the format version and opens the write-ahead log. A brand-new store
/// gets its log before the marker that says "initialised" is written, so a
/// store whose marker exists must have a log: a missing one was lost (which
/// would make the node forget its vote), and is reported as corrupt.
fn open_wal(options: &Options) -> Result<Wal, StorageError> {
    let (dir, disk) = (options.dir.as_path(), &*options.disk);
    let wal_dir = dir.join(WAL_DIR);
    let wal_options = |presence| WalOptions {
        disk: Arc::clone(&options.disk),
        exec: options.exec,
        ..WalOptions::new(presence)
    };
    if format::is_initialised(disk, dir)? {
        format::check_or_initialise(disk, dir)?;
        Wal::open(&wal_dir, wal_options(Presence::MustExist))
    } else {
        let wal = Wal::open(&wal_dir, wal_options(Presence::CreateIfMissing))?;
        format::check_or_initialise(disk, dir)?;
        Ok(wal)
    }
}
