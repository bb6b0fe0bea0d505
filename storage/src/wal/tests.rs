//! Tests of the write-ahead log: recovery from torn and damaged tails,
//! rollover and purge, truncation, segments that come back after a lost
//! unlink, holes, and group commit.

use std::path::{Path, PathBuf};

use openraft::{CommittedLeaderId, EntryPayload};
use tokio::sync::oneshot;

use super::*;
use crate::disk::OsDisk;

/// Small enough that a few dozen blank entries span many segments.
const TINY_SEGMENT_BYTES: u64 = 256;

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

fn blanks(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<Entry<TypeConfig>> {
    indexes.map(|index| blank(term, index)).collect()
}

fn open(dir: &Path, segment_max_bytes: u64) -> Wal {
    let options = WalOptions {
        segment_max_bytes,
        ..WalOptions::new(Presence::CreateIfMissing)
    };
    Wal::open(dir, options).expect("open the wal")
}

/// Appends `entries` and returns a receiver of the durability callback.
fn append(wal: &Wal, entries: Vec<Entry<TypeConfig>>) -> oneshot::Receiver<Result<(), SyncFailed>> {
    let (sender, receiver) = oneshot::channel();
    let done: AppendDone = Box::new(move |result| {
        let _ = sender.send(result);
    });
    wal.append(0, entries, done).expect("append");
    receiver
}

async fn append_synced(wal: &Wal, entries: Vec<Entry<TypeConfig>>) {
    append(wal, entries).await.unwrap().expect("synced");
}

fn log_ids(wal: &Wal) -> Vec<LogId<NodeId>> {
    let entries = wal.read(0, .., usize::MAX, u64::MAX).expect("read");
    entries.into_iter().map(|entry| entry.log_id).collect()
}

fn expected(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<LogId<NodeId>> {
    indexes.map(|index| log_id(term, index)).collect()
}

fn segment_paths(dir: &Path) -> Vec<PathBuf> {
    segment::list(&OsDisk, dir)
        .unwrap()
        .into_iter()
        .map(|(_, path)| path)
        .collect()
}

/// The active segment's file and where its records end (zeros may follow).
fn active_records(wal: &Wal) -> (PathBuf, u64) {
    let state = wal.lock();
    (state.active.segment.path.clone(), state.active.len)
}

/// The location of entry `index`, as the open log's index has it.
fn location(wal: &Wal, index: u64) -> Location {
    wal.lock().shards[&0].index[&index]
}

/// Copies every file of `from` into a new temp dir.
fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for file in std::fs::read_dir(from).unwrap() {
        let file = file.unwrap();
        std::fs::copy(file.path(), to.path().join(file.file_name())).unwrap();
    }
    to
}

/// A commit writes nothing: its record goes ahead of the next write's, once
/// for however many commits came before it, and an unclean stop in between
/// keeps the committed id written before.
#[tokio::test]
async fn a_committed_id_is_written_with_the_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    append_synced(&wal, blanks(1, 1..=3)).await;
    let (_, before) = active_records(&wal);
    wal.save_committed(0, Some(log_id(1, 2))).unwrap();
    wal.save_committed(0, Some(log_id(1, 3))).unwrap();
    assert_eq!(active_records(&wal).1, before, "no record written yet");
    assert_eq!(wal.raft_state(0).committed, Some(log_id(1, 3)));
    let crashed = copy_dir(dir.path());
    let reopened = open(crashed.path(), SEGMENT_MAX_BYTES);
    assert_eq!(reopened.raft_state(0).committed, None);
    assert_eq!(log_ids(&reopened), expected(1, 1..=3));

    append_synced(&wal, blanks(1, 4..=4)).await;
    let mut committed_record = Vec::new();
    record::push_committed(&mut committed_record, 0, &Some(log_id(1, 3))).unwrap();
    let entry = location(&wal, 4);
    assert_eq!(entry.offset, before + committed_record.len() as u64);
    assert_eq!(active_records(&wal).1, entry.offset + entry.len);
    let crashed = copy_dir(dir.path());
    let reopened = open(crashed.path(), SEGMENT_MAX_BYTES);
    assert_eq!(reopened.raft_state(0).committed, Some(log_id(1, 3)));
    assert_eq!(log_ids(&reopened), expected(1, 1..=4));
}

#[tokio::test]
async fn entries_vote_and_committed_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    append_synced(&wal, blanks(1, 1..=3)).await;
    append_synced(&wal, blanks(1, 4..=4)).await;
    let vote = Vote::new_committed(1, 1);
    wal.save_vote(0, vote).await.unwrap();
    wal.save_committed(0, Some(log_id(1, 3))).unwrap();
    drop(wal);

    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    assert_eq!(log_ids(&wal), expected(1, 1..=4));
    let raft = wal.raft_state(0);
    assert_eq!(raft.vote, Some(vote));
    assert_eq!(raft.committed, Some(log_id(1, 3)));
    assert_eq!(raft.purged, None);
    assert_eq!(wal.last_log_id(0), Some(log_id(1, 4)));
}

#[tokio::test]
async fn a_crc_mismatch_ends_the_log_there() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    append_synced(&wal, blanks(1, 1..=5)).await;
    let damaged = location(&wal, 4);
    drop(wal);
    let path = dir.path().join(segment::file_name(damaged.segment));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(damaged.offset + damaged.len - 1) as usize] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();

    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    assert_eq!(log_ids(&wal), expected(1, 1..=3));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), damaged.offset);
    // The log goes on from the cut.
    append_synced(&wal, blanks(1, 4..=4)).await;
    assert_eq!(log_ids(&wal), expected(1, 1..=4));
}

#[tokio::test]
async fn a_torn_tail_is_cut_at_every_byte_offset_of_the_last_record() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    for index in 1..=3 {
        append_synced(&wal, blanks(1, index..=index)).await;
    }
    let last = location(&wal, 3);
    drop(wal);
    let name = segment::file_name(last.segment);
    for cut in last.offset..last.offset + last.len {
        let copy = copy_dir(dir.path());
        let path = copy.path().join(&name);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(cut).unwrap();
        drop(file);
        let wal = open(copy.path(), SEGMENT_MAX_BYTES);
        assert_eq!(log_ids(&wal), expected(1, 1..=2), "cut at {cut}");
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(
            len, last.offset,
            "cut at {cut}: the file is truncated at the record"
        );
    }
}

#[tokio::test]
async fn damage_in_an_older_segment_deletes_every_later_one() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    for index in 1..=20 {
        append_synced(&wal, blanks(1, index..=index)).await;
    }
    let damaged = location(&wal, 5);
    assert!(location(&wal, 20).segment > damaged.segment + 1);
    drop(wal);
    let path = dir.path().join(segment::file_name(damaged.segment));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[damaged.offset as usize + 4] ^= 0xFF; // the CRC
    std::fs::write(&path, bytes).unwrap();

    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    assert_eq!(log_ids(&wal), expected(1, 1..=4));
    let sequences: Vec<u64> = wal.lock().segments.keys().copied().collect();
    assert_eq!(
        sequences.last(),
        Some(&(damaged.segment + 1)),
        "only the damaged segment's predecessors, itself and a new active one remain"
    );
}

#[tokio::test]
async fn rollover_then_purge_deletes_old_segments_and_a_reopen_restores_everything() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    let vote = Vote::new_committed(2, 1);
    wal.save_vote(0, vote).await.unwrap();
    for first in (1..=100).step_by(4) {
        append_synced(&wal, blanks(2, first..=first + 3)).await;
    }
    wal.save_committed(0, Some(log_id(2, 90))).unwrap();
    let before = segment_paths(dir.path()).len();
    assert!(before > 10, "tiny segments roll over: {before} segments");

    wal.purge(0, log_id(2, 60)).await.unwrap();
    let after = segment_paths(dir.path());
    assert!(
        after.len() < before / 2,
        "{} of {before} segments left",
        after.len()
    );
    let oldest_live = location(&wal, 61).segment;
    assert_eq!(after[0], dir.path().join(segment::file_name(oldest_live)));
    assert_eq!(log_ids(&wal), expected(2, 61..=100));
    drop(wal);

    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    assert_eq!(log_ids(&wal), expected(2, 61..=100));
    let raft = wal.raft_state(0);
    assert_eq!(raft.vote, Some(vote));
    assert_eq!(raft.committed, Some(log_id(2, 90)));
    assert_eq!(raft.purged, Some(log_id(2, 60)));
}

#[tokio::test]
async fn purging_past_the_last_entry_leaves_the_purge_point_as_the_last_log_id() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    append_synced(&wal, blanks(1, 1..=10)).await;
    wal.purge(0, log_id(1, 20)).await.unwrap();
    assert_eq!(log_ids(&wal), vec![]);
    assert_eq!(wal.last_log_id(0), Some(log_id(1, 20)));
    assert_eq!(
        segment_paths(dir.path()).len(),
        1,
        "only the active segment is left"
    );
    // Entries at or below the purge point are not stored again.
    append_synced(&wal, blanks(1, 19..=21)).await;
    assert_eq!(log_ids(&wal), expected(1, 21..=21));
    drop(wal);
    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    assert_eq!(log_ids(&wal), expected(1, 21..=21));
    assert_eq!(wal.raft_state(0).purged, Some(log_id(1, 20)));
}

#[tokio::test]
async fn truncate_then_append_then_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    append_synced(&wal, blanks(1, 1..=10)).await;
    wal.truncate(0, 6).await.unwrap();
    assert_eq!(log_ids(&wal), expected(1, 1..=5));
    append_synced(&wal, blanks(2, 6..=8)).await;
    // An overwrite without a truncate (openraft's suite does this) drops the rest.
    append_synced(&wal, blanks(3, 8..=8)).await;
    let mut wanted = expected(1, 1..=5);
    wanted.extend(expected(2, 6..=7));
    wanted.push(log_id(3, 8));
    assert_eq!(log_ids(&wal), wanted);
    drop(wal);

    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    assert_eq!(log_ids(&wal), wanted);
    assert_eq!(wal.last_log_id(0), Some(log_id(3, 8)));
}

/// A read that spans entries older than the cache of recent entries and
/// entries in it returns the same as a read of the same range after a reopen,
/// when every entry comes from the segment files.
#[tokio::test]
async fn a_read_across_the_cache_boundary_returns_what_the_disk_holds() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    let count = recent::MAX_RECENT_ENTRIES as u64 + 500;
    append_synced(&wal, blanks(1, 1..=count)).await;
    wal.truncate(0, count - 10).await.unwrap();
    append_synced(&wal, blanks(2, count - 10..=count)).await;
    let before = wal.read(0, .., usize::MAX, u64::MAX).unwrap();
    let some = wal.read(0, 400..=600, 50, u64::MAX).unwrap();
    let few_bytes = wal.read(0, count - 20.., usize::MAX, 1).unwrap();
    drop(wal);

    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    assert_eq!(before.len() as u64, count);
    assert_eq!(wal.read(0, .., usize::MAX, u64::MAX).unwrap(), before);
    assert_eq!(wal.read(0, 400..=600, 50, u64::MAX).unwrap(), some);
    assert_eq!(wal.read(0, count - 20.., usize::MAX, 1).unwrap(), few_bytes);
    assert_eq!(few_bytes.len(), 1);
    assert_eq!(before.last().unwrap().log_id, log_id(2, count));
}

/// Runs `scenario` on a log, then purges up to `purge_to`, then copies back
/// the segments the purge deleted (as a crash that lost the unlinks would):
/// the newest one alone (what a crash can do: each unlink is fsynced before
/// the next), and all of them. Either way the reopened log must be the same.
async fn assert_resurrection_changes_nothing<Scenario, Done>(
    scenario: Scenario,
    purge_to: LogId<NodeId>,
) where
    Scenario: FnOnce(Wal) -> Done,
    Done: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    wal.save_vote(0, Vote::new_committed(1, 1)).await.unwrap();
    append_synced(&wal, blanks(1, 1..=40)).await;
    scenario(wal.clone()).await;
    let saved = copy_dir(dir.path());
    wal.purge(0, purge_to).await.unwrap();
    drop(wal);
    let deleted: Vec<PathBuf> = segment_paths(saved.path())
        .into_iter()
        .filter(|path| !dir.path().join(path.file_name().unwrap()).exists())
        .collect();
    assert!(!deleted.is_empty(), "the purge deletes segments");
    let clean = open(dir.path(), TINY_SEGMENT_BYTES);
    let (clean_ids, clean_raft) = (log_ids(&clean), clean.raft_state(0));
    assert_eq!(clean_raft.purged, Some(purge_to));
    drop(clean);

    for restored in [&deleted[deleted.len() - 1..], &deleted[..]] {
        for path in restored {
            std::fs::copy(path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
        let reopened = open(dir.path(), TINY_SEGMENT_BYTES);
        assert_eq!(log_ids(&reopened), clean_ids, "{} restored", restored.len());
        assert_eq!(reopened.raft_state(0), clean_raft);
    }
}

#[tokio::test]
async fn segments_that_reappear_after_a_purge_replay_to_the_same_state() {
    let scenario = |wal: Wal| async move {
        for index in 41..=50 {
            append_synced(&wal, blanks(1, index..=index)).await;
        }
    };
    assert_resurrection_changes_nothing(scenario, log_id(1, 30)).await;
}

#[tokio::test]
async fn reappearing_segments_do_not_bring_back_truncated_entries() {
    let scenario = |wal: Wal| async move {
        wal.truncate(0, 20).await.unwrap();
        append_synced(&wal, blanks(2, 20..=45)).await;
    };
    assert_resurrection_changes_nothing(scenario, log_id(2, 30)).await;
}

#[tokio::test]
async fn a_hole_is_reported_as_corrupt_naming_the_dir() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    for index in 1..=30 {
        append_synced(&wal, blanks(1, index..=index)).await;
    }
    let middle = location(&wal, 15).segment;
    assert!(location(&wal, 1).segment < middle && middle < location(&wal, 30).segment);
    drop(wal);
    std::fs::remove_file(dir.path().join(segment::file_name(middle))).unwrap();

    let options = WalOptions {
        segment_max_bytes: TINY_SEGMENT_BYTES,
        ..WalOptions::new(Presence::MustExist)
    };
    let error = Wal::open(dir.path(), options).expect_err("a hole must not open");
    assert!(matches!(error, StorageError::Corrupt { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains(&dir.path().display().to_string()),
        "{message}"
    );
    assert!(message.contains("hole"), "{message}");
}

#[tokio::test]
async fn a_lost_log_is_corrupt_when_the_store_must_have_one() {
    let dir = tempfile::tempdir().unwrap();
    let options = WalOptions::new(Presence::MustExist);
    let missing = Wal::open(&dir.path().join("wal"), options.clone()).expect_err("missing dir");
    assert!(matches!(missing, StorageError::Corrupt { .. }), "{missing}");
    let empty = Wal::open(dir.path(), options).expect_err("no segment");
    assert!(matches!(empty, StorageError::Corrupt { .. }), "{empty}");
}

#[tokio::test]
async fn group_commit_covers_many_appends_with_few_fdatasyncs() {
    const APPENDS: u64 = 500;
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    let (_, fdatasyncs_before) = wal.sync_counts();
    let mut pending = Vec::new();
    for index in 1..=APPENDS {
        pending.push(append(&wal, blanks(1, index..=index)));
        // Readers see an entry as soon as its append returned, synced or not.
        assert_eq!(
            wal.read(0, index..=index, 1, u64::MAX).unwrap()[0].log_id,
            log_id(1, index)
        );
    }
    for receiver in pending {
        receiver.await.unwrap().expect("synced");
    }
    let (rounds, fdatasyncs) = wal.sync_counts();
    let fdatasyncs = fdatasyncs - fdatasyncs_before;
    assert!(rounds >= 1 && fdatasyncs >= 1);
    assert!(
        fdatasyncs < APPENDS,
        "{fdatasyncs} fdatasyncs for {APPENDS} appends: no grouping"
    );
    assert_eq!(log_ids(&wal), expected(1, 1..=APPENDS));
}

#[tokio::test]
async fn completions_run_in_append_order() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    let order = Arc::new(Mutex::new(Vec::new()));
    let (sender, receiver) = oneshot::channel();
    let mut sender = Some(sender);
    for index in 1..=100u64 {
        let order = Arc::clone(&order);
        let sender = (index == 100).then(|| sender.take()).flatten();
        let done: AppendDone = Box::new(move |result| {
            result.expect("synced");
            order.lock().unwrap().push(index);
            if let Some(sender) = sender {
                let _ = sender.send(());
            }
        });
        wal.append(0, blanks(1, index..=index), done).unwrap();
    }
    receiver.await.unwrap();
    assert_eq!(*order.lock().unwrap(), (1..=100).collect::<Vec<_>>());
}

/// A leader's early appends are tasks started on the Raft runtime's one worker
/// just before its entries are written; the write then wakes the group
/// commit's task, which syncs inline on that worker. Told of the sends, the
/// task lets them run first, two hops deep as an append's are (its task hands
/// the frame to the peer stream's writer), so they leave before the worker
/// blocks. Without [`Wal::sends_first`] tokio runs the task woken last first:
/// the sync, then the sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn sends_started_before_a_write_leave_before_its_inline_sync() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    let order = Arc::new(Mutex::new(Vec::new()));
    let on_worker = {
        let order = Arc::clone(&order);
        async move {
            let (frames, mut queued) = tokio::sync::mpsc::channel::<()>(1);
            let written = Arc::clone(&order);
            let writer = tokio::spawn(async move {
                queued.recv().await.expect("a frame");
                written.lock().unwrap().push("sent");
            });
            tokio::task::yield_now().await; // the writer waits for frames
            drop(tokio::spawn(async move { frames.send(()).await }));
            wal.sends_first();
            let (sender, synced) = oneshot::channel();
            let done: AppendDone = Box::new(move |result| {
                result.expect("synced");
                order.lock().unwrap().push("synced");
                let _ = sender.send(());
            });
            wal.append(0, blanks(1, 1..=1), done).unwrap();
            synced.await.unwrap();
            writer.await.unwrap();
        }
    };
    tokio::spawn(on_worker).await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["sent", "synced"]);
}

#[tokio::test]
async fn a_failed_log_refuses_writes_and_fails_their_callbacks() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    append_synced(&wal, blanks(1, 1..=1)).await;
    wal.inner.sync.fail(&StorageError::WalFailed(
        "simulated fsync failure".to_owned(),
    ));
    let (sender, receiver) = oneshot::channel();
    let refused = wal.append(
        0,
        blanks(1, 2..=2),
        Box::new(move |result| {
            let _ = sender.send(result);
        }),
    );
    assert!(
        matches!(refused, Err(StorageError::WalFailed(_))),
        "{refused:?}"
    );
    assert!(
        receiver.await.unwrap().is_err(),
        "the callback hears of the failure"
    );
    assert!(wal.save_vote(0, Vote::new_committed(1, 1)).await.is_err());
    assert!(wal.truncate(0, 1).await.is_err());
    assert_eq!(log_ids(&wal), expected(1, 1..=1), "reads still work");
}

#[tokio::test]
async fn limited_reads_stop_at_the_byte_bound_but_return_at_least_one_entry() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), TINY_SEGMENT_BYTES);
    append_synced(&wal, blanks(1, 1..=20)).await;
    let record_len = location(&wal, 1).len;
    assert_eq!(wal.read(0, 1..=20, usize::MAX, 1).unwrap().len(), 1);
    assert_eq!(
        wal.read(0, 1..=20, usize::MAX, 3 * record_len)
            .unwrap()
            .len(),
        3
    );
    assert_eq!(wal.read(0, 1..=20, 5, u64::MAX).unwrap().len(), 5);
    assert_eq!(wal.read(0, 25.., usize::MAX, u64::MAX).unwrap().len(), 0);
}

#[tokio::test]
async fn out_of_order_batches_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    append_synced(&wal, blanks(1, 1..=3)).await;
    let gap = wal.append(0, blanks(1, 5..=5), Box::new(|_| {}));
    assert!(matches!(gap, Err(StorageError::OutOfOrder(_))), "{gap:?}");
    let unordered = wal.append(0, vec![blank(1, 4), blank(1, 6)], Box::new(|_| {}));
    assert!(
        matches!(unordered, Err(StorageError::OutOfOrder(_))),
        "{unordered:?}"
    );
    append_synced(&wal, blanks(1, 4..=4)).await;
    drop(wal);
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    assert_eq!(log_ids(&wal), expected(1, 1..=4));
}

#[tokio::test]
async fn an_entry_that_skips_an_index_is_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    append_synced(&wal, blanks(1, 1..=3)).await;
    let (active, records_end) = active_records(&wal);
    let next = wal.lock().active.segment.sequence + 1;
    drop(wal);
    // Rolled past as the writer does: cut to its records.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&active)
        .unwrap();
    file.set_len(records_end).unwrap();
    drop(file);
    // A segment as a buggy writer would leave it: entry 5 after entry 3.
    let mut bytes = head_records(&BTreeMap::from([(0, ShardLog::default())])).unwrap();
    record::push_entry(&mut bytes, 0, &blank(1, 5)).unwrap();
    std::fs::write(dir.path().join(segment::file_name(next)), bytes).unwrap();

    let error = Wal::open(dir.path(), WalOptions::new(Presence::MustExist)).expect_err("a hole");
    assert!(matches!(error, StorageError::Corrupt { .. }), "{error}");
    assert!(error.to_string().contains("entry 5"), "{error}");
}

#[tokio::test]
async fn the_active_segment_is_zero_filled_ahead_and_a_reopen_cuts_the_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    append_synced(&wal, blanks(1, 1..=3)).await;
    let (path, records_end) = active_records(&wal);
    let file_len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(
        file_len,
        records_end + super::ZERO_AHEAD_BYTES,
        "the records land inside the file"
    );
    append_synced(&wal, blanks(1, 4..=6)).await;
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        file_len,
        "no growth while the zeros last"
    );
    let (_, records_end) = active_records(&wal);
    drop(wal);

    let wal = open(dir.path(), SEGMENT_MAX_BYTES);
    assert_eq!(log_ids(&wal), expected(1, 1..=6));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), records_end);
}
