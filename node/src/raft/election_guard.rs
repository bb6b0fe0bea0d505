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
//! So openraft's own election timer stays off (`Config::enable_elect = false`)
//! and this guard decides when a node stands:
//!
//! 1. each time this node starts to wait for a leader it draws its patience:
//!    openraft's leader lease (`election_timeout_max`) plus a timeout drawn
//!    uniformly from `[election_timeout_min, election_timeout_max]`, as
//!    openraft's timer would wait, but drawn afresh for every wait (openraft
//!    0.9 draws its timeout once per process, so two followers that drew close
//!    values split their votes on every failover) and checked every 10 ms, not
//!    on openraft's 60 ms tick (while it hears its leader it rests until a
//!    minimum election timeout of silence, while it leads for the shortest
//!    patience: nothing is due sooner, and the node's stall clock sees a
//!    stall meanwhile);
//! 2. while it hears its leader (an append received, or one still being
//!    received and handled, or, for a quiet shard, the leader's liveness claim:
//!    `liveness.rs`), it does nothing; a vote it casts for another
//!    node starts its wait again, as it restarts Raft's election timer, and
//!    so does a vote request it will likely grant, noted on arrival (openraft's
//!    metrics show a vote only once it is durable, a sync later), and a
//!    pre-vote it grants (the asker is about to stand in the next term; see
//!    [`ElectionGuard::answer`]);
//! 3. a node that was itself stalled (its Raft runtime ran no task for more
//!    than a heartbeat interval: a pause, a starved CPU; the node's
//!    [`StallClock`] says when it last woke from one) counts its silence from
//!    the moment it woke, and gives the leader its patience to reach it;
//! 4. after its patience, it asks every other voter (`POST /raft/prevote`). A
//!    voter grants when it is not the leader, has not heard a leader for the
//!    lease itself (so the vote that follows is not refused by it), is not
//!    yet in the term the asker would stand in (a candidate of that term, or
//!    a node that voted in it, refuses), and the asker's last log id is at
//!    least its own (Raft thesis §9.6). With grants
//!    from a majority of every config (this node counts; the old and the new
//!    voters during a membership change, as openraft's election counts), and
//!    neither a leader heard nor a vote cast meanwhile, it stands at once
//!    (`Trigger::elect`); otherwise it asks again after a fresh election
//!    timeout. A voter already in the asked term or a later one (each answer
//!    carries the voter's term) makes this node adopt that term instead of
//!    standing (`catch_up_on_term`: openraft never raises a node's term on a
//!    vote request it refuses for the candidate's shorter log, and a voter
//!    holding a vote for a higher node in the won term would depose the
//!    winner);
//! 5. a single-voter cluster elects freely (openraft's timer, turned on);
//! 6. a leader that is gone is told from one that is silent: while it waits,
//!    a node looks once a heartbeat interval whether anything listens at its
//!    leader's Raft address ([`Network::reach`]). A refused connection (the
//!    process is dead; a paused or cut-off one times out instead) cuts its
//!    patience to the lease plus a step by rank among the survivors
//!    ([`survivor_rank`]): they stand in turn, without a drawn timeout, and
//!    the voters' rule above is unchanged.
//!
//! The tolerance of a silent leader is what it was with openraft's timer
//! (360–480 ms with the shipped timings); a failover is faster (bench: p50
//! 549 → 375 ms on a fresh cluster) because the first of the two followers
//! to run out of patience stands, without waiting for a timer tick, and
//! faster again (375 → 259 ms; 270 ms at S = 3 under load) when the leader
//! is known gone (step 6).
//!
//! A follower that cannot reach a majority keeps its term (it never wins a
//! pre-vote) and so keeps naming its old leader in openraft's metrics; the
//! guard says when that leader has been silent for longer than the maximum
//! plus the minimum election timeout ([`ElectionGuard::leader_silent`]), and
//! the node's view of the leadership (`leader/leadership.rs`) then names no
//! leader, as it did when such a node stood for election.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::raft::VoteRequest;
use openraft::{LogId, ServerState};
use permitd_storage::{codec, NodeId, PeerNode, ShardId};
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use super::network::{Network, Reach};
use super::quiescence::RaftSwitch;
use super::stall_clock::StallClock;
use super::Raft;
use crate::raft::stall_probe::LeaderContact;

/// How often the guard looks.
const GUARD_TICK: Duration = Duration::from_millis(10);

pub const PREVOTES: &str = "permitd_raft_prevotes_total";
pub const LEADERS_GONE: &str = "permitd_raft_leaders_gone_total";

/// `POST /raft/prevote`: would you vote for me?
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVoteRequest {
    pub candidate: NodeId,
    pub last_log_id: Option<LogId<NodeId>>,
    /// The term the asker would stand in (its current term plus one); `None`
    /// from a node that predates it (no term check then).
    #[serde(default)]
    pub term: Option<u64>,
}

/// The answer to a [`PreVoteRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteAnswer {
    pub granted: bool,
    /// The voter's current term (0 from nodes that predate it): an asker
    /// behind it adopts it before standing (`catch_up_on_term`).
    #[serde(default)]
    pub term: u64,
}

/// What a voter knows when it is asked.
#[derive(Debug, Clone, Copy)]
pub struct VoterView {
    pub is_leader: bool,
    /// Since the last append from a leader; `None` if none came since start.
    pub leader_silent_for: Option<Duration>,
    pub last_log_id: Option<LogId<NodeId>>,
    pub term: u64,
}

/// The voter's rule (step 4 of the module docs). A voter already in the term
/// the asker would stand in (a candidate of it, or a node that voted in it)
/// refuses: the asker would only split or disrupt that election.
pub fn grants(request: &PreVoteRequest, voter: &VoterView, lease: Duration) -> bool {
    eligible(request, voter, lease) && newer_term(request, voter)
}

/// Everything but the term: not leading, no leader heard for the lease, and
/// the asker's log at least as long as the voter's.
fn eligible(request: &PreVoteRequest, voter: &VoterView, lease: Duration) -> bool {
    let leader_gone = voter.leader_silent_for.is_none_or(|silent| silent >= lease);
    !voter.is_leader && leader_gone && request.last_log_id >= voter.last_log_id
}

fn newer_term(request: &PreVoteRequest, voter: &VoterView) -> bool {
    request.term.is_none_or(|term| term > voter.term)
        || permitd_storage::bugs::prevote_without_term_rule()
}

/// Where `me` stands among the voters other than the `gone` leader for
/// `shard`'s election: 0 first. The order turns with the shard.
fn survivor_rank(me: NodeId, shard: ShardId, voters: &[NodeId], gone: NodeId) -> u32 {
    let survivors: Vec<NodeId> = voters.iter().copied().filter(|&v| v != gone).collect();
    let position = survivors.iter().position(|&v| v == me).unwrap_or(0);
    let rank = (position + shard as usize) % survivors.len().max(1);
    u32::try_from(rank).unwrap_or(u32::MAX)
}

/// Whether `nodes` hold a majority of every config of a (possibly joint)
/// membership: during a change a candidate needs both the old and the new
/// voters' majorities, as openraft's election does.
pub fn is_quorum(configs: &[BTreeSet<NodeId>], nodes: &BTreeSet<NodeId>) -> bool {
    configs
        .iter()
        .all(|config| config.intersection(nodes).count() * 2 > config.len())
}

/// What the guard last decided.
#[derive(Debug, Clone, Copy, Default)]
struct Decision {
    /// Elections may run until then (`None`: off); a single voter only.
    elect_until: Option<Instant>,
    /// After a pre-vote (denied, or granted and stood on): the next one not
    /// before then.
    ask_after: Option<Instant>,
    /// How long this wait for a leader lasts before a pre-vote; drawn when
    /// the wait starts (`None`: this node hears its leader, or leads).
    patience: Option<Duration>,
    /// While waiting: when this node last looked whether its silent leader's
    /// process is there ([`ElectionGuard::look_at_leader`]).
    looked_at: Option<Instant>,
    /// The silent leader found gone: nothing listened at its address.
    leader_gone: Option<NodeId>,
}

/// An election timeout within `[min, max]`, drawn uniformly.
fn draw_timeout(rng: &mut impl rand::Rng, min: Duration, max: Duration) -> Duration {
    let (min_ms, max_ms) = (min.as_millis() as u64, max.as_millis() as u64);
    Duration::from_millis(rng.random_range(min_ms..=max_ms.max(min_ms)))
}

/// The node's guard: its timings and what it heard.
#[derive(Debug)]
pub struct ElectionGuard {
    id: NodeId,
    /// The shard this guard elects in, for its logs.
    shard: ShardId,
    contact: Arc<LeaderContact>,
    timeout_min: Duration,
    timeout_max: Duration,
    heartbeat: Duration,
    /// When the node's Raft runtime last woke from a stall.
    stalls: Arc<StallClock>,
    /// Milliseconds since `started` at which this node last voted for another.
    voted_at_ms: AtomicU64,
    started: Instant,
    /// True while this node follows a leader it has not heard for longer than
    /// the maximum plus the minimum election timeout.
    leader_silent: watch::Sender<bool>,
    /// Draws the timeouts: the OS's entropy, or the simulation's seed.
    rng: Mutex<StdRng>,
    /// A leader handing this shard over to this node (`leader/handover.rs`)
    /// in this term (0: none asked): the next pre-vote goes without waiting
    /// out a patience, once, while this node is still in that term.
    hurried_in_term: AtomicU64,
    /// The highest term this node stood in. Standing shows in openraft's
    /// metrics only once the node's vote for itself is durable, a sync
    /// later; meanwhile this node answers pre-votes as in that term already
    /// (simulator, seed 130 at S = 8: a node on a slow disk stood in term 4,
    /// answered another's pre-vote as in term 3 while its vote synced, and
    /// its candidacy then deposed the leader that other node had become).
    stood_in_term: AtomicU64,
    /// Wakes the guard from its rest when a handover hurries it.
    hurried: tokio::sync::Notify,
}

impl ElectionGuard {
    pub fn new(
        (id, shard): (NodeId, ShardId),
        (contact, stalls): (Arc<LeaderContact>, Arc<StallClock>),
        (heartbeat, timeout_min, timeout_max): (Duration, Duration, Duration),
        rng: Mutex<StdRng>,
    ) -> Self {
        Self {
            id,
            shard,
            contact,
            timeout_min,
            timeout_max,
            heartbeat,
            stalls,
            voted_at_ms: AtomicU64::new(0),
            started: Instant::now(),
            leader_silent: watch::channel(false).0,
            rng,
            hurried_in_term: AtomicU64::new(0),
            stood_in_term: AtomicU64::new(0),
            hurried: tokio::sync::Notify::new(),
        }
    }

    /// A handover of `term` names this node: it asks for a pre-vote at its
    /// next tick after a minimum election timeout of silence, instead of a
    /// drawn patience. Still a pre-vote: a voter that hears a leader (another
    /// voter may have won while the old leader was silent) refuses, so the
    /// handover never deposes a leader that nothing disturbed (simulator,
    /// seed 120 at S = 8: a bare `elect` deposed the leader another voter had
    /// become 10 ms earlier).
    pub fn hurry(&self, term: u64) {
        self.hurried_in_term.store(term.max(1), Ordering::Relaxed);
        self.hurried.notify_one();
    }

    /// Whether a handover hurries this wait; consumed, so it hurries one
    /// pre-vote at most. A term that moved on since makes it void.
    fn take_hurry(&self, current_term: u64) -> bool {
        let term = self.hurried_in_term.swap(0, Ordering::Relaxed);
        term != 0 && current_term <= term
    }

    fn draw_timeout(&self) -> Duration {
        let mut rng = self
            .rng
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        draw_timeout(&mut *rng, self.timeout_min, self.timeout_max)
    }

    /// Changes when this node's leader goes silent or is heard again.
    pub fn leader_silent(&self) -> watch::Receiver<bool> {
        self.leader_silent.subscribe()
    }

    /// How long this node has heard no leader, counted from its start, its
    /// last stall or the last vote it cast for another node at the earliest.
    fn silent_for(&self, now: Instant) -> Duration {
        let voted = self.started + Duration::from_millis(self.voted_at_ms.load(Ordering::Relaxed));
        let woke = voted.max(self.stalls.woke_at());
        let heard = self.contact.heard_at(now).map_or(woke, |at| at.max(woke));
        now.saturating_duration_since(heard)
    }

    /// This node's wait for a leader starts again at `now`: it voted, or
    /// will likely vote, or told a pre-candidate it would, for another node.
    fn restart_wait(&self, now: Instant) {
        let since_start = now.saturating_duration_since(self.started).as_millis();
        self.voted_at_ms.store(
            u64::try_from(since_start).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Notes a vote this node cast for another node: like Raft's election
    /// timer, the wait for a leader starts again (that node may be about to
    /// lead; standing now would split or disrupt its election).
    fn note_vote(
        &self,
        vote: &openraft::Vote<NodeId>,
        last: &mut openraft::Vote<NodeId>,
        now: Instant,
    ) {
        if permitd_storage::bugs::prevote_without_term_rule() {
            return;
        }
        if vote == last {
            return;
        }
        *last = *vote;
        if vote
            .leader_id()
            .voted_for()
            .is_some_and(|voted| voted != self.id)
        {
            self.restart_wait(now);
        }
    }

    /// Notes a vote another candidate asks of this node, on its arrival,
    /// before openraft decides it: when this node will likely grant it (a
    /// newer term, a log at least as long), the wait for a leader starts
    /// again, as for a vote cast ([`Self::note_vote`]). Not left to
    /// openraft's metrics, which show a vote only once it is durable: with a
    /// slow disk they lag by a sync, long enough for a pre-vote this node sent
    /// earlier, granted by that candidate before it stood, to come back and let
    /// this node depose the leader it was electing (found by the simulator:
    /// docs/simulation.md).
    pub fn note_vote_request(&self, raft: &Raft, request: &VoteRequest<NodeId>) {
        if permitd_storage::bugs::prevote_without_term_rule() {
            return;
        }
        let candidate = request.vote.leader_id();
        let newer = candidate.term > raft.metrics().borrow().current_term;
        let log_ok = request.last_log_id >= raft.data_metrics().borrow().last_log;
        if newer && log_ok && candidate.voted_for() != Some(self.id) {
            self.restart_wait(Instant::now());
        }
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
            term: metrics
                .current_term
                .max(self.stood_in_term.load(Ordering::Relaxed)),
        };
        let answer = PreVoteAnswer {
            granted: grants(request, &view, self.timeout_max),
            term: view.term,
        };
        if answer.granted && !permitd_storage::bugs::prevote_without_term_rule() {
            // The asker is about to stand in the next term; standing in it
            // too would split it, and in openraft a split term is worse than
            // a lost election: votes are ordered by (term, node), so the
            // higher node's candidacy deposes the lower one even when the
            // lower one won (simulator, seed 4095 at S = 8: node 2 granted
            // node 3's pre-vote in a handover, stood itself 2 ms later, won
            // term 4, and was deposed once node 3's slow disk had synced its
            // vote). So a grant restarts the wait, as a vote cast does; a
            // pre-candidate that never stands holds this node back by one
            // patience, as a candidate that never wins would.
            self.restart_wait(Instant::now());
        }
        tracing::debug!(
            shard = self.shard,
            candidate = request.candidate,
            ?answer,
            ?view,
            "pre-vote asked"
        );
        answer
    }

    /// Runs the guard until Raft shuts down.
    pub fn start(self: Arc<Self>, raft: Raft, network: Network, switch: Arc<RaftSwitch>) {
        crate::seams::spawn(async move {
            let mut decision = Decision::default();
            let mut vote = raft.metrics().borrow().vote;
            let mut rest = GUARD_TICK;
            loop {
                tokio::select! {
                    () = tokio::time::sleep(rest) => {}
                    () = self.hurried.notified() => {}
                }
                let now = Instant::now();
                if raft.metrics().has_changed().is_err() {
                    return; // Raft shut down.
                }
                self.stalls.ran(now);
                self.note_vote(&raft.metrics().borrow().vote, &mut vote, now);
                let silent = self.silent_for(now) >= self.timeout_max + self.timeout_min;
                self.leader_silent.send_if_modified(|seen| {
                    let changed = *seen != silent;
                    *seen = silent;
                    changed
                });
                let next = self.decide(&raft, &network, now, decision).await;
                if next.elect_until.is_some() != decision.elect_until.is_some() {
                    switch.electing(next.elect_until.is_some());
                }
                decision = next;
                rest = self.rest(&raft, Instant::now(), &decision);
            }
        });
    }

    /// How long the guard may sleep before it looks again. A follower that
    /// hears its leader has nothing to do until the leader has been silent
    /// for the minimum election timeout: then it starts to wait out its
    /// patience and looks whether the leader's process is there (step 6), so
    /// it rests until then. A leader's guard has nothing to do while it
    /// leads; it rests the shortest patience (the maximum plus the minimum
    /// election timeout), the soonest a wait it would start on losing the
    /// leadership could end. A handover's hurry wakes either at once.
    /// Waiting out a patience, it looks every [`GUARD_TICK`]. At 64 shards a
    /// guard that looked every 10 ms whatever it knew was the most of an idle
    /// node's CPU once the shards went quiet (perf: 16 % of the samples in
    /// the guard, its metrics reads and the timer wheel, beside 15 % in task
    /// switches); one that rested a heartbeat interval at most was still
    /// ~10 % (`stall_clock.rs`). Resting followers until their patience
    /// could end instead put the look at a gone leader 240 ms late (failover
    /// bench at S = 3: p50 259 → 364 ms).
    fn rest(&self, raft: &Raft, now: Instant, decision: &Decision) -> Duration {
        let waiting = decision.patience.is_some()
            || decision.ask_after.is_some()
            || decision.elect_until.is_some();
        if waiting {
            return GUARD_TICK;
        }
        let leading = raft.metrics().borrow().state == ServerState::Leader;
        let until_due = match leading {
            true => self.timeout_max + self.timeout_min,
            false => self.timeout_min.saturating_sub(self.silent_for(now)),
        };
        // As long as that: a stall while the guard rests is seen by the
        // node's stall clock, whose probe notes every 10 ms, not by this
        // guard's late wake. When each guard looked for stalls itself it
        // could rest one heartbeat interval at most, or a starved runtime
        // that woke in time for it went unseen and the node stood at once on
        // the silence the starvation made (shipped_timings' bursts of large
        // requests, S = 1: a follower stood five times and deposed the leader).
        until_due.max(GUARD_TICK)
    }

    /// The next decision, given the last one.
    async fn decide(
        &self,
        raft: &Raft,
        network: &Network,
        now: Instant,
        last: Decision,
    ) -> Decision {
        // Every 10 ms per shard: the metrics are read, not cloned (a clone
        // of their maps was the most of an idle node's CPU at 64 shards).
        let (state, current_term, vote, stored, leader) = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            let stored = metrics.membership_config.clone();
            let leader = metrics.current_leader;
            (
                metrics.state,
                metrics.current_term,
                metrics.vote,
                stored,
                leader,
            )
        };
        let membership = stored.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        if !voters.contains(&self.id) || state == ServerState::Leader {
            return Decision::default();
        }
        if voters.len() == 1 {
            return Decision {
                elect_until: Some(now + self.timeout_max),
                ..Decision::default()
            };
        }
        if self.silent_for(now) < self.timeout_min {
            // Hearing the leader: the next wait draws a new patience.
            return Decision::default();
        }
        let hurried = self.take_hurry(current_term);
        let mut waiting = last;
        if let Some(leader) = leader.filter(|&leader| leader != self.id && !hurried) {
            waiting = self
                .look_at_leader(network, membership, leader, now, waiting)
                .await;
        }
        let drawn = last
            .patience
            .unwrap_or_else(|| self.timeout_max + self.draw_timeout());
        let patience = match (hurried, waiting.leader_gone) {
            (true, _) => self.timeout_min,
            (false, Some(gone)) if leader == Some(gone) => {
                drawn.min(self.patience_for_a_gone_leader(&voters, gone))
            }
            (false, _) => drawn,
        };
        let waiting = Decision {
            patience: Some(patience),
            ..waiting
        };
        let asked_lately = last.ask_after.is_some_and(|after| now < after);
        if !hurried && (self.silent_for(now) < patience || asked_lately) {
            return waiting;
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
            term: Some(current_term + 1),
        };
        let answers = self.ask(network, &peers, &request).await;
        let configs = membership.get_joint_config();
        let granted: BTreeSet<NodeId> = answers
            .iter()
            .filter(|(_, answer)| answer.granted)
            .map(|(id, _)| *id)
            .chain([self.id])
            .collect();
        // A voter already in the asked term or later: this node is behind in
        // term (see `catch_up_on_term`).
        let ahead = answers
            .iter()
            .filter(|_| !permitd_storage::bugs::prevote_without_term_rule())
            .filter(|(_, answer)| answer.term > current_term)
            .max_by_key(|(id, answer)| (answer.term, *id))
            .map(|(id, answer)| (answer.term, *id));
        let won = is_quorum(configs, &granted) && ahead.is_none();
        let outcome = if won { "granted" } else { "denied" };
        metrics::counter!(PREVOTES, "outcome" => outcome).increment(1);
        let done = Instant::now();
        // Whatever comes of it, the next pre-vote waits a fresh election
        // timeout, so two nodes whose campaigns split do not ask in step.
        let next = Decision {
            elect_until: None,
            ask_after: Some(done + self.draw_timeout()),
            patience: None,
            ..waiting
        };
        if !won && ahead.is_none() {
            tracing::debug!(
                shard = self.shard,
                ?granted,
                voters = voters.len(),
                "pre-vote denied"
            );
            return next;
        }
        // A leader heard, or a vote cast for another candidate, while the
        // pre-vote was out: standing now would only disrupt (and a vote cast
        // moved this node's term up to the voters' own).
        let vote_kept = raft.metrics().borrow().vote == vote;
        if !vote_kept || self.silent_for(done) < patience {
            tracing::debug!(
                shard = self.shard,
                vote_kept,
                "pre-vote granted, but the cluster moved meanwhile"
            );
            return next;
        }
        if let Some((term, voter)) = ahead {
            self.catch_up_on_term(raft, term, voter).await;
            return next;
        }
        tracing::info!(
            shard = self.shard,
            granted = granted.len(),
            voters = voters.len(),
            patience_ms = patience.as_millis() as u64,
            "pre-vote granted: this node stands for election"
        );
        self.stood_in_term
            .fetch_max(current_term + 1, Ordering::Relaxed);
        if let Err(error) = raft.trigger().elect().await {
            tracing::warn!(shard = self.shard, %error, "cannot stand for election");
        }
        next
    }

    /// Looks, at most once a heartbeat interval while this node waits, whether
    /// its silent leader's process is there: a liveness call naming nothing,
    /// which any answer (even an error status) shows it is, and a refused
    /// connection shows it is not. Only a refusal counts: a paused, starved
    /// or cut-off leader times out instead, and keeps its full patience.
    async fn look_at_leader(
        &self,
        network: &Network,
        membership: &openraft::Membership<NodeId, PeerNode>,
        leader: NodeId,
        now: Instant,
        waiting: Decision,
    ) -> Decision {
        let known = waiting.leader_gone == Some(leader);
        let looked_lately = waiting
            .looked_at
            .is_some_and(|at| now.saturating_duration_since(at) < self.heartbeat);
        let Some(node) = membership
            .get_node(&leader)
            .filter(|_| !known && !looked_lately)
        else {
            return waiting;
        };
        let call = super::liveness::LivenessCall {
            from: self.id,
            ..Default::default()
        };
        let Ok(body) = codec::encode(&call) else {
            return waiting;
        };
        let reach = network.reach(node, "liveness", body, self.heartbeat).await;
        if reach == Reach::Refused {
            tracing::info!(
                shard = self.shard,
                leader,
                "nothing listens at the silent leader's address: it is gone"
            );
            metrics::counter!(LEADERS_GONE).increment(1);
        }
        Decision {
            looked_at: Some(now),
            leader_gone: (reach == Reach::Refused).then_some(leader),
            ..waiting
        }
    }

    /// This node's patience once its leader is known gone: the leader lease
    /// (the voters refuse any vote before it) and a short step by rank, so
    /// the survivors stand one after another instead of all at once after a
    /// drawn timeout. The ranks turn with the shard, so a dead node's shards
    /// fall to different survivors.
    fn patience_for_a_gone_leader(&self, voters: &[NodeId], gone: NodeId) -> Duration {
        let rank = survivor_rank(self.id, self.shard, voters, gone);
        self.timeout_max + GUARD_TICK + (self.heartbeat / 2) * rank
    }

    /// A voter is already in the term this node would stand in, or a later
    /// one. Standing now would be refused by it, or, won with the others,
    /// undone by it: openraft orders votes by (term, node), so a voter
    /// holding a vote in the same term as this node's victory for a higher
    /// node (its own, as a candidate) deposes it at the first append (found
    /// by the simulator, seeds 548 and 527). And openraft never raises a node's term
    /// on a vote request it refuses for the candidate's shorter log, so
    /// behind in term this node could stay refused for good while a
    /// candidate that needs its vote stands over and over (seed 10, a joint
    /// membership). So it adopts that term first, by granting itself, through
    /// openraft's own vote handling, a vote in it for node 0: the lowest
    /// vote of the term, which no real candidate's or leader's vote is below
    /// (a vote for a real node could outrank the term's rightful leader and
    /// depose it: seed 517 in the soak), and which nobody ever hears of. The
    /// vote restarts this node's wait; its next pre-vote asks past the term.
    async fn catch_up_on_term(&self, raft: &Raft, term: u64, voter: NodeId) {
        tracing::info!(
            shard = self.shard,
            term,
            voter,
            "a voter is in a later term: this node adopts it before it asks again"
        );
        metrics::counter!(PREVOTES, "outcome" => "term_behind").increment(1);
        let last_log_id = raft.data_metrics().borrow().last_log;
        let lowest_vote_of_the_term = openraft::Vote::new(term, 0);
        if let Err(error) = raft
            .vote(VoteRequest::new(lowest_vote_of_the_term, last_log_id))
            .await
        {
            tracing::warn!(shard = self.shard, %error, "cannot adopt the voters' term");
        }
    }

    /// Asks every peer at once; the answers that came within the minimum
    /// election timeout (an unreachable or slow peer counts as a refusal).
    async fn ask(
        &self,
        network: &Network,
        peers: &[(NodeId, PeerNode)],
        request: &PreVoteRequest,
    ) -> Vec<(NodeId, PreVoteAnswer)> {
        let Ok(body) = codec::encode(request) else {
            return Vec::new();
        };
        let asks = peers.iter().map(|(id, node)| {
            let answer =
                network.call::<PreVoteAnswer>(*id, node, "prevote", body.clone(), self.timeout_min);
            async move { answer.await.ok().map(|answer| (*id, answer)) }
        });
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

/// Registers the descriptions shown in `/metrics`.
pub fn describe() {
    metrics::describe_counter!(
        PREVOTES,
        "Pre-votes this node held before it could stand for election, by outcome (granted, denied)."
    );
    metrics::describe_counter!(
        LEADERS_GONE,
        "Times this node found its silent leader's process gone (a refused connection) and stood after the leader lease instead of a drawn timeout."
    );
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    const MIN: Duration = Duration::from_millis(120);
    /// openraft's leader lease: the maximum election timeout.
    const LEASE: Duration = Duration::from_millis(240);

    fn log(term: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    fn ask(last_log_id: Option<LogId<NodeId>>) -> PreVoteRequest {
        PreVoteRequest {
            candidate: 2,
            last_log_id,
            term: Some(4),
        }
    }

    fn follower(silent_ms: Option<u64>, last_log_id: Option<LogId<NodeId>>) -> VoterView {
        VoterView {
            is_leader: false,
            leader_silent_for: silent_ms.map(Duration::from_millis),
            last_log_id,
            term: 3,
        }
    }

    #[test]
    fn a_voter_that_hears_its_leader_refuses() {
        assert!(!grants(
            &ask(log(3, 10)),
            &follower(Some(200), log(3, 10)),
            LEASE
        ));
        let leader = VoterView {
            is_leader: true,
            ..follower(None, None)
        };
        assert!(!grants(&ask(log(9, 99)), &leader, LEASE));
    }

    #[test]
    fn a_voter_whose_leader_went_silent_grants_an_asker_as_up_to_date() {
        assert!(grants(
            &ask(log(3, 10)),
            &follower(Some(240), log(3, 10)),
            LEASE
        ));
        assert!(grants(
            &ask(log(4, 2)),
            &follower(Some(500), log(3, 10)),
            LEASE
        ));
        assert!(
            grants(&ask(None), &follower(None, None), LEASE),
            "a new cluster"
        );
    }

    #[test]
    fn a_voter_already_in_the_askers_term_refuses() {
        let voter = follower(Some(500), log(3, 10));
        let in_term_4 = VoterView { term: 4, ..voter };
        assert!(
            grants(&ask(log(3, 10)), &voter, LEASE),
            "term 4 is new to it"
        );
        assert!(
            !grants(&ask(log(3, 10)), &in_term_4, LEASE),
            "a candidate of term 4, or a node that voted in it"
        );
        let from_an_older_node = PreVoteRequest {
            term: None,
            ..ask(log(3, 10))
        };
        assert!(grants(&from_an_older_node, &in_term_4, LEASE));
    }

    #[test]
    fn survivors_of_a_gone_leader_stand_in_turn_and_the_turn_moves_with_the_shard() {
        let voters = [1, 2, 3, 4, 5];
        for shard in 0..10 {
            let mut ranks: Vec<u32> = [1, 2, 4, 5]
                .iter()
                .map(|&me| survivor_rank(me, shard, &voters, 3))
                .collect();
            let first = ranks.iter().position(|&rank| rank == 0);
            ranks.sort_unstable();
            assert_eq!(ranks, [0, 1, 2, 3], "one rank each, shard {shard}");
            assert_eq!(first, Some((4 - shard as usize % 4) % 4), "shard {shard}");
        }
        assert_eq!(survivor_rank(2, 0, &[1, 2], 1), 0, "a lone survivor");
    }

    #[test]
    fn a_joint_membership_needs_a_majority_of_each_config() {
        let old = BTreeSet::from([1, 2, 3]);
        let new = BTreeSet::from([1, 2]);
        let joint = [old.clone(), new];
        assert!(is_quorum(&joint, &BTreeSet::from([1, 2])));
        assert!(
            !is_quorum(&joint, &BTreeSet::from([2, 3])),
            "a majority of the old voters, half of the new"
        );
        assert!(is_quorum(
            std::slice::from_ref(&old),
            &BTreeSet::from([2, 3])
        ));
        assert!(!is_quorum(&[old], &BTreeSet::from([3])));
    }

    #[test]
    fn a_timeout_lies_within_the_election_timeouts_and_is_drawn_afresh() {
        let (min, max) = (MIN, LEASE);
        let drawn: Vec<Duration> = (0..200)
            .map(|_| draw_timeout(&mut rand::rng(), min, max))
            .collect();
        assert!(drawn.iter().all(|timeout| (min..=max).contains(timeout)));
        let first = drawn[0];
        assert!(
            drawn.iter().any(|timeout| *timeout != first),
            "drawn afresh"
        );
        assert_eq!(
            draw_timeout(&mut rand::rng(), min, min),
            min,
            "an empty range"
        );
    }

    #[test]
    fn an_asker_behind_the_voter_is_refused() {
        assert!(!grants(
            &ask(log(3, 9)),
            &follower(Some(500), log(3, 10)),
            LEASE
        ));
        assert!(!grants(
            &ask(log(2, 50)),
            &follower(None, log(3, 10)),
            LEASE
        ));
    }
}
