//! Consensus health as Prometheus gauges, sampled from openraft's `RaftMetrics`.
//!
//! Every [`SAMPLE_INTERVAL_MS`] (and once at start) the node exports:
//! - `permitd_has_leader`, `permitd_is_leader` (0 or 1), `permitd_term`;
//! - `permitd_last_log_index` (appended here), `permitd_applied_index` (applied
//!   to this node's state machine), `permitd_snapshot_index`;
//! - on the leader only: `permitd_committed_index`, the highest index a majority
//!   of voters has stored (openraft 0.9 does not publish the commit index; this is
//!   it, except right after an election, before an entry of the new term
//!   commits), and `permitd_follower_lag_entries{follower}`, how many entries each
//!   follower or learner is behind the leader's last log index;
//! - `permitd_quorum_ack_age_seconds` on the leader: time since a quorum last
//!   acknowledged it (a rising value means it is being cut off).
//!
//! Sampling rather than following every change keeps the cost flat on a busy
//! leader (the metrics change on every append); a scrape every 15 s or so sees
//! values at most one interval old. A node that stops leading sets the lag of
//! every follower it exported to 0, so an old leader's series never alert.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::{RaftMetrics, ServerState};
use permitd_storage::{NodeId, PeerNode};

use crate::raft::liveness::Liveness;
use crate::raft::quiescence::RaftSwitch;
use crate::raft::Raft;

pub const HAS_LEADER: &str = "permitd_has_leader";
pub const IS_LEADER: &str = "permitd_is_leader";
pub const TERM: &str = "permitd_term";
pub const LAST_LOG_INDEX: &str = "permitd_last_log_index";
pub const APPLIED_INDEX: &str = "permitd_applied_index";
pub const COMMITTED_INDEX: &str = "permitd_committed_index";
pub const SNAPSHOT_INDEX: &str = "permitd_snapshot_index";
pub const FOLLOWER_LAG: &str = "permitd_follower_lag_entries";
pub const QUORUM_ACK_AGE: &str = "permitd_quorum_ack_age_seconds";

/// How often the gauges are refreshed, in ms.
pub const SAMPLE_INTERVAL_MS: u64 = 1_000;

/// What one sample exports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RaftSample {
    pub has_leader: bool,
    pub is_leader: bool,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    /// Leader only.
    pub committed_index: Option<u64>,
    /// Leader only: entries each other member is behind.
    pub follower_lag: BTreeMap<NodeId, u64>,
    /// Leader only, once a quorum has acknowledged it.
    pub quorum_ack_age_ms: Option<u64>,
}

/// Reduces openraft's metrics to the exported values.
pub fn sample(metrics: &RaftMetrics<NodeId, PeerNode>) -> RaftSample {
    let is_leader =
        metrics.state == ServerState::Leader && metrics.current_leader == Some(metrics.id);
    let last_log_index = metrics.last_log_index.unwrap_or(0);
    let mut sample = RaftSample {
        has_leader: metrics.current_leader.is_some(),
        is_leader,
        term: metrics.current_term,
        last_log_index,
        applied_index: metrics.last_applied.map_or(0, |log_id| log_id.index),
        snapshot_index: metrics.snapshot.map_or(0, |log_id| log_id.index),
        ..RaftSample::default()
    };
    let Some(replication) = metrics.replication.as_ref().filter(|_| is_leader) else {
        return sample;
    };
    let matched = |id: &NodeId| -> u64 {
        if *id == metrics.id {
            return last_log_index;
        }
        replication
            .get(id)
            .and_then(|log_id| log_id.map(|log_id| log_id.index))
            .unwrap_or(0)
    };
    for id in replication.keys().filter(|id| **id != metrics.id) {
        sample
            .follower_lag
            .insert(*id, last_log_index.saturating_sub(matched(id)));
    }
    let voters: BTreeSet<NodeId> = metrics.membership_config.membership().voter_ids().collect();
    sample.committed_index = Some(majority_index(voters.iter().map(matched).collect()));
    sample.quorum_ack_age_ms = metrics.millis_since_quorum_ack;
    sample
}

/// A quiet shard's quorum acknowledgement age, from the liveness answers.
fn quiet_quorum_age(raft: &Raft, liveness: &Liveness) -> Option<u64> {
    let voters: BTreeSet<NodeId> = {
        let metrics = raft.metrics();
        let metrics = metrics.borrow();
        metrics.membership_config.membership().voter_ids().collect()
    };
    let age = liveness.quorum_age(&voters, tokio::time::Instant::now())?;
    Some(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
}

/// The highest index at least a majority of `matched` (one per voter) reaches.
pub fn majority_index(mut matched: Vec<u64>) -> u64 {
    if matched.is_empty() {
        return 0;
    }
    matched.sort_unstable_by(|a, b| b.cmp(a));
    matched[matched.len() / 2]
}

/// Starts the sampling task; it ends when Raft shuts down. While this node
/// leads the shard and it is quiet (`raft/quiescence.rs`), openraft hears no
/// acknowledgement and reports none; a quorum heard in the node's liveness
/// exchanges (`raft/liveness.rs`) stands for one.
pub fn start(raft: Raft, shard: u32, (switch, liveness): (Arc<RaftSwitch>, Arc<Liveness>)) {
    crate::seams::spawn(async move {
        let mut ticker = tokio::time::interval(Duration::from_millis(SAMPLE_INTERVAL_MS));
        let mut exported_lag: BTreeSet<NodeId> = BTreeSet::new();
        let mut metrics = raft.metrics();
        loop {
            ticker.tick().await;
            if metrics.has_changed().is_err() {
                return; // Raft shut down.
            }
            let mut current = sample(&metrics.borrow_and_update());
            if current.is_leader && switch.is_quiet_leader() {
                current.quorum_ack_age_ms = quiet_quorum_age(&raft, &liveness);
            }
            publish(&current, &shard.to_string(), &mut exported_lag);
        }
    });
}

fn flag(value: bool) -> f64 {
    if value {
        1.0
    } else {
        0.0
    }
}

/// Every series carries the `shard` label: each shard is a Raft group.
fn publish(sample: &RaftSample, shard: &str, exported_lag: &mut BTreeSet<NodeId>) {
    let label = || ("shard", shard.to_owned());
    metrics::gauge!(HAS_LEADER, &[label()]).set(flag(sample.has_leader));
    metrics::gauge!(IS_LEADER, &[label()]).set(flag(sample.is_leader));
    metrics::gauge!(TERM, &[label()]).set(sample.term as f64);
    metrics::gauge!(LAST_LOG_INDEX, &[label()]).set(sample.last_log_index as f64);
    metrics::gauge!(APPLIED_INDEX, &[label()]).set(sample.applied_index as f64);
    metrics::gauge!(SNAPSHOT_INDEX, &[label()]).set(sample.snapshot_index as f64);
    if let Some(committed) = sample.committed_index {
        metrics::gauge!(COMMITTED_INDEX, &[label()]).set(committed as f64);
    }
    let age_seconds = sample.quorum_ack_age_ms.unwrap_or(0) as f64 / 1_000.0;
    metrics::gauge!(QUORUM_ACK_AGE, &[label()]).set(age_seconds);
    let lag = |id: &NodeId| [label(), ("follower", id.to_string())];
    for id in exported_lag.iter() {
        if !sample.follower_lag.contains_key(id) {
            metrics::gauge!(FOLLOWER_LAG, &lag(id)).set(0.0);
        }
    }
    for (id, value) in &sample.follower_lag {
        metrics::gauge!(FOLLOWER_LAG, &lag(id)).set(*value as f64);
        exported_lag.insert(*id);
    }
}

/// Registers the descriptions shown in `/metrics`.
pub fn describe() {
    metrics::describe_gauge!(HAS_LEADER, "1 when this node knows a leader.");
    metrics::describe_gauge!(IS_LEADER, "1 when this node is the leader.");
    metrics::describe_gauge!(TERM, "The Raft term this node is in.");
    metrics::describe_gauge!(LAST_LOG_INDEX, "Last log index appended on this node.");
    metrics::describe_gauge!(APPLIED_INDEX, "Last log index applied on this node.");
    metrics::describe_gauge!(SNAPSHOT_INDEX, "Last log index in this node's snapshot.");
    metrics::describe_gauge!(
        COMMITTED_INDEX,
        "Leader only: the highest index a majority of voters has stored."
    );
    metrics::describe_gauge!(
        FOLLOWER_LAG,
        "Leader only: entries each member is behind the leader's last log index."
    );
    metrics::describe_gauge!(
        QUORUM_ACK_AGE,
        "Leader only: seconds since a quorum last acknowledged this leader."
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership};
    use std::sync::Arc;

    fn log_id(index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(2, 1), index))
    }

    fn leader_metrics() -> RaftMetrics<NodeId, PeerNode> {
        let mut metrics = RaftMetrics::new_initial(1);
        metrics.state = ServerState::Leader;
        metrics.current_leader = Some(1);
        metrics.current_term = 2;
        metrics.last_log_index = Some(100);
        metrics.last_applied = log_id(98);
        let voters = BTreeSet::from([1, 2, 3]);
        let nodes: BTreeMap<NodeId, PeerNode> = [1, 2, 3, 4]
            .map(|id| (id, PeerNode::default()))
            .into_iter()
            .collect();
        let membership = Membership::new(vec![voters], nodes);
        metrics.membership_config = Arc::new(StoredMembership::new(None, membership));
        metrics.replication = Some(BTreeMap::from([
            (1, log_id(100)),
            (2, log_id(90)),
            (3, log_id(60)),
            (4, None),
        ]));
        metrics
    }

    #[test]
    fn the_leader_exports_lag_and_the_majority_index() {
        let sample = sample(&leader_metrics());
        assert!(sample.is_leader && sample.has_leader);
        assert_eq!(sample.applied_index, 98);
        assert_eq!(
            sample.follower_lag,
            BTreeMap::from([(2, 10), (3, 40), (4, 100)])
        );
        // Voters 1, 2, 3 hold 100, 90, 60: two of three hold 90. Learner 4 never
        // counts towards the majority.
        assert_eq!(sample.committed_index, Some(90));
    }

    #[test]
    fn a_follower_exports_no_leader_only_values() {
        let mut metrics = leader_metrics();
        metrics.state = ServerState::Follower;
        metrics.current_leader = Some(2);
        let sample = sample(&metrics);
        assert!(!sample.is_leader && sample.has_leader);
        assert!(sample.follower_lag.is_empty());
        assert_eq!(sample.committed_index, None);
    }

    #[test]
    fn majority_of_even_and_odd_voter_counts() {
        assert_eq!(majority_index(vec![]), 0);
        assert_eq!(majority_index(vec![7]), 7);
        assert_eq!(majority_index(vec![5, 9]), 5);
        assert_eq!(majority_index(vec![3, 9, 5, 7]), 5);
        assert_eq!(majority_index(vec![1, 2, 3, 4, 5]), 3);
    }
}
