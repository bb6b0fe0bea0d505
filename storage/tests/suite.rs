//! openraft's own storage test suite, run against stores opened with [`open`]
//! in temp dirs: the write-ahead log and the in-memory state machine.

use openraft::storage::RaftLogStorageExt;
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use permitd_storage::{
    open, open_shards, LogStore, NodeId, Options, StateMachineStore, TypeConfig,
};
use tempfile::TempDir;

/// Builds each store in its own temp dir; the dir is the guard openraft drops last.
struct TempDirStore;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for TempDirStore {
    async fn build(
        &self,
    ) -> Result<(TempDir, LogStore, StateMachineStore), openraft::StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let opened = open(&Options::new(dir.path().to_owned()))
            .await
            .expect("open a fresh store");
        Ok((dir, opened.log, opened.state_machine))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(TempDirStore).expect("openraft storage suite");
}

/// Builds shard 2 of a store of three, whose shards 0 and 1 already hold
/// entries in the segments shard 2 writes to.
struct ShardBesideOthers;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for ShardBesideOthers {
    async fn build(
        &self,
    ) -> Result<(TempDir, LogStore, StateMachineStore), openraft::StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut shards = open_shards(&Options::new(dir.path().to_owned()), 3)
            .await
            .expect("open a fresh store of three shards");
        for (term, opened) in (1..).zip(shards.iter_mut().take(2)) {
            let entries = (1..=20).map(|index| Entry::<TypeConfig> {
                log_id: LogId::new(CommittedLeaderId::new(term, 0), index),
                payload: EntryPayload::Blank,
            });
            opened.log.blocking_append(entries).await?;
        }
        let shard = shards.swap_remove(2);
        Ok((dir, shard.log, shard.state_machine))
    }
}

#[test]
fn openraft_storage_suite_passes_on_a_shard_beside_others() {
    Suite::test_all(ShardBesideOthers).expect("openraft storage suite on shard 2");
}
