//! Round and sync batching on the leader: the async side of [`crate::leader::schedule`].
//!
//! A `request` does not become a log entry by itself: it parks in its key's
//! pending list until the key's round falls due. A `sync` waits only until the
//! next entry leaves. One `Command::Round` entry carries every sync that arrived
//! meanwhile (applied first, so the permits they return are granted by the
//! rounds of the same entry) and the rounds of every key that fell due. The
//! rules of when (pipelined rounds per key, entries in flight, keys and bytes per
//! entry) live in the pure [`Schedule`] and are unit-tested there.
//!
//! One driver task takes entries from the schedule and proposes them; it sleeps
//! on a [`PreciseTimer`] (tokio's 1 ms timer wheel made a 1 ms round wait take
//! up to 2 ms) and is woken by every arrival and every answered entry.
//!
//! Only the leader parks messages. When it loses leadership every parked and
//! in-flight message fails at once with `LeaderChanged`; clients ask again.
//!
//! A leader cut off from its followers keeps leading (openraft 0.9 does not step
//! down), so nothing it proposes commits. Once an entry has waited
//! `commit_timeout` the schedule counts the leader as stalled: the entry's
//! callers and every parked message are answered `no_quorum`, new messages are
//! refused with it at once, and no entry leaves until the stuck one ends (it
//! may still commit when the partition heals: retrying with the same
//! `requestId` is safe).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use permitd_core::limits::{
    COMMIT_TIMEOUT_MS, DEFAULT_ENTRIES_IN_FLIGHT, MAX_ENTRIES_IN_FLIGHT, MAX_ENTRY_MESSAGE_BYTES,
    MAX_KEYS_PER_ENTRY, MAX_PARKED_BYTES, MAX_PARKED_MESSAGES, MAX_PENDING_REQUESTS_PER_KEY,
    MAX_REQUEST_WAIT_MS,
};
use permitd_core::protocol::{
    BlockedReason, PermitGrant, PermitRequest, PermitSync, PermitSyncResult,
};
use permitd_core::Event;
use permitd_storage::{Command, KeyRound, KeySync, Refused};
use tokio::sync::{broadcast, oneshot, watch, Notify};
use tracing::Instrument;

use crate::leader::leadership::Leadership;
use crate::leader::propose::{propose, ProposeError};
use crate::leader::schedule::{Entry, Refusal, Schedule, ScheduleSettings, Timings};
use crate::leader::timer::PreciseTimer;
use crate::raft::Raft;

/// Why a request or sync got no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RoundError {
    #[error(transparent)]
    Propose(#[from] ProposeError),
    #[error("{pending} requests already wait for this key's round")]
    TooManyPending { pending: usize },
    #[error("the leader already holds {messages} waiting messages ({bytes} bytes), its limit")]
    LeaderFull { messages: usize, bytes: usize },
    #[error(
        "the leader has not committed for {for_ms} ms: no quorum answers it \
         (a retry with the same requestId is safe)"
    )]
    NoQuorum { for_ms: u64 },
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("the round's result did not match its requests")]
    Mismatch,
}

impl From<Refusal> for RoundError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::KeyFull { pending } => Self::TooManyPending { pending },
            Refusal::LeaderFull { messages, bytes } => Self::LeaderFull { messages, bytes },
            Refusal::Stalled { for_ms } => Self::NoQuorum { for_ms },
        }
    }
}

/// The leader's bounds on waiting work (`[limits]` of the cluster file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundLimits {
    /// Requests that may wait for one key's round; 429 `too_many_pending` beyond.
    pub max_pending_per_key: usize,
    /// Round and sync entries in flight at once.
    pub entries_in_flight: usize,
    /// Requests and syncs waiting on the leader, all keys together; 503
    /// `overloaded` beyond.
    pub max_parked_messages: usize,
    /// Their bytes as received; 503 `overloaded` beyond.
    pub max_parked_bytes: usize,
    /// Longest an entry may wait to commit; 503 `no_quorum` beyond.
    pub commit_timeout: Duration,
}

impl Default for RoundLimits {
    fn default() -> Self {
        Self {
            max_pending_per_key: MAX_PENDING_REQUESTS_PER_KEY,
            entries_in_flight: DEFAULT_ENTRIES_IN_FLIGHT,
            max_parked_messages: MAX_PARKED_MESSAGES,
            max_parked_bytes: MAX_PARKED_BYTES,
            commit_timeout: Duration::from_millis(COMMIT_TIMEOUT_MS),
        }
    }
}

impl RoundLimits {
    fn schedule_settings(&self) -> ScheduleSettings {
        ScheduleSettings {
            max_entries_in_flight: self.entries_in_flight.clamp(1, MAX_ENTRIES_IN_FLIGHT),
            max_keys_per_entry: MAX_KEYS_PER_ENTRY,
            max_bytes_per_entry: MAX_ENTRY_MESSAGE_BYTES,
            max_pending_per_key: self
                .max_pending_per_key
                .clamp(1, MAX_PENDING_REQUESTS_PER_KEY),
            max_parked_messages: self.max_parked_messages.clamp(1, MAX_PARKED_MESSAGES),
            max_parked_bytes: self.max_parked_bytes.clamp(1, MAX_PARKED_BYTES),
            commit_timeout: self.commit_timeout,
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, RoundError>>;

/// A request parked until its key's round.
#[derive(Debug)]
struct WaitingRequest {
    request: PermitRequest,
    reply: Reply<PermitGrant>,
    /// Its bytes as received (the schedule's bounds count them).
    bytes: usize,
    /// Until when a round that grants it nothing may hold it instead of
    /// answering: only pure demand requests with a `waitMs` (see [`holdable`]).
    answer_by: Option<Instant>,
}

/// A sync parked until the next entry.
#[derive(Debug)]
struct WaitingSync {
    key: String,
    sync: PermitSync,
    reply: Reply<PermitSyncResult>,
}

type LeaderSchedule = Schedule<WaitingRequest, WaitingSync>;

/// The batcher's handle; cheap to clone.
#[derive(Debug, Clone)]
pub struct Rounds {
    inner: Arc<Inner>,
}

struct Inner {
    raft: Raft,
    state: permitd_storage::SharedState,
    leadership: watch::Receiver<Leadership>,
    /// A std mutex: held only to move messages in and out, never across an await.
    schedule: Mutex<LeaderSchedule>,
    /// Wakes the driver: an arrival, an answered entry, or the timer.
    wake: Arc<Notify>,
    timer: PreciseTimer,
    commit_timeout: Duration,
}

impl Rounds {
    /// Starts the driver and the task that fails messages on leadership loss.
    pub fn start(
        raft: Raft,
        state: permitd_storage::SharedState,
        leadership: watch::Receiver<Leadership>,
        limits: RoundLimits,
    ) -> Self {
        let settings = limits.schedule_settings();
        let wake = Arc::new(Notify::new());
        let rounds = Self {
            inner: Arc::new(Inner {
                raft,
                state,
                leadership,
                schedule: Mutex::new(Schedule::new(settings)),
                timer: PreciseTimer::start(wake.clone()),
                wake,
                commit_timeout: settings.commit_timeout,
            }),
        };
        tokio::spawn(rounds.clone().drive());
        tokio::spawn(rounds.clone().fail_on_leadership_loss());
        tokio::spawn(rounds.clone().wake_on_returned_permits());
        rounds
    }

    /// Wakes the held requests of every key an applied entry returned permits
    /// of outside its round's reports: a reclaimed grant or lease, or an
    /// operator's force release. (A lowered limit frees nothing; a raised one
    /// wakes from its handler.)
    async fn wake_on_returned_permits(self) {
        let mut applied = self.inner.state.subscribe();
        loop {
            match applied.recv().await {
                Ok(entry) => {
                    let keys: Vec<&str> = entry
                        .events
                        .iter()
                        .filter(|(_, event)| returns_permits_of(event))
                        .map(|(key, _)| key.as_str())
                        .collect();
                    if !keys.is_empty() {
                        let now = Instant::now();
                        let mut schedule = self.schedule();
                        keys.into_iter().for_each(|key| schedule.wake(key, now));
                        drop(schedule);
                        self.inner.wake.notify_one();
                    }
                }
                // Missed entries may have freed anything: wake every key.
                Err(broadcast::error::RecvError::Lagged(_)) => self.wake_all(),
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    fn schedule(&self) -> MutexGuard<'_, LeaderSchedule> {
        // A panic while holding the lock leaves only plain data behind; keep going.
        self.inner
            .schedule
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check_leading(&self) -> Result<(), RoundError> {
        let leadership = *self.inner.leadership.borrow();
        if leadership.is_leader {
            return Ok(());
        }
        Err(ProposeError::NotLeader {
            leader: leadership.leader,
        }
        .into())
    }

    /// Copies of the requests waiting for `key`'s next round, in arrival order
    /// (for the operators' holders view; empty on a follower).
    pub fn waiting(&self, key: &str) -> Vec<PermitRequest> {
        let schedule = self.schedule();
        schedule
            .waiting(key)
            .map(|waiting| waiting.request.clone())
            .collect()
    }

    /// Parks `request` (`bytes` as received) for `key`'s next round and waits
    /// for its answer.
    pub async fn request(
        &self,
        key: &str,
        request: PermitRequest,
        bytes: usize,
    ) -> Result<PermitGrant, RoundError> {
        self.check_leading()?;
        let timings = self.timings(key);
        let (reply, answer) = oneshot::channel();
        let now = Instant::now();
        let answer_by = holdable(&request).map(|wait| now + wait);
        let waiting = WaitingRequest {
            request,
            reply,
            bytes,
            answer_by,
        };
        self.schedule().park(key, waiting, bytes, timings, now)?;
        crate::observe::metrics::pending_changed(1);
        self.inner.wake.notify_one();
        // The sender is dropped only if the node is shutting down.
        answer
            .await
            .unwrap_or(Err(ProposeError::ShuttingDown.into()))
    }

    /// Queues `sync` for the next entry and waits for its answer.
    pub async fn sync(
        &self,
        key: &str,
        sync: PermitSync,
        bytes: usize,
    ) -> Result<PermitSyncResult, RoundError> {
        self.check_leading()?;
        let (reply, answer) = oneshot::channel();
        let wakes = returns_permits(&sync).then_some(key);
        let waiting = WaitingSync {
            key: key.to_owned(),
            sync,
            reply,
        };
        self.schedule()
            .push_sync(waiting, bytes, wakes, Instant::now())?;
        crate::observe::metrics::pending_changed(1);
        self.inner.wake.notify_one();
        answer
            .await
            .unwrap_or(Err(ProposeError::ShuttingDown.into()))
    }

    /// Something may have freed permits of `key` outside a round (a reclaim, a
    /// configuration change, a force release): its held requests join its next
    /// round.
    pub fn wake(&self, key: &str) {
        self.schedule().wake(key, Instant::now());
        self.inner.wake.notify_one();
    }

    /// As [`Self::wake`], for every key (new defaults, a restore).
    pub fn wake_all(&self) {
        self.schedule().wake_all(Instant::now());
        self.inner.wake.notify_one();
    }

    /// `(roundWaitMs, roundPeriodMs)` of a key, as configured now.
    fn timings(&self, key: &str) -> Timings {
        self.inner.state.read(|semaphores| {
            let config = semaphores.config(key);
            Timings {
                wait: Duration::from_millis(config.round_wait_ms),
                period: Duration::from_millis(config.round_period_ms),
            }
        })
    }

    /// The driver: proposes every entry the schedule lets leave, fails what is
    /// parked once the leader is stalled, then sleeps until the schedule's next
    /// wake-up or until something changes.
    async fn drive(self) {
        let mut timer_set_for: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let (entry, next_wake) = {
                let mut schedule = self.schedule();
                if schedule.is_stalled(now) && schedule.parked() > 0 {
                    let (requests, syncs) = schedule.drop_all();
                    drop(schedule);
                    self.fail_dropped(requests, syncs, &self.stalled_error());
                    continue;
                }
                let entry = schedule.take_entry(now);
                (entry, schedule.next_wake(now))
            };
            if let Some(entry) = entry {
                tokio::spawn(self.clone().run_entry(entry));
                continue;
            }
            if let Some(due) = next_wake.filter(|due| timer_set_for != Some(*due)) {
                self.inner.timer.wake_at(due);
                timer_set_for = Some(due);
            }
            self.inner.wake.notified().await;
            if timer_set_for.is_some_and(|due| due <= Instant::now()) {
                timer_set_for = None;
            }
        }
    }

    async fn run_entry(self, entry: Entry<WaitingRequest, WaitingSync>) {
        let parked = entry.syncs.len() + entry.rounds.iter().map(|r| r.1.len()).sum::<usize>();
        crate::observe::metrics::pending_changed(-(parked as i64));
        let span = tracing::info_span!(
            "round_entry",
            keys = entry.rounds.len(),
            syncs = entry.syncs.len()
        );
        let started = Instant::now();
        let (id, woken_before) = (entry.id, entry.woken_before);
        let (command, replies) = into_command(entry);
        let proposal = propose(&self.inner.raft, &self.inner.leadership, command);
        tokio::pin!(proposal);
        let timeout = tokio::time::sleep(self.inner.commit_timeout);
        let result = tokio::select! {
            result = &mut proposal => Some(result),
            () = timeout => None,
        };
        let Some(result) = result else {
            // Stalled: answer now, but keep the entry in flight until it ends.
            let error = RoundError::NoQuorum {
                for_ms: millis(started.elapsed()),
            };
            replies.fail(error);
            let _ = proposal.instrument(span).await;
            self.schedule().entry_done(id, Instant::now());
            self.inner.wake.notify_one();
            return;
        };
        let elapsed = started.elapsed();
        let _entered = span.enter();
        let answered = match result {
            Ok((result, _)) => result.into_round().map_err(RoundError::from),
            Err(error) => Err(error.into()),
        };
        match answered {
            Ok((answers, synced))
                if answers.len() == replies.rounds.len() && synced.len() == replies.syncs.len() =>
            {
                for (reply, answer) in replies.syncs.into_iter().zip(synced) {
                    let _ = reply.send(Ok(answer));
                }
                let answers = self.hold_empty_handed(replies.rounds, answers, woken_before);
                self.end_entry(id);
                for ((key, replies), answers) in answers {
                    answer_round(&key, replies, Ok(&answers), elapsed);
                }
            }
            Ok(_) => {
                self.end_entry(id);
                replies.fail(RoundError::Mismatch);
            }
            Err(error) => {
                self.end_entry(id);
                replies.fail(error);
            }
        }
    }

    fn end_entry(&self, id: crate::leader::schedule::EntryId) {
        self.schedule().entry_done(id, Instant::now());
        self.inner.wake.notify_one();
    }

    /// Holds the requests each round left empty-handed that may still wait
    /// (see [`holdable`]) for their keys' next rounds; hands back the rest to
    /// answer now. Runs before the entry counts as done, so that its keys are
    /// still known to the schedule.
    fn hold_empty_handed(
        &self,
        rounds: Vec<KeyReplies>,
        answers: Vec<Vec<PermitGrant>>,
        woken_before: u64,
    ) -> Vec<(KeyReplies, Vec<PermitGrant>)> {
        let now = Instant::now();
        let mut schedule = self.schedule();
        let mut held = 0;
        let mut out = Vec::with_capacity(rounds.len());
        for ((key, replies), answers) in rounds.into_iter().zip(answers) {
            if answers.len() != replies.len() {
                out.push(((key, replies), answers));
                continue;
            }
            let mut kept = (Vec::new(), Vec::new());
            for (reply, answer) in replies.into_iter().zip(answers) {
                let reply = match reply {
                    RoundReply::Holdable(waiting) if empty_handed(&answer) => {
                        let answer_by = waiting.answer_by.unwrap_or(now);
                        let bytes = waiting.bytes;
                        match schedule.hold(&key, *waiting, bytes, answer_by, woken_before, now) {
                            Ok(()) => {
                                held += 1;
                                continue;
                            }
                            Err(waiting) => RoundReply::Holdable(Box::new(waiting)),
                        }
                    }
                    reply => reply,
                };
                kept.0.push(reply);
                kept.1.push(answer);
            }
            if !kept.0.is_empty() {
                out.push(((key, kept.0), kept.1));
            }
        }
        drop(schedule);
        crate::observe::metrics::pending_changed(held);
        out
    }

    /// Fails every parked message as soon as this node stops leading.
    async fn fail_on_leadership_loss(self) {
        let mut leadership = self.inner.leadership.clone();
        loop {
            let _ = leadership.wait_for(|now| now.is_leader).await;
            let started = *leadership.borrow();
            crate::leader::leadership::lost(leadership.clone(), started).await;
            self.fail_all(ProposeError::LeaderChanged);
            if leadership.has_changed().is_err() {
                return;
            }
        }
    }

    /// Answers every parked message with `error` and forgets the schedule.
    pub fn fail_all(&self, error: ProposeError) {
        let (requests, syncs) = self.schedule().drop_all();
        self.fail_dropped(requests, syncs, &error.into());
    }

    fn fail_dropped(
        &self,
        requests: Vec<WaitingRequest>,
        syncs: Vec<WaitingSync>,
        error: &RoundError,
    ) {
        let failed = requests.len() + syncs.len();
        if failed > 0 {
            tracing::warn!(messages = failed, %error, "failing waiting messages");
        }
        crate::observe::metrics::pending_changed(-(failed as i64));
        for waiting in requests {
            let _ = waiting.reply.send(Err(error.clone()));
        }
        for waiting in syncs {
            let _ = waiting.reply.send(Err(error.clone()));
        }
    }

    /// The answer for messages failed because the leader is stalled.
    fn stalled_error(&self) -> RoundError {
        let now = Instant::now();
        let since = self
            .schedule()
            .stall_deadline()
            .map_or(now, |deadline| deadline - self.inner.commit_timeout);
        RoundError::NoQuorum {
            for_ms: millis(now.saturating_duration_since(since)),
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

/// Where a round's answer to one request goes.
#[derive(Debug)]
enum RoundReply {
    /// Answered whatever the round gives.
    Now(Reply<PermitGrant>),
    /// May be held if the round gives nothing: the request is kept (a copy
    /// went into the entry) to join a later round.
    Holdable(Box<WaitingRequest>),
}

impl RoundReply {
    fn send(self, answer: Result<PermitGrant, RoundError>) {
        let reply = match self {
            Self::Now(reply) => reply,
            Self::Holdable(waiting) => waiting.reply,
        };
        let _ = reply.send(answer);
    }
}

/// One key's round: where its answers go, in request order.
type KeyReplies = (String, Vec<RoundReply>);

/// The reply channels of one entry, in the command's order.
#[derive(Debug, Default)]
struct Replies {
    syncs: Vec<Reply<PermitSyncResult>>,
    rounds: Vec<KeyReplies>,
}

impl Replies {
    fn fail(self, error: RoundError) {
        for reply in self.syncs {
            let _ = reply.send(Err(error.clone()));
        }
        for (key, replies) in self.rounds {
            fail_replies(&key, replies, error.clone());
        }
    }
}

/// Splits an entry into its command (at the leader's clock) and its replies.
fn into_command(entry: Entry<WaitingRequest, WaitingSync>) -> (Command, Replies) {
    let mut replies = Replies::default();
    let mut syncs = Vec::with_capacity(entry.syncs.len());
    for waiting in entry.syncs {
        syncs.push(KeySync {
            key: waiting.key,
            sync: waiting.sync,
        });
        replies.syncs.push(waiting.reply);
    }
    let mut keys = Vec::with_capacity(entry.rounds.len());
    for (key, waiting) in entry.rounds {
        let (requests, key_replies) = waiting
            .into_iter()
            .map(|waiting| match waiting.answer_by {
                Some(_) => (
                    waiting.request.clone(),
                    RoundReply::Holdable(Box::new(waiting)),
                ),
                None => (waiting.request, RoundReply::Now(waiting.reply)),
            })
            .unzip();
        keys.push(KeyRound {
            key: key.clone(),
            requests,
        });
        replies.rounds.push((key, key_replies));
    }
    let command = Command::Round {
        now_ms: crate::now_ms(),
        syncs,
        keys,
    };
    (command, replies)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn answer_round(
    key: &str,
    replies: Vec<RoundReply>,
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
            let requests = replies.len();
            tracing::info_span!("round", key, requests, granted, duration_ms).in_scope(|| {
                tracing::debug!("round answered");
            });
            crate::observe::metrics::round_finished(elapsed);
            for (reply, answer) in replies.into_iter().zip(answers) {
                reply.send(Ok(answer.clone()));
            }
        }
        Ok(_) => fail_replies(key, replies, RoundError::Mismatch),
        Err(error) => fail_replies(key, replies, error.clone()),
    }
}

fn fail_replies(key: &str, replies: Vec<RoundReply>, error: RoundError) {
    tracing::warn!(key, requests = replies.len(), %error, "round failed");
    for reply in replies {
        reply.send(Err(error.clone()));
    }
}

/// How long a request may be held, if at all: a pure demand request (no
/// reports, whose answers the client may be waiting for) with a `waitMs`.
fn holdable(request: &PermitRequest) -> Option<Duration> {
    let wait_ms = request.wait_ms.unwrap_or(0).min(MAX_REQUEST_WAIT_MS);
    let reports =
        !request.grants.is_empty() || request.leases.as_ref().is_some_and(|l| !l.is_empty());
    (wait_ms > 0 && !reports && !request.demand.is_empty()).then(|| Duration::from_millis(wait_ms))
}

/// A round's answer that tells the client nothing new: no grant, no lease,
/// and only demand held back by the key's room or a group cap (which a later
/// round may serve). A group that is not permitted, or cannot be resolved,
/// is answered at once.
fn empty_handed(answer: &PermitGrant) -> bool {
    answer.grants.is_empty()
        && answer.leases.as_ref().is_none_or(Vec::is_empty)
        && answer.blocked.iter().all(|blocked| {
            matches!(
                blocked.reason,
                BlockedReason::Limit | BlockedReason::GroupLimit
            )
        })
}

/// An applied event that returns permits to a key.
fn returns_permits_of(event: &Event) -> bool {
    matches!(
        event,
        Event::GrantReclaimed { .. } | Event::LeaseReclaimed { .. } | Event::ClientReleased { .. }
    )
}

/// A sync that returns permits (a grant released, or any lease report, which
/// may release, retire or settle): it may serve the key's held requests.
fn returns_permits(sync: &PermitSync) -> bool {
    sync.grants.iter().any(|grant| grant.released > 0)
        || sync
            .leases
            .as_ref()
            .is_some_and(|leases| !leases.is_empty())
}
