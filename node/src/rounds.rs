//! Per-key round batching on the leader.
//!
//! A `request` does not become a log entry by itself: it waits in its key's
//! pending list, and when the key's round falls due all of them go into one
//! `Command::Round` entry, in arrival order. The schedule of one key:
//!
//! - the first request into an empty list arms the key's timer at
//!   `max(arrival + roundWaitMs, previous round start + roundPeriodMs)`;
//! - while a round of the key is being committed no timer is armed, so rounds of
//!   one key never overlap; requests arriving meanwhile wait for the next one,
//!   armed when the running round finishes;
//! - timers that fire together are drained by one batcher, and their keys share
//!   one entry (at most [`MAX_KEYS_PER_ENTRY`]);
//! - at most [`MAX_ROUND_ENTRIES_IN_FLIGHT`] round entries are being committed at
//!   once; keys falling due meanwhile wait and then share the next entry. openraft
//!   appends and flushes one batch at a time anyway, so more entries in flight
//!   only add per-entry costs (encoding, replication, apply) without committing
//!   sooner; fewer, fuller entries let many keys' rounds ride one fsync.
//!
//! Only the leader parks requests. When it loses leadership every waiting and
//! in-flight request fails at once with `LeaderChanged`; clients ask again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use permitd_core::limits::MAX_PENDING_REQUESTS_PER_KEY;
use permitd_core::protocol::{PermitGrant, PermitRequest};
use permitd_storage::{Command, KeyRound, Refused};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tracing::Instrument;

use crate::leadership::Leadership;
use crate::propose::{propose, ProposeError};
use crate::raft::Raft;

/// Most keys whose rounds share one log entry; more wait for the next entry.
pub const MAX_KEYS_PER_ENTRY: usize = 256;

/// Most round entries proposed and not yet answered; more due keys wait for one
/// to finish and then go into one entry together.
pub const MAX_ROUND_ENTRIES_IN_FLIGHT: usize = 2;

/// Why a request got no grant answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RoundError {
    #[error(transparent)]
    Propose(#[from] ProposeError),
    #[error("{pending} requests already wait for this key's round")]
    TooManyPending { pending: usize },
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("the round's result did not match its requests")]
    Mismatch,
}

type Reply = oneshot::Sender<Result<PermitGrant, RoundError>>;

/// A request parked until its key's round.
#[derive(Debug)]
struct Waiting {
    request: PermitRequest,
    reply: Reply,
}

/// One key's place in the schedule.
#[derive(Debug, Default)]
struct KeyQueue {
    pending: Vec<Waiting>,
    /// When the oldest pending request arrived: the round waits from there.
    first_arrival: Option<Instant>,
    /// A timer will hand this key to the batcher.
    armed: bool,
    /// A round of this key is being committed.
    running: bool,
    /// When the key's previous round started, for `roundPeriodMs`.
    last_round_at: Option<Instant>,
}

/// The batcher's handle; cheap to clone.
#[derive(Debug, Clone)]
pub struct Rounds {
    inner: Arc<Inner>,
}

struct Inner {
    raft: Raft,
    state: permitd_storage::SharedState,
    leadership: watch::Receiver<Leadership>,
    /// A std mutex: held only to move requests in and out, never across an await.
    keys: Mutex<HashMap<String, KeyQueue>>,
    /// Keys whose round fell due, to the batcher task.
    due: mpsc::UnboundedSender<String>,
    /// Requests that may wait for one key's round (at most
    /// `MAX_PENDING_REQUESTS_PER_KEY`); 429 beyond.
    max_pending_per_key: usize,
}

impl Rounds {
    /// Starts the batcher and the task that fails requests on leadership loss.
    pub fn start(
        raft: Raft,
        state: permitd_storage::SharedState,
        leadership: watch::Receiver<Leadership>,
        max_pending_per_key: usize,
    ) -> Self {
        let (due, due_receiver) = mpsc::unbounded_channel();
        let rounds = Self {
            inner: Arc::new(Inner {
                raft,
                state,
                leadership,
                keys: Mutex::new(HashMap::new()),
                due,
                max_pending_per_key: max_pending_per_key.min(MAX_PENDING_REQUESTS_PER_KEY),
            }),
        };
        tokio::spawn(rounds.clone().batch_due_keys(due_receiver));
        tokio::spawn(rounds.clone().fail_on_leadership_loss());
        rounds
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, KeyQueue>> {
        // A panic while holding the lock leaves only plain data behind; keep going.
        self.inner
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Copies of the requests waiting for `key`'s next round, in arrival order
    /// (for the operators' holders view; empty on a follower).
    pub fn waiting(&self, key: &str) -> Vec<PermitRequest> {
        let keys = self.keys();
        keys.get(key).map_or_else(Vec::new, |queue| {
            queue.pending.iter().map(|w| w.request.clone()).collect()
        })
    }

    /// Parks `request` for `key`'s next round and waits for its answer.
    pub async fn request(
        &self,
        key: &str,
        request: PermitRequest,
    ) -> Result<PermitGrant, RoundError> {
        let leadership = *self.inner.leadership.borrow();
        if !leadership.is_leader {
            return Err(ProposeError::NotLeader {
                leader: leadership.leader,
            }
            .into());
        }
        let (reply, answer) = oneshot::channel();
        self.park(key, Waiting { request, reply })?;
        // The sender is dropped only if the node is shutting down.
        answer
            .await
            .unwrap_or(Err(ProposeError::ShuttingDown.into()))
    }

    fn park(&self, key: &str, waiting: Waiting) -> Result<(), RoundError> {
        let timings = self.timings(key);
        let mut keys = self.keys();
        let queue = keys.entry(key.to_owned()).or_default();
        if queue.pending.len() >= self.inner.max_pending_per_key {
            return Err(RoundError::TooManyPending {
                pending: queue.pending.len(),
            });
        }
        if queue.pending.is_empty() {
            queue.first_arrival = Some(Instant::now());
        }
        queue.pending.push(waiting);
        crate::metrics::pending_changed(1);
        if !queue.armed && !queue.running {
            self.arm(key, queue, timings);
        }
        Ok(())
    }

    /// `(roundWaitMs, roundPeriodMs)` of a key, as configured now.
    fn timings(&self, key: &str) -> (Duration, Duration) {
        self.inner.state.read(|semaphores| {
            let config = semaphores.config(key);
            (
                Duration::from_millis(config.round_wait_ms),
                Duration::from_millis(config.round_period_ms),
            )
        })
    }

    fn arm(&self, key: &str, queue: &mut KeyQueue, (wait, period): (Duration, Duration)) {
        let arrival = queue.first_arrival.unwrap_or_else(Instant::now);
        let mut due_at = arrival + wait;
        if let Some(last) = queue.last_round_at {
            due_at = due_at.max(last + period);
        }
        queue.armed = true;
        let due = self.inner.due.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep_until(due_at.into()).await;
            // Fails only when the batcher is gone, i.e. the node is stopping.
            let _ = due.send(key);
        });
    }

    /// The batcher: takes every key that fell due at once into one entry, once
    /// fewer than [`MAX_ROUND_ENTRIES_IN_FLIGHT`] entries are in flight.
    async fn batch_due_keys(self, mut due: mpsc::UnboundedReceiver<String>) {
        let in_flight = Arc::new(Semaphore::new(MAX_ROUND_ENTRIES_IN_FLIGHT));
        while let Some(first) = due.recv().await {
            // Keys falling due while we wait queue up in `due` for this entry.
            let Ok(slot) = in_flight.clone().acquire_owned().await else {
                return;
            };
            let mut keys = vec![first];
            while keys.len() < MAX_KEYS_PER_ENTRY {
                match due.try_recv() {
                    Ok(key) => keys.push(key),
                    Err(_) => break,
                }
            }
            if let Some(batch) = self.take_batch(&keys) {
                let rounds = self.clone();
                tokio::spawn(async move {
                    rounds.run_batch(batch).await;
                    drop(slot);
                });
            }
        }
    }

    /// Moves the pending requests of due keys out of their queues.
    fn take_batch(&self, due: &[String]) -> Option<Batch> {
        let now = Instant::now();
        let mut batch = Batch::default();
        let mut keys = self.keys();
        for key in due {
            let Some(queue) = keys.get_mut(key) else {
                continue;
            };
            queue.armed = false;
            if queue.pending.is_empty() || queue.running {
                continue;
            }
            queue.running = true;
            queue.last_round_at = Some(now);
            queue.first_arrival = None;
            let waiting = std::mem::take(&mut queue.pending);
            crate::metrics::pending_changed(-(waiting.len() as i64));
            let (requests, replies) = waiting
                .into_iter()
                .map(|waiting| (waiting.request, waiting.reply))
                .unzip();
            batch.rounds.push(KeyRound {
                key: key.clone(),
                requests,
            });
            batch.replies.push(replies);
        }
        (!batch.rounds.is_empty()).then_some(batch)
    }

    async fn run_batch(self, batch: Batch) {
        let span = tracing::info_span!("round_entry", keys = batch.rounds.len());
        let started = Instant::now();
        let now_ms = crate::now_ms();
        let keys: Vec<String> = batch.rounds.iter().map(|round| round.key.clone()).collect();
        let sizes: Vec<usize> = batch.rounds.iter().map(|r| r.requests.len()).collect();
        let command = Command::Round {
            now_ms,
            keys: batch.rounds,
        };
        let result = propose(&self.inner.raft, &self.inner.leadership, command)
            .instrument(span.clone())
            .await;
        let elapsed = started.elapsed();
        let answers = match result {
            Ok((result, _)) => result.into_round().map_err(RoundError::from),
            Err(error) => Err(error.into()),
        }
        .and_then(|answers| {
            if answers.len() == keys.len() {
                Ok(answers)
            } else {
                Err(RoundError::Mismatch)
            }
        });
        let _entered = span.enter();
        for (index, replies) in batch.replies.into_iter().enumerate() {
            let key_answers = answers.as_ref().map(|all| &all[index]);
            answer_round(&keys[index], sizes[index], replies, key_answers, elapsed);
        }
        self.finish(&keys);
    }

    /// Marks the keys' rounds done and arms the next round of keys with waiters.
    fn finish(&self, done: &[String]) {
        let timings: Vec<_> = done.iter().map(|key| self.timings(key)).collect();
        let mut keys = self.keys();
        for (key, timings) in done.iter().zip(timings) {
            let Some(queue) = keys.get_mut(key) else {
                continue;
            };
            queue.running = false;
            if !queue.pending.is_empty() && !queue.armed {
                self.arm(key, queue, timings);
            }
            if queue.pending.is_empty() && !queue.armed {
                // An idle key keeps only its last round time, and only as long as
                // the period could still matter.
                let idle = queue
                    .last_round_at
                    .map_or(true, |at| at.elapsed() > timings.1);
                if idle {
                    keys.remove(key);
                }
            }
        }
    }

    /// Fails every parked request as soon as this node stops leading.
    async fn fail_on_leadership_loss(self) {
        let mut leadership = self.inner.leadership.clone();
        loop {
            let _ = leadership.wait_for(|now| now.is_leader).await;
            let started = *leadership.borrow();
            crate::leadership::lost(leadership.clone(), started).await;
            self.fail_all(ProposeError::LeaderChanged);
            if leadership.has_changed().is_err() {
                return;
            }
        }
    }

    /// Answers every parked request with `error` and forgets the schedule.
    pub fn fail_all(&self, error: ProposeError) {
        let drained: Vec<Waiting> = {
            let mut keys = self.keys();
            keys.values_mut()
                .flat_map(|queue| {
                    queue.first_arrival = None;
                    std::mem::take(&mut queue.pending)
                })
                .collect()
        };
        if !drained.is_empty() {
            tracing::warn!(requests = drained.len(), %error, "failing waiting requests");
        }
        crate::metrics::pending_changed(-(drained.len() as i64));
        for waiting in drained {
            let _ = waiting.reply.send(Err(error.clone().into()));
        }
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("leadership", &*self.leadership.borrow())
            .finish_non_exhaustive()
    }
}

/// The requests and reply channels of one entry, key by key in the same order.
#[derive(Debug, Default)]
struct Batch {
    rounds: Vec<KeyRound>,
    replies: Vec<Vec<Reply>>,
}

fn answer_round(
    key: &str,
    requests: usize,
    replies: Vec<Reply>,
    answers: Result<&Vec<PermitGrant>, &RoundError>,
    elapsed: Duration,
) {
    match answers {
        Ok(answers) if answers.len() == replies.len() => {
            let granted: u64 = answers
                .iter()
                .flat_map(|answer| &answer.grants)
                .map(|grant| grant.permits)
                .sum();
            let duration_ms = elapsed.as_secs_f64() * 1e3;
            tracing::info_span!("round", key, requests, granted, duration_ms).in_scope(|| {
                tracing::debug!("round answered");
            });
            crate::metrics::round_finished(elapsed);
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer.clone()));
            }
        }
        Ok(_) => fail_replies(key, replies, RoundError::Mismatch),
        Err(error) => fail_replies(key, replies, error.clone()),
    }
}

fn fail_replies(key: &str, replies: Vec<Reply>, error: RoundError) {
    tracing::warn!(key, requests = replies.len(), %error, "round failed");
    for reply in replies {
        let _ = reply.send(Err(error.clone()));
    }
}
