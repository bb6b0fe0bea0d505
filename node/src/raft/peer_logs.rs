//! Where each peer's log ends, as its last answer to a vote said, so that a new
//! leader asks a follower whether it already holds a run of entries before it
//! sends the run.
//!
//! openraft 0.9 starts a new leader's replication knowing nothing of the
//! followers' logs: it binary-searches from the oldest entry it kept
//! (`[raft] log_kept_after_snapshot` plus the entries since the last snapshot,
//! up to ~19,000 by default), sending the entries of every step (openraft's
//! default of 300 then), all the way up to its blank entry. After the bench's
//! lease rows (entries of ~4.6 KB) that was six appends of 1.1–1.5 MB, ~115 ms,
//! to a follower that held every one of those entries, before the blank entry
//! committed and the new leader could grant anything. The probe below, and
//! steps of 64 entries (`app.rs`, `MAX_ENTRIES_PER_APPEND`: every step's
//! entries are still read back from the log), brought that to ~19 ms.
//!
//! A follower's vote answer names its last log id. When that is at or past the
//! last entry of an append, the append first goes out empty, with the run's
//! last entry as its previous log id: Raft's consistency check, a few hundred
//! bytes. A follower says yes only if it holds that entry, and then (Log
//! Matching) holds the whole run exactly as the leader does; it records what
//! it would for the run (accepted up to that entry, committed up to the
//! smaller of it and the leader's commit). If it says no, it has truncated its
//! log from that index, which the run would have done too (its entry there is
//! not the leader's, so it was never committed), and the run is sent as asked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::LogId;
use permitd_storage::NodeId;

/// Appends with entries answered by an empty probe: the follower held the run.
pub const RUNS_FOUND_HELD: &str = "permitd_raft_runs_found_held_total";

/// Each peer's log end as last heard; shared by the connections of one node.
#[derive(Debug, Clone, Default)]
pub struct PeerLogs {
    ends: Arc<Mutex<HashMap<NodeId, LogId<NodeId>>>>,
}

impl PeerLogs {
    /// `peer` said its log ends at `end` (it answered a vote).
    pub fn ends_at(&self, peer: NodeId, end: LogId<NodeId>) {
        self.ends().insert(peer, end);
    }

    /// Whether `peer` may hold the entry at `last.index`: its log reached that
    /// far when it last said. Only a probe can tell whether it holds `last`.
    pub fn may_hold(&self, peer: NodeId, last: &LogId<NodeId>) -> bool {
        self.ends()
            .get(&peer)
            .is_some_and(|end| end.index >= last.index)
    }

    /// A probe found `peer`'s log different from what it said: ask no more
    /// until its next vote answer.
    pub fn forget(&self, peer: NodeId) {
        self.ends().remove(&peer);
    }

    fn ends(&self) -> MutexGuard<'_, HashMap<NodeId, LogId<NodeId>>> {
        // Plain data: a panic while holding the lock leaves nothing half-done.
        self.ends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

pub fn describe() {
    metrics::describe_counter!(
        RUNS_FOUND_HELD,
        "Appends a new leader did not send: an empty probe found the follower already held the entries."
    );
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    fn log_id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    #[test]
    fn a_peer_may_hold_what_its_log_reached_and_nothing_once_forgotten() {
        let logs = PeerLogs::default();
        assert!(!logs.may_hold(2, &log_id(1, 1)), "nothing heard yet");
        logs.ends_at(2, log_id(3, 100));
        assert!(logs.may_hold(2, &log_id(3, 100)));
        assert!(logs.may_hold(2, &log_id(1, 40)), "the probe tells the term");
        assert!(!logs.may_hold(2, &log_id(3, 101)));
        assert!(!logs.may_hold(3, &log_id(3, 10)), "another peer");
        logs.forget(2);
        assert!(!logs.may_hold(2, &log_id(3, 10)));
    }
}
