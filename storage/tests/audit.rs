//! The audit of a running replica (`audit::check_live`): its state in memory
//! against its store's snapshot and log replayed to the same applied id.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{blank, normal, open_dir, Workload};
use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
use openraft::{Entry, EntryPayload, Membership, RaftSnapshotBuilder};
use permitd_storage::audit::check_live;
use permitd_storage::{Opened, Options, StorageError, TypeConfig};

/// A cluster's log: blank and membership entries at 0 and 1, then `rounds`
/// commands of the shared test workload.
fn cluster_log(rounds: u64) -> Vec<Entry<TypeConfig>> {
    let members = Membership::new(vec![BTreeSet::from([1, 2, 3])], None);
    let mut workload = Workload::new(11);
    let mut entries = vec![
        blank(0),
        Entry {
            log_id: common::log_id(1, 1),
            payload: EntryPayload::Membership(members),
        },
    ];
    entries.extend((2..2 + rounds).map(|index| normal(index, workload.next_command())));
    entries
}

/// Appends `entries` to the log and applies them, as a replica does.
async fn append_and_apply(opened: &mut Opened, entries: Vec<Entry<TypeConfig>>) {
    opened.log.blocking_append(entries.clone()).await.unwrap();
    opened.state_machine.apply(entries).await.unwrap();
}

/// Copies the files and folders of `from` into `to`.
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Audits `live` against a copy of its data dir `dir` (it holds the lock).
async fn audit(live: &Opened, dir: &Path) -> Result<permitd_storage::audit::Audit, StorageError> {
    let copy = tempfile::tempdir().unwrap();
    copy_tree(dir, copy.path());
    check_live(&live.state, &Options::new(copy.path())).await
}

#[tokio::test]
async fn a_replica_equals_its_log_replayed_and_after_a_snapshot_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = open_dir(dir.path()).await;
    let entries = cluster_log(120);
    append_and_apply(&mut live, entries[..60].to_vec()).await;
    let checked = audit(&live, dir.path()).await.unwrap();
    assert_eq!((checked.snapshot, checked.entries_replayed), (None, 60));

    live.state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    append_and_apply(&mut live, entries[60..].to_vec()).await;
    let checked = audit(&live, dir.path()).await.unwrap();
    assert_eq!(checked.snapshot.map(|id| id.index), Some(59));
    assert_eq!(checked.entries_replayed, 62);
}

#[tokio::test]
async fn an_applied_entry_the_log_lacks_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = open_dir(dir.path()).await;
    let entries = cluster_log(40);
    append_and_apply(&mut live, entries[..30].to_vec()).await;
    // Applied, never appended: a log that lost an entry the replica applied.
    live.state_machine
        .apply(entries[30..].to_vec())
        .await
        .unwrap();
    let error = audit(&live, dir.path()).await.unwrap_err().to_string();
    assert!(error.contains("does not hold every entry"), "{error}");
}

#[tokio::test]
async fn a_state_its_log_does_not_give_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = open_dir(dir.path()).await;
    let entries = cluster_log(40);
    append_and_apply(&mut live, entries[..30].to_vec()).await;
    // The log holds other commands at the same indexes than were applied.
    let others: Vec<Entry<TypeConfig>> = {
        let mut workload = Workload::new(99);
        (30..42)
            .map(|index| normal(index, workload.next_command()))
            .collect()
    };
    live.log.blocking_append(others).await.unwrap();
    live.state_machine
        .apply(entries[30..].to_vec())
        .await
        .unwrap();
    let error = audit(&live, dir.path()).await.unwrap_err().to_string();
    assert!(error.contains("differ from a replay"), "{error}");
}
