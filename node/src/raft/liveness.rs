//! Liveness calls: while this node leads quiet shards (`quiescence.rs`), it
//! calls each of their peers every [`LIVENESS_EVERY`] heartbeat intervals
//! (`POST /raft/liveness`), naming every quiet shard it leads with its term
//! and applied index. One call per peer stands for all those shards'
//! heartbeats.
//!
//! The peer takes it as its leader heard ([`LeaderContact::vouched`]), so
//! its election guard waits and refuses pre-votes exactly as when heartbeats
//! came, but only for a shard whose term it is in and whose leader's appends
//! it last took. Anything else (another term, no append taken since a
//! restart, an applied index behind the leader's) it answers with a wake:
//! the leader turns the shard's heartbeats on until it settles again, and the
//! heartbeats tell the peer who leads and what is committed, as they always
//! did.
//!
//! The answers also keep the leader's `permitd_quorum_ack_age_seconds` true
//! for its quiet shards, which send openraft nothing to acknowledge
//! ([`Liveness::quorum_age`]).
//!
//! Safety does not rest on these calls: a leader that stops calling (dead,
//! paused, cut off) is a silent leader to its followers, who elect another
//! after their patience, as before.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::ServerState;
use permitd_storage::{codec, NodeId, PeerNode, ShardId};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::network::Network;
use super::quiescence::RaftSwitch;
use super::stall_probe::{LeaderContact, Sender};
use super::Raft;
use crate::leader::leadership::Leadership;

/// Heartbeat intervals between two liveness calls to a peer: twice the
/// heartbeat interval (80 ms shipped), well within the minimum election
/// timeout (120 ms) a follower waits before it counts its leader silent.
pub const LIVENESS_EVERY: u32 = 2;

pub const LIVENESS_CALLS: &str = "permitd_liveness_calls_total";
pub const LIVENESS_WAKES: &str = "permitd_liveness_wakes_total";

/// Registers the descriptions shown in `/metrics`.
pub fn describe() {
    metrics::describe_counter!(
        LIVENESS_CALLS,
        "Liveness calls this node made to its peers for the quiet shards it leads, by outcome."
    );
    metrics::describe_counter!(
        LIVENESS_WAKES,
        "Quiet shards this node leads that a peer's liveness answer woke (it was behind)."
    );
}

/// `POST /raft/liveness`: the quiet shards `from` leads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivenessCall {
    pub from: NodeId,
    pub leads: Vec<Led>,
}

/// One quiet shard the caller leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Led {
    pub shard: ShardId,
    pub term: u64,
    /// The leader's applied index: every entry it has.
    pub applied: u64,
}

/// The answer: the shards the caller should wake.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivenessAnswer {
    pub wake: Vec<ShardId>,
}

/// A shard as the callee sees it when a call names it.
#[derive(Debug, Clone, Copy)]
pub struct FollowerView {
    pub term: u64,
    pub is_leader: bool,
    pub applied: u64,
}

impl FollowerView {
    pub fn of(raft: &Raft) -> Self {
        let (term, is_leader) = {
            let server = raft.server_metrics();
            let server = server.borrow();
            (
                server.vote.leader_id().get_term(),
                server.state == ServerState::Leader,
            )
        };
        let applied = raft.data_metrics().borrow().last_applied;
        Self {
            term,
            is_leader,
            applied: applied.map_or(0, |id| id.index),
        }
    }
}

/// Whether a follower in `view`, told `led` by `from` at `now`, takes it as
/// its leader heard (noted in `contact`), or asks the leader to wake.
pub fn heard(
    from: NodeId,
    led: &Led,
    view: FollowerView,
    contact: &LeaderContact,
    now: Instant,
) -> bool {
    let sender = Sender {
        term: led.term,
        leader: Some(from),
    };
    let in_term = view.term == led.term && !view.is_leader;
    in_term && contact.vouched(sender, now) && view.applied >= led.applied
}

/// One shard as the calling side needs it.
#[allow(missing_debug_implementations)] // openraft's handle prints nothing useful
pub struct CallerShard {
    pub id: ShardId,
    pub raft: Raft,
    pub leadership: watch::Receiver<Leadership>,
    pub switch: Arc<RaftSwitch>,
    pub wake: Arc<Notify>,
}

/// The node's liveness calls: when each peer last answered one.
#[derive(Debug, Default)]
pub struct Liveness {
    answered: Mutex<BTreeMap<NodeId, Instant>>,
}

impl Liveness {
    /// Since when a majority of `voters` (this node `me` counting as now)
    /// answered a liveness call, as of `now`; `None` before any did.
    pub fn quorum_age(
        &self,
        me: NodeId,
        voters: &BTreeSet<NodeId>,
        now: Instant,
    ) -> Option<Duration> {
        let answered = self.answered.lock().unwrap_or_else(PoisonError::into_inner);
        let mut times: Vec<Instant> = voters
            .iter()
            .filter_map(|voter| match *voter == me {
                true => Some(now),
                false => answered.get(voter).copied(),
            })
            .collect();
        let majority = voters.len() / 2 + 1;
        if times.len() < majority {
            return None;
        }
        times.sort_unstable_by(|a, b| b.cmp(a));
        Some(now.saturating_duration_since(times[majority - 1]))
    }

    fn answered(&self, peer: NodeId, at: Instant) {
        let mut answered = self.answered.lock().unwrap_or_else(PoisonError::into_inner);
        answered.insert(peer, at);
    }

    /// Starts the calls; they end when the first shard's Raft shuts down.
    pub fn start(
        self: Arc<Self>,
        me: NodeId,
        shards: Vec<CallerShard>,
        network: Network,
        heartbeat: Duration,
    ) {
        crate::seams::spawn(async move {
            let every = heartbeat * LIVENESS_EVERY;
            loop {
                tokio::time::sleep(every).await;
                if shards
                    .first()
                    .is_none_or(|shard| shard.raft.metrics().has_changed().is_err())
                {
                    return; // Raft shut down.
                }
                self.call_peers(me, &shards, &network, every).await;
            }
        });
    }

    /// One round: a call to each peer of the quiet shards this node leads.
    async fn call_peers(
        &self,
        me: NodeId,
        shards: &[CallerShard],
        network: &Network,
        timeout: Duration,
    ) {
        let (leads, peers) = quiet_led(me, shards);
        if leads.is_empty() {
            return;
        }
        let call = LivenessCall { from: me, leads };
        let Ok(body) = codec::encode(&call) else {
            return;
        };
        let calls = peers.into_iter().map(|(peer, node)| {
            let body = body.clone();
            async move {
                let answer: Result<LivenessAnswer, _> =
                    network.call(peer, &node, "liveness", body, timeout).await;
                (peer, answer)
            }
        });
        for (peer, answer) in futures_util::future::join_all(calls).await {
            let outcome = if answer.is_ok() { "answered" } else { "failed" };
            metrics::counter!(LIVENESS_CALLS, "outcome" => outcome).increment(1);
            let Ok(answer) = answer else { continue };
            self.answered(peer, Instant::now());
            for shard in answer.wake {
                if let Some(shard) = shards.iter().find(|s| s.id == shard) {
                    metrics::counter!(LIVENESS_WAKES).increment(1);
                    shard.wake.notify_one();
                }
            }
        }
    }
}

/// The quiet shards `me` leads, and every other member of them.
fn quiet_led(me: NodeId, shards: &[CallerShard]) -> (Vec<Led>, BTreeMap<NodeId, PeerNode>) {
    let mut leads = Vec::new();
    let mut peers = BTreeMap::new();
    for shard in shards.iter().filter(|shard| shard.switch.is_quiet_leader()) {
        let leadership = *shard.leadership.borrow();
        if !leadership.is_leader {
            continue;
        }
        let metrics = shard.raft.metrics();
        let metrics = metrics.borrow();
        leads.push(Led {
            shard: shard.id,
            term: leadership.term,
            applied: metrics.last_applied.map_or(0, |id| id.index),
        });
        for (id, node) in metrics.membership_config.membership().nodes() {
            if *id != me {
                peers.entry(*id).or_insert_with(|| node.clone());
            }
        }
    }
    (leads, peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_age_counts_the_majoritys_oldest_answer() {
        let liveness = Liveness::default();
        let start = Instant::now();
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        assert_eq!(
            liveness.quorum_age(1, &voters, start),
            None,
            "none answered"
        );
        liveness.answered(2, start);
        let later = start + Duration::from_millis(300);
        assert_eq!(
            liveness.quorum_age(1, &voters, later),
            Some(Duration::from_millis(300))
        );
        liveness.answered(3, later);
        assert_eq!(
            liveness.quorum_age(1, &voters, later),
            Some(Duration::ZERO),
            "node 3 answered just now"
        );
    }

    fn view(term: u64, applied: u64) -> FollowerView {
        FollowerView {
            term,
            is_leader: false,
            applied,
        }
    }

    #[test]
    fn a_follower_hears_only_its_leader_in_its_term_with_everything_applied() {
        let contact = LeaderContact::default();
        let now = Instant::now();
        let led = Led {
            shard: 1,
            term: 4,
            applied: 10,
        };
        assert!(
            !heard(2, &led, view(4, 10), &contact, now),
            "no append taken from node 2 yet"
        );
        {
            let mut receiving = contact.receiving();
            let vote = openraft::Vote::new_committed(4, 2);
            receiving.decoded(&vote, now);
        }
        assert!(heard(2, &led, view(4, 10), &contact, now));
        assert!(!heard(2, &led, view(4, 9), &contact, now), "behind");
        assert!(!heard(2, &led, view(5, 10), &contact, now), "a later term");
        assert!(
            !heard(3, &led, view(4, 10), &contact, now),
            "another leader"
        );
        let leading = FollowerView {
            is_leader: true,
            ..view(4, 10)
        };
        assert!(!heard(2, &led, leading, &contact, now));
    }
}
