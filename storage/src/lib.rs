//! permitd's Raft log and replicated state machine, over sled.
//!
//! [`open`] opens one sled database at `<dir>/sled` and hands back the openraft
//! [`LogStore`], the [`StateMachineStore`] and a [`SharedState`] through which the
//! node reads the applied state and hears of every applied entry.
//!
//! # Trees and their keys (byte layout in [`keys`])
//!
//! | tree | key | value |
//! |---|---|---|
//! | default | `permitd_format_version` | on-disk format version, u32 BE (also in the file `<dir>/format_version`: see `format.rs`) |
//! | `log` | entry index, u64 BE | `Entry<TypeConfig>` |
//! | `raft` | `vote`, `committed`, `last_purged` | vote / log ids |
//! | `state` | `0x00` + name: `last_applied`, `membership`, `cluster` (defaults and clock), `tokens` (the API token registry, hashes only: `token_state.rs`), `snapshot_meta` | the value; the snapshot's data is a file (`snapshot.rs`) |
//! | `state` | `0x01` + u32 BE length + key + row kind (`0` meta, `1` grant id, `2` lease id, `3` u32 BE length + clientId + requestId) | the core value |
//!
//! Every value is encoded by [`codec`] (MessagePack); the Raft RPC bodies too.
//!
//! # Data flow
//!
//! openraft appends entries to the `log` tree (flushed before it is told), and
//! once they commit hands them to [`StateMachineStore`]'s apply. Apply runs the
//! deterministic engine (`permitd_core::Semaphores`, kept in memory), collects
//! the rows each engine call changed (`Semaphores::take_changes`) and writes them,
//! with the last applied log id and the membership, as **one `sled::Batch` on the
//! `state` tree**. sled applies a batch atomically, also across a crash: after a
//! restart the tree holds every row of an apply or none, and the last applied id
//! always names exactly the entries whose rows are there; openraft replays the
//! rest from the log. The state tree needs no flush of its own: the log holds the
//! entries, and every later log flush (db-wide) persists the applied rows too.
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
pub mod durable;
mod error;
mod format;
pub mod keys;
mod log_store;
mod rows;
mod snapshot;
mod snapshot_metrics;
mod state_machine;
pub mod token_state;

use std::path::PathBuf;

pub use command::{Command, CommandResult, KeyRound, KeySync, Refused};
pub use error::StorageError;
pub use format::STORAGE_FORMAT_VERSION;
pub use log_store::LogStore;
pub use snapshot::SNAPSHOT_FORMAT_VERSION;
pub use snapshot_metrics::{describe_snapshot_metrics, SNAPSHOT_BYTES, SNAPSHOT_DURATION};
pub use state_machine::{Applied, SharedState, SnapshotBuilder, StateMachineStore};

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
    durable::create_dir_all(dir).map_err(|source| StorageError::CreateDir {
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
    format::check_or_initialise(&db, dir)?;
    let log = db.db().open_tree("log")?;
    let raft = db.db().open_tree("raft")?;
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
        log: LogStore::new(db, log, raft),
        state: state_machine.shared(),
        state_machine,
    })
}
