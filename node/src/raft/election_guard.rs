//! Pre-vote, outside openraft: a node stands for election only when a majority
//! of the voters would vote for it, so a node back from a pause, a restart or a
//! partition never deposes a leader that still reaches a majority.
//!
//! openraft 0.9 has no pre-vote. A follower whose election timer fires bumps
//! its term and asks for votes; the others refuse (the leader lease), but the
//! leader sees the higher term in the follower's answers to its appends and
//! steps down. Measured before this guard: a follower SIGSTOPped for 2 s under
//! light load took the leadership on 7 of 7 tries, because after SIGCONT its
//! overdue timer fired before it read the heartbeats waiting for it.
//!
//! So openraft's elections start disabled (`Config::enable_elect = false`), and
//! this guard turns them on only while they are warranted:
//!
//! 1. while this node hears its leader (an append within
//!    `election_timeout_min`), elections stay off;
//! 2. a node that was itself stalled (its 10 ms guard tick woke more than a
//!    heartbeat interval late: a pause, a starved CPU) counts its silence from
//!    the moment it woke, and gives the leader an election timeout to reach it;
//! 3. after `election_timeout_min` of silence, the guard asks every other voter
//!    (`POST /raft/prevote`). A voter grants when it is not the leader, has not
//!    heard a leader for `election_timeout_min` itself, and the asker's last
//!    log id is at least its own (Raft thesis §9.6). With grants from a
//!    majority (this node counts) elections are turned on, and openraft's own
//!    randomised timer decides when to stand; the grant holds for
//!    `election_timeout_max`, then the guard asks again;
//! 4. a single-voter cluster elects freely.
//!
//! A follower that cannot reach a majority keeps its term (it never wins a
//! pre-vote) and so keeps naming its old leader in openraft's metrics; the
//! guard says when that leader has been silent for longer than the leader lease
//! plus the minimum election timeout ([`ElectionGuard::leader_silent`]), and the
//! node's view of the leadership (`leader/leadership.rs`) then names no leader, as it
//! did when such a node stood for election.
//!
//! A failover is not slowed: openraft stands only after the leader lease plus
//! its election timeout (360–480 ms by default), and the pre-vote is done by
//! 120 ms of silence plus one round trip.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::{LogId, ServerState};
use permitd_storage::{codec, NodeId, PeerNode};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::network::Network;
use super::Raft;
use crate::raft::stall_probe::LeaderContact;

/// How often the guard looks.
const GUARD_TICK: Duration = Duration::from_millis(10);

pub const PREVOTES: &str = "permitd_raft_prevotes_total";
pub const STALLS: &str = "permitd_raft_stalls_total";

/// `POST /raft/prevote`: would you vote for me?
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVoteRequest {
    pub candidate: NodeId,
    pub last_log_id: Option<LogId<NodeId>>,
}

/// The answer to a [`PreVoteRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteAnswer {
    pub granted: bool,
}

/// What a voter knows when it is asked.
#[derive(Debug, Clone, Copy)]
pub struct VoterView {
    pub is_leader: bool,
    /// Since the last append from a leader; `None` if none came since start.
    pub leader_silent_for: Option<Duration>,
    pub last_log_id: Option<LogId<NodeId>>,
}

/// The voter's rule (step 3 of the module docs).
pub fn grants(request: &PreVoteRequest, voter: &VoterView, timeout_min: Duration) -> bool {
    let leader_gone = voter
        .leader_silent_for
        .is_none_or(|silent| silent >= timeout_min);
    !voter.is_leader && leader_gone && request.last_log_id >= voter.last_log_id
}

/// What the guard last decided.
#[derive(Debug, Clone, Copy, Default)]
struct Decision {
    /// Elections may run until then (`None`: off).
    elect_until: Option<Instant>,
    /// After a denied pre-vote: the next one not before then.
    ask_after: Option<Instant>,
}

impl Decision {
    fn elect_until(until: Instant) -> Self {
        Self {
            elect_until: Some(until),
            ask_after: None,
        }
    }
}

/// The node's guard: its timings and what it heard.
#[derive(Debug)]
pub struct ElectionGuard {
    id: NodeId,
    contact: Arc<LeaderContact>,
    timeout_min: Duration,
    timeout_max: Duration,
    heartbeat: Duration,
    /// Milliseconds since `started` at which the guard last woke from a stall.
    woke_at_ms: AtomicU64,
    started: Instant,
    /// True while this node follows a leader it has not heard for longer than
    /// the leader lease plus the minimum election timeout.
    leader_silent: watch::Sender<bool>,
}

impl ElectionGuard {
    pub fn new(
        id: NodeId,
        contact: Arc<LeaderContact>,
        (heartbeat, timeout_min, timeout_max): (Duration, Duration, Duration),
    ) -> Self {
        Self {
            id,
            contact,
            timeout_min,
            timeout_max,
            heartbeat,
            woke_at_ms: AtomicU64::new(0),
            started: Instant::now(),
            leader_silent: watch::channel(false).0,
        }
    }

    /// Changes when this node's leader goes silent or is heard again.
    pub fn leader_silent(&self) -> watch::Receiver<bool> {
        self.leader_silent.subscribe()
    }

    /// How long this node has heard no leader, counted from its start or its
    /// last stall at the earliest.
    fn silent_for(&self, now: Instant) -> Duration {
        let woke = self.started + Duration::from_millis(self.woke_at_ms.load(Ordering::Relaxed));
        let heard = self.contact.heard_at(now).map_or(woke, |at| at.max(woke));
        now.saturating_duration_since(heard)
    }

    /// This node's answer to a pre-vote.
    pub fn answer(&self, raft: &Raft, request: &PreVoteRequest) -> PreVoteAnswer {
        let metrics = raft.metrics().borrow().clone();
        let view = VoterView {
            is_leader: metrics.state == ServerState::Leader,
            leader_silent_for: {
                let now = Instant::now();
                self.contact
                    .heard_at(now)
                    .map(|at| now.saturating_duration_since(at))
            },
            last_log_id: raft.data_metrics().borrow().last_log,
        };
        let granted = grants(request, &view, self.timeout_min);
        tracing::debug!(
            candidate = request.candidate,
            granted,
            ?view,
            "pre-vote asked"
        );
        PreVoteAnswer { granted }
    }

    /// Runs the guard until Raft shuts down.
    pub fn start(self: Arc<Self>, raft: Raft, network: Network) {
        tokio::spawn(async move {
            let mut decision = Decision::default();
            raft.runtime_config().elect(false);
            loop {
                let asked = Instant::now();
                tokio::time::sleep(GUARD_TICK).await;
                let now = Instant::now();
                if raft.metrics().has_changed().is_err() {
                    return; // Raft shut down.
                }
                if now.saturating_duration_since(asked) > GUARD_TICK + self.heartbeat {
                    self.stalled(now);
                }
                let silent = self.silent_for(now) >= self.timeout_max + self.timeout_min;
                self.leader_silent.send_if_modified(|seen| {
                    let changed = *seen != silent;
                    *seen = silent;
                    changed
                });
                let next = self.decide(&raft, &network, now, decision).await;
                if next.elect_until.is_some() != decision.elect_until.is_some() {
                    raft.runtime_config().elect(next.elect_until.is_some());
                }
                decision = next;
            }
        });
    }

    fn stalled(&self, now: Instant) {
        let since_start = now.saturating_duration_since(self.started).as_millis();
        self.woke_at_ms.store(
            u64::try_from(since_start).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        metrics::counter!(STALLS).increment(1);
        tracing::warn!("this node was stalled; it gives the leader an election timeout to reach it before it may stand");
    }

    /// The next decision, given the last one.
    async fn decide(
        &self,
        raft: &Raft,
        network: &Network,
        now: Instant,
        last: Decision,
    ) -> Decision {
        let metrics = raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership().clone();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        if !voters.contains(&self.id) || metrics.state == ServerState::Leader {
            return Decision::default();
        }
        if voters.len() == 1 {
            return Decision::elect_until(now + self.timeout_max);
        }
        if self.silent_for(now) < self.timeout_min {
            return Decision::default();
        }
        if last.elect_until.is_some_and(|until| now < until)
            || last.ask_after.is_some_and(|after| now < after)
        {
            return last;
        }
        let peers: Vec<(NodeId, PeerNode)> = voters
            .iter()
            .filter(|&&voter| voter != self.id)
            .filter_map(|&voter| {
                membership
                    .get_node(&voter)
                    .map(|node| (voter, node.clone()))
            })
            .collect();
        let request = PreVoteRequest {
            candidate: self.id,
            last_log_id: raft.data_metrics().borrow().last_log,
        };
        let granted = 1 + self.ask(network, &peers, &request).await;
        let won = granted * 2 > voters.len();
        let outcome = if won { "granted" } else { "denied" };
        metrics::counter!(PREVOTES, "outcome" => outcome).increment(1);
        let done = Instant::now();
        if won {
            tracing::info!(
                granted,
                voters = voters.len(),
                "pre-vote granted: this node may stand for election"
            );
            Decision::elect_until(done + self.timeout_max)
        } else {
            // A node cut off from the others asks again only after another
            // minimum election timeout, not every tick.
            tracing::debug!(granted, voters = voters.len(), "pre-vote denied");
            Decision {
                elect_until: None,
                ask_after: Some(done + self.timeout_min),
            }
        }
    }

    /// Asks every peer at once; how many granted within the minimum election
    /// timeout (an unreachable or slow peer counts as a refusal).
    async fn ask(
        &self,
        network: &Network,
        peers: &[(NodeId, PeerNode)],
        request: &PreVoteRequest,
    ) -> usize {
        let Ok(body) = codec::encode(request) else {
            return 0;
        };
        let asks = peers.iter().map(|(id, node)| {
            network.call::<PreVoteAnswer>(*id, node, "prevote", body.clone(), self.timeout_min)
        });
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .filter(|answer| matches!(answer, Ok(PreVoteAnswer { granted: true })))
            .count()
    }
}

/// Registers the descriptions shown in `/metrics`.
pub fn describe() {
    metrics::describe_counter!(
        PREVOTES,
        "Pre-votes this node held before it could stand for election, by outcome (granted, denied)."
    );
    metrics::describe_counter!(
        STALLS,
        "Times this node's election guard woke more than a heartbeat interval late (the node was paused or starved)."
    );
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    const MIN: Duration = Duration::from_millis(120);

    fn log(term: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    fn ask(last_log_id: Option<LogId<NodeId>>) -> PreVoteRequest {
        PreVoteRequest {
            candidate: 2,
            last_log_id,
        }
    }

    fn follower(silent_ms: Option<u64>, last_log_id: Option<LogId<NodeId>>) -> VoterView {
        VoterView {
            is_leader: false,
            leader_silent_for: silent_ms.map(Duration::from_millis),
            last_log_id,
        }
    }

    #[test]
    fn a_voter_that_hears_its_leader_refuses() {
        assert!(!grants(
            &ask(log(3, 10)),
            &follower(Some(40), log(3, 10)),
            MIN
        ));
        let leader = VoterView {
            is_leader: true,
            ..follower(None, None)
        };
        assert!(!grants(&ask(log(9, 99)), &leader, MIN));
    }

    #[test]
    fn a_voter_whose_leader_went_silent_grants_an_asker_as_up_to_date() {
        assert!(grants(
            &ask(log(3, 10)),
            &follower(Some(120), log(3, 10)),
            MIN
        ));
        assert!(grants(
            &ask(log(4, 2)),
            &follower(Some(500), log(3, 10)),
            MIN
        ));
        assert!(
            grants(&ask(None), &follower(None, None), MIN),
            "a new cluster"
        );
    }

    #[test]
    fn an_asker_behind_the_voter_is_refused() {
        assert!(!grants(
            &ask(log(3, 9)),
            &follower(Some(500), log(3, 10)),
            MIN
        ));
        assert!(!grants(&ask(log(2, 50)), &follower(None, log(3, 10)), MIN));
    }
}
