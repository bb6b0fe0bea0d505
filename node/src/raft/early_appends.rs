//! Early appends: a leader's new entries leave for an idle follower as they
//! are written, not after the leader's own `fdatasync`.
//!
//! openraft 0.9's core writes a leader's entries and then *waits* for the
//! log's flush callback before it runs the next command, the one that hands
//! the entries to the replication streams (`RaftCore::append_to_log`). So the
//! leader's sync and the followers' appends, each with its own sync, ran one
//! after the other. A scheduler trace (`perf record -e sched:…`) of the
//! bench's 1-client row showed it: the leader's write, its sync thread's
//! `fdatasync` (~0.17 ms), the wake back, and only then the two sends, each
//! follower's write and sync, and the answers (docs/scaling.md, "Sending
//! before the leader's own sync").
//!
//! Raft needs no such order: the leader may send an entry before it is
//! durable on its own disk (the Raft thesis, §10.2.1). What commits an entry
//! is a majority of durable copies, and openraft counts the leader's own only
//! once its flush callback fires, as before. So here the log store tells this
//! shard's network of each append before writing it ([`AppendObserver`]), and
//! the network sends the entries at once to every follower whose connection
//! is idle, as the very append openraft will ask for after the flush: the
//! same vote, the follower's last acknowledged entry as the previous log id,
//! openraft's last commit index on that connection. When openraft then asks
//! for that append, the connection joins the send under way
//! (`Connection::send_entries`), as it joins one openraft asked for twice.
//! The sends are tasks on the Raft runtime's worker, where a fast disk's sync
//! also runs: told that sends were started, the log's group commit yields
//! once so that they leave before its `fdatasync` blocks the worker
//! (`permitd_storage`'s group commit module).
//!
//! A send is started only when the request it makes is exactly the one
//! openraft will make, as far as this connection can tell:
//! - openraft's last call on the connection carried a vote of this node as
//!   leader, and the entries are of that leader;
//! - nothing is being sent to the follower (openraft sends one append at a
//!   time per follower, so the next one will start at the follower's last
//!   acknowledged entry), and that entry is the one just before these;
//! - at most [`EARLY_ENTRIES_MAX`] entries: the latency-bound case. Runs
//!   are encoded inline on the core's turn, so large ones are left to
//!   openraft as before.
//!
//! openraft joins it only if its request has the same vote, previous log id
//! and commit index; otherwise it sends its own and the early one finishes
//! alone: the follower then holds the same entries twice over, which Raft's
//! consistency check makes harmless (a legitimate append of the current
//! leader, however late). Nothing here decides what is committed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use openraft::error::{RPCError, RaftError};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use openraft::{Entry, LogId, Vote};
use permitd_storage::{AppendObserver, NodeId, PeerNode, TypeConfig};
use tokio::task::JoinHandle;

/// Appends sent to a follower before the leader's own sync.
pub const EARLY_APPENDS_SENT: &str = "permitd_raft_early_appends_sent_total";
/// Early appends that openraft's own append joined.
pub const EARLY_APPENDS_JOINED: &str = "permitd_raft_early_appends_joined_total";

/// Most entries an early append carries.
pub const EARLY_ENTRIES_MAX: usize = 2;

/// What a follower answered to an append (or why it did not).
pub type AppendResult =
    Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, PeerNode, RaftError<NodeId>>>;

/// An append with entries being sent in its own task: one openraft asked for,
/// or an early one.
#[derive(Debug)]
pub struct AppendInFlight {
    pub vote: Vote<NodeId>,
    pub prev_log_id: Option<LogId<NodeId>>,
    pub leader_commit: Option<LogId<NodeId>>,
    pub last_log_id: LogId<NodeId>,
    pub task: JoinHandle<AppendResult>,
}

impl AppendInFlight {
    /// Whether an append of the same vote and previous log id may be answered
    /// by this one: within one vote the leader's log only grows, so both carry
    /// the same entries as far as both reach.
    pub fn answers(&self, request: &AppendEntriesRequest<TypeConfig>) -> bool {
        self.vote == request.vote && self.prev_log_id == request.prev_log_id
    }
}

/// Starts an append's send in a task of its own (the Raft network,
/// `network.rs`); `None` if it cannot go (too large, not encodable), which
/// leaves the append to openraft.
pub trait AppendSender: Send + Sync + std::fmt::Debug {
    fn start_append(
        &self,
        target: NodeId,
        target_node: &PeerNode,
        request: AppendEntriesRequest<TypeConfig>,
    ) -> Option<AppendInFlight>;
}

/// One shard's followers, as its replication connections know them.
#[derive(Debug)]
pub struct EarlyAppends {
    /// This node: the leader whose entries may go early.
    node: NodeId,
    /// Each follower's connection state; a connection openraft dropped is gone.
    followers: Mutex<BTreeMap<NodeId, Weak<Mutex<Follower>>>>,
}

/// What one replication connection knows of its follower.
#[derive(Debug)]
pub struct Follower {
    sender: Arc<dyn AppendSender>,
    target: NodeId,
    target_node: PeerNode,
    /// The vote of openraft's last call on this connection.
    vote: Option<Vote<NodeId>>,
    /// The commit index of openraft's last call on this connection.
    commit: Option<Option<LogId<NodeId>>>,
    /// The follower's last entry, as its last answer to an append of
    /// [`Follower::vote`] showed it; `None` when unknown.
    acknowledged: Option<LogId<NodeId>>,
    /// openraft's append with entries is being sent.
    sending: bool,
    /// An early append, until openraft's append joins it or moves past it.
    early: Option<AppendInFlight>,
}

impl EarlyAppends {
    pub fn new(node: NodeId) -> Arc<Self> {
        Arc::new(Self {
            node,
            followers: Mutex::default(),
        })
    }

    /// `follower`'s connection replicates to its target now: it replaces the
    /// one before. openraft makes connections for votes, linearizable reads
    /// and snapshots too; only the one that sends entries is the follower's.
    pub fn replicating(&self, follower: &Arc<Mutex<Follower>>) {
        let target = lock(follower).target;
        lock(&self.followers).insert(target, Arc::downgrade(follower));
    }

    /// Sends `entries` early to every follower whose connection can tell the
    /// append openraft will ask for; how many it sent to.
    pub fn send(&self, entries: &[Entry<TypeConfig>]) -> usize {
        if entries.is_empty() || entries.len() > EARLY_ENTRIES_MAX {
            return 0;
        }
        let followers: Vec<_> = lock(&self.followers)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        followers
            .iter()
            .filter(|follower| lock(follower).send_early(self.node, entries))
            .count()
    }
}

impl AppendObserver for EarlyAppends {
    fn appending(&self, entries: &[Entry<TypeConfig>]) -> bool {
        self.send(entries) > 0
    }
}

impl Follower {
    /// The state of a new connection to `target`.
    pub fn new(
        sender: Arc<dyn AppendSender>,
        target: NodeId,
        target_node: PeerNode,
    ) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Self {
            sender,
            target,
            target_node,
            vote: None,
            commit: None,
            acknowledged: None,
            sending: false,
            early: None,
        }))
    }

    /// Starts the early append of `entries` if it is the one openraft will ask
    /// for (the module docs); whether it did.
    fn send_early(&mut self, leader: NodeId, entries: &[Entry<TypeConfig>]) -> bool {
        let Some(request) = self.early_request(leader, entries) else {
            return false;
        };
        let Some(append) = self
            .sender
            .start_append(self.target, &self.target_node, request)
        else {
            return false;
        };
        metrics::counter!(EARLY_APPENDS_SENT).increment(1);
        self.early = Some(append);
        true
    }

    /// The append openraft will ask for after its flush, if this connection
    /// can tell it exactly.
    fn early_request(
        &self,
        leader: NodeId,
        entries: &[Entry<TypeConfig>],
    ) -> Option<AppendEntriesRequest<TypeConfig>> {
        let vote = self.vote?;
        let of_this_leader = vote.is_committed()
            && vote.leader_id().voted_for() == Some(leader)
            && entries
                .iter()
                .all(|entry| entry.log_id.leader_id == *vote.leader_id());
        let idle = !self.sending && self.early.is_none();
        let previous = self.acknowledged?;
        let follows = entries.first()?.log_id.index == previous.index + 1;
        let leader_commit = self.commit?;
        (of_this_leader && idle && follows).then(|| AppendEntriesRequest {
            vote,
            prev_log_id: Some(previous),
            leader_commit,
            entries: entries.to_vec(),
        })
    }

    /// Notes openraft's call `request` on this connection: a new vote
    /// forgets what the old one's answers showed.
    pub fn asked(&mut self, request: &AppendEntriesRequest<TypeConfig>) {
        if self.vote != Some(request.vote) {
            self.acknowledged = None;
            self.early = None;
        }
        self.vote = Some(request.vote);
        self.commit = Some(request.leader_commit);
    }

    /// The early append that answers `request` (same vote, previous log id
    /// and commit index), if any; one that does not is left to finish alone.
    pub fn take_early(
        &mut self,
        request: &AppendEntriesRequest<TypeConfig>,
    ) -> Option<AppendInFlight> {
        let early = self.early.take()?;
        let joins = early.answers(request) && early.leader_commit == request.leader_commit;
        if joins {
            metrics::counter!(EARLY_APPENDS_JOINED).increment(1);
        }
        joins.then_some(early)
    }

    /// openraft's append with entries is being sent (`true`) or was answered.
    pub fn sending(&mut self, sending: bool) {
        self.sending = sending;
    }

    /// The follower's answer to an append of `vote` whose entries ended at
    /// `sent`: what it now holds, as far as it shows.
    pub fn answered(
        &mut self,
        vote: Vote<NodeId>,
        sent: LogId<NodeId>,
        answer: &AppendEntriesResponse<NodeId>,
    ) {
        if self.vote != Some(vote) {
            return;
        }
        self.acknowledged = match answer {
            AppendEntriesResponse::Success => Some(sent),
            AppendEntriesResponse::PartialSuccess(matching) => *matching,
            AppendEntriesResponse::Conflict | AppendEntriesResponse::HigherVote(_) => None,
        };
    }
}

/// Plain data: a panic while holding the lock leaves nothing half-done.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn describe() {
    metrics::describe_counter!(
        EARLY_APPENDS_SENT,
        "Appends a leader sent to an idle follower as it wrote the entries, before its own fdatasync."
    );
    metrics::describe_counter!(
        EARLY_APPENDS_JOINED,
        "Early appends that openraft's own append, asked for after the leader's sync, joined."
    );
}
