//! Round and sync batching on the leader: the async side of [`crate::leader::schedule`].
//!
//! A `request` does not become a log entry by itself: it parks in its key's
//! pending list until the key's round falls due. A `sync` waits only until the
//! next entry leaves. A request's grant reports do not wait for its round: they
//! are split off into a sync of the same client that rides the next entry
//! (docs/protocol.md, "Early reports"), so a runner's release and its next
//! demand share one message without the release waiting. The request's answer
//! carries that sync's grant results, and fails if the sync failed. A retried
//! `requestId` has its reports applied again, which cumulative reports make
//! harmless, and its remembered answer gets the fresh grant results. Lease
//! reports stay in the request for the round's lease pass. One `Command::Round` entry carries every sync that arrived
//! meanwhile (applied first, so the permits they return are granted by the
//! rounds of the same entry) and the rounds of every key that fell due. The
//! rules of when (one round in flight per key, entries in flight, keys and bytes per
//! entry) live in the pure [`Schedule`] and are unit-tested there.
//!
//! One driver task takes entries from the schedule and proposes them; it sleeps
//! on a [`PreciseTimer`] (a timerfd: tokio's 1 ms timer wheel made a 1 ms round
//! wait take up to 2 ms) and is woken by every arrival and every answered entry.
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
use std::time::Duration;

use permitd_core::contract::protocol::{PermitGrant, PermitRequest, PermitSync, PermitSyncResult};
use permitd_core::limits::{
    COMMIT_TIMEOUT_MS, DEFAULT_ENTRIES_IN_FLIGHT, MAX_ENTRIES_IN_FLIGHT, MAX_ENTRY_MESSAGE_BYTES,
    MAX_KEYS_PER_ENTRY, MAX_PARKED_BYTES, MAX_PARKED_MESSAGES, MAX_PENDING_REQUESTS_PER_KEY,
};
use permitd_storage::Applied;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{oneshot, watch, Notify};
use tokio::time::Instant;
use tracing::Instrument;

use super::applied_feed::{AppliedFeed, FeedChange};
use super::leadership::Leadership;
use super::propose::{self, ProposeError};
use super::round_error::RoundError;
use super::round_plan::{
    self, granted, into_command, match_answers, returns_permits, returns_permits_of, KeyAnswers,
    Replies, RoundReply, WaitingRequest, WaitingSync,
};
use super::schedule::{CannotPark, Entry, Schedule, ScheduleSettings, Timings};
use super::timer::PreciseTimer;
use crate::clock::Clock;
use crate::raft::Raft;
use crate::seams::Seams;

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
    /// One shard's share of the node's limits among `shards`: what the
    /// node's leaders park, all shards together, stays within `[limits]`.
    /// Per-key and in-flight limits are per shard's driver as they were.
    pub fn per_shard(self, shards: u32) -> Self {
        let shards = usize::try_from(shards.max(1)).unwrap_or(usize::MAX);
        Self {
            max_parked_messages: self.max_parked_messages.div_ceil(shards),
            max_parked_bytes: self.max_parked_bytes.div_ceil(shards),
            ..self
        }
    }

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
            // Off only where the out-of-order bug is put back: it lived in
            // the pipelined schedule (docs/simulation.md, "Finding bugs").
            one_round_in_flight_per_key: !permitd_storage::bugs::entries_out_of_order(),
            commit_timeout: self.commit_timeout,
        }
    }
}

type LeaderSchedule = Schedule<WaitingRequest, WaitingSync>;

/// An entry handed to openraft: where its answers go, and what the schedule
/// needs back once it ends.
struct EntryInFlight {
    id: super::schedule::EntryId,
    woken_before: u64,
    replies: Replies,
    started: Instant,
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
    /// A std mutex: held only to move messages in and out, never across an await.
    schedule: Mutex<LeaderSchedule>,
    /// Wakes the driver: an arrival or an answered entry (the driver's own
    /// [`PreciseTimer`] wakes it at the schedule's deadlines).
    wake: Arc<Notify>,
    commit_timeout: Duration,
    /// Stamps each entry's `now` (leases and claim deadlines count from it).
    clock: Clock,
    /// Round deadlines on a timerfd ([`PreciseTimer`]) or tokio's timer.
    precise_timer: bool,
}

impl Rounds {
    /// Starts the driver and the task that fails messages on leadership loss
    /// (on the current runtime, the API's), and the waker of keys whose
    /// permits an applied entry returned on `raft_runtime`.
    pub fn start(
        raft: Raft,
        state: permitd_storage::SharedState,
        leadership: watch::Receiver<Leadership>,
        limits: RoundLimits,
        (seams, raft_runtime): (&Seams, &tokio::runtime::Handle),
    ) -> Self {
        let settings = limits.schedule_settings();
        let wake = Arc::new(Notify::new());
        let rounds = Self {
            inner: Arc::new(Inner {
                raft,
                state,
                leadership,
                schedule: Mutex::new(Schedule::new(settings)),
                wake,
                commit_timeout: settings.commit_timeout,
                clock: seams.clock.clone(),
                precise_timer: seams.precise_timer,
            }),
        };
        crate::seams::spawn(rounds.clone().drive());
        crate::seams::spawn(rounds.clone().fail_on_leadership_loss());
        {
            // Beside the applies that notify it: most entries return no
            // permits outside their round, and then the API runtime, where
            // the driver runs, is not woken at all.
            let _on_raft_runtime = raft_runtime.enter();
            crate::seams::spawn(rounds.clone().wake_on_returned_permits());
        }
        rounds
    }

    /// Wakes the held requests of every key an applied entry returned permits
    /// of outside its round's reports: a reclaimed grant or lease, or an
    /// operator's force release. (A lowered limit frees nothing; a raised one
    /// wakes from its handler.) Subscribed only while leading
    /// (`applied_feed.rs`): only a leader holds requests.
    async fn wake_on_returned_permits(self) {
        let mut leadership = self.inner.leadership.clone();
        let mut applied = AppliedFeed::new(self.inner.state.clone());
        loop {
            let leading = leadership.borrow_and_update().is_leader;
            if applied.follow(leading) == FeedChange::Started {
                // Entries applied between taking leadership and subscribing
                // may have freed permits that requests held since wait for.
                self.wake_all();
            }
            tokio::select! {
                changed = leadership.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                entry = applied.recv() => match entry {
                    Ok(entry) => self.wake_keys_returning_permits(&entry),
                    // Missed entries may have freed anything: wake every key.
                    Err(RecvError::Lagged(_)) => self.wake_all(),
                    Err(RecvError::Closed) => return,
                },
            }
        }
    }

    fn wake_keys_returning_permits(&self, entry: &Applied) {
        let keys: Vec<&str> = entry
            .events
            .iter()
            .filter(|(_, event)| returns_permits_of(event))
            .map(|(key, _)| key.as_str())
            .collect();
        if keys.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut schedule = self.schedule();
        keys.into_iter().for_each(|key| schedule.wake(key, now));
        drop(schedule);
        self.inner.wake.notify_one();
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

    /// How many requests wait on this leader for `key`'s round (parked or
    /// held; 0 on a follower).
    pub fn waiting_count(&self, key: &str) -> usize {
        self.schedule().pending(key)
    }

    /// Parks `request` (`bytes` as received) for `key`'s next round and waits
    /// for its answer. Its grant reports go ahead with the next entry, as a
    /// sync's would ([`round_plan::split_early_reports`]).
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
        let waiting = WaitingRequest::new(request, reply, bytes, now);
        let (waiting, early) = round_plan::split_early_reports(waiting);
        let Some(early) = early else {
            self.park_or_hold(key, waiting, timings, now)?;
            crate::observe::metrics::pending_changed(1);
            self.inner.wake.notify_one();
            return answered(answer).await;
        };
        let (sync_reply, synced) = oneshot::channel();
        let reports = early.sync.grants.len();
        let sync = WaitingSync {
            key: key.to_owned(),
            sync: early.sync,
            reply: sync_reply,
        };
        let bytes = waiting.bytes;
        self.schedule().park_behind_sync(
            key,
            (waiting, bytes),
            (sync, early.bytes),
            timings,
            now,
        )?;
        crate::observe::metrics::pending_changed(2);
        crate::observe::metrics::early_reports(reports);
        self.inner.wake.notify_one();
        // Answering a round whose reports were not applied would tell the
        // client they were: a failed early sync fails the request.
        let early = answered(synced).await?;
        Ok(round_plan::with_early_results(
            answered(answer).await?,
            early,
        ))
    }

    /// Parks `waiting` for `key`'s next round, or holds it at once with the
    /// key's held requests when a round of them all would serve nobody and
    /// change nothing (rehearsed on the applied state:
    /// [`round_plan::serves_nobody`]). That round would cost a log entry on
    /// every node and hold them all again; worse, a release arriving while it
    /// is in flight would wait for it. Anything that may free permits later
    /// wakes the held requests as before (docs/protocol.md, "Held requests").
    fn park_or_hold(
        &self,
        key: &str,
        waiting: WaitingRequest,
        timings: Timings,
        now: Instant,
    ) -> Result<(), CannotPark> {
        let bytes = waiting.bytes;
        let hold = waiting.answer_by.and_then(|answer_by| {
            let (probe, mut requests) = {
                let schedule = self.schedule();
                let probe = schedule.hold_probe(key)?;
                let held = schedule.waiting(key).map(|held| held.request.clone());
                (probe, held.collect::<Vec<_>>())
            };
            requests.push(waiting.request.clone());
            let now_ms = self.inner.clock.now_ms();
            let rehearsal = self
                .inner
                .state
                .read(|semaphores| semaphores.rehearse_round(key, now_ms, &requests));
            round_plan::serves_nobody(&rehearsal).then_some((answer_by, probe))
        });
        let mut schedule = self.schedule();
        let Some((answer_by, probe)) = hold else {
            return schedule.park(key, waiting, bytes, timings, now);
        };
        let held = schedule.hold_arrival(key, (waiting, bytes), answer_by, timings, probe, now)?;
        if held {
            crate::observe::metrics::held_on_arrival();
        }
        Ok(())
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
        answered(answer).await
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
        let mut timer = PreciseTimer::register(self.inner.precise_timer);
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
                self.submit(entry).await;
                continue;
            }
            self.sleep(&mut timer, next_wake).await;
        }
    }

    /// Sleeps until `next_wake` or until something arrives or is answered.
    async fn sleep(&self, timer: &mut PreciseTimer, next_wake: Option<Instant>) {
        let woken = self.inner.wake.notified();
        match next_wake {
            None => woken.await,
            Some(due) => tokio::select! {
                () = woken => {}
                () = timer.wait_until(due) => {}
            },
        }
    }

    /// Hands an entry to openraft, here in the driver so that entries take log
    /// indexes in the order they left the schedule: a sync that left first is
    /// applied first, and a wake counted against an entry (`woken_before`) is
    /// one whose sync comes later in the log. (Proposing from a task per entry
    /// let a later round overtake an earlier sync under load: a held request
    /// woken by that sync's release then met its round before the release, was
    /// held again, and waited out its `waitMs`.) Waiting for the commit runs in
    /// a task of its own.
    async fn submit(&self, entry: Entry<WaitingRequest, WaitingSync>) {
        let parked = entry.syncs.len() + entry.rounds.iter().map(|r| r.1.len()).sum::<usize>();
        crate::observe::metrics::pending_changed(-(parked as i64));
        let span = tracing::info_span!(
            "round_entry",
            keys = entry.rounds.len(),
            syncs = entry.syncs.len()
        );
        let started = Instant::now();
        let (id, woken_before) = (entry.id, entry.woken_before);
        let (command, replies) = into_command(entry.syncs, entry.rounds, self.inner.clock.now_ms());
        crate::observe::metrics::requests_abandoned(replies.abandoned);
        if replies.is_empty() {
            self.end_entry(id);
            return;
        }
        let entry = EntryInFlight {
            id,
            woken_before,
            replies,
            started,
        };
        if permitd_storage::bugs::entries_out_of_order() {
            // The bug this method's order fixed, put back for the simulator's
            // hunt (`permitd_storage::bugs`): proposed from a task of its own.
            let rounds = self.clone();
            let proposal = async move {
                let (raft, leadership) = (&rounds.inner.raft, &rounds.inner.leadership);
                let submitted = propose::submit(raft, leadership, command).await;
                rounds.run_entry(entry, submitted).await;
            };
            crate::seams::spawn(proposal.instrument(span));
            return;
        }
        let submitted = propose::submit(&self.inner.raft, &self.inner.leadership, command).await;
        crate::seams::spawn(self.clone().run_entry(entry, submitted).instrument(span));
    }

    /// Waits for a submitted entry to commit and answers its messages.
    async fn run_entry(
        self,
        entry: EntryInFlight,
        submitted: Result<propose::Uncommitted, ProposeError>,
    ) {
        let EntryInFlight {
            id,
            woken_before,
            replies,
            started,
        } = entry;
        let leadership = self.inner.leadership.clone();
        let proposal = async move { propose::outcome(submitted?, &leadership).await };
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
            fail(replies, error);
            let _ = proposal.await;
            self.schedule().entry_done(id, Instant::now());
            self.inner.wake.notify_one();
            return;
        };
        let elapsed = started.elapsed();
        let mut log_index = 0;
        let answered = match result {
            Ok((result, index)) => {
                log_index = index;
                result.into_round().map_err(RoundError::from)
            }
            Err(error) => Err(error.into()),
        };
        let matched = match answered {
            Ok((answers, synced)) => match_answers(replies, answers, synced)
                .map_err(|replies| (replies, RoundError::Mismatch)),
            Err(error) => Err((replies, error)),
        };
        match matched {
            Ok(matched) => {
                for (reply, answer) in matched.syncs {
                    let _ = reply.send(Ok(answer));
                }
                let rounds = self.hold_empty_handed(matched.rounds, woken_before);
                self.end_entry(id);
                for (key, answers) in rounds {
                    match self.deleted_after(&key, log_index) {
                        Some(error) => fail_replies(&key, replies_of(answers), error),
                        None => answer_round(&key, answers, elapsed),
                    }
                }
            }
            Err((replies, error)) => {
                self.end_entry(id);
                fail(replies, error);
            }
        }
    }

    /// Whether `key` was deleted after the round entry at `log_index` applied
    /// (docs/protocol.md, "Deleting a key"): the delete released the grants
    /// of the round's answers, so they must not be handed out. Read under the
    /// state's lock: a delete applied after this read comes after the answers.
    fn deleted_after(&self, key: &str, log_index: u64) -> Option<RoundError> {
        let deleted_at = self.inner.state.deleted_after(key, log_index)?;
        Some(RoundError::KeyDeleted {
            log_index: deleted_at,
        })
    }

    fn end_entry(&self, id: super::schedule::EntryId) {
        self.schedule().entry_done(id, Instant::now());
        self.inner.wake.notify_one();
    }

    /// Holds, in the schedule, the requests each round left empty-handed that
    /// may still wait (the rules: [`round_plan::hold_empty_handed`]); hands
    /// back the rest to answer now. Runs before the entry counts as done, so
    /// that its keys are still known to the schedule.
    fn hold_empty_handed(&self, rounds: Vec<KeyAnswers>, woken_before: u64) -> Vec<KeyAnswers> {
        let now = Instant::now();
        let mut schedule = self.schedule();
        let (held, rounds) =
            round_plan::hold_empty_handed(rounds, now, |key, waiting, answer_by| {
                let bytes = waiting.bytes;
                schedule
                    .hold(key, *waiting, bytes, answer_by, woken_before, now)
                    .map_err(Box::new)
            });
        drop(schedule);
        crate::observe::metrics::pending_changed(held as i64);
        rounds
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

    /// The error every new message gets while the leader counts as stalled
    /// (an entry waited `commit_timeout` to commit); `None` while it commits.
    pub fn stalled(&self) -> Option<RoundError> {
        let stalled = self.schedule().is_stalled(Instant::now());
        stalled.then(|| self.stalled_error())
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

/// Answers every request and sync of an entry with `error`.
fn fail(replies: Replies, error: RoundError) {
    for reply in replies.syncs {
        let _ = reply.send(Err(error.clone()));
    }
    for (key, replies) in replies.rounds {
        fail_replies(&key, replies, error.clone());
    }
}

/// Waits for a parked message's answer. The sender is dropped only if the
/// node is shutting down.
async fn answered<T>(answer: oneshot::Receiver<Result<T, RoundError>>) -> Result<T, RoundError> {
    answer
        .await
        .unwrap_or(Err(ProposeError::ShuttingDown.into()))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Sends one key's answers, or fails its requests if they did not match.
fn answer_round(
    key: &str,
    answers: Result<Vec<(RoundReply, PermitGrant)>, Vec<RoundReply>>,
    elapsed: Duration,
) {
    let answers = match answers {
        Ok(answers) => answers,
        Err(replies) => return fail_replies(key, replies, RoundError::Mismatch),
    };
    let granted = granted(&answers);
    let duration_ms = elapsed.as_secs_f64() * 1e3;
    let requests = answers.len();
    // An event, not a span around one: at the default `info` filter an INFO
    // span was built (its fields formatted by the log layer) for every key
    // of every entry only to hold a DEBUG line nobody printed.
    tracing::debug!(key, requests, granted, duration_ms, "round answered");
    crate::observe::metrics::round_finished(elapsed);
    for (reply, answer) in answers {
        reply.send(Ok(answer));
    }
}

/// The replies of one key's answers, whether they matched or not.
fn replies_of(answers: Result<Vec<(RoundReply, PermitGrant)>, Vec<RoundReply>>) -> Vec<RoundReply> {
    match answers {
        Ok(answers) => answers.into_iter().map(|(reply, _)| reply).collect(),
        Err(replies) => replies,
    }
}

fn fail_replies(key: &str, replies: Vec<RoundReply>, error: RoundError) {
    tracing::warn!(key, requests = replies.len(), %error, "round failed");
    for reply in replies {
        reply.send(Err(error.clone()));
    }
}
