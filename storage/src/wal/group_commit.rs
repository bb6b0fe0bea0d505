//! Group commit: the one thread that makes the log durable.
//!
//! Writers put their bytes in the page cache (a `pwrite` under the log's lock),
//! then hand the sync thread a [`Waiter`]: a completion to run once those bytes
//! are on disk. The thread loops:
//!
//! 1. wait until a waiter is pending;
//! 2. take *every* pending waiter, with the set of segments written since the
//!    last batch (under one lock, so every byte a taken waiter covers is in the
//!    taken set);
//! 3. `fdatasync` every written segment (the one left behind by a rollover
//!    too; a new segment's creation was made durable when it was created);
//! 4. run the taken completions, in the order they were enqueued.
//!
//! While one batch syncs, writers keep appending and enqueueing: the next batch
//! covers all of them with one `fdatasync`. That is the whole gain: one disk
//! flush per batch of appends instead of one per append.
//!
//! A failed fsync leaves the page cache in a state nobody knows (Linux may
//! have dropped the dirty pages and cleared the error): retrying could report
//! success for data that is gone. So the first failure is final: the batch's
//! completions get the error, every later write is refused
//! ([`SyncQueue::check`]), and openraft, which treats a storage error as fatal,
//! stops the node. A restart recovers from what is really on disk.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use super::metrics;
use super::segment::Segment;
use crate::StorageError;

/// The name of the sync thread (shown by `top -H`, in panics and profiles).
const THREAD_NAME: &str = "permitd-wal-sync";

/// Why a sync batch failed, as every waiter of it (and of later batches) hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyncFailed(pub(crate) String);

impl From<SyncFailed> for StorageError {
    fn from(failed: SyncFailed) -> Self {
        StorageError::WalFailed(failed.0)
    }
}

impl From<SyncFailed> for std::io::Error {
    fn from(failed: SyncFailed) -> Self {
        std::io::Error::other(failed.0)
    }
}

/// Runs once the bytes written before it was enqueued are durable (or with
/// the error that stopped them from becoming durable).
pub(crate) type Completion = Box<dyn FnOnce(Result<(), SyncFailed>) + Send>;

/// A completion and how many log entries it covers (for the batch metric).
pub(crate) struct Waiter {
    pub(crate) entries: u64,
    pub(crate) completion: Completion,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("entries", &self.entries)
            .finish_non_exhaustive()
    }
}

/// What the sync thread has not synced yet.
#[derive(Debug, Default)]
struct Pending {
    waiters: Vec<Waiter>,
    /// Segments with bytes written since the last batch took them, by sequence.
    dirty: BTreeMap<u64, Arc<Segment>>,
    /// The first failure; once set, it stays.
    failure: Option<SyncFailed>,
    /// Set when the log is dropped: the thread drains the waiters and exits.
    stopping: bool,
}

/// Counts for tests and the bench: how many batches and `fdatasync` calls ran.
#[derive(Debug, Default)]
pub(crate) struct SyncCounts {
    pub(crate) batches: AtomicU64,
    pub(crate) fdatasyncs: AtomicU64,
}

/// The queue between writers and the sync thread.
#[derive(Debug)]
pub(crate) struct SyncQueue {
    /// The log's dir, for error messages.
    dir: PathBuf,
    /// A std mutex: held for a few pointer moves, never across IO or an await.
    pending: Mutex<Pending>,
    /// Signalled when a waiter is enqueued or the log stops.
    wake: Condvar,
    pub(crate) counts: SyncCounts,
}

/// One group commit's share of the queue: the waiters it completes and the
/// segments it syncs. (Not an allocation round: those are log entries.)
struct Batch {
    waiters: Vec<Waiter>,
    dirty: BTreeMap<u64, Arc<Segment>>,
    failure: Option<SyncFailed>,
}

impl SyncQueue {
    pub(crate) fn new(dir: PathBuf) -> Arc<Self> {
        Arc::new(Self {
            dir,
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            counts: SyncCounts::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .expect("the wal sync queue's lock is poisoned: a thread panicked holding it")
    }

    /// Starts the sync thread; it runs until [`SyncQueue::stop`].
    pub(crate) fn spawn(self: &Arc<Self>) -> Result<JoinHandle<()>, StorageError> {
        let queue = Arc::clone(self);
        std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || queue.run())
            .map_err(super::segment::io_error(
                "start the sync thread for",
                &self.dir,
            ))
    }

    /// Refuses writes once a write or sync has failed.
    pub(crate) fn check(&self) -> Result<(), StorageError> {
        match &self.lock().failure {
            Some(failed) => Err(failed.clone().into()),
            None => Ok(()),
        }
    }

    /// Records a failed write: the log refuses every later one.
    pub(crate) fn fail(&self, error: &StorageError) {
        let mut pending = self.lock();
        pending
            .failure
            .get_or_insert_with(|| SyncFailed(error.to_string()));
    }

    /// Bytes were written to `segment`; `waiter`, if any, runs once they are
    /// durable. Call after the write, in write order.
    pub(crate) fn written(&self, segment: &Arc<Segment>, waiter: Option<Waiter>) {
        let mut pending = self.lock();
        pending
            .dirty
            .entry(segment.sequence)
            .or_insert_with(|| Arc::clone(segment));
        if let Some(waiter) = waiter {
            pending.waiters.push(waiter);
            self.wake.notify_one();
        }
    }

    /// Asks the thread to sync what is pending and exit.
    pub(crate) fn stop(&self) {
        self.lock().stopping = true;
        self.wake.notify_one();
    }

    fn run(&self) {
        while let Some(batch) = self.next_batch() {
            let result = match batch.failure {
                Some(failed) => Err(failed),
                None => self.sync(&batch.dirty, &batch.waiters),
            };
            if let Err(failed) = &result {
                tracing::error!(error = %failed.0, "write-ahead log sync failed: the log refuses writes");
                self.lock().failure.get_or_insert_with(|| failed.clone());
            }
            for waiter in batch.waiters {
                (waiter.completion)(result.clone());
            }
        }
    }

    /// Waits for work; `None` once stopping with nothing left.
    fn next_batch(&self) -> Option<Batch> {
        let mut pending = self.lock();
        while pending.waiters.is_empty() && !pending.stopping {
            pending = self
                .wake
                .wait(pending)
                .expect("the wal sync queue's lock is poisoned: a thread panicked holding it");
        }
        if pending.waiters.is_empty() {
            return None;
        }
        Some(Batch {
            waiters: std::mem::take(&mut pending.waiters),
            dirty: std::mem::take(&mut pending.dirty),
            failure: pending.failure.clone(),
        })
    }

    /// One batch's disk work: an fdatasync of every written segment.
    fn sync(
        &self,
        dirty: &BTreeMap<u64, Arc<Segment>>,
        waiters: &[Waiter],
    ) -> Result<(), SyncFailed> {
        let started = Instant::now();
        for segment in dirty.values() {
            segment.sync_data().map_err(|error| {
                SyncFailed(format!("fdatasync of {}: {error}", segment.path.display()))
            })?;
            self.counts.fdatasyncs.fetch_add(1, Ordering::Relaxed);
        }
        self.counts.batches.fetch_add(1, Ordering::Relaxed);
        let entries = waiters.iter().map(|waiter| waiter.entries).sum();
        metrics::synced(entries, started.elapsed());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn waiter(sender: &mpsc::Sender<Result<(), SyncFailed>>) -> Waiter {
        let sender = sender.clone();
        Waiter {
            entries: 1,
            completion: Box::new(move |result| {
                let _ = sender.send(result);
            }),
        }
    }

    #[test]
    fn waiters_fire_after_a_sync_and_a_failure_is_final() {
        let dir = tempfile::tempdir().unwrap();
        let queue = SyncQueue::new(dir.path().to_owned());
        let thread = queue.spawn().unwrap();
        let segment = Arc::new(Segment::create(dir.path(), 1).unwrap());
        segment.write_at(b"bytes", 0).unwrap();
        let (sender, results) = mpsc::channel();
        queue.written(&segment, Some(waiter(&sender)));
        assert_eq!(results.recv().unwrap(), Ok(()));
        assert!(queue.counts.fdatasyncs.load(Ordering::Relaxed) >= 1);

        queue.fail(&StorageError::WalFailed("disk gone".to_owned()));
        assert!(queue.check().is_err());
        queue.written(&segment, Some(waiter(&sender)));
        assert!(
            results.recv().unwrap().is_err(),
            "a failed log syncs nothing more"
        );
        queue.stop();
        thread.join().unwrap();
    }
}
