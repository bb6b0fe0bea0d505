//! permitd's Raft log (a write-ahead log of our own) and replicated state
//! machine (over sled).
//!
//! [`open`] opens the write-ahead log at `<dir>/wal` and one sled database at
//! `<dir>/sled`, and hands back the openraft [`LogStore`], the
//! [`StateMachineStore`] and a [`SharedState`] through which the node reads the
//! applied state and hears of every applied entry.
//!
//! # The write-ahead log (`wal/`)
//!
//! The Raft log, the vote, the committed and the last purged log ids live in
//! segment files `<dir>/wal/<sequence, 20 digits>.wal` of CRC-framed records
//! (Entry, Vote, Committed, Purged, Truncate), made durable by one `fdatasync`
//! per group of appends; a torn tail is cut at open. The format, the
//! invariants and why group commit is safe are in `wal/mod.rs`.
//!
//! # Trees and their keys (byte layout in [`keys`])
//!
//! | tree | key | value |
//! |---|---|---|
//! | default | `permitd_format_version` | on-disk format version, u32 BE (also in the file `<dir>/format_version`: see `format.rs`) |
//! | `state` | `0x00` + name: `last_applied`, `membership`, `cluster` (defaults and clock), `tokens` (the API token registry, hashes only: `token_state.rs`), `snapshot_meta` | the value; the snapshot's data is a file (`snapshot.rs`) |
//! | `state` | `0x01` + u32 BE length + key + row kind (`0` meta, `1` grant id, `2` lease id, `3` u32 BE length + clientId + requestId) | the core value |
//!
//! Every value is encoded by [`codec`] (MessagePack); the Raft RPC bodies too.
//!
//! # Data flow
//!
//! openraft appends entries to the write-ahead log (told once an `fdatasync`
//! covers them), and once they commit hands them to [`StateMachineStore`]'s apply. Apply runs the
//! deterministic engine (`permitd_core::Semaphores`, kept in memory), collects
//! the rows each engine call changed (`Semaphores::take_changes`) and writes them,
//! with the last applied log id and the membership, as **one `sled::Batch` on the
//! `state` tree**. sled applies a batch atomically, also across a crash: after a
//! restart the tree holds every row of an apply or none, and the last applied id
//! always names exactly the entries whose rows are there; openraft replays the
//! rest from the log. The state tree needs no flush per apply: the log holds the
//! entries, and sled writes the rows as its buffers fill; snapshots (before
//! openraft purges the log behind them) and shutdown flush sled.
//!
//! On start-up the state is rebuilt from the `state` tree's rows
//! (`Semaphores::from_parts`), never by replaying from index 0. A data dir that
//! sled cannot open, that lacks or has a different format version, that sled
//! recovers as empty although it was initialised, or whose rows do not decode,
//! fails [`open`] with an error naming the dir, never with a panic.

mod apply;
#[cfg(test)]
mod apply_fuzz;
pub mod audit;
pub mod codec;
pub mod command;
mod durable;
mod error;
mod format;
pub mod fsync;
pub mod keys;
mod log_store;
mod rows;
mod snapshot;
mod snapshot_metrics;
mod state_machine;
pub mod token_state;
mod wal;

use std::path::PathBuf;

pub use command::{Command, CommandResult, KeyRound, KeySync, Refused};
pub use error::StorageError;
pub use format::STORAGE_FORMAT_VERSION;
pub use log_store::LogStore;
pub use snapshot::SNAPSHOT_FORMAT_VERSION;
pub use snapshot_metrics::{describe_snapshot_metrics, SNAPSHOT_BYTES, SNAPSHOT_DURATION};
pub use state_machine::{Applied, SharedState, SnapshotBuilder, StateMachineStore};
pub use wal::{
    describe_wal_metrics, Presence, Wal, WalOptions, SEGMENT_MAX_BYTES, WAL_DIR, WAL_SYNCS,
    WAL_SYNC_BATCH_ENTRIES, WAL_SYNC_DURATION,
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
        D = Command,
        R = CommandResult,
        NodeId = NodeId,
        Node = PeerNode,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);

/// sled's page cache when no setting says otherwise, in bytes. The state
/// machine lives in memory (rebuilt from the `state` rows at start), so sled's
/// cache only holds pages being written (the log's tail, the leaves of rows an
/// apply rewrites) and old log entries read for a lagging follower; a page
/// outside it is read back from the data files (usually the OS page cache).
/// At 64 MiB the cache filled with the rows of idle keys (33 MiB of heap at
/// 100,000 keys) and cost the leader about 300 B of RSS per key
/// (docs/operations.md, "Memory"); sled's own default is 1 GiB.
pub const DEFAULT_CACHE_CAPACITY_BYTES: u64 = 8 * 1024 * 1024;

/// Where the store lives, and how much memory sled may cache.
#[derive(Debug, Clone)]
pub struct Options {
    /// The node's data dir; the sled database is `dir/sled`.
    pub dir: PathBuf,
    /// Bound of sled's page cache, in bytes.
    pub cache_capacity_bytes: u64,
}

impl Options {
    /// A store in `dir` with the default cache bound.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            cache_capacity_bytes: DEFAULT_CACHE_CAPACITY_BYTES,
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

/// Opens (or creates) the store in `options.dir` and loads the applied state.
pub async fn open(options: &Options) -> Result<Opened, StorageError> {
    let dir = options.dir.clone();
    // sled's open and the state load read the whole state tree: blocking IO.
    let task = tokio::task::spawn_blocking({
        let options = options.clone();
        move || open_blocking(&options)
    });
    match task.await {
        Ok(opened) => opened,
        // sled may panic on some damaged files; report it as the dir's problem.
        Err(error) => Err(StorageError::Corrupt {
            dir,
            detail: format!("opening the store failed: {error}"),
        }),
    }
}

fn open_blocking(options: &Options) -> Result<Opened, StorageError> {
    let dir = options.dir.as_path();
    // Durably: a data dir whose own directory entry is lost in a power cut
    // would come back empty, and the node would start a new cluster.
    fsync::durable_create_dir_all(dir).map_err(|source| StorageError::CreateDir {
        dir: dir.to_owned(),
        source,
    })?;
    let sled_dir = dir.join("sled");
    let db = sled::Config::new()
        .path(&sled_dir)
        .cache_capacity(options.cache_capacity_bytes)
        // Every write that must survive a crash flushes before it is
        // acknowledged (see `log_store.rs`); sled's background flush every
        // 500 ms would only add disk writes that compete with those.
        .flush_every_ms(None)
        .open()
        .map_err(|source| StorageError::Open {
            dir: dir.to_owned(),
            source,
        })?;
    let db = durable::DurableDb::new(db, sled_dir);
    let wal = open_wal(&db, dir)?;
    let state_tree = db.db().open_tree("state")?;
    let loaded = rows::load(&state_tree, dir)?;
    tracing::info!(
        dir = %dir.display(),
        last_applied = ?loaded.last_applied,
        keys = loaded.semaphores.keys().len(),
        "storage opened"
    );
    let state_machine = StateMachineStore::new(dir.to_owned(), db.clone(), state_tree, loaded);
    Ok(Opened {
        log: LogStore::new(wal),
        state: state_machine.shared(),
        state_machine,
    })
}

/// Checks the format version and opens the write-ahead log. A brand-new store
/// gets its log before the marker that says "initialised" is written, so a
/// store whose marker exists must have a log: a missing one was lost (which
/// would make the node forget its vote), and is reported as corrupt.
fn open_wal(db: &durable::DurableDb, dir: &std::path::Path) -> Result<Wal, StorageError> {
    let wal_dir = dir.join(WAL_DIR);
    if format::is_initialised(dir)? {
        format::check_or_initialise(db, dir)?;
        Wal::open(&wal_dir, WalOptions::new(Presence::MustExist))
    } else {
        let wal = Wal::open(&wal_dir, WalOptions::new(Presence::CreateIfMissing))?;
        format::check_or_initialise(db, dir)?;
        Ok(wal)
    }
}
