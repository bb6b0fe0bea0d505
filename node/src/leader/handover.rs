//! Leaders spread over the voters: each shard has a preferred leader, and a
//! leader of a shard that is not its preferred one hands the shard over as
//! soon as the preferred node has every entry.
//!
//! The preferred leader of shard k is the `k mod N`-th of the N voters in id
//! order ([`preferred_leader`]), so in steady state each voter leads
//! `⌊S/N⌋` or `⌈S/N⌉` of the S shards. A node that comes back (a restart, a
//! healed partition) catches up through replication and then gets its shards
//! back within a few seconds.
//!
//! openraft 0.9 has no leadership transfer (0.10 has `transfer_leader`), and
//! a voter refuses any vote request while it heard its leader within the
//! leader lease (`election_timeout_max`). So a handover is built from what 0.9
//! has, and from nothing that weakens Raft's safety (which depends only on
//! votes):
//!
//! 1. the leader stops proposing on the shard: its view of the leadership
//!    names no leader while it steps down (`leader/leadership.rs`), so the
//!    calls parked on it fail with `leader_changed` and new ones get 503,
//!    which clients retry, and the reclaim and defaults tasks pause;
//! 2. it stops its heartbeats (`RuntimeConfigHandle::heartbeat(false)`);
//! 3. it asks the preferred node (`POST /raft/elect`) to stand once the lease
//!    has passed on every voter: a lease plus a heartbeat from now;
//! 4. the preferred node, whose log is as long as the leader's, asks for a
//!    pre-vote at once (`ElectionGuard::hurry`: no drawn patience, but the
//!    same pre-vote, so a voter that already follows another leader refuses)
//!    and, granted, stands and wins the votes of the others, whose leases
//!    ran out. The old leader sees the new term and follows. It does not
//!    stand once a later term has begun: another voter stood while the
//!    leader was silent.
//!
//! Whatever happens, after [`HANDOVER_TIMEOUT_LEASES`] leases the old leader
//! turns its heartbeats back on and stops stepping down: if it still leads,
//! it serves again and tries later ([`RETRY_AFTER`]). The shard is unserved
//! for about one lease plus an election round trip (~300 ms with the shipped
//! timings).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use permitd_storage::{codec, NodeId, ShardId};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::raft::election_guard::ElectionGuard;
use crate::raft::network::Network;
use crate::raft::quiescence::RaftSwitch;
use crate::raft::Raft;

/// How often a leader of a shard that prefers another leader checks
/// whether that node caught up. A leader of its preferred shards never
/// polls: it waits for a change of its role or membership.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// How long a leader leads before it hands over: a new leader first commits
/// its term's first entry, and a node just back is given time to settle.
const LEAD_BEFORE_HANDOVER: Duration = Duration::from_secs(1);
/// Leases after which a handover that did not happen is given up.
const HANDOVER_TIMEOUT_LEASES: u32 = 4;
/// Wait after a handover that did not happen before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Longest wait a `POST /raft/elect` may ask for.
pub const MAX_ELECT_AFTER_MS: u64 = 10_000;

/// `POST /raft/elect`: stand for election in this shard after `after_ms`,
/// unless a term after `term` (the handing-over leader's) has begun by then.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ElectRequest {
    pub after_ms: u64,
    /// The term the leader hands over; 0 from a node that did not say.
    #[serde(default)]
    pub term: u64,
}

/// The shard's preferred leader among `voters`: the `shard mod N`-th in id
/// order.
pub fn preferred_leader(shard: ShardId, voters: &BTreeSet<NodeId>) -> Option<NodeId> {
    if voters.is_empty() {
        return None;
    }
    let position = usize::try_from(shard).unwrap_or(0) % voters.len();
    voters.iter().nth(position).copied()
}

/// What a handover needs of its shard.
#[allow(missing_debug_implementations)] // openraft's handle prints nothing useful
pub struct Handover {
    pub shard: ShardId,
    pub raft: Raft,
    pub network: Network,
    /// True while this node steps down ([`crate::leader::leadership`]).
    pub stepping_down: watch::Sender<bool>,
    /// openraft's leader lease: `election_timeout_max`.
    pub lease: Duration,
    pub heartbeat: Duration,
    /// Turns the shard's heartbeats off while the shard is handed over.
    pub switch: Arc<RaftSwitch>,
    /// Counts the handovers this node started ([`Handover::started`]).
    pub started: watch::Sender<u64>,
}

impl Handover {
    /// Starts the task; it ends when Raft shuts down. In a cluster of one
    /// shard there is nothing to spread, and a leader is never moved.
    pub fn start(self, shards: u32) {
        if shards > 1 {
            crate::seams::spawn(self.run());
        }
    }

    async fn run(self) {
        let mut server = self.raft.server_metrics();
        let mut leading_since: Option<(u64, Instant)> = None;
        let mut next_try = Instant::now();
        loop {
            let due = self.due(&server, &mut leading_since, next_try);
            if let Some(preferred) = due {
                if !self.hand_over(preferred).await {
                    next_try = Instant::now() + RETRY_AFTER;
                }
            }
            let may_be_due = leading_since.is_some() && !self.preferred_here();
            let changed = if may_be_due {
                tokio::select! {
                    changed = server.changed() => changed.is_ok(),
                    () = tokio::time::sleep(CHECK_EVERY) => true,
                }
            } else {
                server.changed().await.is_ok()
            };
            if !changed {
                return; // Raft shut down.
            }
        }
    }

    /// Whether this node is the shard's preferred leader, as far as the full
    /// metrics show the voters yet (they may lag the role: then it is not
    /// known, and the task polls).
    fn preferred_here(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let voters: BTreeSet<NodeId> = metrics.membership_config.membership().voter_ids().collect();
        preferred_leader(self.shard, &voters) == Some(metrics.id)
    }

    /// The node to hand the shard over to now, if any: this node leads (since
    /// [`LEAD_BEFORE_HANDOVER`]), the shard prefers another voter, and that
    /// voter has every entry this node has.
    ///
    /// The role and term come from `server`, the watch this task waits on:
    /// openraft sends it apart from the full metrics, which may not show the
    /// new role yet; a task that read the role there could miss its own
    /// election and wait for a change that never comes.
    fn due(
        &self,
        server: &watch::Receiver<
            openraft::metrics::RaftServerMetrics<NodeId, permitd_storage::PeerNode>,
        >,
        leading_since: &mut Option<(u64, Instant)>,
        next_try: Instant,
    ) -> Option<NodeId> {
        let (state, term) = {
            let server = server.borrow();
            (server.state, server.vote.leader_id().get_term())
        };
        if state != ServerState::Leader {
            *leading_since = None;
            return None;
        }
        if leading_since.map(|(led, _)| led) != Some(term) {
            *leading_since = Some((term, Instant::now()));
        }
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        if metrics.state != ServerState::Leader {
            // The full metrics lag: checked again at the next poll.
            return None;
        }
        let (_, since) = (*leading_since)?;
        let now = Instant::now();
        if now < since + LEAD_BEFORE_HANDOVER || now < next_try {
            return None;
        }
        let voters: BTreeSet<NodeId> = metrics.membership_config.membership().voter_ids().collect();
        let preferred = preferred_leader(self.shard, &voters)?;
        if preferred == metrics.id {
            return None;
        }
        let matched = metrics
            .replication
            .as_ref()
            .and_then(|replication| replication.get(&preferred)?.as_ref().map(|id| id.index));
        let last = metrics.last_log_index;
        tracing::debug!(
            shard = self.shard,
            preferred,
            ?matched,
            ?last,
            "handover due?"
        );
        (matched.is_some() && matched == last).then_some(preferred)
    }

    /// Steps down in favour of `preferred`; whether this node stopped leading.
    async fn hand_over(&self, preferred: NodeId) -> bool {
        let Some(node) = crate::raft::member(&self.raft, preferred) else {
            return false;
        };
        tracing::info!(
            shard = self.shard,
            to = preferred,
            "handing the shard over to its preferred leader"
        );
        self.started.send_modify(|started| *started += 1);
        self.stepping_down.send_replace(true);
        self.switch.handing_over(true);
        let after = self.lease + self.heartbeat;
        let request = ElectRequest {
            after_ms: u64::try_from(after.as_millis()).unwrap_or(MAX_ELECT_AFTER_MS),
            term: self.raft.metrics().borrow().current_term,
        };
        let asked = match codec::encode(&request) {
            Ok(body) => {
                let timeout = self.lease;
                let answer: Result<(), _> = self
                    .network
                    .call(preferred, &node, "elect", body, timeout)
                    .await;
                answer.is_ok()
            }
            Err(_) => false,
        };
        let stepped_down = asked
            && self
                .wait_until_follower(self.lease * HANDOVER_TIMEOUT_LEASES)
                .await;
        self.switch.handing_over(false);
        self.stepping_down.send_replace(false);
        if !stepped_down {
            tracing::warn!(
                shard = self.shard,
                to = preferred,
                asked,
                "the handover did not happen; leading on"
            );
        }
        let outcome = if stepped_down { "handed_over" } else { "kept" };
        metrics::counter!(crate::observe::metrics::HANDOVERS, "shard" => self.shard.to_string(), "outcome" => outcome)
            .increment(1);
        stepped_down
    }

    /// Waits up to `limit` for this node to stop leading.
    async fn wait_until_follower(&self, limit: Duration) -> bool {
        let mut server = self.raft.server_metrics();
        let followed = server.wait_for(|metrics| metrics.state != ServerState::Leader);
        let outcome = tokio::time::timeout(limit, followed).await;
        matches!(outcome, Ok(Ok(_)))
    }
}

/// Answers `POST /raft/elect`: after the wait asked for (capped at
/// [`MAX_ELECT_AFTER_MS`]), hurries the shard's election guard into a
/// pre-vote, unless this node leads by then or a later term has begun.
pub fn elect_after(raft: Raft, guard: Arc<ElectionGuard>, request: ElectRequest) {
    let after = Duration::from_millis(request.after_ms.min(MAX_ELECT_AFTER_MS));
    crate::seams::spawn(async move {
        tokio::time::sleep(after).await;
        let (state, term) = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            (metrics.state, metrics.current_term)
        };
        if should_stand(state, term, request.term) {
            guard.hurry(term);
        }
    });
}

/// Whether a node in `state` and `term` stands for a handover of
/// `handed_over` (0: unknown). Not once a later term has begun: another
/// voter stood while the leader was silent, and may lead already; standing
/// then deposes a leader that nothing disturbed (simulator, seed 54 at S = 3:
/// node2 won the handed-over shard 48 ms before node1 stood).
fn should_stand(state: ServerState, term: u64, handed_over: u64) -> bool {
    state != ServerState::Leader && (handed_over == 0 || term <= handed_over)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preferred_node_stands_only_in_the_handed_over_term() {
        assert!(should_stand(ServerState::Follower, 4, 4));
        assert!(should_stand(ServerState::Follower, 3, 4));
        // Another voter began term 5 while the leader was silent.
        assert!(!should_stand(ServerState::Follower, 5, 4));
        assert!(!should_stand(ServerState::Candidate, 5, 4));
        assert!(!should_stand(ServerState::Leader, 4, 4));
        // A node that did not say which term: as before, it stands.
        assert!(should_stand(ServerState::Follower, 9, 0));
    }

    #[test]
    fn an_old_elect_request_without_a_term_still_decodes() {
        #[derive(Serialize)]
        struct Old {
            after_ms: u64,
        }
        let body = codec::encode(&Old { after_ms: 300 }).expect("encodes");
        let request: ElectRequest = codec::decode(&body).expect("decodes");
        assert_eq!((request.after_ms, request.term), (300, 0));
    }
}
