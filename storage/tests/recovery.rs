//! Recovery: a reopened store holds exactly the state a fresh replay of its log
//! builds; snapshots carry the state across stores; damaged data dirs fail to open
//! with an error naming the dir.

mod common;

use std::collections::BTreeSet;

use common::{blank, log_id, normal, open_dir, raw_sled, state_bytes, Rng, Workload};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{Entry, EntryPayload, Membership, RaftLogReader, RaftSnapshotBuilder};
use permitd_core::protocol::{Demand, GrantReport, PermitRequest, V1};
use permitd_storage::{
    open, Command, CommandResult, KeyRound, Opened, Options, StorageError, TypeConfig,
};

const ENTRIES: u64 = 400;

/// Appends and applies a workload on `opened`, in apply batches of 1 to 8 entries.
/// Returns the entries and each one's result.
async fn run_workload(
    opened: &mut Opened,
    start: u64,
) -> (Vec<Entry<TypeConfig>>, Vec<CommandResult>) {
    let mut workload = Workload::new(start);
    let mut rng = Rng::new(start);
    let members = Membership::new(vec![BTreeSet::from([1, 2, 3])], None);
    let mut entries = vec![
        blank(1),
        Entry {
            log_id: log_id(1, 2),
            payload: EntryPayload::Membership(members),
        },
    ];
    let mut results = opened.state_machine.apply(entries.clone()).await.unwrap();
    opened.log.blocking_append(entries.clone()).await.unwrap();
    let mut index = 3;
    while index <= ENTRIES {
        let batch_len = (1 + rng.below(8)).min(ENTRIES + 1 - index);
        let batch: Vec<Entry<TypeConfig>> = (index..index + batch_len)
            .map(|index| normal(index, workload.next_command()))
            .collect();
        opened.log.blocking_append(batch.clone()).await.unwrap();
        let batch_results = opened.state_machine.apply(batch.clone()).await.unwrap();
        for (entry, result) in batch.iter().zip(&batch_results) {
            let EntryPayload::Normal(command) = &entry.payload else {
                unreachable!()
            };
            workload.observe(command, result);
        }
        entries.extend(batch);
        results.extend(batch_results);
        index += batch_len;
    }
    (entries, results)
}

#[tokio::test]
async fn reopened_store_equals_a_fresh_replay_of_its_log() {
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

    let mut reopened = open_dir(dir.path()).await;
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

/// The error opening `dir` gives, past any lock a just-dropped store still holds
/// (see `common::open_dir`).
async fn open_error(dir: &std::path::Path) -> StorageError {
    let options = Options::new(dir.to_owned());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match open(&options).await {
            Ok(_) => panic!("{} opened", dir.display()),
            Err(error)
                if error.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(error) => return error,
        }
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

#[tokio::test]
async fn garbage_files_fail_to_open_with_the_dir_named() {
    let dir = tempfile::tempdir().unwrap();
    let sled_dir = dir.path().join("sled");
    std::fs::create_dir_all(sled_dir.join("blobs")).unwrap();
    std::fs::write(
        sled_dir.join("conf"),
        b"this is not a sled config\n\0\x01\x02",
    )
    .unwrap();
    std::fs::write(sled_dir.join("db"), vec![0xA5; 64 * 1024]).unwrap();
    let error = open_error(dir.path()).await;
    assert_names_dir(&error, dir.path());
}

#[tokio::test]
async fn a_store_whose_data_file_is_overwritten_fails_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut opened = open_dir(dir.path()).await;
    run_workload(&mut opened, 9).await;
    drop(opened);
    let mut rng = Rng::new(9);
    let garbage: Vec<u8> = (0..256 * 1024).map(|_| rng.next() as u8).collect();
    std::fs::write(dir.path().join("sled").join("db"), garbage).unwrap();
    let error = open_error(dir.path()).await;
    assert_refused_as(&error, "corrupt", dir.path());
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
async fn another_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open_dir(dir.path()).await);
    {
        let db = raw_sled(dir.path());
        db.insert(permitd_storage::keys::FORMAT_VERSION, &99u32.to_be_bytes())
            .unwrap();
        db.flush().unwrap();
    }
    let error = open_error(dir.path()).await;
    assert!(
        matches!(error, StorageError::Incompatible { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("format version 99"), "{error}");
    assert_names_dir(&error, dir.path());
}

#[tokio::test]
async fn another_format_version_in_the_marker_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(open_dir(dir.path()).await);
    // Version 1 is the JSON format of earlier builds: refused, never migrated.
    std::fs::write(dir.path().join("format_version"), "1\n").unwrap();
    let error = open_error(dir.path()).await;
    let message = error.to_string();
    assert!(message.contains("format version 1"), "{error}");
    assert!(message.contains("does not migrate"), "{error}");
    std::fs::write(dir.path().join("format_version"), "\x00garbage").unwrap();
    let error = open_error(dir.path()).await;
    assert_refused_as(&error, "incompatible", dir.path());
}

#[tokio::test]
async fn a_foreign_sled_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = raw_sled(dir.path());
        db.open_tree("somebody_else")
            .unwrap()
            .insert(b"k", b"v")
            .unwrap();
        db.flush().unwrap();
    }
    let error = open_error(dir.path()).await;
    assert_refused_as(&error, "incompatible", dir.path());
}

#[tokio::test]
async fn an_undecodable_state_row_is_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut opened = open_dir(dir.path()).await;
    run_workload(&mut opened, 5).await;
    drop(opened);
    {
        let db = raw_sled(dir.path());
        let state = db.open_tree("state").unwrap();
        let (row, _) = state
            .scan_prefix([permitd_storage::keys::TAG_KEY])
            .next()
            .unwrap()
            .unwrap();
        state.insert(row, b"{not json".to_vec()).unwrap();
        db.flush().unwrap();
    }
    let error = open_error(dir.path()).await;
    assert_refused_as(&error, "corrupt", dir.path());
}

#[tokio::test]
async fn truncate_and_purge_leave_no_hole_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut opened = open_dir(dir.path()).await;
    let entries: Vec<_> = (1..=30).map(blank).collect();
    opened.log.blocking_append(entries).await.unwrap();
    opened.log.truncate(log_id(1, 21)).await.unwrap();
    opened.log.purge(log_id(1, 10)).await.unwrap();
    drop(opened);

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

/// The engine drops a key that holds nothing and forgets its pending changes; a
/// later call of the same entry re-creates it. The dropped key's rows must still
/// be deleted.
#[tokio::test]
async fn a_key_emptied_and_refilled_by_one_entry_leaves_no_stale_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut opened = open_dir(dir.path()).await;
    let results = opened
        .state_machine
        .apply([normal(1, round(10_000, vec![vec![request(2, vec![])]]))])
        .await
        .unwrap();
    let CommandResult::Round { answers, .. } = &results[0] else {
        panic!("{results:?}")
    };
    let grant = &answers[0][0].grants[0];
    let release = GrantReport {
        grant_id: grant.grant_id.to_string(),
        claimed: 2,
        released: 2,
    };
    let refill = round(
        11_000,
        vec![vec![request(0, vec![release])], vec![request(1, vec![])]],
    );
    opened
        .state_machine
        .apply([normal(2, refill)])
        .await
        .unwrap();
    let grants = opened
        .state
        .read(|semaphores| semaphores.key("k").unwrap().grants().len());
    assert_eq!(grants, 1, "the released grant is gone, the new one is held");
    let expected = String::from_utf8(state_bytes(&opened)).unwrap();
    drop(opened);

    let reopened = open_dir(dir.path()).await;
    assert_eq!(String::from_utf8(state_bytes(&reopened)).unwrap(), expected);
}
