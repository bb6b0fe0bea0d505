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

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::Vote;
use permitd_storage::NodeId;
use tokio::time::Instant;

use crate::raft::stall_clock::StallClock;
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

/// The gap tracker and the silence clock: pure, time passed in.
///
/// Two notions of contact. The *gap* (the histogram) is measured between
/// arrivals. The *silence* the election guard counts ([`Self::heard_at`]) also
/// stops while an append is being received and handled, and restarts when one
/// from the current leader is done: a large append (megabytes of entries to
/// decode, write and sync) can take longer than an election timeout, and the
/// leader sends nothing else to this node meanwhile (openraft keeps one append
/// in flight per follower). Counting that time as silence made both followers
/// of a leader busy with large entries grant each other pre-votes and depose
/// it. Raft's own rule is the same: the election timer restarts when a message
/// from the leader is handled, and a node busy handling one is not idle.
#[derive(Debug, Default)]
pub struct ContactGaps {
    /// The sender of the latest append and when it arrived.
    last: Option<(Sender, Instant)>,
    /// When an append from the current leader last arrived or was done.
    heard: Option<Instant>,
    /// Appends being received or handled now.
    receiving: usize,
}

impl ContactGaps {
    /// Notes an append from `from` arriving `at`; the gap since the previous one
    /// from the same leader, if there was one, and whether `from` is current
    /// (not a deposed leader still sending).
    pub fn received(&mut self, from: Sender, at: Instant) -> (Option<Duration>, bool) {
        let gap = match self.last {
            // A deposed leader still sending: neither a contact nor a reset.
            Some((last, _)) if from.term < last.term => return (None, false),
            Some((last, previous)) if last == from => {
                // Concurrent appends may lock in another order than they arrived.
                self.last = Some((from, at.max(previous)));
                Some(at.saturating_duration_since(previous))
            }
            _ => {
                self.last = Some((from, at));
                None
            }
        };
        self.heard = Some(self.heard.map_or(at, |heard| heard.max(at)));
        (gap, true)
    }

    /// An append starts arriving: until [`Self::done`], the leader counts as heard.
    pub fn receiving(&mut self) {
        self.receiving += 1;
    }

    /// An append was handled at `at`; if it came from the current leader, the
    /// silence clock restarts from then.
    pub fn done(&mut self, current: bool, at: Instant) {
        self.receiving = self.receiving.saturating_sub(1);
        if current {
            self.heard = Some(self.heard.map_or(at, |heard| heard.max(at)));
        }
    }

    /// A liveness claim (`raft/liveness.rs`) from `from`, which says it still
    /// leads this shard, arrived `at`: the leader counts as heard when it is
    /// the one whose appends this node last took. Whether it was.
    pub fn vouched(&mut self, from: Sender, at: Instant) -> bool {
        let current = self.last.is_some_and(|(last, _)| last == from);
        if current {
            self.heard = Some(self.heard.map_or(at, |heard| heard.max(at)));
        }
        current
    }

    /// When this node last heard its leader, as of `now`.
    pub fn heard_at(&self, now: Instant) -> Option<Instant> {
        if self.receiving > 0 {
            return Some(now);
        }
        self.heard
    }
}

/// The tracker of one node, shared by its append handlers.
#[derive(Debug, Default)]
pub struct LeaderContact(Mutex<ContactGaps>);

impl LeaderContact {
    fn gaps(&self) -> std::sync::MutexGuard<'_, ContactGaps> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// When this node last heard its leader, as of `now` (see [`ContactGaps`]).
    pub fn heard_at(&self, now: Instant) -> Option<Instant> {
        self.gaps().heard_at(now)
    }

    /// See [`ContactGaps::vouched`].
    pub fn vouched(&self, from: Sender, at: Instant) -> bool {
        self.gaps().vouched(from, at)
    }

    /// An append starts arriving; the leader counts as heard until the
    /// returned guard is dropped, when the append has been handled.
    pub fn receiving(&self) -> Receiving<'_> {
        self.gaps().receiving();
        Receiving {
            contact: self,
            current: false,
        }
    }
}

/// One append being received and handled (see [`LeaderContact::receiving`]).
#[derive(Debug)]
pub struct Receiving<'a> {
    contact: &'a LeaderContact,
    current: bool,
}

impl Receiving<'_> {
    /// Records the gap before this append, which arrived `at` with the leader's
    /// `vote`.
    pub fn decoded(&mut self, vote: &Vote<NodeId>, at: Instant) {
        let (gap, current) = self.contact.gaps().received(Sender::of(vote), at);
        self.current = current;
        if let Some(gap) = gap {
            metrics::histogram!(LEADER_CONTACT_GAP).record(gap.as_secs_f64());
        }
    }
}

impl Drop for Receiving<'_> {
    fn drop(&mut self) {
        self.contact.gaps().done(self.current, Instant::now());
    }
}

/// Sleeps `period` on the current runtime; how much later than asked it woke.
pub async fn tick_lateness(period: Duration) -> Duration {
    let started = Instant::now();
    tokio::time::sleep(period).await;
    started.elapsed().saturating_sub(period)
}

/// Starts the probe on the current runtime, labelled `runtime`; it ends when
/// Raft shuts down. On the Raft runtime its ticks also feed the node's
/// [`StallClock`].
pub fn start(raft: &Raft, runtime: &'static str, stalls: Option<Arc<StallClock>>) {
    let metrics = raft.metrics();
    tokio::spawn(async move {
        loop {
            let late = tick_lateness(TICK).await;
            if metrics.has_changed().is_err() {
                return; // Raft shut down.
            }
            if let Some(stalls) = &stalls {
                stalls.ran(Instant::now());
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
            (None, true),
            "the first has no gap"
        );
        assert_eq!(gaps.received(from(2, 1), start + ms(40)).0, Some(ms(40)));
        assert_eq!(gaps.received(from(2, 1), start + ms(290)).0, Some(ms(250)));
    }

    #[test]
    fn a_new_leader_starts_over() {
        let start = Instant::now();
        let mut gaps = ContactGaps::default();
        gaps.received(from(2, 1), start);
        assert_eq!(
            gaps.received(from(3, 2), start + ms(900)).0,
            None,
            "new term"
        );
        assert_eq!(gaps.received(from(3, 2), start + ms(940)).0, Some(ms(40)));
        // Same term, another node (cannot happen in Raft, but not a gap either).
        assert_eq!(gaps.received(from(3, 3), start + ms(980)).0, None);
    }

    #[test]
    fn a_deposed_leader_is_ignored() {
        let start = Instant::now();
        let mut gaps = ContactGaps::default();
        gaps.received(from(3, 2), start);
        assert_eq!(gaps.received(from(2, 1), start + ms(10)), (None, false));
        assert_eq!(gaps.heard_at(start + ms(20)), Some(start), "not heard");
        assert_eq!(
            gaps.received(from(3, 2), start + ms(40)).0,
            Some(ms(40)),
            "measured from the current leader's last append"
        );
    }

    #[test]
    fn appends_locked_out_of_order_count_no_negative_gap() {
        let start = Instant::now();
        let mut gaps = ContactGaps::default();
        gaps.received(from(2, 1), start + ms(50));
        assert_eq!(gaps.received(from(2, 1), start + ms(45)).0, Some(ms(0)));
        assert_eq!(gaps.received(from(2, 1), start + ms(90)).0, Some(ms(40)));
    }

    #[test]
    fn the_leader_is_heard_while_an_append_is_handled_and_when_it_is_done() {
        let start = Instant::now();
        let mut gaps = ContactGaps::default();
        assert_eq!(gaps.heard_at(start), None);
        gaps.received(from(2, 1), start);
        // A large append arrives at 40 ms and takes 500 ms to decode and sync.
        gaps.receiving();
        assert_eq!(gaps.heard_at(start + ms(300)), Some(start + ms(300)));
        gaps.received(from(2, 1), start + ms(40));
        assert_eq!(gaps.heard_at(start + ms(400)), Some(start + ms(400)));
        gaps.done(true, start + ms(540));
        assert_eq!(
            gaps.heard_at(start + ms(600)),
            Some(start + ms(540)),
            "the silence restarts when it is done, not when it arrived"
        );
    }

    #[test]
    fn a_deposed_leaders_append_stops_the_clock_only_while_it_is_handled() {
        let start = Instant::now();
        let mut gaps = ContactGaps::default();
        gaps.received(from(3, 2), start);
        gaps.receiving();
        assert_eq!(gaps.received(from(2, 1), start + ms(100)), (None, false));
        assert_eq!(gaps.heard_at(start + ms(150)), Some(start + ms(150)));
        gaps.done(false, start + ms(200));
        assert_eq!(gaps.heard_at(start + ms(250)), Some(start));
    }

    #[test]
    fn a_liveness_call_counts_only_from_the_leader_whose_appends_were_taken() {
        let start = Instant::now();
        let mut gaps = ContactGaps::default();
        assert!(!gaps.vouched(from(2, 1), start), "no append taken yet");
        assert_eq!(gaps.heard_at(start), None);
        gaps.received(from(2, 1), start);
        assert!(gaps.vouched(from(2, 1), start + ms(500)));
        assert_eq!(gaps.heard_at(start + ms(600)), Some(start + ms(500)));
        assert!(!gaps.vouched(from(1, 1), start + ms(700)), "an older term");
        assert!(!gaps.vouched(from(2, 3), start + ms(700)), "another node");
        assert_eq!(gaps.heard_at(start + ms(800)), Some(start + ms(500)));
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
