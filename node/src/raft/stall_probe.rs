//! Metrics that make a stall visible, and say where it is.
//!
//! - `permitd_raft_leader_contact_gap_seconds` (histogram, on followers and
//!   learners): the time between consecutive AppendEntries (heartbeats or
//!   appends) this node received from its leader, taken as each arrives at the
//!   `/raft/append` handler. The first append after start, and the first from a
//!   new leader (another term or node), have no gap; appends of an older term
//!   than the last seen are ignored. Heartbeats are due every 40 ms by default,
//!   but openraft 0.9 checks its timers every 1.5 heartbeats, so an idle
//!   follower's gaps sit at about 60 ms; a gap past the leader lease plus the
//!   election timeout (360–480 ms by default) lets this node's election timer
//!   fire and start a needless election.
//! - `permitd_runtime_tick_lateness_seconds{runtime}` (histogram, on every
//!   node): a task on each of the node's tokio runtimes (`raft`: openraft and
//!   the peers' calls, [`crate::raft::runtime`]; `api`: everything else) sleeps
//!   [`TICK`] in a loop and records how much later than asked it woke. About a
//!   millisecond is normal (the timer wheel has 1 ms slots); tens of
//!   milliseconds mean every task of that runtime was that late: a worker
//!   thread blocked, the CPU starved, the process or the VM paused.
//!
//! Read together: long contact gaps on a follower whose tick lateness stays low
//! point at the leader (its runtime, its disk) or the network between them; long
//! gaps with a high lateness on the follower itself point at the follower.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use openraft::Vote;
use permitd_storage::NodeId;

use crate::raft::Raft;

pub const LEADER_CONTACT_GAP: &str = "permitd_raft_leader_contact_gap_seconds";
pub const TICK_LATENESS: &str = "permitd_runtime_tick_lateness_seconds";

/// Leader contact gap buckets, in seconds: 1 ms to 2 s, finest around the 40 ms
/// heartbeat and the 150–300 ms election timeout.
pub const LEADER_CONTACT_GAP_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0,
];

/// Tick lateness buckets, in seconds: 1 ms to 2 s.
pub const TICK_LATENESS_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0,
];

/// How long the probe sleeps each time.
pub const TICK: Duration = Duration::from_millis(10);

/// Who an append came from: the leader's term and node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender {
    pub term: u64,
    pub leader: Option<NodeId>,
}

impl Sender {
    pub fn of(vote: &Vote<NodeId>) -> Self {
        let leader_id = vote.leader_id();
        Self {
            term: leader_id.term,
            leader: leader_id.voted_for(),
        }
    }
}

/// The gap tracker: pure, time passed in.
#[derive(Debug, Default)]
pub struct ContactGaps {
    /// The sender of the latest append and when it arrived.
    last: Option<(Sender, Instant)>,
}

impl ContactGaps {
    /// Notes an append from `from` arriving `at`; the gap since the previous one
    /// from the same leader, if there was one.
    pub fn received(&mut self, from: Sender, at: Instant) -> Option<Duration> {
        match self.last {
            // A deposed leader still sending: neither a contact nor a reset.
            Some((last, _)) if from.term < last.term => None,
            Some((last, previous)) if last == from => {
                // Concurrent appends may lock in another order than they arrived.
                self.last = Some((from, at.max(previous)));
                Some(at.saturating_duration_since(previous))
            }
            _ => {
                self.last = Some((from, at));
                None
            }
        }
    }
}

/// The tracker of one node, shared by its append handlers.
#[derive(Debug, Default)]
pub struct LeaderContact(Mutex<ContactGaps>);

impl LeaderContact {
    /// When the last append from the current leader arrived.
    pub fn last_contact(&self) -> Option<Instant> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .last
            .map(|(_, at)| at)
    }

    /// Records the gap before an append that arrived `at` with the leader's `vote`.
    pub fn append_received(&self, vote: &Vote<NodeId>, at: Instant) {
        let gap = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .received(Sender::of(vote), at);
        if let Some(gap) = gap {
            metrics::histogram!(LEADER_CONTACT_GAP).record(gap.as_secs_f64());
        }
    }
}

/// Sleeps `period` on the current runtime; how much later than asked it woke.
pub async fn tick_lateness(period: Duration) -> Duration {
    let started = Instant::now();
    tokio::time::sleep(period).await;
    started.elapsed().saturating_sub(period)
}

/// Starts the probe on the current runtime, labelled `runtime`; it ends when
/// Raft shuts down.
pub fn start(raft: &Raft, runtime: &'static str) {
    let metrics = raft.metrics();
    tokio::spawn(async move {
        loop {
            let late = tick_lateness(TICK).await;
            if metrics.has_changed().is_err() {
                return; // Raft shut down.
            }
            metrics::histogram!(TICK_LATENESS, "runtime" => runtime).record(late.as_secs_f64());
        }
    });
}

/// Registers the descriptions shown in `/metrics`.
pub fn describe() {
    metrics::describe_histogram!(
        LEADER_CONTACT_GAP,
        metrics::Unit::Seconds,
        "Followers: time between consecutive AppendEntries (heartbeats or appends) received from the leader."
    );
    metrics::describe_histogram!(
        TICK_LATENESS,
        metrics::Unit::Seconds,
        "How much later than asked a 10 ms sleep on this node's async runtime woke."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(term: u64, leader: NodeId) -> Sender {
        Sender {
            term,
            leader: Some(leader),
        }
    }

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn gaps_between_appends_of_one_leader() {
        let start = Instant::now();
        let mut gaps = ContactGaps::default();
        assert_eq!(
            gaps.received(from(2, 1), start),
            None,
            "the first has no gap"
        );
        assert_eq!(gaps.received(from(2, 1), start + ms(40)), Some(ms(40)));
        assert_eq!(gaps.received(from(2, 1), start + ms(290)), Some(ms(250)));
    }

    #[test]
    fn a_new_leader_starts_over() {
        let start = Instant::now();
        let mut gaps = ContactGaps::default();
        gaps.received(from(2, 1), start);
        assert_eq!(gaps.received(from(3, 2), start + ms(900)), None, "new term");
        assert_eq!(gaps.received(from(3, 2), start + ms(940)), Some(ms(40)));
        // Same term, another node (cannot happen in Raft, but not a gap either).
        assert_eq!(gaps.received(from(3, 3), start + ms(980)), None);
    }

    #[test]
    fn a_deposed_leader_is_ignored() {
        let start = Instant::now();
        let mut gaps = ContactGaps::default();
        gaps.received(from(3, 2), start);
        assert_eq!(gaps.received(from(2, 1), start + ms(10)), None);
        assert_eq!(
            gaps.received(from(3, 2), start + ms(40)),
            Some(ms(40)),
            "measured from the current leader's last append"
        );
    }

    #[test]
    fn appends_locked_out_of_order_count_no_negative_gap() {
        let start = Instant::now();
        let mut gaps = ContactGaps::default();
        gaps.received(from(2, 1), start + ms(50));
        assert_eq!(gaps.received(from(2, 1), start + ms(45)), Some(ms(0)));
        assert_eq!(gaps.received(from(2, 1), start + ms(90)), Some(ms(40)));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_runtime_makes_the_tick_late() {
        let probe = tokio::spawn(tick_lateness(TICK));
        tokio::task::yield_now().await; // the probe starts its sleep
        std::thread::sleep(ms(60)); // blocks the runtime's only thread
        let late = probe.await.expect("the probe ends");
        assert!(late >= ms(45), "late by {late:?}");
    }
}
