//! [`SemaphoreQueue`]: a job queue that admits items only under a permit, as one
//! background task per queue.
//!
//! The application enqueues items `{id, key, group, body}`; the queue asks the
//! holder of each key for permits, admits items under confirmed grant claims or
//! drawn lease permits by calling [`Admission::admit`], and returns each permit
//! when the application calls [`SemaphoreQueue::release`]. Releases it never gets
//! are recovered by asking [`Admission::finished`] periodically.
//!
//! All accounting lives in the synchronous [`state::QueueState`]; this module only
//! moves values. One step of the loop:
//! 1. `poll` the state (draws lease permits, decides each key's next message);
//! 2. write the changed records to the queue's journal and `fdatasync` it
//!    ([`store`], [`journal`]), before anything leaves the process; a failed
//!    write or sync stops the queue for good (it fails closed:
//!    [`QueueError::StoreFailed`]);
//! 3. hand admitted items to `admit` (a spawned task) and send the messages
//!    (at most one in flight per key and lane; the poll's reports, across its
//!    keys, in one `POST /v1/batch` call, each key's demand alone: [`send_all`];
//!    a key's releases ride in its request when both leave in one poll, see
//!    `state::messages`);
//! 4. wait for an answer, an enqueue or release, or the next timer, and feed it
//!    to the state.
//!
//! The application side is the [`Admission`] trait, whose methods return
//! `impl Future + Send`: implementors write plain `async fn`s, nothing is boxed,
//! and the loop can spawn the futures on tokio's multi-threaded runtime (a bare
//! `async fn` in the trait could not promise `Send`). The price is that the trait
//! is not object-safe, so the queue takes the implementor as a type parameter of
//! [`SemaphoreQueue::start`] (the handle itself is generic only in `T`).

pub mod journal;
pub mod state;
pub mod store;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use permitd_core::contract::batch::BatchItem;
use permitd_core::contract::protocol::{SemaphoreRequest, SemaphoreResponse};
use permitd_core::limits::MAX_BATCH_KEYS;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use state::{
    AdmittedItem, EnqueueOutcome, ItemPermit, ItemStatus, QueueCounts, QueueItem, ReleaseOutcome,
    StateConfig,
};

use crate::client::{now_ms, SemaphoreClient};
use crate::error::QueueError;
use state::{Lane, Outgoing, QueueState};
use store::QueueStore;

/// Default time between two `finished` checks.
pub const DEFAULT_FINISHED_INTERVAL_MS: u64 = 10_000;
/// Most ids one `finished` call is asked about.
pub const MAX_FINISHED_BATCH: usize = 1_024;
/// Default time `shutdown` spends returning permits before it gives up.
pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = 5_000;
/// The `tracing` target of a TRACE event per message that reports releases,
/// as it leaves (fields `key` and `releases`, the permits it returns): what
/// the bench times a freed permit's reuse from.
pub const RELEASES_SENT_TARGET: &str = "permitd_client::releases_sent";

/// The application side of a queue.
pub trait Admission<T>: Send + Sync + 'static {
    /// Starts work for admitted items. Must be a no-op for an id it already
    /// started: after a restart, admitted items are handed over again.
    fn admit(&self, items: Vec<AdmittedItem<T>>) -> impl Future<Output = ()> + Send;

    /// Of `ids` (admitted items), those whose work reached a terminal state. The
    /// queue releases them: this recovers releases the application never sent.
    fn finished(&self, ids: Vec<String>) -> impl Future<Output = Vec<String>> + Send;
}

/// How a queue runs.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// This runner's id towards the holder; must be stable across restarts of a
    /// queue dir (grants are the client's own).
    pub client_id: String,
    /// Keep the queue in this dir (its journal, see [`store`]); `None` keeps
    /// it in memory only.
    pub path: Option<PathBuf>,
    /// Time between two `finished` checks.
    pub finished_interval: Duration,
    /// Time `shutdown` spends returning permits.
    pub shutdown_timeout: Duration,
    pub state: StateConfig,
}

impl QueueConfig {
    /// Defaults for `client_id`, in memory.
    pub fn new(client_id: impl Into<String>) -> Self {
        Self {
            client_id: client_id.into(),
            path: None,
            finished_interval: Duration::from_millis(DEFAULT_FINISHED_INTERVAL_MS),
            shutdown_timeout: Duration::from_millis(DEFAULT_SHUTDOWN_TIMEOUT_MS),
            state: StateConfig::default(),
        }
    }

    /// Keeps the queue in the dir `path` (created if missing).
    pub fn with_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = Some(path.into());
        self
    }
}

/// What `shutdown` leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    pub counts: QueueCounts,
    /// Keys whose final reports did not reach the holder in time.
    pub unreported_keys: usize,
}

/// A handle on a running queue; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct SemaphoreQueue<T> {
    shared: Arc<Shared<T>>,
    task: Mutex<Option<JoinHandle<usize>>>,
}

#[derive(Debug)]
struct Shared<T> {
    /// A std mutex: held for pure state changes and a journal append, never
    /// across an await (the sync runs outside it).
    state: Mutex<QueueState<T>>,
    store: Option<QueueStore>,
    /// Wakes the loop after an enqueue or a release.
    wake: Notify,
    stopping: AtomicBool,
    /// Set when a store write or flush failed: the queue stopped.
    failure: Mutex<Option<String>>,
}

/// What comes back to the loop from its spawned tasks. A failure carries only
/// its text: the loop logs it and retries the lane.
enum Event {
    Answer(String, Result<SemaphoreResponse, (Lane, String)>),
    Finished(Vec<String>),
}

impl<T> SemaphoreQueue<T>
where
    T: Clone + Send + Sync + Serialize + DeserializeOwned + 'static,
{
    /// Opens the queue's dir (if any), restores its items and permits, and
    /// starts the loop. Must run inside a tokio runtime.
    pub fn start<A: Admission<T>>(
        client: SemaphoreClient,
        config: QueueConfig,
        admission: A,
    ) -> Result<Self, QueueError> {
        let (state, store) = match &config.path {
            Some(path) => {
                let store = QueueStore::open(path, &config.client_id)?;
                let (items, keys, released) = store.load::<T>()?;
                let state = QueueState::restore(
                    config.client_id.clone(),
                    config.state.clone(),
                    items,
                    keys,
                    released,
                );
                (state, Some(store))
            }
            None => (
                QueueState::new(config.client_id.clone(), config.state.clone())
                    .without_change_tracking(),
                None,
            ),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            store,
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            failure: Mutex::new(None),
        });
        let task = tokio::spawn(run(shared.clone(), client, Arc::new(admission), config));
        Ok(Self {
            shared,
            task: Mutex::new(Some(task)),
        })
    }

    /// Adds items; known ids are skipped. Durable (flushed) when it returns.
    pub async fn enqueue(&self, items: Vec<QueueItem<T>>) -> Result<EnqueueOutcome, QueueError> {
        self.shared.check_failure()?;
        if self.shared.stopping.load(Ordering::Acquire) {
            return Err(QueueError::Shutdown);
        }
        let outcome = {
            let mut state = self.shared.lock();
            let outcome = state.enqueue(items, now_ms())?;
            self.shared.persist(&mut state)?;
            outcome
        };
        self.shared.flush().await?;
        self.shared.wake.notify_one();
        Ok(outcome)
    }

    /// The work of item `id` reached a terminal state (or, if still queued, it
    /// is dropped). The permit returns to the holder with the next report.
    pub fn release(&self, id: &str) -> Result<ReleaseOutcome, QueueError> {
        self.shared.check_failure()?;
        let outcome = {
            let mut state = self.shared.lock();
            let outcome = state.release(id);
            if self.shared.stopping.load(Ordering::Acquire) {
                // No loop persists for us any more.
                self.shared.persist(&mut state)?;
            }
            outcome
        };
        self.shared.wake.notify_one();
        Ok(outcome)
    }

    /// Where item `id` stands.
    pub fn status(&self, id: &str) -> ItemStatus {
        self.shared.lock().status(id)
    }

    /// The store failure that stopped the queue, if one did
    /// ([`QueueError::StoreFailed`]).
    pub fn failure(&self) -> Option<QueueError> {
        self.shared.check_failure().err()
    }

    /// Items per state and permits held.
    pub fn counts(&self) -> QueueCounts {
        self.shared.lock().counts(now_ms())
    }

    /// Stops asking for permits, returns undrawn lease permits and reports every
    /// release so far (within the configured timeout), persists, and reports the
    /// final counts. Admitted work is not waited for: later `release` calls are
    /// still recorded (and persisted), and reported by the next start.
    pub async fn shutdown(&self) -> Result<ShutdownReport, QueueError> {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        let task = self.task.lock().expect("task lock").take();
        let unreported_keys = match task {
            Some(task) => task.await.unwrap_or_else(|error| {
                tracing::error!(%error, "queue loop ended abnormally");
                0
            }),
            None => 0,
        };
        self.shared.check_failure()?;
        {
            let mut state = self.shared.lock();
            self.shared.persist(&mut state)?;
        }
        self.shared.flush().await?;
        Ok(ShutdownReport {
            counts: self.counts(),
            unreported_keys,
        })
    }
}

impl<T> Drop for SemaphoreQueue<T> {
    fn drop(&mut self) {
        // A dropped handle stops the loop at once (no final reports: use
        // `shutdown` for those); what was persisted is reported by the next start.
        if let Some(task) = self.task.lock().ok().and_then(|mut task| task.take()) {
            task.abort();
        }
    }
}

impl<T: Clone + Serialize> Shared<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState<T>> {
        self.state.lock().expect("queue state lock")
    }

    /// Writes the state's changed records (not flushed). Without a file, only
    /// forgets the change set. A failed write stops the queue for good.
    fn persist(&self, state: &mut QueueState<T>) -> Result<(), QueueError> {
        self.check_failure()?;
        let dirty = state.take_dirty();
        if let Some(store) = &self.store {
            store
                .write(state, &dirty)
                .map_err(|error| self.fail(error))?;
        }
        Ok(())
    }
}

impl<T> Shared<T> {
    /// Makes every write so far durable; a failed flush stops the queue for good.
    async fn flush(&self) -> Result<(), QueueError> {
        match &self.store {
            Some(store) => store.flush().await.map_err(|error| self.fail(error)),
            None => Ok(()),
        }
    }

    /// Records a store failure: the queue fails closed from now on. Returns
    /// the error callers get.
    fn fail(&self, error: QueueError) -> QueueError {
        let mut failure = self.failure.lock().expect("failure lock");
        let message = failure.get_or_insert_with(|| {
            tracing::error!(%error, "the queue's store failed; the queue stopped");
            error.to_string()
        });
        self.wake.notify_one();
        QueueError::StoreFailed(message.clone())
    }

    fn check_failure(&self) -> Result<(), QueueError> {
        match &*self.failure.lock().expect("failure lock") {
            Some(message) => Err(QueueError::StoreFailed(message.clone())),
            None => Ok(()),
        }
    }
}

/// The loop; returns the number of keys whose final reports were not answered.
async fn run<T, A>(
    shared: Arc<Shared<T>>,
    client: SemaphoreClient,
    admission: Arc<A>,
    config: QueueConfig,
) -> usize
where
    T: Clone + Send + Sync + Serialize + DeserializeOwned + 'static,
    A: Admission<T>,
{
    let (events_tx, mut events) = mpsc::unbounded_channel::<Event>();
    let mut finished_due = Instant::now() + config.finished_interval;
    let mut finished_in_flight = false;
    let mut draining: Option<Instant> = None;
    loop {
        if shared.check_failure().is_err() {
            return shared.lock().in_flight();
        }
        if draining.is_none() && shared.stopping.load(Ordering::Acquire) {
            shared.lock().retire_all_leases();
            draining = Some(Instant::now() + config.shutdown_timeout);
        }
        let now = now_ms();
        let step = {
            let mut state = shared.lock();
            let messages = if draining.is_some() {
                state.poll_reports(now)
            } else {
                state.poll(now)
            };
            let admits = state.take_admits();
            shared.persist(&mut state).map(|()| {
                let in_flight = state.in_flight() + messages.len();
                (messages, admits, state.next_wakeup_ms(now), in_flight)
            })
        };
        // Fails closed: a step whose records are not durable neither admits nor
        // sends anything (see `Shared::fail`).
        let Ok((messages, admits, wake_at_ms, in_flight)) = step else {
            return shared.lock().in_flight();
        };
        // Durable before anything it records leaves the process. Synced even
        // when this step wrote nothing: an `enqueue` writes every pending
        // change, the loop's too (an answer that admitted items), and syncs on
        // its own time; admitting them before that sync returned lost an
        // admission to a power cut (tests/tests/queue_power_loss.rs). A flush
        // with nothing unsynced returns at once.
        if shared.flush().await.is_err() {
            return shared.lock().in_flight();
        }
        if let Some(deadline) = draining {
            if in_flight == 0 || Instant::now() >= deadline {
                return in_flight;
            }
        }
        if !admits.is_empty() {
            let admission = admission.clone();
            tokio::spawn(async move { admission.admit(admits).await });
        }
        send_all(&client, messages, &events_tx);
        if draining.is_none() && !finished_in_flight && Instant::now() >= finished_due {
            finished_due = Instant::now() + config.finished_interval;
            let ids = shared.lock().admitted_ids(MAX_FINISHED_BATCH);
            if !ids.is_empty() {
                finished_in_flight = true;
                let admission = admission.clone();
                let events_tx = events_tx.clone();
                tokio::spawn(async move {
                    let done = admission.finished(ids).await;
                    let _ = events_tx.send(Event::Finished(done));
                });
            }
        }
        let mut wake = finished_due;
        if let Some(at_ms) = wake_at_ms {
            let delay = Duration::from_millis(at_ms.saturating_sub(now_ms()));
            wake = wake.min(Instant::now() + delay);
        }
        if let Some(deadline) = draining {
            wake = wake.min(deadline);
        }
        tokio::select! {
            _ = shared.wake.notified() => {}
            event = events.recv() => {
                if let Some(event) = event {
                    finished_in_flight &= !matches!(event, Event::Finished(_));
                    apply_event(&shared, event);
                }
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

fn apply_event<T: Clone + Serialize>(shared: &Shared<T>, event: Event) {
    if shared.check_failure().is_err() {
        return;
    }
    let mut state = shared.lock();
    let now = now_ms();
    match event {
        Event::Answer(key, Ok(answer)) => state.on_answer(&key, answer, now),
        Event::Answer(key, Err((lane, error))) => {
            tracing::warn!(%key, ?lane, %error, "permit message failed; will retry");
            state.on_failure(&key, lane, now);
        }
        Event::Finished(ids) => {
            for id in ids {
                if state.release(&id) == ReleaseOutcome::Released {
                    tracing::info!(%id, "recovered a release through finished()");
                }
            }
        }
    }
}

/// Sends one poll's messages as [`plan_calls`] groups them.
fn send_all(client: &SemaphoreClient, messages: Vec<Outgoing>, events: &Events) {
    let Calls { alone, batches } = plan_calls(messages);
    for outgoing in alone {
        spawn_send(client, outgoing, events.clone());
    }
    for batch in batches {
        spawn_report_batch(client, batch, events.clone());
    }
}

/// One poll's messages, grouped into calls.
#[derive(Debug, PartialEq, Eq)]
struct Calls {
    /// Each sent alone: every key's demand, and a lone report.
    alone: Vec<Outgoing>,
    /// Reports (syncs) of several keys, each group one `POST /v1/batch`.
    batches: Vec<Vec<Outgoing>>,
}

/// Groups a poll's messages: its reports, across all keys, in one batch call;
/// each key's demand in a call of its own.
///
/// Reports are answered with the next entry, so sharing a call delays none of
/// them. A batch is answered when its slowest item is, so demand for several
/// keys in one call would tie every key's grant to the slowest round (and a
/// held request waits up to its `waitMs`): demand goes alone. A key has at most
/// one report in flight, so a poll's reports name distinct keys, and chunks of
/// `MAX_BATCH_KEYS` stay inside both batch limits.
fn plan_calls(messages: Vec<Outgoing>) -> Calls {
    let (reports, mut alone): (Vec<Outgoing>, Vec<Outgoing>) = messages
        .into_iter()
        .partition(|outgoing| Lane::of(&outgoing.message) == Lane::Report);
    if reports.len() == 1 {
        alone.extend(reports);
        return Calls {
            alone,
            batches: Vec::new(),
        };
    }
    let batches = reports
        .chunks(MAX_BATCH_KEYS)
        .map(<[Outgoing]>::to_vec)
        .collect();
    Calls { alone, batches }
}

type Events = mpsc::UnboundedSender<Event>;

/// Marks the permits a message returns as they leave (the bench times reuse
/// from here).
fn trace_releases(outgoing: &Outgoing) {
    if outgoing.releases > 0 {
        let (key, releases) = (&outgoing.key, outgoing.releases);
        tracing::trace!(target: RELEASES_SENT_TARGET, %key, releases, "releases sent");
    }
}

fn spawn_report_batch(client: &SemaphoreClient, reports: Vec<Outgoing>, events: Events) {
    let client = client.clone();
    tokio::spawn(async move {
        reports.iter().for_each(trace_releases);
        let (keys, items): (Vec<String>, Vec<BatchItem>) = reports
            .into_iter()
            .map(|outgoing| {
                let item = BatchItem {
                    key: outgoing.key.clone(),
                    message: outgoing.message,
                };
                (outgoing.key, item)
            })
            .unzip();
        match client.batch(items).await {
            Ok(results) => {
                for (key, result) in keys.into_iter().zip(results) {
                    let result = result.map_err(|error| (Lane::Report, error.to_string()));
                    let _ = events.send(Event::Answer(key, result));
                }
            }
            Err(error) => {
                let error = error.to_string();
                for key in keys {
                    let _ = events.send(Event::Answer(key, Err((Lane::Report, error.clone()))));
                }
            }
        }
    });
}

fn spawn_send(client: &SemaphoreClient, outgoing: Outgoing, events: Events) {
    let client = client.clone();
    tokio::spawn(async move {
        trace_releases(&outgoing);
        let Outgoing { key, message, .. } = outgoing;
        let lane = Lane::of(&message);
        let answer = match message {
            SemaphoreRequest::Request(request) => client
                .request(&key, request)
                .await
                .map(SemaphoreResponse::Grant),
            SemaphoreRequest::Sync(sync) => {
                client.sync(&key, sync).await.map(SemaphoreResponse::Synced)
            }
        };
        let answer = answer.map_err(|error| (lane, error.to_string()));
        let _ = events.send(Event::Answer(key, answer));
    });
}

#[cfg(test)]
mod tests {
    use permitd_core::contract::protocol::{PermitRequest, PermitSync};

    use super::*;

    fn outgoing(key: &str, report: bool) -> Outgoing {
        let message = if report {
            SemaphoreRequest::Sync(PermitSync {
                client_id: "c".into(),
                ..PermitSync::default()
            })
        } else {
            SemaphoreRequest::Request(PermitRequest {
                client_id: "c".into(),
                ..PermitRequest::default()
            })
        };
        Outgoing {
            key: key.into(),
            message,
            releases: 0,
        }
    }

    #[test]
    fn reports_of_a_poll_share_one_call_and_demand_goes_alone() {
        let calls = plan_calls(vec![
            outgoing("a", false),
            outgoing("a", true),
            outgoing("b", true),
            outgoing("c", false),
            outgoing("c", true),
        ]);
        assert_eq!(calls.alone, [outgoing("a", false), outgoing("c", false)]);
        assert_eq!(
            calls.batches,
            [vec![
                outgoing("a", true),
                outgoing("b", true),
                outgoing("c", true)
            ]]
        );
    }

    #[test]
    fn a_lone_report_is_a_plain_sync() {
        let calls = plan_calls(vec![outgoing("a", true), outgoing("b", false)]);
        assert_eq!(calls.alone, [outgoing("b", false), outgoing("a", true)]);
        assert!(calls.batches.is_empty());
        assert_eq!(plan_calls(vec![]).alone, []);
    }

    #[test]
    fn more_reports_than_a_batch_takes_are_split() {
        let reports = (0..MAX_BATCH_KEYS * 2 + 1)
            .map(|n| outgoing(&format!("k{n}"), true))
            .collect();
        let sizes: Vec<usize> = plan_calls(reports).batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, [MAX_BATCH_KEYS, MAX_BATCH_KEYS, 1]);
    }
}
