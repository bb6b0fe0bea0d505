//! Recovery: a restarted store (its snapshot, then openraft's replay of the
//! committed entries after it) holds exactly the state it held before; snapshots
//! carry the state across stores; damaged data dirs fail to open with an error
//! naming the dir.

mod common;

use common::{
    blank, log_id, normal, open_dir, restart, run_workload, state_bytes, Rng, Workload, ENTRIES,
};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use permitd_core::contract::protocol::{Demand, GrantReport, PermitRequest, V1};
use permitd_storage::{open, Command, CommandResult, KeyRound, Options, StorageError};

#[tokio::test]
async fn a_restarted_store_replays_its_log_to_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = open_dir(dir.path()).await;
    let (entries, results) = run_workload(&mut first, 7).await;
    let expected_state = state_bytes(&first);
    let expected_applied = first.state_machine.applied_state().await.unwrap();
    let granted = results
        .iter()
        .filter(|result| matches!(result, CommandResult::Round { answers, .. } if answers.iter().flatten().any(|answer| !answer.grants.is_empty())))
        .count();
    assert!(
        granted > 50,
        "the workload must grant permits, {granted} rounds did"
    );
    drop(first);

    let mut reopened = restart(dir.path()).await;
    assert_eq!(reopened.state.last_applied(), Some(log_id(1, ENTRIES)));
    assert_eq!(
        reopened.state_machine.applied_state().await.unwrap(),
        expected_applied
    );
    assert_eq!(
        String::from_utf8(state_bytes(&reopened)).unwrap(),
        String::from_utf8(expected_state.clone()).unwrap()
    );
    let log = reopened.log.try_get_log_entries(..).await.unwrap();
    assert_eq!(log, entries, "the log survives a reopen");

    // Another store replays the same log in one batch: same answers, same bytes.
    let replay_dir = tempfile::tempdir().unwrap();
    let mut replay = open_dir(replay_dir.path()).await;
    let replay_results = replay.state_machine.apply(entries).await.unwrap();
    assert_eq!(replay_results, results, "apply is deterministic");
    assert_eq!(state_bytes(&replay), expected_state);
}

#[tokio::test]
async fn installed_snapshot_replaces_all_state_and_survives_a_reopen() {
    let leader_dir = tempfile::tempdir().unwrap();
    let mut leader = open_dir(leader_dir.path()).await;
    run_workload(&mut leader, 11).await;
    let mut builder = leader.state_machine.get_snapshot_builder().await;
    let snapshot = builder.build_snapshot().await.unwrap();
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, ENTRIES)));

    // The follower holds other state first: none of it may survive the install.
    let follower_dir = tempfile::tempdir().unwrap();
    let mut follower = open_dir(follower_dir.path()).await;
    run_workload(&mut follower, 12).await;
    assert_ne!(state_bytes(&follower), state_bytes(&leader));
    let mut notices = follower.state.subscribe();
    follower
        .state_machine
        .install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
        .await
        .unwrap();
    assert_eq!(state_bytes(&follower), state_bytes(&leader));
    let notice = notices.try_recv().expect("an install is announced");
    assert_eq!(notice.log_index, ENTRIES);
    let current = follower
        .state_machine
        .get_current_snapshot()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(current.meta, snapshot.meta);
    drop(follower);

    let mut reopened = open_dir(follower_dir.path()).await;
    assert_eq!(state_bytes(&reopened), state_bytes(&leader));
    assert_eq!(reopened.state.last_applied(), Some(log_id(1, ENTRIES)));
    let current = reopened
        .state_machine
        .get_current_snapshot()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(current.meta, snapshot.meta);
}

#[tokio::test]
async fn apply_announces_touched_keys_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let mut opened = open_dir(dir.path()).await;
    let mut notices = opened.state.subscribe();
    let mut workload = Workload::new(3);
    let command = workload.round(2, 3);
    let results = opened
        .state_machine
        .apply([normal(1, command)])
        .await
        .unwrap();
    let CommandResult::Round { answers, .. } = &results[0] else {
        panic!("{results:?}")
    };
    assert_eq!(answers.len(), 2);
    assert!(answers.iter().all(|answers| answers.len() == 3));
    let notice = notices.try_recv().unwrap();
    assert_eq!(notice.log_index, 1);
    assert_eq!(notice.keys.len(), 2);
    assert!(!notice.events.is_empty());
    assert_eq!(opened.state.last_applied(), Some(log_id(1, 1)));
}

/// The error opening `dir` gives.
async fn open_error(dir: &std::path::Path) -> StorageError {
    match open(&Options::new(dir.to_owned())).await {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(error) => error,
    }
}

/// The store refused to open `dir` with an error of `kind` that names the dir.
fn assert_refused_as(error: &StorageError, kind: &str, dir: &std::path::Path) {
    let matches_kind = match kind {
        "incompatible" => matches!(error, StorageError::Incompatible { .. }),
        "corrupt" => matches!(error, StorageError::Corrupt { .. }),
        other => panic!("unknown kind {other}"),
    };
    assert!(matches_kind, "expected {kind}: {error}");
    assert_names_dir(error, dir);
}

fn assert_names_dir(error: &StorageError, dir: &std::path::Path) {
    let message = error.to_string();
    assert!(message.contains(&dir.display().to_string()), "{message}");
}

/// Builds a snapshot of a workload's state and stops the store; returns the
/// snapshot file's path.
async fn store_with_a_snapshot(dir: &std::path::Path) -> std::path::PathBuf {
    let mut opened = open_dir(dir).await;
    run_workload(&mut opened, 9).await;
    let mut builder = opened.state_machine.get_snapshot_builder().await;
    builder.build_snapshot().await.unwrap();
    drop(opened);
    let mut files: Vec<_> = std::fs::read_dir(dir.join("snapshots"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.pop().unwrap()
}

#[tokio::test]
async fn a_store_whose_snapshot_is_overwritten_fails_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let file = store_with_a_snapshot(dir.path()).await;
    let mut rng = Rng::new(9);
    let garbage: Vec<u8> = (0..256 * 1024).map(|_| rng.next() as u8).collect();
    std::fs::write(file, garbage).unwrap();
    let error = open_error(dir.path()).await;
    assert_refused_as(&error, "corrupt", dir.path());
}

#[tokio::test]
async fn a_truncated_snapshot_is_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let file = store_with_a_snapshot(dir.path()).await;
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let error = open_error(dir.path()).await;
    assert_refused_as(&error, "corrupt", dir.path());
}

#[tokio::test]
async fn the_newest_snapshot_is_loaded_and_unfinished_writes_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let file = store_with_a_snapshot(dir.path()).await;
    let expected = state_bytes(&open_dir(dir.path()).await);
    // A crash between writing a newer file and removing the older one leaves
    // both; one cut while writing leaves a temporary file.
    let older = dir.path().join("snapshots").join("older.snap");
    let mut empty = open_dir(tempfile::tempdir().unwrap().path()).await;
    let mut builder = empty.state_machine.get_snapshot_builder().await;
    let snapshot = builder.build_snapshot().await.unwrap();
    std::fs::write(&older, snapshot.snapshot.into_inner()).unwrap();
    std::fs::write(file.with_extension("tmp"), b"half a snap").unwrap();
    drop(empty);
    let reopened = open_dir(dir.path()).await;
    assert_eq!(state_bytes(&reopened), expected);
    assert_eq!(reopened.state.last_applied(), Some(log_id(1, ENTRIES)));
}

#[tokio::test]
async fn a_second_open_of_a_dir_is_refused_while_the_first_lives() {
    let dir = tempfile::tempdir().unwrap();
    let first = open_dir(dir.path()).await;
    let error = open_error(dir.path()).await;
    assert!(matches!(error, StorageError::Locked { .. }), "{error}");
    assert_names_dir(&error, dir.path());
    drop(first);
    open_dir(dir.path()).await;
}

#[tokio::test]
async fn a_store_whose_log_vanished_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut opened = open_dir(dir.path()).await;
    run_workload(&mut opened, 4).await;
    drop(opened);
    std::fs::remove_dir_all(dir.path().join("wal")).unwrap();
    let error = open_error(dir.path()).await;
    assert_names_dir(&error, dir.path());
}

#[tokio::test]
async fn a_file_in_place_of_the_dir_fails_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    std::fs::write(&path, b"not a dir").unwrap();
    let error = open_error(&path).await;
    assert!(matches!(error, StorageError::CreateDir { .. }), "{error}");
    assert_names_dir(&error, &path);
}

#[tokio::test]
async fn another_format_version_in_the_marker_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open_dir(dir.path()).await);
    // Version 3 kept the state in sled: refused, never migrated.
    std::fs::write(dir.path().join("format_version"), "3\n").unwrap();
    let error = open_error(dir.path()).await;
    let message = error.to_string();
    assert!(message.contains("format version 3"), "{error}");
    assert!(message.contains("does not migrate"), "{error}");
    std::fs::write(dir.path().join("format_version"), "\x00garbage").unwrap();
    let error = open_error(dir.path()).await;
    assert_refused_as(&error, "incompatible", dir.path());
}

/// Copies the dir `tests/fixtures/<name>` into a new temp dir.
fn fixture(name: &str) -> tempfile::TempDir {
    fn copy(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for item in std::fs::read_dir(from).unwrap() {
            let item = item.unwrap();
            let target = to.join(item.file_name());
            if item.file_type().unwrap().is_dir() {
                copy(&item.path(), &target);
            } else {
                std::fs::copy(item.path(), target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    copy(&from, dir.path());
    dir
}

/// A data dir written by format 4, whose entries hold the command's map
/// (`tests/fixtures/format4/README.md` says how it was made), opens: its log
/// reads back and replays to the state it held, its marker says 5, and a new
/// entry logged after the old ones reads back beside them after a reopen.
#[tokio::test]
async fn a_data_dir_of_format_4_opens_and_replays_to_its_state() {
    let dir = fixture("format4");
    let mut opened = open_dir(dir.path()).await;
    let marker = std::fs::read_to_string(dir.path().join("format_version")).unwrap();
    assert_eq!(marker.trim(), "5");
    let old = opened.log.try_get_log_entries(0..).await.unwrap();
    assert!(old.len() >= 14, "{} entries", old.len());
    opened.state_machine.apply(old.clone()).await.unwrap();
    let usage = opened
        .state
        .read(|semaphores| semaphores.usage("account-7", 0));
    assert_eq!((usage.limit, usage.granted), (5, 0), "{usage:?}");

    let next = old.last().unwrap().log_id.index + 1;
    let added = normal(
        next,
        Command::RemoveGroup {
            key: "account-7".into(),
            group: "wf".into(),
        },
    );
    opened.log.blocking_append([added.clone()]).await.unwrap();
    drop(opened);
    let mut reopened = open_dir(dir.path()).await;
    let all = reopened.log.try_get_log_entries(0..).await.unwrap();
    assert_eq!(all[..old.len()], old[..]);
    assert_eq!(all[old.len()..], [added]);
}

#[tokio::test]
async fn truncate_and_purge_leave_no_hole_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut opened = open_dir(dir.path()).await;
    let entries: Vec<_> = (1..=30).map(blank).collect();
    opened.log.blocking_append(entries).await.unwrap();
    opened.log.truncate(log_id(1, 21)).await.unwrap();
    // A purge never passes the durable snapshot (storage/src/snapshot_reach.rs).
    opened
        .state_machine
        .apply((1..=10).map(blank))
        .await
        .unwrap();
    let mut builder = opened.state_machine.get_snapshot_builder().await;
    builder.build_snapshot().await.unwrap();
    opened.log.purge(log_id(1, 10)).await.unwrap();
    drop((builder, opened));

    let mut reopened = open_dir(dir.path()).await;
    let state = reopened.log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 10)));
    assert_eq!(state.last_log_id, Some(log_id(1, 20)));
    let indexes: Vec<u64> = reopened
        .log
        .try_get_log_entries(..)
        .await
        .unwrap()
        .iter()
        .map(|entry| entry.log_id.index)
        .collect();
    assert_eq!(indexes, (11..=20).collect::<Vec<_>>());
}

fn request(demand: u64, grants: Vec<GrantReport>) -> PermitRequest {
    PermitRequest {
        v: V1,
        client_id: "runner-1".to_owned(),
        request_id: None,
        demand: (demand > 0)
            .then(|| Demand {
                group: "wf-1".to_owned(),
                count: demand,
                oldest_at_ms: 1_000,
            })
            .into_iter()
            .collect(),
        grants,
        leases: None,
        wait_ms: None,
    }
}

fn round(now_ms: u64, keys: Vec<Vec<PermitRequest>>) -> Command {
    let keys = keys
        .into_iter()
        .map(|requests| KeyRound {
            key: "k".to_owned(),
            requests,
        })
        .collect();
    Command::Round {
        now_ms,
        syncs: Vec::new(),
        keys,
    }
}

/// The engine drops a key that holds nothing; a later call of the same entry
/// re-creates it. A restart (replay) must reach the same state.
#[tokio::test]
async fn a_key_emptied_and_refilled_by_one_entry_replays_alike() {
    let dir = tempfile::tempdir().unwrap();
    let mut opened = open_dir(dir.path()).await;
    let first = normal(1, round(10_000, vec![vec![request(2, vec![])]]));
    opened.log.blocking_append([first.clone()]).await.unwrap();
    let results = opened.state_machine.apply([first]).await.unwrap();
    let CommandResult::Round { answers, .. } = &results[0] else {
        panic!("{results:?}")
    };
    let grant = &answers[0][0].grants[0];
    let release = GrantReport {
        grant_id: grant.grant_id.to_string(),
        claimed: 2,
        released: 2,
    };
    let refill = normal(
        2,
        round(
            11_000,
            vec![vec![request(0, vec![release])], vec![request(1, vec![])]],
        ),
    );
    opened.log.blocking_append([refill.clone()]).await.unwrap();
    opened.state_machine.apply([refill]).await.unwrap();
    opened.log.save_committed(Some(log_id(1, 2))).await.unwrap();
    let grants = opened
        .state
        .read(|semaphores| semaphores.key("k").unwrap().grants().len());
    assert_eq!(grants, 1, "the released grant is gone, the new one is held");
    let expected = String::from_utf8(state_bytes(&opened)).unwrap();
    drop(opened);

    let restarted = restart(dir.path()).await;
    assert_eq!(
        String::from_utf8(state_bytes(&restarted)).unwrap(),
        expected
    );
}

/// A round and a delete of its key applied in one batch: the store says the
/// key was deleted after the round, so the leader fails the round's answers
/// (their grants went with the key) instead of handing them out.
#[tokio::test]
async fn a_delete_applied_after_a_round_is_told_to_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut opened = open_dir(dir.path()).await;
    let delete = |now_ms| Command::DeleteKey {
        now_ms,
        key: "k".to_owned(),
        force: true,
        request_id: None,
    };
    let entries = vec![
        normal(1, round(10_000, vec![vec![request(3, vec![])]])),
        normal(2, delete(10_001)),
        normal(3, round(10_002, vec![vec![request(1, vec![])]])),
    ];
    opened.log.blocking_append(entries.clone()).await.unwrap();
    opened.state_machine.apply(entries).await.unwrap();
    assert_eq!(
        opened.state.deleted_after("k", 1),
        Some(2),
        "round 1 is stale"
    );
    assert_eq!(
        opened.state.deleted_after("k", 3),
        None,
        "round 3 came after"
    );
    assert_eq!(opened.state.deleted_after("other", 0), None);
    let granted = opened
        .state
        .read(|semaphores| semaphores.usage("k", 10_002).granted);
    assert_eq!(granted, 1, "only the round after the delete holds permits");
    // Deleted again: round 3's grant goes (told); then a key with nothing
    // kept for it, whose delete changes nothing and tells nothing.
    let again = vec![normal(4, delete(10_003)), normal(5, delete(10_004))];
    opened.log.blocking_append(again.clone()).await.unwrap();
    opened.state_machine.apply(again).await.unwrap();
    assert_eq!(opened.state.deleted_after("k", 3), Some(4));
    assert_eq!(opened.state.deleted_after("k", 4), None);
}
