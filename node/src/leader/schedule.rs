//! The leader's entry schedule: which rounds and syncs leave in the next log
//! entry, and when. Pure: time is passed in, nothing here sleeps or does IO, so
//! every rule is unit-tested with plain values (see the tests below).
//!
//! The rules:
//! - a request parks in its key's pending list; the key falls due at
//!   `max(first arrival + roundWaitMs, last round start + roundPeriodMs)`;
//! - a key's next round leaves only once its round in flight is answered
//!   (rounds of different keys are pipelined, a key's own are not): the
//!   requests of the round in flight may come back empty-handed and be held,
//!   and those are older than whatever parked meanwhile, so they must join the
//!   next round ahead of it. Pipelined, a younger request's round could take a
//!   permit released while the older requests' round was being committed
//!   (found by the simulator's liveness checker: a waiter overtaken by 78 ms);
//! - a sync is due at once: it waits at most until the next entry leaves;
//!   but the early sync split off a request (its grant reports) is due only
//!   [`EARLY_SYNC_WAIT_MAX`] after it arrived, or its key's round wait if
//!   shorter: meanwhile it rides any entry that leaves, usually its own
//!   request's round. An entry of its own would spend a log entry (a commit
//!   on every node) to apply a release a few milliseconds sooner, which no
//!   round could use before then anyway: every entry carries every parked
//!   sync, applied first;
//! - one entry carries every pending sync and every due key's round, up to
//!   `max_keys_per_entry` keys and `max_bytes_per_entry` bytes of messages
//!   (at least one message always goes, however large); a key's requests that
//!   do not fit stay due and lead the next entry after this one is answered;
//! - at most `max_entries_in_flight` entries are being committed at once;
//!   whatever falls due meanwhile waits and then shares the next entry;
//! - at most `max_parked_messages` messages and `max_parked_bytes` bytes wait
//!   on the whole leader, and `max_pending_per_key` requests per key;
//! - an entry not committed within `commit_timeout` means the leader is
//!   stalled (no quorum answers): no entry leaves, the caller fails everything
//!   parked, and new messages are refused until the oldest entry ends;
//! - a request that a round left empty-handed may be *held* (see
//!   [`Schedule::hold`]): it waits, without making its key due, until its key
//!   is *woken* — a new request for the key, a sync that returns permits, or
//!   an explicit wake (reclaims, configuration changes) — or until its own
//!   answer-by time; then it joins the key's next round, ahead of newer
//!   requests. A wake that came while the request's round was in flight counts
//!   too: the request goes straight back into the next round;
//! - a wake that may have freed permits (any but a new request's) makes the
//!   key due at once, never sooner than `roundPeriodMs` after its last round:
//!   its held requests have waited their round already, and `roundWaitMs`
//!   after the wake would leave the freed permits idle that long (measured:
//!   a contended key handing 32 permits from runner to runner lost 1 ms of
//!   each ~5 ms hand-off to it). A new request's wake keeps its own wait, which
//!   gathers the requests that arrive with it;
//! - a key with nothing parked or held, and no round in flight, is forgotten
//!   once its period ends;
//! - losing leadership drops everything parked (the caller fails it).
//!
//! It keeps round due times, idle keys' period ends and held requests' ends in
//! [`Deadlines`] (`deadlines.rs`), the one timer structure the reclaim timers
//! share.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::deadlines::Deadlines;

/// Longest an early sync (a request's grant reports) waits for an entry to
/// ride before it makes one leave: the default `roundWaitMs`, so with the
/// default timings a request and its reports share one entry, and with a
/// long round wait a release still takes effect within a few milliseconds.
pub const EARLY_SYNC_WAIT_MAX: Duration = Duration::from_millis(5);

/// Tunables of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleSettings {
    /// Entries proposed and not yet answered; more due work waits.
    pub max_entries_in_flight: usize,
    /// Keys whose rounds share one entry.
    pub max_keys_per_entry: usize,
    /// Message bytes (as received) one entry carries; the first always goes.
    pub max_bytes_per_entry: usize,
    /// Requests that may wait for one key's round.
    pub max_pending_per_key: usize,
    /// Requests and syncs that may wait on this leader, all keys together.
    pub max_parked_messages: usize,
    /// Their bytes (as received), all keys together.
    pub max_parked_bytes: usize,
    /// A key's next round waits for its round in flight (the rule above);
    /// `false` pipelines them, as before that rule, for the simulator's hunt
    /// of entries proposed out of order (`permitd_storage::bugs`).
    pub one_round_in_flight_per_key: bool,
    /// Longest an entry may take to commit before the leader counts as stalled.
    pub commit_timeout: Duration,
}

/// A key's timings, as configured when a request parks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    pub wait: Duration,
    pub period: Duration,
}

/// One key's parked and held requests and round history.
#[derive(Debug)]
struct KeyPending<R> {
    requests: Vec<(R, usize)>,
    /// Requests a round left empty-handed, waiting for a wake.
    held: Vec<(R, usize)>,
    first_arrival: Option<Instant>,
    last_round_at: Option<Instant>,
    timings: Timings,
    /// The schedule's wake count at this key's last wake.
    woken_at: u64,
    /// The same, at its last wake that may have freed permits (not a new
    /// request's).
    freed_at: u64,
    /// Entries in flight that carry a round of this key.
    rounds_in_flight: usize,
    /// When the key falls due once its round in flight is answered.
    due_after_flight: Option<Instant>,
}

impl<R> Default for KeyPending<R> {
    fn default() -> Self {
        Self {
            requests: Vec::new(),
            held: Vec::new(),
            first_arrival: None,
            last_round_at: None,
            timings: Timings {
                wait: Duration::ZERO,
                period: Duration::ZERO,
            },
            woken_at: 0,
            freed_at: 0,
            rounds_in_flight: 0,
            due_after_flight: None,
        }
    }
}

impl<R> KeyPending<R> {
    /// Nothing parked, held or in flight: the key may be forgotten.
    fn is_idle(&self) -> bool {
        self.requests.is_empty() && self.held.is_empty() && self.rounds_in_flight == 0
    }
}

/// The schedule as [`Schedule::hold_probe`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldProbe {
    wakes: u64,
}

/// Names an entry taken from the schedule until [`Schedule::entry_done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryId(u64);

/// What the next entry carries: syncs first (in arrival order), then one round
/// per key (requests in arrival order).
#[derive(Debug, PartialEq, Eq)]
pub struct Entry<R, S> {
    pub id: EntryId,
    pub syncs: Vec<S>,
    pub rounds: Vec<(String, Vec<R>)>,
    /// The schedule's wake count when the entry left: [`Schedule::hold`]
    /// compares it with its keys' later wakes.
    pub woken_before: u64,
}

/// Why a message could not park.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CannotPark {
    /// `max_pending_per_key` requests already wait for this key.
    KeyFull { pending: usize },
    /// The leader already holds `max_parked_messages` or `max_parked_bytes`.
    LeaderFull { messages: usize, bytes: usize },
    /// The oldest entry in flight has not committed for `commit_timeout`.
    Stalled { for_ms: u64 },
}

/// The schedule of rounds `R` and syncs `S` on one leader.
#[derive(Debug)]
pub struct Schedule<R, S> {
    settings: ScheduleSettings,
    keys: HashMap<String, KeyPending<R>>,
    /// Keys with parked requests, by when their round falls due.
    due: Deadlines<Instant, String>,
    /// Keys with nothing parked, by when their period ends (then forgotten).
    idle: Deadlines<Instant, String>,
    /// Keys with held requests, by the earliest answer-by time among them.
    holds: Deadlines<Instant, String>,
    /// Wakes so far (of any key): orders wakes against entries leaving.
    wakes: u64,
    /// Parked syncs, each with when it falls due (at once, or later for an
    /// early sync riding with its request), and its bytes.
    syncs: Vec<((S, Instant), usize)>,
    /// The earliest of those due times.
    syncs_due: Option<Instant>,
    /// Requests and syncs parked, and their bytes.
    parked_messages: usize,
    parked_bytes: usize,
    /// Entries taken and not yet done, by id (ids grow: the first is the oldest),
    /// with when they left and the keys of their rounds.
    in_flight: BTreeMap<EntryId, (Instant, Vec<String>)>,
    next_id: u64,
}

impl<R, S> Schedule<R, S> {
    pub fn new(settings: ScheduleSettings) -> Self {
        assert!(
            settings.max_entries_in_flight > 0,
            "an entry must be able to leave"
        );
        assert!(settings.max_keys_per_entry > 0, "an entry carries a key");
        Self {
            settings,
            keys: HashMap::new(),
            due: Deadlines::default(),
            idle: Deadlines::default(),
            holds: Deadlines::default(),
            wakes: 0,
            syncs: Vec::new(),
            syncs_due: None,
            parked_messages: 0,
            parked_bytes: 0,
            in_flight: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// Whether `messages` more messages of `bytes` together may park at `now`.
    fn admit(&self, messages: usize, bytes: usize, now: Instant) -> Result<(), CannotPark> {
        if let Some(since) = self.stalled_since(now) {
            let for_ms = now.saturating_duration_since(since).as_millis();
            return Err(CannotPark::Stalled {
                for_ms: u64::try_from(for_ms).unwrap_or(u64::MAX),
            });
        }
        let settings = &self.settings;
        if self.parked_messages.saturating_add(messages) > settings.max_parked_messages
            || self.parked_bytes.saturating_add(bytes) > settings.max_parked_bytes
        {
            return Err(CannotPark::LeaderFull {
                messages: self.parked_messages,
                bytes: self.parked_bytes,
            });
        }
        Ok(())
    }

    /// When the oldest entry in flight left, if it has been in flight for
    /// `commit_timeout` or longer at `now`.
    fn stalled_since(&self, now: Instant) -> Option<Instant> {
        let (_, &(since, _)) = self.in_flight.first_key_value()?;
        (since + self.settings.commit_timeout <= now).then_some(since)
    }

    /// Whether the leader is stalled at `now`: see the module rules.
    pub fn is_stalled(&self, now: Instant) -> bool {
        self.stalled_since(now).is_some()
    }

    /// When the leader counts as stalled if nothing commits before: `None` with
    /// nothing in flight.
    pub fn stall_deadline(&self) -> Option<Instant> {
        let (_, &(since, _)) = self.in_flight.first_key_value()?;
        Some(since + self.settings.commit_timeout)
    }

    /// Parks `request` (`bytes` long) for `key`'s next round.
    pub fn park(
        &mut self,
        key: &str,
        request: R,
        bytes: usize,
        timings: Timings,
        now: Instant,
    ) -> Result<(), CannotPark> {
        self.park_after(key, (request, bytes), None, timings, now)
    }

    /// Parks a request for `key`'s next round and queues, for the next entry,
    /// the sync its reports were split into (each with its bytes): both or
    /// neither, so that a refused request has applied nothing.
    pub fn park_behind_sync(
        &mut self,
        key: &str,
        request: (R, usize),
        sync: (S, usize),
        timings: Timings,
        now: Instant,
    ) -> Result<(), CannotPark> {
        self.park_after(key, request, Some(sync), timings, now)
    }

    /// Parks a request with its bytes, after `sync` if it has one. The sync
    /// needs no wake of its own: the new request wakes the key's held requests.
    fn park_after(
        &mut self,
        key: &str,
        (request, bytes): (R, usize),
        sync: Option<(S, usize)>,
        timings: Timings,
        now: Instant,
    ) -> Result<(), CannotPark> {
        let sync_bytes = sync.as_ref().map_or(0, |(_, bytes)| *bytes);
        let messages = 1 + usize::from(sync.is_some());
        self.admit(messages, bytes.saturating_add(sync_bytes), now)?;
        self.key_has_room(key)?;
        if let Some((sync, sync_bytes)) = sync {
            let due = now + timings.wait.min(EARLY_SYNC_WAIT_MAX);
            self.queue_sync(sync, due, sync_bytes, None, now);
        }
        let pending = self.keys.entry(key.to_owned()).or_default();
        pending.requests.push((request, bytes));
        pending.timings = timings;
        self.parked_messages += 1;
        self.parked_bytes += bytes;
        // Held requests are older: they join this round, ahead of it, which
        // waits for others as a new request's does.
        self.unhold(key);
        self.make_due(key, now);
        Ok(())
    }

    /// Whether a new request for `key` might skip its round: the key holds
    /// requests, has none parked and no round in flight, so a round now would
    /// carry the held requests and the new one, and nothing else. The caller
    /// rehearses that round; if it would serve nobody, [`Self::hold_arrival`]
    /// holds the new request with the others, provided nothing changed since
    /// this probe (no wake of any key: the probe remembers the wake count).
    pub fn hold_probe(&self, key: &str) -> Option<HoldProbe> {
        let pending = self.keys.get(key)?;
        let quiet = !pending.held.is_empty()
            && pending.requests.is_empty()
            && pending.rounds_in_flight == 0;
        quiet.then_some(HoldProbe { wakes: self.wakes })
    }

    /// Holds a new `request` (`bytes` long) for `key` without making the key
    /// due, as a round that left it empty-handed would have, if `probe` still
    /// describes the schedule; otherwise parks it as [`Self::park`] does.
    /// The caller rehearsed, after `probe`, a round of the held requests and
    /// this one, and it would have served nobody and changed nothing.
    /// Returns whether the request was held.
    pub fn hold_arrival(
        &mut self,
        key: &str,
        (request, bytes): (R, usize),
        answer_by: Instant,
        timings: Timings,
        probe: HoldProbe,
        now: Instant,
    ) -> Result<bool, CannotPark> {
        let unchanged = self.hold_probe(key) == Some(probe);
        if !unchanged || answer_by <= now {
            return self.park(key, request, bytes, timings, now).map(|()| false);
        }
        self.admit(1, bytes, now)?;
        self.key_has_room(key)?;
        self.keys.get_mut(key).expect("probed above").timings = timings;
        self.push_held(key, (request, bytes), answer_by);
        Ok(true)
    }

    /// Whether one more request may wait for `key`'s round.
    fn key_has_room(&self, key: &str) -> Result<(), CannotPark> {
        let pending = self.pending(key);
        if pending >= self.settings.max_pending_per_key {
            return Err(CannotPark::KeyFull { pending });
        }
        Ok(())
    }

    /// Makes `key`'s round due by the rules, unless it already is.
    fn make_due(&mut self, key: &str, now: Instant) {
        if self
            .keys
            .get(key)
            .is_some_and(|p| p.first_arrival.is_none())
        {
            self.make_due_after(key, now, true);
        }
    }

    /// Makes `key`'s round due `roundWaitMs` after `now` (with `wait`) or at
    /// `now`, never sooner than `roundPeriodMs` after its last round, or once
    /// its round in flight is answered; an earlier due time stays.
    fn make_due_after(&mut self, key: &str, now: Instant, wait: bool) {
        let Some(pending) = self.keys.get_mut(key) else {
            return;
        };
        if pending.requests.is_empty() {
            return;
        }
        let mut due_at = if wait {
            now + pending.timings.wait
        } else {
            now
        };
        if let Some(last) = pending.last_round_at {
            due_at = due_at.max(last + pending.timings.period);
        }
        pending.first_arrival.get_or_insert(now);
        let key = key.to_owned();
        self.idle.set(key.clone(), None);
        if pending.rounds_in_flight > 0 && self.settings.one_round_in_flight_per_key {
            let later = pending.due_after_flight.unwrap_or(due_at);
            pending.due_after_flight = Some(later.min(due_at));
        } else {
            let later = self.due.get(&key).copied().unwrap_or(due_at);
            self.due.set(key, Some(later.min(due_at)));
        }
    }

    /// Something happened that may let `key`'s held requests get permits (see
    /// the module rules): they join its next round, which falls due by the
    /// usual rules. A key with nothing held and no round in flight is not
    /// remembered: no request can be waiting for this wake.
    pub fn wake(&mut self, key: &str, now: Instant) {
        if let Some(pending) = self.keys.get_mut(key) {
            pending.freed_at = self.wakes + 1;
        }
        if self.unhold(key) {
            self.make_due_now(key, now);
        }
    }

    /// Counts a wake of `key` and moves its held requests ahead of the parked
    /// ones; whether there were any.
    fn unhold(&mut self, key: &str) -> bool {
        let Some(pending) = self.keys.get_mut(key) else {
            return false;
        };
        self.wakes += 1;
        pending.woken_at = self.wakes;
        if pending.held.is_empty() {
            return false;
        }
        let mut held = std::mem::take(&mut pending.held);
        held.append(&mut pending.requests);
        pending.requests = held;
        self.holds.set(key.to_owned(), None);
        true
    }

    /// Makes `key`'s round due at once (by the period and the round in
    /// flight): its waiting requests have waited already (the module rules).
    fn make_due_now(&mut self, key: &str, now: Instant) {
        self.make_due_after(key, now, false);
    }

    /// Wakes every key that holds requests (a change that may concern any key,
    /// such as new defaults or a restore).
    pub fn wake_all(&mut self, now: Instant) {
        let mut keys: Vec<String> = self.keys.keys().cloned().collect();
        // In key order, not the map's (which differs from run to run): the same
        // history gives the same entries (the simulator replays it).
        keys.sort_unstable();
        for key in keys {
            self.wake(&key, now);
        }
    }

    /// Holds `request` (`bytes` long), which a round of `key` in the entry
    /// that left with `woken_before` wakes left empty-handed, until the key is
    /// woken or `answer_by` comes. If the key was woken since that entry left,
    /// the request joins the key's next round at once. Hands the request back
    /// when it cannot wait (the leader's or the key's bounds, a stalled
    /// leader): the caller answers it as it is.
    pub fn hold(
        &mut self,
        key: &str,
        request: R,
        bytes: usize,
        answer_by: Instant,
        woken_before: u64,
        now: Instant,
    ) -> Result<(), R> {
        if answer_by <= now || self.admit(1, bytes, now).is_err() {
            return Err(request);
        }
        let max_pending = self.settings.max_pending_per_key;
        let Some(pending) = self.keys.get_mut(key) else {
            return Err(request);
        };
        if pending.requests.len() + pending.held.len() >= max_pending {
            return Err(request);
        }
        if pending.woken_at > woken_before {
            // Woken while its round was in flight: what woke it may have
            // freed the permits it waits for.
            let freed = pending.freed_at > woken_before;
            pending.requests.insert(0, (request, bytes));
            self.parked_messages += 1;
            self.parked_bytes += bytes;
            if freed {
                self.make_due_now(key, now);
            } else {
                self.make_due(key, now);
            }
            return Ok(());
        }
        self.push_held(key, (request, bytes), answer_by);
        Ok(())
    }

    /// Adds `request` to the held requests of `key` (a key the schedule
    /// knows), counted as parked, until a wake or `answer_by`.
    fn push_held(&mut self, key: &str, (request, bytes): (R, usize), answer_by: Instant) {
        let pending = self.keys.get_mut(key).expect("a known key");
        pending.held.push((request, bytes));
        self.parked_messages += 1;
        self.parked_bytes += bytes;
        // The key's hold ends at its earliest answer-by time.
        let until = self.holds.get(&key.to_owned()).copied();
        let until = until.map_or(answer_by, |until| until.min(answer_by));
        self.holds.set(key.to_owned(), Some(until));
    }

    /// Keys whose earliest held request must be answered by `now` are woken.
    fn wake_expired_holds(&mut self, now: Instant) {
        while let Some((_, key)) = self.holds.pop_due(&now) {
            self.wake(&key, now);
        }
    }

    /// Queues a sync (`bytes` long) for the next entry. `wakes` names the key
    /// whose held requests it may serve (it returns permits), if any.
    pub fn push_sync(
        &mut self,
        sync: S,
        bytes: usize,
        wakes: Option<&str>,
        now: Instant,
    ) -> Result<(), CannotPark> {
        self.admit(1, bytes, now)?;
        self.queue_sync(sync, now, bytes, wakes, now);
        Ok(())
    }

    /// Queues an admitted sync that falls due at `due`.
    fn queue_sync(
        &mut self,
        sync: S,
        due: Instant,
        bytes: usize,
        wakes: Option<&str>,
        now: Instant,
    ) {
        self.syncs_due = Some(self.syncs_due.map_or(due, |earliest| earliest.min(due)));
        self.syncs.push(((sync, due), bytes));
        self.parked_messages += 1;
        self.parked_bytes += bytes;
        if let Some(key) = wakes {
            self.wake(key, now);
        }
    }

    /// Requests parked or held for `key`.
    pub fn pending(&self, key: &str) -> usize {
        self.keys
            .get(key)
            .map_or(0, |pending| pending.requests.len() + pending.held.len())
    }

    /// The requests held, then parked, for `key`.
    pub fn waiting(&self, key: &str) -> impl Iterator<Item = &R> {
        self.keys.get(key).into_iter().flat_map(|pending| {
            let held = pending.held.iter();
            held.chain(&pending.requests).map(|(request, _)| request)
        })
    }

    /// Requests and syncs parked in all.
    pub fn parked(&self) -> usize {
        self.parked_messages
    }

    /// The bytes of the requests and syncs parked.
    pub fn parked_bytes(&self) -> usize {
        self.parked_bytes
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// When the next entry may leave: `None` with nothing parked, no room in
    /// flight or a stalled leader; a time at or before `now` means now.
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        if self.in_flight.len() >= self.settings.max_entries_in_flight || self.is_stalled(now) {
            return None;
        }
        // An expired hold makes its key due (then by the usual rules).
        [
            self.syncs_due.as_ref(),
            self.due.first(),
            self.holds.first(),
        ]
        .into_iter()
        .flatten()
        .min()
        .copied()
    }

    /// When the driver should next look at the schedule: the next entry, the
    /// leader counting as stalled, or an idle key to forget (so that memory of
    /// idle keys is dropped on time even when nothing else happens).
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        let stall = self.stall_deadline().filter(|at| *at > now);
        [self.next_due(now), stall, self.idle.first().copied()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Takes the next entry if one may leave at `now`; it counts as in flight
    /// until [`Self::entry_done`].
    pub fn take_entry(&mut self, now: Instant) -> Option<Entry<R, S>> {
        self.forget_idle(now);
        self.wake_expired_holds(now);
        if self.next_due(now).is_none_or(|due| due > now) {
            return None;
        }
        let mut budget = ByteBudget::new(self.settings.max_bytes_per_entry);
        let id = EntryId(self.next_id);
        let syncs = budget.take(&mut self.syncs);
        self.syncs_due = self.syncs.iter().map(|((_, due), _)| *due).min();
        let mut entry = Entry {
            id,
            syncs: syncs.into_iter().map(|(sync, _)| sync).collect(),
            rounds: Vec::new(),
            woken_before: self.wakes,
        };
        while entry.rounds.len() < self.settings.max_keys_per_entry && !budget.spent() {
            let Some((due_at, key)) = self.due.pop_due(&now) else {
                break;
            };
            let pending = self.keys.get_mut(&key).expect("due keys are kept");
            let requests = budget.take(&mut pending.requests);
            if requests.is_empty() {
                self.due.set(key, Some(due_at));
                break;
            }
            pending.last_round_at = Some(now);
            pending.rounds_in_flight += 1;
            if pending.requests.is_empty() {
                pending.first_arrival = None;
            } else if self.settings.one_round_in_flight_per_key {
                // The rest did not fit: due again once this round is answered.
                pending.due_after_flight = Some(due_at);
            } else {
                self.due.set(key.clone(), Some(due_at));
            }
            entry.rounds.push((key, requests));
        }
        if entry.syncs.is_empty() && entry.rounds.is_empty() {
            return None;
        }
        let taken = entry.syncs.len() + entry.rounds.iter().map(|(_, r)| r.len()).sum::<usize>();
        self.parked_messages -= taken;
        self.parked_bytes -= budget.used;
        self.next_id += 1;
        let keys = entry.rounds.iter().map(|(key, _)| key.clone()).collect();
        self.in_flight.insert(id, (now, keys));
        Some(entry)
    }

    /// An entry taken earlier was answered (or failed), and its empty-handed
    /// requests held: a key left with nothing waits out its period, then is
    /// forgotten.
    pub fn entry_done(&mut self, id: EntryId, now: Instant) {
        let Some((_, keys)) = self.in_flight.remove(&id) else {
            debug_assert!(false, "{id:?} was in flight");
            return;
        };
        for key in keys {
            let Some(pending) = self.keys.get_mut(&key) else {
                continue;
            };
            pending.rounds_in_flight = pending.rounds_in_flight.saturating_sub(1);
            if pending.rounds_in_flight == 0 {
                if let Some(due_at) = pending.due_after_flight.take() {
                    self.due.set(key.clone(), Some(due_at));
                }
            }
            if pending.is_idle() {
                let last = pending.last_round_at.unwrap_or(now);
                self.idle
                    .set(key, Some(last.max(now) + pending.timings.period));
            }
        }
    }

    /// Leadership was lost: hands back everything parked and forgets the
    /// schedule. Entries in flight still end through [`Self::entry_done`].
    pub fn drop_all(&mut self) -> (Vec<R>, Vec<S>) {
        self.syncs_due = None;
        let syncs = std::mem::take(&mut self.syncs)
            .into_iter()
            .map(|((sync, _), _)| sync)
            .collect();
        // In key order, not the map's (which differs from run to run): the
        // callers are failed, and retry, in the same order every time (a
        // simulated seed replays).
        let mut keys: Vec<(String, KeyPending<R>)> =
            std::mem::take(&mut self.keys).into_iter().collect();
        keys.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        let requests = keys
            .into_iter()
            .flat_map(|(_, pending)| pending.held.into_iter().chain(pending.requests))
            .map(|(request, _)| request)
            .collect();
        self.due.clear();
        self.idle.clear();
        self.holds.clear();
        self.parked_messages = 0;
        self.parked_bytes = 0;
        (requests, syncs)
    }

    /// Keys whose period ended with nothing parked are forgotten (bounded memory).
    fn forget_idle(&mut self, now: Instant) {
        while let Some((_, key)) = self.idle.pop_due(&now) {
            if self.keys.get(&key).is_some_and(KeyPending::is_idle) {
                self.keys.remove(&key);
            }
        }
    }
}

/// The bytes one entry may still carry. The first message always fits, so that
/// one larger than the whole budget still leaves (alone).
#[derive(Debug)]
struct ByteBudget {
    left: usize,
    used: usize,
    first: bool,
    /// A message did not fit: the entry is full.
    full: bool,
}

impl ByteBudget {
    fn new(bytes: usize) -> Self {
        Self {
            left: bytes,
            used: 0,
            first: true,
            full: false,
        }
    }

    fn spent(&self) -> bool {
        self.full
    }

    /// Takes messages from the front of `queue` while they fit, in order.
    fn take<T>(&mut self, queue: &mut Vec<(T, usize)>) -> Vec<T> {
        let mut count = 0;
        for &(_, bytes) in queue.iter() {
            if self.full || !(self.first || bytes <= self.left) {
                self.full = true;
                break;
            }
            self.first = false;
            self.left = self.left.saturating_sub(bytes);
            self.used += bytes;
            count += 1;
        }
        queue.drain(..count).map(|(message, _)| message).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTINGS: ScheduleSettings = ScheduleSettings {
        max_entries_in_flight: 2,
        max_keys_per_entry: 3,
        max_bytes_per_entry: 1_000,
        max_pending_per_key: 4,
        max_parked_messages: 8,
        max_parked_bytes: 10_000,
        one_round_in_flight_per_key: true,
        commit_timeout: Duration::from_millis(100),
    };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn timings(wait: u64, period: u64) -> Timings {
        Timings {
            wait: ms(wait),
            period: ms(period),
        }
    }

    fn schedule() -> (Schedule<u32, &'static str>, Instant) {
        (Schedule::new(SETTINGS), Instant::now())
    }

    fn keys_of<'a>(entry: &'a Entry<u32, &'static str>) -> Vec<&'a str> {
        entry.rounds.iter().map(|(key, _)| key.as_str()).collect()
    }

    #[test]
    fn a_round_falls_due_round_wait_after_the_first_arrival() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 10, timings(5, 1), t0).unwrap();
        schedule
            .park("a", 2, 10, timings(5, 1), t0 + ms(3))
            .unwrap();
        assert_eq!(schedule.next_due(t0), Some(t0 + ms(5)));
        assert!(schedule.take_entry(t0 + ms(4)).is_none());
        let entry = schedule.take_entry(t0 + ms(5)).unwrap();
        assert_eq!(
            entry.rounds,
            [("a".to_string(), vec![1, 2])],
            "arrival order"
        );
    }

    #[test]
    fn the_next_round_waits_for_the_period_after_the_last_start() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 10, timings(1, 20), t0).unwrap();
        let first = schedule.take_entry(t0 + ms(1)).unwrap();
        schedule.entry_done(first.id, t0 + ms(2));
        schedule
            .park("a", 2, 10, timings(1, 20), t0 + ms(2))
            .unwrap();
        assert_eq!(schedule.next_due(t0 + ms(2)), Some(t0 + ms(21)));
        // Arriving after the period: only the wait counts.
        let (mut schedule, t0) = self::schedule();
        schedule.park("a", 1, 10, timings(1, 20), t0).unwrap();
        let first = schedule.take_entry(t0 + ms(1)).unwrap();
        schedule.entry_done(first.id, t0 + ms(3));
        schedule
            .park("a", 2, 10, timings(1, 20), t0 + ms(40))
            .unwrap();
        assert_eq!(schedule.next_due(t0 + ms(40)), Some(t0 + ms(41)));
    }

    #[test]
    fn a_keys_next_round_waits_for_its_round_in_flight_while_other_keys_go() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 10, timings(1, 1), t0).unwrap();
        let first = schedule.take_entry(t0 + ms(1)).unwrap();
        schedule
            .park("a", 2, 10, timings(1, 1), t0 + ms(1))
            .unwrap();
        schedule
            .park("b", 3, 10, timings(1, 1), t0 + ms(1))
            .unwrap();
        let other = schedule.take_entry(t0 + ms(2)).unwrap();
        assert_eq!(other.rounds, [("b".to_string(), vec![3])], "b pipelines");
        assert_eq!(schedule.next_due(t0 + ms(3)), None, "a waits for its round");
        schedule.entry_done(first.id, t0 + ms(5));
        assert_eq!(schedule.next_due(t0 + ms(5)), Some(t0 + ms(2)));
        let second = schedule.take_entry(t0 + ms(5)).unwrap();
        assert_eq!(second.rounds, [("a".to_string(), vec![2])]);
    }

    /// The simulator's finding: a request in a round in flight comes back
    /// empty-handed after a release and a younger request arrived meanwhile;
    /// it leads the next round, and the younger one does not go first.
    #[test]
    fn a_request_back_empty_handed_goes_ahead_of_one_parked_during_its_round() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 10, timings(1, 1), t0).unwrap();
        let first = schedule.take_entry(t0 + ms(1)).unwrap();
        schedule
            .push_sync("release", 10, Some("a"), t0 + ms(2))
            .unwrap();
        schedule
            .park("a", 2, 10, timings(1, 1), t0 + ms(2))
            .unwrap();
        let syncs = schedule.take_entry(t0 + ms(3)).unwrap();
        assert_eq!((syncs.syncs, syncs.rounds.len()), (vec!["release"], 0));
        let answer_by = t0 + ms(1_000);
        schedule
            .hold("a", 1, 10, answer_by, first.woken_before, t0 + ms(4))
            .unwrap();
        schedule.entry_done(first.id, t0 + ms(4));
        let next = schedule.take_entry(t0 + ms(4)).unwrap();
        assert_eq!(next.rounds, [("a".to_string(), vec![1, 2])]);
    }

    #[test]
    fn syncs_are_due_at_once_and_ride_with_due_rounds() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 10, timings(5, 5), t0).unwrap();
        schedule.push_sync("s1", 10, None, t0).unwrap();
        assert_eq!(schedule.next_due(t0), Some(t0));
        let entry = schedule.take_entry(t0).unwrap();
        assert_eq!(
            (entry.syncs, entry.rounds.len()),
            (vec!["s1"], 0),
            "a is not due yet"
        );
        schedule.push_sync("s2", 10, None, t0).unwrap();
        schedule.push_sync("s3", 10, None, t0).unwrap();
        let entry = schedule.take_entry(t0 + ms(5)).unwrap();
        assert_eq!(entry.syncs, ["s2", "s3"]);
        assert_eq!(keys_of(&entry), ["a"]);
    }

    #[test]
    fn entries_in_flight_are_capped_and_work_due_meanwhile_shares_the_next() {
        let (mut schedule, t0) = schedule();
        schedule.push_sync("s1", 10, None, t0).unwrap();
        let first = schedule.take_entry(t0).unwrap();
        schedule.push_sync("s2", 10, None, t0).unwrap();
        schedule.take_entry(t0).unwrap();
        schedule.push_sync("s3", 10, None, t0).unwrap();
        schedule.park("a", 1, 10, timings(0, 0), t0).unwrap();
        schedule.park("b", 2, 10, timings(0, 0), t0).unwrap();
        assert_eq!(schedule.next_due(t0), None, "two in flight");
        assert!(schedule.take_entry(t0).is_none());
        schedule.entry_done(first.id, t0);
        let entry = schedule.take_entry(t0 + ms(1)).unwrap();
        assert_eq!(
            (entry.syncs, keys_of_owned(&entry.rounds)),
            (vec!["s3"], vec!["a", "b"])
        );
    }

    fn keys_of_owned(rounds: &[(String, Vec<u32>)]) -> Vec<&str> {
        rounds.iter().map(|(key, _)| key.as_str()).collect()
    }

    #[test]
    fn keys_per_entry_are_capped_earliest_due_first() {
        let (mut schedule, t0) = schedule();
        for (index, key) in ["d", "c", "b", "a"].into_iter().enumerate() {
            schedule
                .park(key, 0, 10, timings(index as u64, 0), t0)
                .unwrap();
        }
        let entry = schedule.take_entry(t0 + ms(10)).unwrap();
        assert_eq!(keys_of(&entry), ["d", "c", "b"]);
        let entry = schedule.take_entry(t0 + ms(10)).unwrap();
        assert_eq!(keys_of(&entry), ["a"]);
    }

    #[test]
    fn bytes_per_entry_are_capped_but_one_message_always_goes() {
        let (mut schedule, t0) = schedule();
        schedule.push_sync("big", 5_000, None, t0).unwrap();
        schedule.push_sync("next", 10, None, t0).unwrap();
        let entry = schedule.take_entry(t0).unwrap();
        assert_eq!(entry.syncs, ["big"]);
        schedule.entry_done(entry.id, t0);
        schedule.push_sync("more", 600, None, t0).unwrap();
        schedule.park("a", 1, 500, timings(0, 0), t0).unwrap();
        let entry = schedule.take_entry(t0).unwrap();
        assert_eq!(entry.syncs, ["next", "more"]);
        assert!(entry.rounds.is_empty(), "a's 500 bytes pass the 1,000 left");
        let entry = schedule.take_entry(t0).unwrap();
        assert_eq!(keys_of(&entry), ["a"]);
    }

    #[test]
    fn pending_requests_per_key_are_capped() {
        let (mut schedule, t0) = schedule();
        for request in 0..4 {
            schedule.park("a", request, 1, timings(1, 1), t0).unwrap();
        }
        assert_eq!(
            schedule.park("a", 9, 1, timings(1, 1), t0),
            Err(CannotPark::KeyFull { pending: 4 })
        );
        schedule.park("b", 9, 1, timings(1, 1), t0).unwrap();
        assert_eq!((schedule.pending("a"), schedule.parked()), (4, 5));
        let waiting: Vec<u32> = schedule.waiting("a").copied().collect();
        assert_eq!(waiting, [0, 1, 2, 3], "in arrival order");
    }

    #[test]
    fn losing_leadership_drops_everything_parked() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 1, timings(1, 1), t0).unwrap();
        schedule.park("b", 2, 1, timings(1, 1), t0).unwrap();
        schedule.push_sync("s", 1, None, t0).unwrap();
        let (mut requests, syncs) = schedule.drop_all();
        requests.sort_unstable();
        assert_eq!((requests, syncs), (vec![1, 2], vec!["s"]));
        assert_eq!(schedule.next_due(t0), None);
        assert_eq!(schedule.parked(), 0);
    }

    #[test]
    fn idle_keys_are_forgotten_once_their_period_ends() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 1, timings(0, 10), t0).unwrap();
        let entry = schedule.take_entry(t0).unwrap();
        schedule.entry_done(entry.id, t0);
        assert!(schedule.take_entry(t0 + ms(5)).is_none());
        assert!(schedule.keys.contains_key("a"), "its period still matters");
        assert_eq!(
            schedule.next_wake(t0 + ms(5)),
            Some(t0 + ms(10)),
            "woken to forget"
        );
        assert!(schedule.take_entry(t0 + ms(10)).is_none());
        assert!(!schedule.keys.contains_key("a"));
        assert!(schedule.idle.is_empty() && schedule.due.is_empty());
        assert_eq!(schedule.next_wake(t0 + ms(10)), None);
    }

    #[test]
    fn a_keys_requests_that_do_not_fit_lead_the_next_entry() {
        let (mut schedule, t0) = schedule();
        for request in 0..4 {
            schedule
                .park("a", request, 400, timings(0, 1_000), t0)
                .unwrap();
        }
        schedule.park("b", 9, 10, timings(0, 1_000), t0).unwrap();
        let entry = schedule.take_entry(t0).unwrap();
        assert_eq!(
            entry.rounds,
            [("a".to_string(), vec![0, 1])],
            "800 of 1,000 bytes"
        );
        assert_eq!(schedule.parked_bytes(), 810);
        // The rest is due again once that round is answered, although a's
        // period has not passed.
        schedule.entry_done(entry.id, t0 + ms(1));
        let entry = schedule.take_entry(t0 + ms(1)).unwrap();
        assert_eq!(entry.rounds[0], ("a".to_string(), vec![2, 3]));
        assert_eq!(keys_of(&entry), ["a", "b"], "b fits beside them");
        assert_eq!((schedule.parked(), schedule.parked_bytes()), (0, 0));
    }

    #[test]
    fn one_request_larger_than_the_budget_still_leaves_alone() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 3_000, timings(0, 0), t0).unwrap();
        schedule.park("a", 2, 10, timings(0, 0), t0).unwrap();
        let entry = schedule.take_entry(t0).unwrap();
        assert_eq!(entry.rounds, [("a".to_string(), vec![1])]);
        schedule.entry_done(entry.id, t0);
        let entry = schedule.take_entry(t0).unwrap();
        assert_eq!(entry.rounds, [("a".to_string(), vec![2])]);
    }

    #[test]
    fn parked_messages_and_bytes_are_capped_on_the_whole_leader() {
        let (mut schedule, t0) = schedule();
        for key in ["a", "b", "c", "d", "e", "f", "g"] {
            schedule.park(key, 0, 1, timings(9, 9), t0).unwrap();
        }
        schedule.push_sync("s", 1, None, t0).unwrap();
        let full = CannotPark::LeaderFull {
            messages: 8,
            bytes: 8,
        };
        assert_eq!(schedule.park("h", 0, 1, timings(9, 9), t0), Err(full));
        assert_eq!(schedule.push_sync("t", 1, None, t0), Err(full));
        let (mut schedule, t0) = self::schedule();
        schedule.park("a", 0, 9_000, timings(9, 9), t0).unwrap();
        assert_eq!(
            schedule.park("b", 0, 1_001, timings(9, 9), t0),
            Err(CannotPark::LeaderFull {
                messages: 1,
                bytes: 9_000
            })
        );
        schedule.park("b", 0, 1_000, timings(9, 9), t0).unwrap();
        // Leaving in an entry makes room again.
        schedule.take_entry(t0 + ms(9)).unwrap();
        schedule
            .park("c", 0, 1_000, timings(9, 9), t0 + ms(9))
            .unwrap();
    }

    #[test]
    fn a_request_parked_behind_its_sync_sends_the_sync_with_the_next_entry() {
        let (mut schedule, t0) = schedule();
        park_behind_s1(&mut schedule, 5, t0);
        assert_eq!((schedule.parked(), schedule.parked_bytes()), (2, 15));
        assert_eq!(
            schedule.next_due(t0),
            Some(t0 + ms(5)),
            "the early sync is due with the round"
        );
        assert!(schedule.take_entry(t0).is_none());
        let entry = schedule.take_entry(t0 + ms(5)).unwrap();
        assert_eq!(entry.syncs, ["s1"], "it rides its request's round");
        assert_eq!(entry.rounds, [("a".to_string(), vec![1])]);
    }

    /// Parks request 1 of key `a` (10 bytes) behind its early sync `s1` (5
    /// bytes), with a round wait and period of `wait_ms`.
    fn park_behind_s1(schedule: &mut Schedule<u32, &'static str>, wait_ms: u64, t0: Instant) {
        schedule
            .park_behind_sync("a", (1, 10), ("s1", 5), timings(wait_ms, wait_ms), t0)
            .unwrap();
    }

    #[test]
    fn an_early_sync_waits_for_a_long_round_at_most_its_own_maximum() {
        let (mut schedule, t0) = schedule();
        park_behind_s1(&mut schedule, 4_000, t0);
        let due = t0 + EARLY_SYNC_WAIT_MAX;
        assert_eq!(schedule.next_due(t0), Some(due));
        let entry = schedule.take_entry(due).unwrap();
        assert_eq!((entry.syncs, entry.rounds.len()), (vec!["s1"], 0));
        assert_eq!(schedule.next_due(due), Some(t0 + ms(4_000)), "the round");
    }

    #[test]
    fn an_early_sync_rides_the_first_entry_that_leaves() {
        let (mut schedule, t0) = schedule();
        park_behind_s1(&mut schedule, 5, t0);
        schedule.park("b", 2, 10, timings(1, 1), t0).unwrap();
        let entry = schedule.take_entry(t0 + ms(1)).unwrap();
        assert_eq!(entry.syncs, ["s1"], "with another key's round");
        assert_eq!(entry.rounds, [("b".to_string(), vec![2])]);
        schedule.push_sync("urgent", 5, None, t0 + ms(2)).unwrap();
        assert_eq!(
            schedule.next_due(t0 + ms(2)),
            Some(t0 + ms(2)),
            "a sync of its own"
        );
    }

    #[test]
    fn a_request_and_its_sync_park_together_or_not_at_all() {
        let (mut schedule, t0) = schedule();
        for key in ["a", "b", "c", "d", "e", "f", "g"] {
            schedule.park(key, 0, 1, timings(9, 9), t0).unwrap();
        }
        assert_eq!(
            schedule.park_behind_sync("h", (0, 1), ("s", 1), timings(9, 9), t0),
            Err(CannotPark::LeaderFull {
                messages: 7,
                bytes: 7
            }),
            "room for one message, not two"
        );
        assert_eq!(schedule.parked(), 7, "the sync was not queued");
        let (mut schedule, t0) = self::schedule();
        for request in 0..4 {
            schedule.park("a", request, 1, timings(9, 9), t0).unwrap();
        }
        assert_eq!(
            schedule.park_behind_sync("a", (4, 1), ("s", 1), timings(9, 9), t0),
            Err(CannotPark::KeyFull { pending: 4 })
        );
        assert_eq!(schedule.parked(), 4, "the sync was not queued");
    }

    #[test]
    fn an_entry_not_committed_in_time_stalls_the_leader_until_it_ends() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 10, timings(0, 0), t0).unwrap();
        let stuck = schedule.take_entry(t0).unwrap();
        assert_eq!(schedule.stall_deadline(), Some(t0 + ms(100)));
        schedule
            .park("a", 2, 10, timings(0, 0), t0 + ms(99))
            .unwrap();
        assert!(!schedule.is_stalled(t0 + ms(99)));
        assert!(schedule.is_stalled(t0 + ms(100)));
        assert_eq!(schedule.next_due(t0 + ms(100)), None, "nothing leaves");
        assert!(schedule.take_entry(t0 + ms(100)).is_none());
        assert_eq!(
            schedule.park("a", 3, 10, timings(0, 0), t0 + ms(130)),
            Err(CannotPark::Stalled { for_ms: 130 })
        );
        assert_eq!(
            schedule.push_sync("s", 10, None, t0 + ms(130)),
            Err(CannotPark::Stalled { for_ms: 130 })
        );
        let (requests, _) = schedule.drop_all();
        assert_eq!(requests, [2], "the caller fails what was parked");
        schedule.entry_done(stuck.id, t0);
        assert!(!schedule.is_stalled(t0 + ms(200)));
        assert_eq!(schedule.stall_deadline(), None);
        schedule
            .park("a", 4, 10, timings(0, 0), t0 + ms(200))
            .unwrap();
        assert!(schedule.take_entry(t0 + ms(200)).is_some());
    }

    /// Parks `request` for "a", takes its round at `at` and hands back the entry.
    fn round_of_a(
        schedule: &mut Schedule<u32, &'static str>,
        request: u32,
        at: Instant,
    ) -> Entry<u32, &'static str> {
        schedule.park("a", request, 10, timings(0, 0), at).unwrap();
        schedule.take_entry(at).unwrap()
    }

    /// Request 1 of "a" was left empty-handed by its round and is held until
    /// `t0 + 500 ms`; that round's entry is done.
    fn hold_one_in_a(schedule: &mut Schedule<u32, &'static str>, t0: Instant) {
        let entry = round_of_a(schedule, 1, t0);
        hold_one_when_done(schedule, &entry, t0 + ms(500), t0 + ms(2));
    }

    /// Request 1 of "a", which `entry`'s round left empty-handed, is held
    /// until `answer_by` from `at`, when the entry is done.
    fn hold_one_when_done(
        schedule: &mut Schedule<u32, &'static str>,
        entry: &Entry<u32, &'static str>,
        answer_by: Instant,
        at: Instant,
    ) {
        schedule
            .hold("a", 1, 10, answer_by, entry.woken_before, at)
            .unwrap();
        schedule.entry_done(entry.id, at);
    }

    #[test]
    fn a_held_request_makes_no_round_due_until_its_answer_by_time() {
        let (mut schedule, t0) = schedule();
        let entry = round_of_a(&mut schedule, 1, t0);
        hold_one_when_done(&mut schedule, &entry, t0 + ms(50), t0 + ms(2));
        assert_eq!(schedule.parked(), 1, "held requests count as parked");
        assert_eq!(schedule.pending("a"), 1);
        assert!(
            schedule.take_entry(t0 + ms(49)).is_none(),
            "not due while held"
        );
        assert_eq!(schedule.next_due(t0 + ms(3)), Some(t0 + ms(50)));
        let entry = schedule.take_entry(t0 + ms(50)).unwrap();
        assert_eq!(
            entry.rounds,
            [("a".to_string(), vec![1])],
            "answered by then"
        );
    }

    #[test]
    fn a_new_request_wakes_held_ones_and_they_go_first() {
        let (mut schedule, t0) = schedule();
        hold_one_in_a(&mut schedule, t0);
        schedule
            .park("a", 2, 10, timings(0, 0), t0 + ms(5))
            .unwrap();
        let entry = schedule.take_entry(t0 + ms(5)).unwrap();
        assert_eq!(entry.rounds, [("a".to_string(), vec![1, 2])]);
        assert_eq!(schedule.parked(), 0);
    }

    #[test]
    fn a_sync_that_returns_permits_wakes_the_keys_held_requests() {
        let (mut schedule, t0) = schedule();
        hold_one_in_a(&mut schedule, t0);
        schedule.push_sync("claim", 10, None, t0 + ms(3)).unwrap();
        let entry = schedule.take_entry(t0 + ms(3)).unwrap();
        assert!(
            entry.rounds.is_empty(),
            "a sync returning nothing wakes nobody"
        );
        schedule.entry_done(entry.id, t0 + ms(3));
        schedule
            .push_sync("release", 10, Some("a"), t0 + ms(4))
            .unwrap();
        let entry = schedule.take_entry(t0 + ms(4)).unwrap();
        assert_eq!(
            (entry.syncs, entry.rounds),
            (vec!["release"], vec![("a".to_string(), vec![1])])
        );
    }

    #[test]
    fn a_wake_while_the_round_was_in_flight_sends_the_request_straight_back() {
        let (mut schedule, t0) = schedule();
        let entry = round_of_a(&mut schedule, 1, t0);
        // The release arrives while the round that will leave 1 empty-handed
        // is being committed: it must not be missed.
        schedule
            .push_sync("release", 10, Some("a"), t0 + ms(1))
            .unwrap();
        let sync_entry = schedule.take_entry(t0 + ms(1)).unwrap();
        schedule
            .hold("a", 1, 10, t0 + ms(500), entry.woken_before, t0 + ms(2))
            .unwrap();
        schedule.entry_done(entry.id, t0 + ms(2));
        schedule.entry_done(sync_entry.id, t0 + ms(2));
        let next = schedule.take_entry(t0 + ms(2)).unwrap();
        assert_eq!(next.rounds, [("a".to_string(), vec![1])]);
        // Woken before the round left: that wake is already in its outcome.
        let (mut schedule, t0) = self::schedule();
        schedule.push_sync("release", 10, Some("a"), t0).unwrap();
        hold_one_in_a(&mut schedule, t0);
        assert!(schedule.take_entry(t0 + ms(3)).is_none());
    }

    /// Request 1 of "a" (wait 5 ms, period 1 ms) left its round, which left at
    /// `t0 + 5 ms`, empty-handed: held from `t0 + 6 ms`, that entry done.
    fn hold_one_waiting_in_a(schedule: &mut Schedule<u32, &'static str>, t0: Instant) {
        schedule.park("a", 1, 10, timings(5, 1), t0).unwrap();
        assert!(schedule.take_entry(t0 + ms(4)).is_none());
        let entry = schedule.take_entry(t0 + ms(5)).unwrap();
        hold_one_when_done(schedule, &entry, t0 + ms(500), t0 + ms(6));
    }

    #[test]
    fn a_release_sends_held_requests_to_a_round_at_once_but_a_new_request_waits() {
        let (mut schedule, t0) = schedule();
        hold_one_waiting_in_a(&mut schedule, t0);
        schedule
            .push_sync("release", 10, Some("a"), t0 + ms(10))
            .unwrap();
        let entry = schedule.take_entry(t0 + ms(10)).unwrap();
        assert_eq!(
            (entry.syncs, entry.rounds),
            (vec!["release"], vec![("a".to_string(), vec![1])]),
            "the freed permits are not left idle for roundWaitMs"
        );

        let (mut schedule, t0) = self::schedule();
        hold_one_waiting_in_a(&mut schedule, t0);
        schedule
            .park("a", 2, 10, timings(5, 1), t0 + ms(10))
            .unwrap();
        assert!(
            schedule.take_entry(t0 + ms(14)).is_none(),
            "a new request waits for others to share its round"
        );
        let entry = schedule.take_entry(t0 + ms(15)).unwrap();
        assert_eq!(entry.rounds, [("a".to_string(), vec![1, 2])]);
    }

    #[test]
    fn a_release_during_the_round_sends_its_held_requests_back_once_it_is_answered() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 10, timings(5, 1), t0).unwrap();
        let entry = schedule.take_entry(t0 + ms(5)).unwrap();
        schedule
            .push_sync("release", 10, Some("a"), t0 + ms(6))
            .unwrap();
        let sync_entry = schedule.take_entry(t0 + ms(6)).unwrap();
        schedule.entry_done(sync_entry.id, t0 + ms(7));
        hold_one_when_done(&mut schedule, &entry, t0 + ms(500), t0 + ms(8));
        let next = schedule.take_entry(t0 + ms(8)).unwrap();
        assert_eq!(next.rounds, [("a".to_string(), vec![1])]);

        // Woken by a new request instead: the round waits for it.
        let (mut schedule, t0) = self::schedule();
        schedule.park("a", 1, 10, timings(5, 1), t0).unwrap();
        let entry = schedule.take_entry(t0 + ms(5)).unwrap();
        schedule
            .park("a", 2, 10, timings(5, 1), t0 + ms(6))
            .unwrap();
        hold_one_when_done(&mut schedule, &entry, t0 + ms(500), t0 + ms(8));
        assert!(schedule.take_entry(t0 + ms(10)).is_none());
        let next = schedule.take_entry(t0 + ms(11)).unwrap();
        assert_eq!(next.rounds, [("a".to_string(), vec![1, 2])]);
    }

    #[test]
    fn a_woken_round_still_waits_for_the_period() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 10, timings(0, 20), t0).unwrap();
        let entry = schedule.take_entry(t0).unwrap();
        hold_one_when_done(&mut schedule, &entry, t0 + ms(500), t0 + ms(1));
        schedule.wake("a", t0 + ms(2));
        assert!(schedule.take_entry(t0 + ms(19)).is_none());
        let next = schedule.take_entry(t0 + ms(20)).unwrap();
        assert_eq!(next.rounds, [("a".to_string(), vec![1])]);
    }

    #[test]
    fn an_explicit_wake_and_wake_all_release_held_requests() {
        let (mut schedule, t0) = schedule();
        hold_one_in_a(&mut schedule, t0);
        schedule.wake("b", t0 + ms(3));
        assert!(
            schedule.take_entry(t0 + ms(3)).is_none(),
            "another key's wake"
        );
        schedule.wake_all(t0 + ms(4));
        let entry = schedule.take_entry(t0 + ms(4)).unwrap();
        assert_eq!(entry.rounds, [("a".to_string(), vec![1])]);
    }

    #[test]
    fn a_request_that_cannot_wait_is_handed_back() {
        let (mut schedule, t0) = schedule();
        let entry = round_of_a(&mut schedule, 1, t0);
        assert_eq!(
            schedule.hold("a", 1, 10, t0 + ms(2), entry.woken_before, t0 + ms(2)),
            Err(1),
            "its answer-by time has come"
        );
        for request in 2..=4 {
            schedule
                .park("a", request, 10, timings(0, 1_000), t0)
                .unwrap();
        }
        schedule
            .hold("a", 1, 10, t0 + ms(50), entry.woken_before, t0 + ms(2))
            .unwrap();
        assert_eq!(
            schedule.hold("a", 5, 10, t0 + ms(50), entry.woken_before, t0 + ms(2)),
            Err(5),
            "the key's bound counts held requests"
        );
        assert_eq!(
            schedule.hold("z", 6, 10, t0 + ms(50), entry.woken_before, t0 + ms(2)),
            Err(6),
            "a key the schedule no longer knows (leadership was lost)"
        );
    }

    #[test]
    fn held_requests_are_dropped_with_leadership_and_keep_their_key_known() {
        let (mut schedule, t0) = schedule();
        hold_one_in_a(&mut schedule, t0);
        assert!(schedule.take_entry(t0 + ms(100)).is_none());
        assert!(
            schedule.keys.contains_key("a"),
            "held: not forgotten after its period"
        );
        let (requests, _) = schedule.drop_all();
        assert_eq!(requests, [1]);
        assert_eq!(schedule.parked(), 0);
        assert_eq!(schedule.next_wake(t0 + ms(100)), None);
    }

    #[test]
    fn a_request_held_on_arrival_makes_no_round_until_a_wake() {
        let (mut schedule, t0) = schedule();
        hold_one_in_a(&mut schedule, t0);
        let probe = schedule.hold_probe("a").expect("held, nothing parked");
        let held = schedule
            .hold_arrival("a", (2, 10), t0 + ms(300), timings(1, 0), probe, t0 + ms(3))
            .unwrap();
        assert!(held);
        assert_eq!((schedule.parked(), schedule.pending("a")), (2, 2));
        assert!(schedule.take_entry(t0 + ms(10)).is_none(), "no round due");
        assert_eq!(
            schedule.next_due(t0 + ms(10)),
            Some(t0 + ms(300)),
            "the earliest answer-by time"
        );
        schedule
            .push_sync("release", 10, Some("a"), t0 + ms(20))
            .unwrap();
        let entry = schedule.take_entry(t0 + ms(20)).unwrap();
        assert_eq!(
            entry.rounds,
            [("a".to_string(), vec![1, 2])],
            "a release sends both, in arrival order, at once"
        );
    }

    #[test]
    fn a_wake_after_the_probe_parks_the_request_as_usual() {
        let (mut schedule, t0) = schedule();
        hold_one_in_a(&mut schedule, t0);
        let probe = schedule.hold_probe("a").unwrap();
        schedule.wake("a", t0 + ms(3));
        let held = schedule
            .hold_arrival("a", (2, 10), t0 + ms(300), timings(1, 0), probe, t0 + ms(3))
            .unwrap();
        assert!(!held);
        let entry = schedule.take_entry(t0 + ms(4)).unwrap();
        assert_eq!(entry.rounds, [("a".to_string(), vec![1, 2])]);
    }

    #[test]
    fn only_a_key_holding_requests_with_none_parked_or_in_flight_is_probed() {
        let (mut schedule, t0) = schedule();
        assert_eq!(schedule.hold_probe("a"), None, "unknown key");
        let entry = round_of_a(&mut schedule, 1, t0);
        assert_eq!(schedule.hold_probe("a"), None, "round in flight");
        hold_one_when_done(&mut schedule, &entry, t0 + ms(500), t0 + ms(2));
        assert!(schedule.hold_probe("a").is_some());
        schedule
            .park("a", 2, 10, timings(5, 0), t0 + ms(3))
            .unwrap();
        assert_eq!(schedule.hold_probe("a"), None, "a request parked");
    }
}
