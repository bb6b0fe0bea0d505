//! The leader's entry schedule: which rounds and syncs leave in the next log
//! entry, and when. Pure: time is passed in, nothing here sleeps or does IO, so
//! every rule is unit-tested with plain values (see the tests below).
//!
//! The rules:
//! - a request parks in its key's pending list; the key falls due at
//!   `max(first arrival + roundWaitMs, last round start + roundPeriodMs)`;
//! - a key's next round may fall due while its earlier rounds are still being
//!   committed (rounds are pipelined): their outcomes are computed at apply
//!   time, in log order, so this stays deterministic;
//! - a sync is due at once: it waits at most until the next entry leaves;
//! - one entry carries every pending sync and every due key's round, up to
//!   `max_keys_per_entry` keys and `max_bytes_per_entry` bytes of messages
//!   (at least one message always goes, however large);
//! - at most `max_entries_in_flight` entries are being committed at once;
//!   whatever falls due meanwhile waits and then shares the next entry;
//! - losing leadership drops everything parked (the caller fails it).
//!
//! [`Deadlines`] (per-key due times in due order) is the one timer structure:
//! the schedule keeps round due times and idle keys' period ends in it, and the
//! reclaim timers keep claim deadlines in it.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Per-key due times, earliest first.
///
/// Invariant: `at[key] == due` exactly when `(due, key)` is in `order`.
#[derive(Debug, Clone)]
pub struct Deadlines<T: Ord + Clone, K: Ord + Hash + Clone> {
    order: BTreeSet<(T, K)>,
    at: HashMap<K, T>,
}

impl<T: Ord + Clone, K: Ord + Hash + Clone> Default for Deadlines<T, K> {
    fn default() -> Self {
        Self {
            order: BTreeSet::new(),
            at: HashMap::new(),
        }
    }
}

impl<T: Ord + Clone, K: Ord + Hash + Clone> Deadlines<T, K> {
    /// Sets `key`'s due time, or clears it with `None`.
    pub fn set(&mut self, key: K, due: Option<T>) {
        if let Some(old) = self.at.remove(&key) {
            self.order.remove(&(old, key.clone()));
        }
        if let Some(due) = due {
            self.order.insert((due.clone(), key.clone()));
            self.at.insert(key, due);
        }
        debug_assert_eq!(self.order.len(), self.at.len(), "deadline indexes agree");
    }

    pub fn get(&self, key: &K) -> Option<&T> {
        self.at.get(key)
    }

    /// The earliest due time.
    pub fn first(&self) -> Option<&T> {
        self.order.first().map(|(due, _)| due)
    }

    /// Takes the earliest key if it is due at `now`.
    pub fn pop_due(&mut self, now: &T) -> Option<(T, K)> {
        if self.order.first().is_some_and(|(due, _)| due <= now) {
            let (due, key) = self.order.pop_first().expect("checked above");
            self.at.remove(&key);
            return Some((due, key));
        }
        None
    }

    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    pub fn clear(&mut self) {
        self.order.clear();
        self.at.clear();
    }
}

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
}

/// A key's timings, as configured when a request parks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    pub wait: Duration,
    pub period: Duration,
}

/// One key's parked requests and round history.
#[derive(Debug)]
struct KeyPending<R> {
    requests: Vec<(R, usize)>,
    first_arrival: Option<Instant>,
    last_round_at: Option<Instant>,
    period: Duration,
}

impl<R> Default for KeyPending<R> {
    fn default() -> Self {
        Self {
            requests: Vec::new(),
            first_arrival: None,
            last_round_at: None,
            period: Duration::ZERO,
        }
    }
}

/// What the next entry carries: syncs first (in arrival order), then one round
/// per key (requests in arrival order).
#[derive(Debug, PartialEq, Eq)]
pub struct Entry<R, S> {
    pub syncs: Vec<S>,
    pub rounds: Vec<(String, Vec<R>)>,
}

/// Why a request could not park.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyFull {
    pub pending: usize,
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
    syncs: Vec<(S, usize)>,
    in_flight: usize,
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
            syncs: Vec::new(),
            in_flight: 0,
        }
    }

    /// Parks `request` (`bytes` long) for `key`'s next round.
    pub fn park(
        &mut self,
        key: &str,
        request: R,
        bytes: usize,
        timings: Timings,
        now: Instant,
    ) -> Result<(), KeyFull> {
        let pending = self.keys.entry(key.to_owned()).or_default();
        if pending.requests.len() >= self.settings.max_pending_per_key {
            return Err(KeyFull {
                pending: pending.requests.len(),
            });
        }
        pending.requests.push((request, bytes));
        pending.period = timings.period;
        if pending.first_arrival.is_none() {
            pending.first_arrival = Some(now);
            let mut due_at = now + timings.wait;
            if let Some(last) = pending.last_round_at {
                due_at = due_at.max(last + timings.period);
            }
            self.idle.set(key.to_owned(), None);
            self.due.set(key.to_owned(), Some(due_at));
        }
        Ok(())
    }

    /// Queues a sync for the next entry.
    pub fn push_sync(&mut self, sync: S, bytes: usize) {
        self.syncs.push((sync, bytes));
    }

    /// Requests parked for `key`.
    pub fn pending(&self, key: &str) -> usize {
        self.keys
            .get(key)
            .map_or(0, |pending| pending.requests.len())
    }

    /// The requests parked for `key`, in arrival order.
    pub fn waiting(&self, key: &str) -> impl Iterator<Item = &R> {
        self.keys
            .get(key)
            .into_iter()
            .flat_map(|pending| pending.requests.iter().map(|(request, _)| request))
    }

    /// Requests and syncs parked in all.
    pub fn parked(&self) -> usize {
        self.syncs.len()
            + self
                .keys
                .values()
                .map(|key| key.requests.len())
                .sum::<usize>()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// When the next entry may leave: `None` with nothing parked or no room in
    /// flight; a time at or before `now` means now.
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        if self.in_flight >= self.settings.max_entries_in_flight {
            return None;
        }
        if !self.syncs.is_empty() {
            return Some(now);
        }
        self.due.first().copied()
    }

    /// Takes the next entry if one may leave at `now`; it counts as in flight
    /// until [`Self::entry_done`].
    pub fn take_entry(&mut self, now: Instant) -> Option<Entry<R, S>> {
        self.forget_idle(now);
        if !self.next_due(now).is_some_and(|due| due <= now) {
            return None;
        }
        let mut budget = self.settings.max_bytes_per_entry;
        let mut entry = Entry {
            syncs: Vec::new(),
            rounds: Vec::new(),
        };
        let mut first = true;
        let mut fits = |bytes: usize| {
            let fits = first || bytes <= budget;
            first = false;
            budget = budget.saturating_sub(bytes);
            fits
        };
        let mut syncs = std::mem::take(&mut self.syncs).into_iter();
        for (sync, bytes) in syncs.by_ref() {
            if !fits(bytes) {
                self.syncs.push((sync, bytes));
                break;
            }
            entry.syncs.push(sync);
        }
        self.syncs.extend(syncs);
        while entry.rounds.len() < self.settings.max_keys_per_entry {
            let Some((due_at, key)) = self.due.pop_due(&now) else {
                break;
            };
            let pending = self.keys.get_mut(&key).expect("due keys are kept");
            let bytes: usize = pending.requests.iter().map(|(_, bytes)| bytes).sum();
            if !fits(bytes) {
                self.due.set(key, Some(due_at));
                break;
            }
            let requests = std::mem::take(&mut pending.requests);
            pending.first_arrival = None;
            pending.last_round_at = Some(now);
            self.idle.set(key.clone(), Some(now + pending.period));
            entry.rounds.push((
                key,
                requests.into_iter().map(|(request, _)| request).collect(),
            ));
        }
        if entry.syncs.is_empty() && entry.rounds.is_empty() {
            return None;
        }
        self.in_flight += 1;
        Some(entry)
    }

    /// An entry taken earlier was answered (or failed).
    pub fn entry_done(&mut self) {
        debug_assert!(self.in_flight > 0, "an entry was in flight");
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Leadership was lost: hands back everything parked and forgets the
    /// schedule. Entries in flight still end through [`Self::entry_done`].
    pub fn drop_all(&mut self) -> (Vec<R>, Vec<S>) {
        let syncs = std::mem::take(&mut self.syncs)
            .into_iter()
            .map(|(sync, _)| sync)
            .collect();
        let requests = std::mem::take(&mut self.keys)
            .into_values()
            .flat_map(|pending| pending.requests)
            .map(|(request, _)| request)
            .collect();
        self.due.clear();
        self.idle.clear();
        (requests, syncs)
    }

    /// Keys whose period ended with nothing parked are forgotten (bounded memory).
    fn forget_idle(&mut self, now: Instant) {
        while let Some((_, key)) = self.idle.pop_due(&now) {
            if self
                .keys
                .get(&key)
                .is_some_and(|key| key.requests.is_empty())
            {
                self.keys.remove(&key);
            }
        }
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
        schedule.take_entry(t0 + ms(1)).unwrap();
        schedule
            .park("a", 2, 10, timings(1, 20), t0 + ms(2))
            .unwrap();
        assert_eq!(schedule.next_due(t0 + ms(2)), Some(t0 + ms(21)));
        // Arriving after the period: only the wait counts.
        let (mut schedule, t0) = self::schedule();
        schedule.park("a", 1, 10, timings(1, 20), t0).unwrap();
        schedule.take_entry(t0 + ms(1)).unwrap();
        schedule
            .park("a", 2, 10, timings(1, 20), t0 + ms(40))
            .unwrap();
        assert_eq!(schedule.next_due(t0 + ms(40)), Some(t0 + ms(41)));
    }

    #[test]
    fn rounds_of_one_key_pipeline_while_earlier_ones_are_in_flight() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 10, timings(1, 1), t0).unwrap();
        schedule.take_entry(t0 + ms(1)).unwrap();
        schedule
            .park("a", 2, 10, timings(1, 1), t0 + ms(1))
            .unwrap();
        let second = schedule.take_entry(t0 + ms(2)).unwrap();
        assert_eq!(second.rounds, [("a".to_string(), vec![2])]);
        assert_eq!(schedule.in_flight(), 2);
    }

    #[test]
    fn syncs_are_due_at_once_and_ride_with_due_rounds() {
        let (mut schedule, t0) = schedule();
        schedule.park("a", 1, 10, timings(5, 5), t0).unwrap();
        schedule.push_sync("s1", 10);
        assert_eq!(schedule.next_due(t0), Some(t0));
        let entry = schedule.take_entry(t0).unwrap();
        assert_eq!(
            (entry.syncs, entry.rounds.len()),
            (vec!["s1"], 0),
            "a is not due yet"
        );
        schedule.push_sync("s2", 10);
        schedule.push_sync("s3", 10);
        let entry = schedule.take_entry(t0 + ms(5)).unwrap();
        assert_eq!(entry.syncs, ["s2", "s3"]);
        assert_eq!(keys_of(&entry), ["a"]);
    }

    #[test]
    fn entries_in_flight_are_capped_and_work_due_meanwhile_shares_the_next() {
        let (mut schedule, t0) = schedule();
        schedule.push_sync("s1", 10);
        schedule.take_entry(t0).unwrap();
        schedule.push_sync("s2", 10);
        schedule.take_entry(t0).unwrap();
        schedule.push_sync("s3", 10);
        schedule.park("a", 1, 10, timings(0, 0), t0).unwrap();
        schedule.park("b", 2, 10, timings(0, 0), t0).unwrap();
        assert_eq!(schedule.next_due(t0), None, "two in flight");
        assert!(schedule.take_entry(t0).is_none());
        schedule.entry_done();
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
        schedule.push_sync("big", 5_000);
        schedule.push_sync("next", 10);
        let entry = schedule.take_entry(t0).unwrap();
        assert_eq!(entry.syncs, ["big"]);
        schedule.entry_done();
        schedule.push_sync("more", 600);
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
            Err(KeyFull { pending: 4 })
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
        schedule.push_sync("s", 1);
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
        schedule.take_entry(t0).unwrap();
        assert!(schedule.take_entry(t0 + ms(5)).is_none());
        assert!(schedule.keys.contains_key("a"), "its period still matters");
        assert!(schedule.take_entry(t0 + ms(10)).is_none());
        assert!(!schedule.keys.contains_key("a"));
        assert!(schedule.idle.is_empty() && schedule.due.is_empty());
    }

    #[test]
    fn deadlines_keep_one_due_time_per_key_in_order() {
        let mut deadlines: Deadlines<u64, &str> = Deadlines::default();
        deadlines.set("a", Some(30));
        deadlines.set("b", Some(10));
        deadlines.set("a", Some(5));
        assert_eq!((deadlines.first(), deadlines.len()), (Some(&5), 2));
        assert_eq!(deadlines.pop_due(&4), None);
        assert_eq!(deadlines.pop_due(&10), Some((5, "a")));
        assert_eq!(deadlines.pop_due(&10), Some((10, "b")));
        deadlines.set("c", Some(1));
        deadlines.set("c", None);
        assert!(deadlines.is_empty() && deadlines.get(&"c").is_none());
    }
}
