//! Group commit: the one loop that makes the log durable.
//!
//! Writers put their bytes in the page cache (a `pwrite` under the log's lock),
//! then hand the group commit a [`Waiter`]: a completion to run once those
//! bytes are on disk. The loop:
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
//!
//! The loop runs as [`Exec`] says: on a thread of its own, which waits on a
//! condition variable ([`Exec::Threads`], production), or as a task on the
//! current tokio runtime, which waits on a `Notify` and syncs inline
//! ([`Exec::Inline`], a simulator's single thread). Both run the same steps,
//! [`Pending::take`] (1–2) and [`SyncQueue::commit`] (3–4); only the waiting
//! differs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::Notify;

use super::metrics;
use super::segment::{io_error, Segment};
use crate::{Exec, StorageError};

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

/// What the group commit has not synced yet.
#[derive(Debug, Default)]
struct Pending {
    waiters: Vec<Waiter>,
    /// Segments with bytes written since the last batch took them, by sequence.
    dirty: BTreeMap<u64, Arc<Segment>>,
    /// The first failure; once set, it stays.
    failure: Option<SyncFailed>,
    /// Set when the log is dropped: the loop drains the waiters and exits.
    stopping: bool,
}

/// Counts for tests and the bench: how many batches and `fdatasync` calls ran.
#[derive(Debug, Default)]
pub(crate) struct SyncCounts {
    pub(crate) batches: AtomicU64,
    pub(crate) fdatasyncs: AtomicU64,
}

/// How the loop waits for a waiter: the thread blocks, the task awaits.
#[derive(Debug)]
enum Wake {
    Thread(Condvar),
    Task(Notify),
}

/// The queue between writers and the group commit.
#[derive(Debug)]
pub(crate) struct SyncQueue {
    /// The log's dir, for error messages.
    dir: PathBuf,
    /// A std mutex: held for a few pointer moves, never across IO or an await.
    pending: Mutex<Pending>,
    /// Signalled when a waiter is enqueued or the log stops.
    wake: Wake,
    pub(crate) counts: SyncCounts,
}

/// One group commit's share of the queue: the waiters it completes and the
/// segments it syncs. (Not an allocation round: those are log entries.)
struct Batch {
    waiters: Vec<Waiter>,
    dirty: BTreeMap<u64, Arc<Segment>>,
    failure: Option<SyncFailed>,
}

/// What the loop does next.
enum Next {
    Commit(Batch),
    /// Nothing pending: wait for a waiter (or the stop).
    Wait,
    /// Stopping with nothing left: exit.
    Exit,
}

impl Pending {
    /// Steps 1–2: takes every pending waiter and written segment as one batch.
    fn take(&mut self) -> Next {
        if !self.waiters.is_empty() {
            return Next::Commit(Batch {
                waiters: std::mem::take(&mut self.waiters),
                dirty: std::mem::take(&mut self.dirty),
                failure: self.failure.clone(),
            });
        }
        if self.stopping {
            Next::Exit
        } else {
            Next::Wait
        }
    }
}

impl SyncQueue {
    /// A queue whose loop will run as `exec` says (started by [`SyncQueue::start`]).
    pub(crate) fn new(dir: PathBuf, exec: Exec) -> Arc<Self> {
        let wake = match exec {
            Exec::Threads => Wake::Thread(Condvar::new()),
            Exec::Inline => Wake::Task(Notify::new()),
        };
        Arc::new(Self {
            dir,
            pending: Mutex::new(Pending::default()),
            wake,
            counts: SyncCounts::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .expect("the wal sync queue's lock is poisoned: a thread panicked holding it")
    }

    /// Starts the loop; it runs until [`SyncQueue::stop`]. Returns the thread
    /// to join, if it is one (a task is left to drain on its own: a drop
    /// cannot await it).
    pub(crate) fn start(self: &Arc<Self>) -> Result<Option<JoinHandle<()>>, StorageError> {
        let queue = Arc::clone(self);
        match &self.wake {
            Wake::Thread(_) => std::thread::Builder::new()
                .name(THREAD_NAME.to_owned())
                .spawn(move || queue.run_thread())
                .map(Some)
                .map_err(io_error("start the sync thread for", &self.dir)),
            Wake::Task(_) => {
                let runtime = tokio::runtime::Handle::try_current().map_err(|error| {
                    io_error("start the sync task for", &self.dir)(std::io::Error::other(error))
                })?;
                drop(runtime.spawn(async move { queue.run_task().await }));
                Ok(None)
            }
        }
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
            self.notify();
        }
    }

    /// Asks the loop to sync what is pending and exit.
    pub(crate) fn stop(&self) {
        self.lock().stopping = true;
        self.notify();
    }

    fn notify(&self) {
        match &self.wake {
            Wake::Thread(condvar) => condvar.notify_one(),
            // Stores a permit when the task is busy: no wake-up is lost.
            Wake::Task(notify) => notify.notify_one(),
        }
    }

    /// The loop on a thread of its own.
    fn run_thread(&self) {
        let Wake::Thread(condvar) = &self.wake else {
            return;
        };
        let mut pending = self.lock();
        loop {
            match pending.take() {
                Next::Commit(batch) => {
                    drop(pending);
                    self.commit(batch);
                    pending = self.lock();
                }
                Next::Wait => {
                    pending = condvar.wait(pending).expect(
                        "the wal sync queue's lock is poisoned: a thread panicked holding it",
                    );
                }
                Next::Exit => return,
            }
        }
    }

    /// The loop as a task of the current runtime: its syncs run inline.
    async fn run_task(&self) {
        let Wake::Task(notify) = &self.wake else {
            return;
        };
        loop {
            let next = self.lock().take();
            match next {
                Next::Commit(batch) => {
                    // A simulated disk's sync takes simulated time: writers
                    // go on meanwhile, as they do while a thread syncs.
                    let delay = batch
                        .dirty
                        .values()
                        .map(|segment| segment.sync_delay())
                        .max();
                    if let Some(delay) = delay.filter(|delay| !delay.is_zero()) {
                        tokio::time::sleep(delay).await;
                    }
                    self.commit(batch);
                }
                Next::Wait => notify.notified().await,
                Next::Exit => return,
            }
        }
    }

    /// Steps 3–4: syncs the batch's segments (unless the log failed before),
    /// records a failure as final, and runs the completions in order.
    fn commit(&self, batch: Batch) {
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
    use crate::disk::OsDisk;
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
        let queue = SyncQueue::new(dir.path().to_owned(), Exec::Threads);
        let thread = queue.start().unwrap().expect("a thread");
        let segment = Arc::new(Segment::create(&OsDisk, dir.path(), 1).unwrap());
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

    #[tokio::test]
    async fn the_inline_task_batches_what_was_written_before_it_ran_and_drains_at_stop() {
        let dir = tempfile::tempdir().unwrap();
        let queue = SyncQueue::new(dir.path().to_owned(), Exec::Inline);
        assert!(queue.start().unwrap().is_none(), "no thread inline");
        let segment = Arc::new(Segment::create(&OsDisk, dir.path(), 1).unwrap());
        let (sender, results) = mpsc::channel();
        for offset in 0..3 {
            segment.write_at(b"x", offset).unwrap();
            queue.written(&segment, Some(waiter(&sender)));
        }
        // Nothing runs before this task yields: one thread, no other.
        assert!(results.try_recv().is_err());
        tokio::task::yield_now().await;
        for _ in 0..3 {
            assert_eq!(results.try_recv().unwrap(), Ok(()));
        }
        let counted = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        assert_eq!(counted(&queue.counts.batches), 1, "one batch for all three");
        assert_eq!(counted(&queue.counts.fdatasyncs), 1);

        queue.written(&segment, Some(waiter(&sender)));
        queue.stop();
        tokio::task::yield_now().await;
        assert_eq!(results.try_recv().unwrap(), Ok(()), "drained at stop");
        assert_eq!(Arc::strong_count(&queue), 1, "the task exited");
    }
}
