//! Liveness calls: in a cluster of several shards, each pair of nodes
//! exchanges one call every [`LIVENESS_EVERY`] heartbeat intervals
//! (`POST /raft/liveness`, made by the node of the lower id, or by the other
//! one while those calls do not arrive: [`Liveness::calls`]), and each side
//! names in it every quiet shard it leads (`quiescence.rs`), with its term
//! and applied index: the call carries the caller's, the answer the
//! callee's. One exchange per pair stands for all those shards' heartbeats,
//! so an idle node of any shard count receives one call per interval from
//! each peer of a lower id, and none from the others.
//!
//! A follower takes a claim as its leader heard ([`LeaderContact::vouched`]),
//! so its election guard waits and refuses pre-votes exactly as when
//! heartbeats came, but only for a shard whose term it is in and whose
//! leader's appends it last took. Anything else (another term, no append
//! taken since a restart, an applied index behind the leader's) it answers
//! with a wake: in its answer, or in its next call when the claim came in an
//! answer. The leader turns the shard's heartbeats on until it settles
//! again, and the heartbeats tell the follower who leads and what is
//! committed, as they always did.
//!
//! The exchanges also keep a leader's `permitd_quorum_ack_age_seconds` true
//! for its quiet shards, which send openraft nothing to acknowledge
//! ([`Liveness::quorum_age`]).
//!
//! Safety does not rest on these calls: a leader that stops claiming (dead,
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

use super::leader_view::Leadership;
use super::network::Network;
use super::quiescence::RaftSwitch;
use super::stall_probe::{LeaderContact, Sender};
use super::Raft;

/// Heartbeat intervals between two liveness exchanges of a pair of nodes:
/// twice the heartbeat interval (80 ms shipped), well within the minimum
/// election timeout (120 ms) a follower waits before it counts its leader
/// silent.
pub const LIVENESS_EVERY: u32 = 2;

pub const LIVENESS_CALLS: &str = "permitd_liveness_calls_total";
pub const LIVENESS_WAKES: &str = "permitd_liveness_wakes_total";

/// Registers the descriptions shown in `/metrics`.
pub fn describe() {
    metrics::describe_counter!(
        LIVENESS_CALLS,
        "Liveness calls this node made to its peers (of a higher id, or of a lower one whose calls do not arrive), by outcome."
    );
    metrics::describe_counter!(
        LIVENESS_WAKES,
        "Quiet shards this node leads that a peer woke (it was behind)."
    );
}

/// `POST /raft/liveness`: the quiet shards `from` leads, and those of the
/// callee's it asks to wake (claimed in the callee's last answer).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivenessCall {
    pub from: NodeId,
    pub leads: Vec<Led>,
    pub wake: Vec<ShardId>,
}

/// One quiet shard a node leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Led {
    pub shard: ShardId,
    pub term: u64,
    /// The leader's applied index: every entry it has.
    pub applied: u64,
}

/// The answer: the caller's shards to wake, and the callee's quiet shards.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivenessAnswer {
    pub wake: Vec<ShardId>,
    pub leads: Vec<Led>,
}

/// A shard as a follower sees it when a claim names it.
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
/// its leader heard (noted in `contact`) with nothing to catch up on; if not,
/// it asks the leader to wake the shard.
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

/// One shard as the exchanges need it.
#[allow(missing_debug_implementations)] // openraft's handle prints nothing useful
pub struct LivenessShard {
    pub id: ShardId,
    pub raft: Raft,
    pub leadership: watch::Receiver<Leadership>,
    pub switch: Arc<RaftSwitch>,
    pub wake: Arc<Notify>,
    pub contact: Arc<LeaderContact>,
}

/// The node's side of the exchanges.
#[derive(Default)]
pub struct Liveness {
    me: NodeId,
    /// Set once the shards have started ([`Liveness::start`]).
    shards: std::sync::OnceLock<Vec<LivenessShard>>,
    /// When each peer was last heard in an exchange.
    answered: Mutex<BTreeMap<NodeId, Instant>>,
    /// The shards each peer is to wake, asked in the next call to it (its
    /// claims came in an answer).
    wakes_for: Mutex<BTreeMap<NodeId, Vec<ShardId>>>,
    /// When each peer last called this node.
    called_by: Mutex<BTreeMap<NodeId, Instant>>,
}

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Liveness")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

impl Liveness {
    pub fn new(me: NodeId) -> Arc<Self> {
        Arc::new(Self {
            me,
            ..Self::default()
        })
    }

    /// Since when a majority of `voters` (this node counting as now) was
    /// heard in an exchange, as of `now`; `None` before one was.
    pub fn quorum_age(&self, voters: &BTreeSet<NodeId>, now: Instant) -> Option<Duration> {
        let answered = self.answered.lock().unwrap_or_else(PoisonError::into_inner);
        let mut times: Vec<Instant> = voters
            .iter()
            .filter_map(|voter| match *voter == self.me {
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

    fn heard_from(&self, peer: NodeId, at: Instant) {
        let mut answered = self.answered.lock().unwrap_or_else(PoisonError::into_inner);
        answered.insert(peer, at);
    }

    fn shards(&self) -> &[LivenessShard] {
        self.shards.get().map_or(&[], Vec::as_slice)
    }

    /// The shards of `claims` (from `peer`) this node asks to wake; the
    /// others count as their leader heard.
    fn take_claims(&self, peer: NodeId, claims: &[Led]) -> Vec<ShardId> {
        let now = Instant::now();
        let shards = self.shards();
        claims
            .iter()
            .filter(|led| {
                shards.get(led.shard as usize).is_some_and(|shard| {
                    let view = FollowerView::of(&shard.raft);
                    !heard(peer, led, view, &shard.contact, now)
                })
            })
            .map(|led| led.shard)
            .collect()
    }

    /// Wakes the quiet shards a peer asked for.
    fn wake(&self, asked: &[ShardId]) {
        for shard in asked
            .iter()
            .filter_map(|id| self.shards().get(*id as usize))
        {
            metrics::counter!(LIVENESS_WAKES).increment(1);
            shard.wake.notify_one();
        }
    }

    /// This node's answer to a peer's call (`edge/raft_inbound.rs`).
    pub fn answer(&self, call: &LivenessCall) -> LivenessAnswer {
        let now = Instant::now();
        self.heard_from(call.from, now);
        let mut called_by = self
            .called_by
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        called_by.insert(call.from, now);
        drop(called_by);
        self.wake(&call.wake);
        LivenessAnswer {
            wake: self.take_claims(call.from, &call.leads),
            leads: quiet_led(self.shards()).0,
        }
    }

    /// Starts the exchanges this node makes (with every peer of a higher
    /// id); they end when the first shard's Raft shuts down.
    pub fn start(
        self: &Arc<Self>,
        shards: Vec<LivenessShard>,
        network: Network,
        heartbeat: Duration,
    ) {
        if self.shards.set(shards).is_err() {
            return; // Started already.
        }
        let this = self.clone();
        crate::seams::spawn(async move {
            let every = heartbeat * LIVENESS_EVERY;
            loop {
                tokio::time::sleep(every).await;
                let raft_gone = this
                    .shards()
                    .first()
                    .is_none_or(|shard| shard.raft.metrics().has_changed().is_err());
                if raft_gone {
                    return;
                }
                this.call_peers(&network, every).await;
            }
        });
    }

    /// One round: a call to each peer of a higher id.
    async fn call_peers(&self, network: &Network, timeout: Duration) {
        let (leads, peers) = quiet_led(self.shards());
        let calls = peers
            .into_iter()
            .filter(|(peer, _)| self.calls(*peer, timeout))
            .map(|(peer, node)| {
                let call = LivenessCall {
                    from: self.me,
                    leads: leads.clone(),
                    wake: self.wakes_pending(peer),
                };
                async move {
                    let body = codec::encode(&call).map_err(|error| error.to_string());
                    let answer = match body {
                        Ok(body) => network
                            .call::<LivenessAnswer>(peer, &node, "liveness", body, timeout)
                            .await
                            .map_err(|error| error.to_string()),
                        Err(error) => Err(error),
                    };
                    (peer, answer)
                }
            });
        for (peer, answer) in futures_util::future::join_all(calls).await {
            let outcome = if answer.is_ok() { "answered" } else { "failed" };
            metrics::counter!(LIVENESS_CALLS, "outcome" => outcome).increment(1);
            let Ok(answer) = answer else { continue };
            self.heard_from(peer, Instant::now());
            self.wake(&answer.wake);
            let wakes = self.take_claims(peer, &answer.leads);
            let mut pending = self
                .wakes_for
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            pending.insert(peer, wakes);
        }
    }

    /// Whether this node makes the exchange with `peer` this round (every
    /// `every`): with a peer of a higher id, always; with one of a lower id,
    /// only when that peer has not called for two rounds (a call from it that
    /// vanishes on the way, a one-way cut, must not leave this node's claims
    /// unheard: its followers there would count its quiet shards' leader
    /// silent, which heartbeats, sent from the leader's side, never let
    /// happen; the one-way cut test found it). A dead peer of a lower id gets
    /// a failed call per round.
    fn calls(&self, peer: NodeId, every: Duration) -> bool {
        if peer > self.me {
            return true;
        }
        let called_by = self
            .called_by
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        called_by
            .get(&peer)
            .is_none_or(|at| at.elapsed() > every * 2)
    }

    fn wakes_pending(&self, peer: NodeId) -> Vec<ShardId> {
        let mut pending = self
            .wakes_for
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        pending.remove(&peer).unwrap_or_default()
    }
}

/// The quiet shards this node leads, and every node of any shard's
/// membership but this one.
fn quiet_led(shards: &[LivenessShard]) -> (Vec<Led>, BTreeMap<NodeId, PeerNode>) {
    let mut leads = Vec::new();
    let mut peers = BTreeMap::new();
    for shard in shards {
        let metrics = shard.raft.metrics();
        let metrics = metrics.borrow();
        for (id, node) in metrics.membership_config.membership().nodes() {
            if *id != metrics.id {
                peers.entry(*id).or_insert_with(|| node.clone());
            }
        }
        let leadership = *shard.leadership.borrow();
        if leadership.is_leader && shard.switch.is_quiet_leader() {
            leads.push(Led {
                shard: shard.id,
                term: leadership.term,
                applied: metrics.last_applied.map_or(0, |id| id.index),
            });
        }
    }
    (leads, peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_age_counts_the_majoritys_oldest_answer() {
        let liveness = Liveness::new(1);
        let start = Instant::now();
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        assert_eq!(liveness.quorum_age(&voters, start), None, "none answered");
        liveness.heard_from(2, start);
        let later = start + Duration::from_millis(300);
        assert_eq!(
            liveness.quorum_age(&voters, later),
            Some(Duration::from_millis(300))
        );
        liveness.heard_from(3, later);
        assert_eq!(
            liveness.quorum_age(&voters, later),
            Some(Duration::ZERO),
            "node 3 answered just now"
        );
    }

    #[test]
    fn the_lower_id_calls_and_the_higher_one_only_while_those_calls_do_not_arrive() {
        let liveness = Liveness::new(2);
        let every = Duration::from_millis(80);
        assert!(liveness.calls(3, every), "a peer of a higher id");
        assert!(liveness.calls(1, every), "node 1 has not called yet");
        liveness.answer(&LivenessCall {
            from: 1,
            ..LivenessCall::default()
        });
        assert!(!liveness.calls(1, every), "node 1 calls");
        let long_ago = Instant::now() - every * 3;
        liveness.called_by.lock().unwrap().insert(1, long_ago);
        assert!(liveness.calls(1, every), "node 1's calls stopped arriving");
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
