//! Claim-deadline timers, kept by the leader: when a key's earliest claim
//! deadline passes, a reclaim entry returns its unclaimed permits without waiting
//! for a request (docs/protocol.md, "Reclaim").
//!
//! A grant's (or a lease's) unclaimed permits return to the pool at its claim
//! deadline, and a remembered answer is forgotten at its forget time. Rounds do
//! both as they run, but a key nobody asks about has no round, so the leader
//! watches `Semaphores::next_deadline_ms` of every key (claim deadlines and
//! answer forget times) and proposes a `Command::Reclaim` when it passes.
//!
//! One task per node keeps the deadlines, whatever the number of keys:
//! - only deadlines within the horizon (`[limits] reclaim_horizon_ms`, default
//!   [`DEFAULT_HORIZON_MS`]) of now are armed: a key idle with a claim deadline an
//!   hour away costs the leader nothing until it comes near;
//! - `deadlines` ([`Deadlines`], the leader's one timer structure, unit-tested
//!   there) orders the armed keys by when they fall due, one deadline per key;
//! - every half horizon a scan walks every key, a slice
//!   of [`KEYS_PER_SCAN_READ`] per hold of the state's read lock, and arms those
//!   that came within the horizon. A key left unarmed (its deadline beyond the
//!   horizon when it was last aimed or scanned) is seen by a scan that starts
//!   less than half a horizon later, long before its deadline, so no deadline is
//!   missed as long as a scan takes less than half the horizon (milliseconds at
//!   100,000 keys);
//! - the task sleeps until the earliest deadline, then proposes one
//!   `Command::Reclaim` for up to [`MAX_RECLAIM_KEYS_PER_ENTRY`] keys due, with at
//!   most [`MAX_RECLAIMS_IN_FLIGHT`] such proposals outstanding;
//! - a key being reclaimed leaves the set; once its proposal ends it is re-aimed
//!   from the state, like every key an applied entry touched;
//! - a proposal that fails while this node still leads is retried after
//!   [`RETRY_DELAY_MS`]; one that fails because leadership moved is dropped.
//!
//! The timers are derived state: after every applied entry the keys it touched
//! are re-aimed, and a new leader rebuilds all of them from the state (a scan).
//! A follower keeps none, and losing leadership cancels every timer and proposal.
//!
//! The task runs on the Raft runtime, beside the applies whose notices it takes
//! (`applied_feed.rs`): on the API runtime each of the leader's entries woke
//! that runtime's thread once more. Its work per entry is a read of the
//! entry's keys' deadlines; a scan slice ([`KEYS_PER_SCAN_READ`] keys) holds
//! the Raft runtime's one worker for well under a millisecond, and the slices
//! interleave with everything else that runs there.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use permitd_storage::{Command, SharedState};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::clock::Clock;
use crate::leader::applied_feed::AppliedFeed;
use crate::leader::deadlines::Deadlines;
use crate::leader::leadership::Leadership;
use crate::leader::propose::propose;
use crate::raft::Raft;

/// Pause before retrying a reclaim proposal that failed while still leading.
const RETRY_DELAY_MS: u64 = 200;
/// Most keys one `Command::Reclaim` entry names: bounds the entry's size and the
/// time its apply holds the state lock.
const MAX_RECLAIM_KEYS_PER_ENTRY: usize = 256;
/// Most reclaim proposals outstanding at once; further due keys wait their turn.
const MAX_RECLAIMS_IN_FLIGHT: usize = 4;
/// Deadlines at most this far ahead are armed, by default; later ones wait for
/// a scan, which runs every half horizon (see the module comment).
pub const DEFAULT_HORIZON_MS: u64 = 60_000;
/// Shortest `[limits] reclaim_horizon_ms`: a scan of every key each half second.
pub const MIN_HORIZON_MS: u64 = 1_000;
/// Longest `[limits] reclaim_horizon_ms`.
pub const MAX_HORIZON_MS: u64 = 3_600_000;
/// Keys a scan reads per hold of the state's read lock: an apply, and every
/// other task of the Raft runtime, waits at most one slice (well under a
/// millisecond).
const KEYS_PER_SCAN_READ: usize = 1_024;

/// The leader's claim-deadline timers, kept by one task.
///
/// Invariants:
/// - a key in `reclaiming` has no deadline armed;
/// - every armed deadline was within `horizon_ms` when it was armed;
/// - nothing is armed, in flight or being scanned while this node does not lead.
pub struct Reclaimer {
    raft: Raft,
    state: SharedState,
    leadership: watch::Receiver<Leadership>,
    /// Deadlines at most this far ahead are armed.
    horizon_ms: u64,
    /// Armed keys by deadline (ms since the epoch): the first falls due next.
    /// A key's name is one shared allocation for both of the structure's indexes.
    deadlines: Deadlines<u64, Arc<str>>,
    /// Reclaim proposals under way; each yields the keys it named.
    in_flight: JoinSet<Vec<String>>,
    /// The keys those proposals named (at most
    /// `MAX_RECLAIMS_IN_FLIGHT × MAX_RECLAIM_KEYS_PER_ENTRY`): not re-armed
    /// until their proposal ends.
    reclaiming: HashSet<String>,
    /// The scan under way: the last key it read (`None`: not started).
    scan: Option<Option<Arc<str>>>,
    /// When the next scan starts.
    next_scan: Instant,
    /// Whose `now` deadlines are compared with and reclaims are stamped with.
    clock: Clock,
}

impl std::fmt::Debug for Reclaimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reclaimer")
            .field("armed", &self.deadlines.len())
            .field("next_deadline_ms", &self.deadlines.first())
            .field("in_flight", &self.in_flight.len())
            .field("scanning", &self.scan.is_some())
            .finish_non_exhaustive()
    }
}

impl Reclaimer {
    /// Starts the task that keeps the timers; it ends when Raft shuts down.
    /// `horizon` is clamped to [`MIN_HORIZON_MS`]..=[`MAX_HORIZON_MS`].
    pub fn start(
        raft: Raft,
        state: SharedState,
        leadership: watch::Receiver<Leadership>,
        horizon: Duration,
        clock: Clock,
    ) {
        let applied = AppliedFeed::new(state.clone());
        let horizon_ms = u64::try_from(horizon.as_millis()).unwrap_or(u64::MAX);
        let reclaimer = Self {
            raft,
            state,
            leadership,
            horizon_ms: horizon_ms.clamp(MIN_HORIZON_MS, MAX_HORIZON_MS),
            deadlines: Deadlines::default(),
            in_flight: JoinSet::new(),
            reclaiming: HashSet::new(),
            scan: None,
            next_scan: Instant::now(),
            clock,
        };
        crate::seams::spawn(reclaimer.run(applied));
    }

    async fn run(mut self, mut applied: AppliedFeed) {
        let mut leadership = self.leadership.clone();
        let mut leading = false;
        loop {
            // Subscribed only while leading (`applied_feed.rs`): the rebuild
            // on taking leadership reads every key, so notices from before
            // it are not needed.
            applied.follow(leading);
            let wake = self.next_wake().filter(|_| leading);
            let sleep = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now));
            tokio::select! {
                changed = leadership.changed() => {
                    if changed.is_err() {
                        self.cancel_all();
                        return;
                    }
                    let now_leading = leadership.borrow_and_update().is_leader;
                    if now_leading && !leading {
                        self.rebuild();
                    } else if !now_leading {
                        self.cancel_all();
                    }
                    leading = now_leading;
                }
                entry = applied.recv() => match entry {
                    Ok(entry) if leading => self.aim(&entry.keys),
                    Ok(_) => {}
                    // Missed entries: re-derive everything rather than guess.
                    Err(RecvError::Lagged(_)) if leading => self.rebuild(),
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => {
                        self.cancel_all();
                        return;
                    }
                },
                Some(done) = self.in_flight.join_next(), if !self.in_flight.is_empty() => {
                    match done {
                        Ok(keys) => {
                            for key in &keys {
                                self.reclaiming.remove(key);
                            }
                            if leading {
                                self.aim(&keys);
                            }
                        }
                        // A panicked proposal names no keys: forget which keys are in
                        // flight, so that the next scan re-arms this one's (at worst
                        // a key is reclaimed twice, which changes nothing).
                        Err(_) => self.reclaiming.clear(),
                    }
                }
                () = sleep, if wake.is_some() => self.fire(),
                () = tokio::time::sleep_until(self.next_scan), if leading && self.scan.is_none() => {
                    self.start_scan();
                }
                // One slice per turn of the loop, so entries and timers interleave.
                () = std::future::ready(()), if leading && self.scan.is_some() => self.scan_slice(),
            }
        }
    }

    /// When to wake for the earliest deadline; `None` with nothing armed or no
    /// room for another proposal.
    fn next_wake(&self) -> Option<Instant> {
        if self.in_flight.len() >= MAX_RECLAIMS_IN_FLIGHT {
            return None;
        }
        let &deadline_ms = self.deadlines.first()?;
        let wait_ms = deadline_ms.saturating_sub(self.clock.now_ms());
        Some(Instant::now() + Duration::from_millis(wait_ms))
    }

    /// Forgets every timer and scans the state afresh.
    fn rebuild(&mut self) {
        self.cancel_all();
        tracing::info!("rebuilding reclaim timers");
        self.start_scan();
    }

    fn start_scan(&mut self) {
        self.scan = Some(None);
        self.next_scan = Instant::now() + Duration::from_millis(self.horizon_ms / 2);
    }

    /// Reads the next slice of the scan and arms its keys due within the horizon.
    fn scan_slice(&mut self) {
        let Some(after) = self.scan.take() else {
            return;
        };
        let horizon_ms = self.clock.now_ms() + self.horizon_ms;
        let (due, last) = self.state.read(|semaphores| {
            let slice = semaphores
                .keys_after(after.as_deref())
                .take(KEYS_PER_SCAN_READ);
            let mut due: Vec<(Arc<str>, u64)> = Vec::new();
            let mut last = None;
            for (key, state) in slice {
                last = Some(key);
                if let Some(deadline_ms) = state.next_deadline_ms() {
                    if deadline_ms <= horizon_ms && !self.reclaiming.contains(&**key) {
                        due.push((Arc::clone(key), deadline_ms));
                    }
                }
            }
            (due, last.cloned())
        });
        for (key, deadline_ms) in due {
            if self.deadlines.get(&key) != Some(&deadline_ms) {
                self.deadlines.set(key, Some(deadline_ms));
            }
        }
        // Goes on after the last key read; a slice that read none (the walk
        // passed the last key) ends the scan.
        self.scan = last.map(Some);
    }

    /// Re-aims the timers of `keys` at their current earliest claim deadline, or
    /// disarms them when it is beyond the horizon (a scan arms them later).
    fn aim(&mut self, keys: &[String]) {
        let deadlines: Vec<Option<u64>> = self.state.read(|semaphores| {
            keys.iter()
                .map(|key| semaphores.next_deadline_ms(key))
                .collect()
        });
        let horizon_ms = self.clock.now_ms() + self.horizon_ms;
        for (key, deadline_ms) in keys.iter().zip(deadlines) {
            if self.reclaiming.contains(key) {
                continue;
            }
            let deadline_ms = deadline_ms.filter(|&deadline_ms| deadline_ms <= horizon_ms);
            let key: Arc<str> = Arc::from(key.as_str());
            if self.deadlines.get(&key) != deadline_ms.as_ref() {
                self.deadlines.set(key, deadline_ms);
            }
        }
    }

    /// Takes the keys due now (at most one entry's worth) out of the timers and
    /// proposes their reclaim.
    fn fire(&mut self) {
        let now_ms = self.clock.now_ms();
        let mut keys = Vec::new();
        let mut latest_ms = 0;
        while keys.len() < MAX_RECLAIM_KEYS_PER_ENTRY {
            let Some((deadline_ms, key)) = self.deadlines.pop_due(&now_ms) else {
                break;
            };
            latest_ms = latest_ms.max(deadline_ms);
            keys.push(key.to_string());
        }
        self.reclaiming.extend(keys.iter().cloned());
        if keys.is_empty() {
            // Woke early (the wall clock lagged the monotonic one): sleep again.
            return;
        }
        tracing::debug!(keys = keys.len(), "reclaim timers fired");
        let raft = self.raft.clone();
        let leadership = self.leadership.clone();
        self.in_flight.spawn(propose_reclaim(
            raft,
            leadership,
            self.clock.clone(),
            keys,
            latest_ms,
        ));
    }

    fn cancel_all(&mut self) {
        // Dropping a `JoinSet` aborts its tasks.
        self.in_flight = JoinSet::new();
        self.reclaiming.clear();
        self.deadlines.clear();
        self.scan = None;
    }
}

/// Proposes the reclaim of `keys`, retrying while this node leads; returns the
/// keys so that the timer task re-aims them.
async fn propose_reclaim(
    raft: Raft,
    leadership: watch::Receiver<Leadership>,
    clock: Clock,
    keys: Vec<String>,
    latest_deadline_ms: u64,
) -> Vec<String> {
    loop {
        let command = Command::Reclaim {
            now_ms: clock.now_ms().max(latest_deadline_ms),
            keys: keys.clone(),
        };
        match propose(&raft, &leadership, command).await {
            Ok(_) => return keys,
            Err(error) if leadership.borrow().is_leader => {
                tracing::warn!(keys = keys.len(), first = %keys[0], %error, "reclaim failed; retrying");
                tokio::time::sleep(Duration::from_millis(RETRY_DELAY_MS)).await;
            }
            // No longer leading: the next leader rebuilds its own timers.
            Err(_) => return keys,
        }
    }
}
