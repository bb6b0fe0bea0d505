//! Several shards in one data dir: each one a Raft group's store (its view
//! of the one write-ahead log, its state machine, its snapshots), opened
//! together by `open_shards`, each replaying to its own state.

mod common;

use common::{open_dir, restart_shards, run_workload, state_bytes, ENTRIES};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use permitd_storage::{open_shards, Options, StorageError, MAX_SHARDS};

fn files_in(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |listing| listing.count())
}

#[tokio::test]
async fn each_shard_replays_to_its_own_state_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut shards = open_shards(&Options::new(dir.path().to_owned()), 3)
        .await
        .unwrap();
    for (start, opened) in (11..).zip(shards.iter_mut()) {
        run_workload(opened, start).await;
    }
    // Shard 1 takes a snapshot and purges its log behind it; the others keep
    // every entry in the segments they share with it.
    let snapshot = shards[1]
        .state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let through = snapshot.meta.last_log_id.unwrap();
    shards[1].log.purge(through).await.unwrap();
    let expected: Vec<Vec<u8>> = shards.iter().map(state_bytes).collect();
    assert_ne!(
        expected[0], expected[1],
        "the shards ran different workloads"
    );
    drop(shards);

    let mut reopened = restart_shards(dir.path(), 3).await;
    for (shard, opened) in reopened.iter().enumerate() {
        assert_eq!(state_bytes(opened), expected[shard], "shard {shard}");
        assert_eq!(
            opened.state.last_applied().map(|id| id.index),
            Some(ENTRIES),
            "shard {shard}"
        );
    }
    assert!(reopened[1]
        .log
        .try_get_log_entries(1..=ENTRIES)
        .await
        .unwrap()
        .is_empty());
    let kept = reopened[2]
        .log
        .try_get_log_entries(1..=ENTRIES)
        .await
        .unwrap();
    assert_eq!(kept.len() as u64, ENTRIES);
    assert_eq!(files_in(&dir.path().join("shards/1/snapshots")), 1);
    assert_eq!(files_in(&dir.path().join("snapshots")), 0);
    assert!(reopened[1]
        .state_machine
        .get_current_snapshot()
        .await
        .unwrap()
        .is_some());
}

/// A store of one group (`open`, or a dir written before shard counts were
/// recorded) is shard 0 of one: `open_shards` with 1 gives the same state, and
/// with more is refused, so no key is looked for in a shard that lacks it.
#[tokio::test]
async fn a_store_of_one_group_opens_as_its_only_shard() {
    let dir = tempfile::tempdir().unwrap();
    let mut single = open_dir(dir.path()).await;
    run_workload(&mut single, 5).await;
    let expected = state_bytes(&single);
    drop(single);

    let shards = restart_shards(dir.path(), 1).await;
    assert_eq!(state_bytes(&shards[0]), expected);
    drop(shards);
    let refused = open_shards(&Options::new(dir.path().to_owned()), 4).await;
    assert!(refused.is_err(), "a one-shard store opened as four");
}

#[tokio::test]
async fn a_shard_count_out_of_range_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for asked in [0, MAX_SHARDS + 1] {
        let refused = open_shards(&Options::new(dir.path().to_owned()), asked).await;
        assert!(
            matches!(refused, Err(StorageError::ShardCount { asked: a, .. }) if a == asked),
            "{asked} shards: {refused:?}"
        );
    }
}

/// A dir keeps the shard count it was written with: opening it with another
/// is refused, and changes nothing (it still opens with its own).
#[tokio::test]
async fn a_store_refuses_another_shard_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = permitd_storage::Options::new(dir.path().to_owned());
    drop(
        permitd_storage::open_shards(&options, 3)
            .await
            .expect("opens with 3"),
    );
    for other in [1, 2, 4] {
        let error = permitd_storage::open_shards(&options, other)
            .await
            .expect_err("another count is refused");
        assert!(
            error.to_string().contains("written with 3 shard(s)"),
            "{error}"
        );
    }
    assert_eq!(
        permitd_storage::open_shards(&options, 3)
            .await
            .expect("reopens")
            .len(),
        3
    );
}

/// A dir written before shard counts were recorded holds one shard, and gets
/// its count recorded at its next open.
#[tokio::test]
async fn a_store_without_a_recorded_count_holds_one_shard() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = permitd_storage::Options::new(dir.path().to_owned());
    drop(permitd_storage::open(&options).await.expect("opens"));
    std::fs::remove_file(dir.path().join("shard_count")).expect("recorded");
    assert!(permitd_storage::open_shards(&options, 2).await.is_err());
    drop(
        permitd_storage::open(&options)
            .await
            .expect("opens as one shard"),
    );
    assert!(
        dir.path().join("shard_count").exists(),
        "recorded at that open"
    );
}
