//! openraft's own storage test suite, run against stores opened with [`open`]
//! in temp dirs: the write-ahead log and the in-memory state machine.

use openraft::testing::{StoreBuilder, Suite};
use permitd_storage::{open, LogStore, NodeId, Options, StateMachineStore, TypeConfig};
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
