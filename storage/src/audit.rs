//! Checking a stopped node's data dir: does its log rebuild its state?
//!
//! A node's applied state is its newest snapshot plus the committed log
//! entries after it, applied again at every start. So a store is sound when
//! - the log still holds every entry from the snapshot to the committed id
//!   (a purge past the snapshot, or a lost piece of log, leaves a hole);
//! - replaying them gives the same state twice: once on the store as it opens
//!   (the snapshot it loads), once on a fresh store in `scratch` that installs
//!   that snapshot the way a follower does. Apply is a pure function of
//!   (state, entry), so any difference is a bug of determinism or of the
//!   snapshot's encoding.
//!
//! The power-loss tests run it on every node's data dir after the cuts. The
//! check takes the dir's lock, so the node must not be running. It writes only
//! to `scratch`, a folder of the caller's.
//!
//! [`check_live`] holds a running replica to the same rule: its state in
//! memory must equal its newest snapshot plus its own log replayed to the
//! same applied id. The simulator runs it on a copy of every node's disk at
//! the end of each history.

use std::path::Path;

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{Entry, LogId, RaftLogReader};

use crate::{open_shards, NodeId, Opened, Options, SharedState, StorageError, TypeConfig};

/// What a successful check covered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audit {
    /// The applied state that was checked (the committed id, or the snapshot's).
    pub last_applied: Option<LogId<NodeId>>,
    /// The snapshot the replay started from, if the store holds one.
    pub snapshot: Option<LogId<NodeId>>,
    /// Log entries replayed on top of it.
    pub entries_replayed: u64,
    /// The store's last log id (entries after `last_applied` are not applied yet).
    pub last_log: Option<LogId<NodeId>>,
}

/// Replays `dir`'s log after its snapshot, on the store itself and on a fresh
/// one in `scratch`, and compares the two states, shard by shard (the count
/// the dir was written with); a hole in a log or a difference is
/// [`StorageError::Corrupt`]. One [`Audit`] per shard, in shard order.
pub async fn check_replay(dir: &Path, scratch: &Path) -> Result<Vec<Audit>, StorageError> {
    let count = crate::shard_count::recorded(&crate::OsDisk, dir)?;
    let stored = open_shards(&Options::new(dir), count).await?;
    let replays = open_shards(&Options::new(scratch), count).await?;
    let mut audits = Vec::with_capacity(stored.len());
    for (mut stored, mut replay) in stored.into_iter().zip(replays) {
        audits.push(check_shard_replay(dir, &mut stored, &mut replay).await?);
    }
    Ok(audits)
}

/// One shard of [`check_replay`].
async fn check_shard_replay(
    dir: &Path,
    stored: &mut Opened,
    replay: &mut Opened,
) -> Result<Audit, StorageError> {
    let corrupt = corrupt_in(dir);
    let raft = |error: openraft::StorageError<NodeId>| corrupt(error.to_string());
    let snapshot_id = stored.state.last_applied();
    let log_state = stored.log.get_log_state().await.map_err(raft)?;
    let committed = stored.log.read_committed().await.map_err(raft)?;
    check_not_purged_past(dir, &log_state.last_purged_log_id, &snapshot_id)?;
    if let Some(snapshot) = stored
        .state_machine
        .get_current_snapshot()
        .await
        .map_err(raft)?
    {
        replay
            .state_machine
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .map_err(raft)?;
    }
    // openraft does the same when the committed id was not synced yet.
    let last_applied = committed.max(snapshot_id);
    let entries = entries_after(stored, dir, snapshot_id, last_applied).await?;
    let entries_replayed = entries.len() as u64;
    stored
        .state_machine
        .apply(entries.clone())
        .await
        .map_err(raft)?;
    replay.state_machine.apply(entries).await.map_err(raft)?;
    compare(&stored.state, &replay.state).map_err(corrupt)?;
    Ok(Audit {
        last_applied,
        snapshot: snapshot_id,
        entries_replayed,
        last_log: log_state.last_log_id,
    })
}

/// Compares `live`, a running replica's applied state, with its store
/// (`store`: a copy of its data dir, which this opens and changes) replayed
/// to the same applied id: the store's newest snapshot, then its log. A
/// snapshot past the live state (an install between its file and memory) is
/// [`StorageError::Corrupt`] too: call this between steps, not during one.
pub async fn check_live(live: &SharedState, store: &Options) -> Result<Audit, StorageError> {
    let mut audits = check_live_shards(std::slice::from_ref(live), store).await?;
    Ok(audits.remove(0))
}

/// [`check_live`] for a replica of `live.len()` shards, `live[k]` shard k's
/// applied state: one [`Audit`] per shard, in shard order.
pub async fn check_live_shards(
    live: &[SharedState],
    store: &Options,
) -> Result<Vec<Audit>, StorageError> {
    let count = u32::try_from(live.len()).unwrap_or(u32::MAX);
    let stored = open_shards(store, count).await?;
    let mut audits = Vec::with_capacity(live.len());
    for (live, mut stored) in live.iter().zip(stored) {
        audits.push(check_shard_live(live, &mut stored, store.dir.as_path()).await?);
    }
    Ok(audits)
}

/// One shard of [`check_live_shards`].
async fn check_shard_live(
    live: &SharedState,
    stored: &mut Opened,
    dir: &Path,
) -> Result<Audit, StorageError> {
    let raft = |error: openraft::StorageError<NodeId>| corrupt_in(dir)(error.to_string());
    let snapshot_id = stored.state.last_applied();
    let last_applied = live.last_applied();
    let log_state = stored.log.get_log_state().await.map_err(raft)?;
    check_not_purged_past(dir, &log_state.last_purged_log_id, &snapshot_id)?;
    if snapshot_id > last_applied {
        return Err(corrupt_in(dir)(format!(
            "the stored snapshot at {snapshot_id:?} is past the applied {last_applied:?}"
        )));
    }
    let entries = entries_after(stored, dir, snapshot_id, last_applied).await?;
    let entries_replayed = entries.len() as u64;
    stored.state_machine.apply(entries).await.map_err(raft)?;
    compare(live, &stored.state).map_err(corrupt_in(dir))?;
    Ok(Audit {
        last_applied,
        snapshot: snapshot_id,
        entries_replayed,
        last_log: log_state.last_log_id,
    })
}

fn corrupt_in(dir: &Path) -> impl Fn(String) -> StorageError + '_ {
    move |detail| StorageError::Corrupt {
        dir: dir.to_owned(),
        detail,
    }
}

/// A log purged past the snapshot has lost entries nothing else holds.
fn check_not_purged_past(
    dir: &Path,
    purged: &Option<LogId<NodeId>>,
    snapshot_id: &Option<LogId<NodeId>>,
) -> Result<(), StorageError> {
    if purged > snapshot_id {
        return Err(corrupt_in(dir)(format!(
            "the log is purged to {purged:?}, past the snapshot at {snapshot_id:?}"
        )));
    }
    Ok(())
}

/// The log's entries after `snapshot_id` up to `last_applied`, every one of
/// them; a hole is [`StorageError::Corrupt`].
async fn entries_after(
    stored: &mut Opened,
    dir: &Path,
    snapshot_id: Option<LogId<NodeId>>,
    last_applied: Option<LogId<NodeId>>,
) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
    let corrupt = corrupt_in(dir);
    // A cluster's log begins at index 0 (openraft's first membership entry).
    let from = snapshot_id.map_or(0, |id| id.index + 1);
    let Some(until) = last_applied
        .map(|id| id.index)
        .filter(|until| *until >= from)
    else {
        return Ok(Vec::new());
    };
    let entries = stored
        .log
        .try_get_log_entries(from..=until)
        .await
        .map_err(|error| corrupt(error.to_string()))?;
    let expected = (from..=until).count();
    if entries.len() != expected
        || entries
            .iter()
            .zip(from..)
            .any(|(entry, index)| entry.log_id.index != index)
    {
        return Err(corrupt(format!(
            "the log does not hold every entry from {from} to the applied {until}: {} found",
            entries.len()
        )));
    }
    Ok(entries)
}

/// Compares everything apply writes: the semaphores, the tokens, the applied
/// log id and the membership.
fn compare(stored: &SharedState, replay: &SharedState) -> Result<(), String> {
    let semaphores = |state: &SharedState| {
        state.read(|semaphores| serde_json::to_vec(semaphores).map_err(|error| error.to_string()))
    };
    if semaphores(stored)? != semaphores(replay)? {
        return Err("the semaphores differ from a replay of the log".to_owned());
    }
    let tokens = |state: &SharedState| state.read_tokens(Clone::clone);
    if tokens(stored) != tokens(replay) {
        return Err("the token registry differs from a replay of the log".to_owned());
    }
    if stored.last_applied() != replay.last_applied() {
        return Err(format!(
            "applied {:?}, the replay reached {:?}",
            stored.last_applied(),
            replay.last_applied()
        ));
    }
    if stored.membership() != replay.membership() {
        return Err(format!(
            "membership {:?}, the replay's {:?}",
            stored.membership(),
            replay.membership()
        ));
    }
    Ok(())
}
