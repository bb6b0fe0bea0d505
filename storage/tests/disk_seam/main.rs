//! The disk seam end to end: a store on a disk in memory (`fake_disk.rs`)
//! with `Exec::Inline`, driven through openraft's storage API on the test's
//! one thread, as the deterministic simulator will drive it. A crash of the
//! fake keeps exactly what was synced; the store must come back with exactly
//! what it acknowledged, and never leave the test's thread.

#[path = "../common/mod.rs"]
mod common;
mod fake_disk;
mod shards;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use common::{blank, log_id};
use fake_disk::FakeDisk;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{RaftLogReader, Vote};
use permitd_storage::disk::{FileKind, OpenMode};
use permitd_storage::{open, Disk, Exec, Opened, Options, WAL_DIR};

const DIR: &str = "/sim/node-1";

fn options(disk: &Arc<FakeDisk>, dir: &str) -> Options {
    Options::with_disk(dir, Arc::clone(disk) as Arc<dyn Disk>, Exec::Inline)
}

async fn open_on(disk: &Arc<FakeDisk>, dir: &str) -> Opened {
    open(&options(disk, dir))
        .await
        .unwrap_or_else(|error| panic!("open {dir}: {error}"))
}

/// The indexes of the log's entries, read without yielding (a yield would
/// let the group commit task run).
async fn indexes(opened: &mut Opened) -> Vec<u64> {
    let entries = opened.log.limited_get_log_entries(0, 1_000).await.unwrap();
    entries.iter().map(|entry| entry.log_id.index).collect()
}

/// Polls `future` once. An append writes its entries and then waits for the
/// group commit, a task that cannot run before this one yields.
fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

/// Every call of the disk came from the test's own thread.
fn assert_only_this_thread(disk: &FakeDisk) {
    let threads = disk.threads();
    assert_eq!(threads.len(), 1, "the disk was called from {threads:?}");
    assert!(threads.contains(&std::thread::current().id()));
}

/// Threads of the sync loop or of tokio's blocking pool in this process (every
/// test here runs inline, so there must be none).
fn storage_threads() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name == "permitd-wal-sync" || name.starts_with("tokio-runtime"))
        .collect()
}

#[test]
fn the_fake_disk_keeps_only_what_was_synced() {
    let disk = FakeDisk::new();
    let path = |name: &str| Path::new("/a").join(name);
    disk.create_dir_all(Path::new("/a")).unwrap();
    disk.sync_dir(Path::new("/")).unwrap();
    let kept = disk.open(&path("kept"), OpenMode::CreateNew).unwrap();
    kept.write_all_at(b"synced", 0).unwrap();
    kept.sync_data().unwrap();
    disk.sync_dir(Path::new("/a")).unwrap();
    kept.write_all_at(b", not synced", 6).unwrap();
    let lost = disk.open(&path("lost"), OpenMode::CreateNew).unwrap();
    lost.write_all_at(b"synced, but not its name", 0).unwrap();
    lost.sync_data().unwrap();
    disk.create_dir_all(&path("b")).unwrap();
    disk.crash();
    assert_eq!(disk.read(&path("kept")).unwrap(), b"synced");
    assert!(disk.read(&path("lost")).is_err());
    assert!(disk.kind(&path("b")).is_err());
    assert!(kept.len().is_err(), "handles die with the crash");

    disk.remove_file(&path("kept")).unwrap();
    let new = disk.open(&path("new"), OpenMode::CreateOrTruncate).unwrap();
    new.write_all_at(b"new", 0).unwrap();
    new.sync_all().unwrap();
    disk.crash();
    assert_eq!(
        disk.read(&path("kept")).unwrap(),
        b"synced",
        "unsynced remove"
    );
    let new = disk.open(&path("new"), OpenMode::CreateOrTruncate).unwrap();
    new.write_all_at(b"new", 0).unwrap();
    new.sync_all().unwrap();
    disk.sync_dir(Path::new("/a")).unwrap();
    disk.rename(&path("new"), &path("kept")).unwrap();
    assert_eq!(disk.read(&path("kept")).unwrap(), b"new");
    disk.crash();
    assert_eq!(
        disk.read(&path("kept")).unwrap(),
        b"synced",
        "unsynced rename"
    );
    assert_eq!(disk.kind(&path("new")).unwrap(), FileKind::File);
}

#[tokio::test]
async fn a_crash_keeps_exactly_what_the_store_synced() {
    let disk = FakeDisk::new();
    let mut opened = open_on(&disk, DIR).await;
    opened
        .log
        .blocking_append((1..=3).map(blank))
        .await
        .unwrap();
    // Rides the vote's sync.
    opened.log.save_committed(Some(log_id(1, 2))).await.unwrap();
    let vote = Vote::new(2, 1);
    opened.log.save_vote(&vote).await.unwrap();
    // Written, never synced: nothing waits for it.
    opened.log.save_committed(Some(log_id(1, 3))).await.unwrap();
    let mut writer = opened.log.clone();
    let mut unsynced = Box::pin(writer.blocking_append([blank(4), blank(5)]));
    assert!(poll_once(unsynced.as_mut()).is_pending());
    assert_eq!(
        indexes(&mut opened).await,
        [1, 2, 3, 4, 5],
        "in the page cache"
    );
    disk.crash();
    drop(unsynced);
    drop(opened);

    let mut opened = open_on(&disk, DIR).await;
    assert_eq!(indexes(&mut opened).await, [1, 2, 3]);
    assert_eq!(opened.log.read_vote().await.unwrap(), Some(vote));
    assert_eq!(
        opened.log.read_committed().await.unwrap(),
        Some(log_id(1, 2))
    );
    // The log goes on where the synced part ends.
    opened.log.blocking_append([blank(4)]).await.unwrap();
    disk.crash();
    drop(opened);
    let mut opened = open_on(&disk, DIR).await;
    assert_eq!(indexes(&mut opened).await, [1, 2, 3, 4]);
    assert_only_this_thread(&disk);
}

#[tokio::test]
async fn snapshots_truncation_and_purges_run_inline_on_this_thread() {
    let disk = FakeDisk::new();
    let mut opened = open_on(&disk, DIR).await;
    opened
        .log
        .blocking_append((1..=6).map(blank))
        .await
        .unwrap();
    opened.log.truncate(log_id(1, 6)).await.unwrap();
    opened
        .state_machine
        .apply((1..=5).map(blank))
        .await
        .unwrap();
    let mut builder = opened.state_machine.get_snapshot_builder().await;
    let snapshot = builder.build_snapshot().await.unwrap();
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 5)));
    disk.crash();
    drop((builder, opened));

    let mut opened = open_on(&disk, DIR).await;
    assert_eq!(opened.state.last_applied(), Some(log_id(1, 5)));
    assert_eq!(indexes(&mut opened).await, [1, 2, 3, 4, 5]);
    // The first open's segment and this open's: a purge of every entry
    // deletes the first.
    let wal = Path::new(DIR).join(WAL_DIR);
    assert_eq!(disk.read_dir(&wal).unwrap().len(), 2);
    opened.log.purge(log_id(1, 5)).await.unwrap();
    assert_eq!(disk.read_dir(&wal).unwrap().len(), 1);
    disk.crash();
    drop(opened);

    let mut opened = open_on(&disk, DIR).await;
    assert_eq!(
        disk.read_dir(&wal).unwrap().len(),
        2,
        "the kept one and a new one"
    );
    let log_state = opened.log.get_log_state().await.unwrap();
    assert_eq!(log_state.last_purged_log_id, Some(log_id(1, 5)));
    assert_eq!(log_state.last_log_id, Some(log_id(1, 5)));

    // A follower installs the snapshot, durably.
    let mut follower = open_on(&disk, "/sim/node-2").await;
    follower
        .state_machine
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    disk.crash();
    drop((follower, opened));
    let follower = open_on(&disk, "/sim/node-2").await;
    assert_eq!(follower.state.last_applied(), Some(log_id(1, 5)));

    assert_only_this_thread(&disk);
    assert_eq!(storage_threads(), Vec::<String>::new());
}

#[tokio::test]
async fn a_failed_fdatasync_is_final_inline_too() {
    let disk = FakeDisk::new();
    let mut opened = open_on(&disk, DIR).await;
    opened.log.blocking_append([blank(1)]).await.unwrap();
    disk.fail_sync_data(true);
    let failed = opened.log.blocking_append([blank(2)]).await.unwrap_err();
    assert!(format!("{failed:?}").contains("os error 5"), "{failed:?}");
    disk.fail_sync_data(false);

    let syncs = disk.sync_data_calls();
    assert!(opened.log.blocking_append([blank(3)]).await.is_err());
    assert!(opened.log.save_vote(&Vote::new(1, 1)).await.is_err());
    assert!(opened.log.truncate(log_id(1, 1)).await.is_err());
    assert_eq!(
        disk.sync_data_calls(),
        syncs,
        "a failed log syncs nothing more"
    );

    disk.crash();
    drop(opened);
    let mut opened = open_on(&disk, DIR).await;
    assert_eq!(indexes(&mut opened).await, [1]);
    opened.log.blocking_append([blank(2)]).await.unwrap();
    assert_only_this_thread(&disk);
}

#[tokio::test]
async fn a_second_store_on_one_dir_is_refused_until_a_crash_frees_the_lock() {
    let disk = FakeDisk::new();
    let opened = open_on(&disk, DIR).await;
    let refused = open(&options(&disk, DIR)).await.unwrap_err();
    assert!(refused.to_string().contains("holds its lock"), "{refused}");
    disk.crash();
    let _reopened = open_on(&disk, DIR).await;
    drop(opened);
    assert_only_this_thread(&disk);
}
