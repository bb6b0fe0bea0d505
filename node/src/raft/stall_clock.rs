//! When this node's Raft runtime last woke from a stall: one clock per node,
//! read by every shard's election guard (`election_guard.rs`, step 3).
//!
//! A stall (the process or the VM paused, the CPU starved, a worker thread
//! blocked) shows only as a gap: for a while no task of the runtime ran. A
//! node back from one has heard nothing for that long, through no fault of
//! its leader, so its guards count their silence from the moment it woke.
//!
//! A stall belongs to the node, not to a shard. Each guard used to look for
//! one itself, as a late wake of its own sleep, so none could rest longer than
//! a heartbeat interval, however far its patience was: at 64 shards that was
//! 1,600 wakes a second on an idle node (perf: ~10 % of its samples). Now
//! every task that wakes on the runtime notes the time ([`StallClock::ran`]):
//! the runtime's tick probe (`stall_probe.rs`, every 10 ms) and each guard. A
//! gap longer than a heartbeat interval plus the probe's tick between two
//! notes is a stall that ended at the later one. A guard may then rest until
//! its patience could be due: it sees a stall that happened while it rested
//! from the probe's note, or, if it woke first, from its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

pub const STALLS: &str = "permitd_raft_stalls_total";

/// The node's stall clock. Times are kept as milliseconds since `started`,
/// so that every task can note one without a lock.
#[derive(Debug)]
pub struct StallClock {
    started: Instant,
    /// A gap between two notes longer than this is a stall.
    longest_gap: Duration,
    /// One more than the latest time a task of the runtime noted that it ran
    /// (0: none yet).
    ran_ms: AtomicU64,
    /// When the runtime last woke from a stall (0: never).
    woke_ms: AtomicU64,
}

impl StallClock {
    /// A clock for a runtime where a gap of up to `longest_gap` between two
    /// notes is no stall: a heartbeat interval plus the probe's tick.
    pub fn new(longest_gap: Duration) -> Self {
        Self {
            started: Instant::now(),
            longest_gap,
            ran_ms: AtomicU64::new(0),
            woke_ms: AtomicU64::new(0),
        }
    }

    /// A task of the runtime ran at `now`. When nothing ran for longer than
    /// the longest gap before it, the runtime was stalled and woke now; of
    /// tasks that note the same stall, only the first counts it.
    pub fn ran(&self, now: Instant) {
        let now_ms = self.ms(now);
        // Stored one up, so that 0 stays "no note yet".
        let last = self
            .ran_ms
            .fetch_max(now_ms.saturating_add(1), Ordering::Relaxed);
        let gap = Duration::from_millis(now_ms.saturating_add(1).saturating_sub(last));
        // The first note is no stall, however long after the clock was made
        // (the shards start after it, one by one).
        if last != 0 && gap > self.longest_gap {
            self.woke_ms.fetch_max(now_ms, Ordering::Relaxed);
            metrics::counter!(STALLS).increment(1);
            tracing::warn!(
                gap_ms = gap.as_millis() as u64,
                "this node was stalled; each shard gives its leader an election timeout to reach it before this node may stand"
            );
        }
    }

    /// When the runtime last woke from a stall; its start if never.
    pub fn woke_at(&self) -> Instant {
        self.started + Duration::from_millis(self.woke_ms.load(Ordering::Relaxed))
    }

    fn ms(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.started).as_millis();
        u64::try_from(since).unwrap_or(u64::MAX)
    }
}

/// Registers the description shown in `/metrics`.
pub fn describe() {
    metrics::describe_counter!(
        STALLS,
        "Times this node's Raft runtime ran no task for longer than a heartbeat interval (the node was paused or starved)."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEARTBEAT: Duration = Duration::from_millis(40);
    const TICK: Duration = Duration::from_millis(10);

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn notes_a_tick_apart_are_no_stall() {
        let clock = StallClock::new(HEARTBEAT + TICK);
        let start = clock.woke_at();
        for tick in 1..=100 {
            clock.ran(start + TICK * tick);
        }
        assert_eq!(clock.woke_at(), start);
    }

    #[test]
    fn the_first_note_is_no_stall_however_late() {
        let clock = StallClock::new(HEARTBEAT + TICK);
        let start = clock.woke_at();
        clock.ran(start + ms(2_000));
        assert_eq!(clock.woke_at(), start);
    }

    #[test]
    fn a_gap_past_a_heartbeat_and_a_tick_is_a_stall_that_ends_at_the_next_note() {
        let clock = StallClock::new(HEARTBEAT + TICK);
        let start = clock.woke_at();
        clock.ran(start + ms(5));
        clock.ran(start + ms(5) + HEARTBEAT + TICK);
        assert_eq!(clock.woke_at(), start, "a gap of exactly the limit");
        let woke = start + ms(5) + (HEARTBEAT + TICK) * 2 + ms(1);
        clock.ran(woke);
        assert_eq!(clock.woke_at(), woke);
    }

    #[test]
    fn the_first_task_to_note_a_stall_dates_it_and_later_ones_do_not_move_it() {
        let clock = StallClock::new(HEARTBEAT + TICK);
        let start = clock.woke_at();
        clock.ran(start + ms(5));
        let first = start + ms(505);
        clock.ran(first); // a guard that woke before the probe
        clock.ran(first + ms(2)); // the probe, 2 ms later
        assert_eq!(clock.woke_at(), first);
    }

    #[test]
    fn a_note_from_the_past_neither_stalls_nor_moves_the_clock_back() {
        let clock = StallClock::new(HEARTBEAT + TICK);
        let start = clock.woke_at();
        clock.ran(start + ms(100));
        clock.ran(start + ms(5)); // a task that read the time before another noted
        clock.ran(start + ms(100) + TICK);
        assert_eq!(clock.woke_at(), start);
    }
}
