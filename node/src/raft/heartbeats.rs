//! Heartbeats coalesced per peer: in a cluster of several shards, the
//! heartbeats every shard's leader sends each follower (empty appends that
//! carry the commit index already sent) travel together, one
//! `POST /raft/heartbeats` per peer for all the shards that have one due.
//! An empty append that moves the follower's commit index is not one of them
//! (`raft/network.rs`, `Connection::coalesces`): openraft sends a follower
//! nothing else while an append is in flight, so holding it would hold the
//! shard's next entries too.
//!
//! Each shard's openraft core ticks its own heartbeat timer, at phases of its
//! own, so sent one by one an idle node's calls to a peer grow with the
//! shard count (measured: 65× at 64 shards; docs/scaling.md). Here the first
//! heartbeat to a peer after a quiet [`Heartbeats::window`] leaves at once,
//! and the ones due within the window after a send wait for its end and
//! leave in one call: at most two calls per heartbeat interval per peer,
//! whatever the shard count. A heartbeat waits at most one window (half a
//! heartbeat interval); the election timeouts are six intervals and more.
//!
//! The follower answers each shard's append in order, as `/raft/append`
//! would have (`edge/raft_inbound.rs`). A call that fails fails every
//! heartbeat in it, as each would have failed alone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, RaftError, RemoteError};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use permitd_storage::{NodeId, PeerNode, ShardId, TypeConfig};
use tokio::sync::oneshot;
use tokio::time::Instant;

use futures_util::future::BoxFuture;

/// One shard's heartbeat, as the follower takes it.
pub type ShardAppend = (ShardId, AppendEntriesRequest<TypeConfig>);
/// The follower's answer to one.
pub type ShardAnswer = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;
type Answer = Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, PeerNode, RaftError<NodeId>>>;

/// Sends one call of heartbeats to the peer (`raft/network.rs` makes it):
/// the answers in order, or why there are none.
pub type SendCall = Box<
    dyn FnOnce(Vec<ShardAppend>) -> BoxFuture<'static, Result<Vec<ShardAnswer>, String>> + Send,
>;

/// Shards' heartbeats per `/raft/heartbeats` call.
pub const HEARTBEATS_PER_CALL: &str = "permitd_heartbeats_per_call";

/// Registers the description shown in `/metrics`.
pub fn describe() {
    metrics::describe_histogram!(
        HEARTBEATS_PER_CALL,
        "Shards' heartbeats sent to a peer in one call, in a cluster of several shards."
    );
}

/// The coalescer of one node: a queue per peer.
#[derive(Debug)]
pub struct Heartbeats {
    /// How long after a send the next heartbeats wait to go together.
    window: Duration,
    peers: Mutex<BTreeMap<NodeId, Queue>>,
}

/// One peer's heartbeats waiting to leave.
#[derive(Debug, Default)]
struct Queue {
    waiting: Vec<(ShardAppend, oneshot::Sender<Answer>)>,
    /// A send is scheduled (it takes everything waiting when it leaves).
    scheduled: bool,
    last_sent: Option<Instant>,
}

impl Heartbeats {
    /// A coalescer that groups heartbeats within half of `heartbeat`.
    pub fn new(heartbeat: Duration) -> Arc<Self> {
        Arc::new(Self {
            window: heartbeat / 2,
            peers: Mutex::default(),
        })
    }

    /// Sends `append` (a shard's, to `target`) with the others due to that
    /// peer; its answer. `call` sends the call this one leaves in, if it is
    /// the one that schedules it.
    pub async fn send(
        self: &Arc<Self>,
        target: NodeId,
        node: &PeerNode,
        append: ShardAppend,
        call: SendCall,
    ) -> Answer {
        let (answer, answered) = oneshot::channel();
        let delay = {
            let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
            let queue = peers.entry(target).or_default();
            queue.waiting.push((append, answer));
            if queue.scheduled {
                None
            } else {
                queue.scheduled = true;
                let since = queue.last_sent.map(|sent| sent.elapsed());
                Some(since.map_or(Duration::ZERO, |since| self.window.saturating_sub(since)))
            }
        };
        if let Some(delay) = delay {
            let (this, node) = (self.clone(), node.clone());
            crate::seams::spawn(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                this.flush(target, &node, call).await;
            });
        }
        match answered.await {
            Ok(answer) => answer,
            Err(_) => {
                let error = std::io::Error::other("the heartbeat batch was dropped");
                Err(RPCError::Network(NetworkError::new(&error)))
            }
        }
    }

    /// Sends everything waiting for `target` in one call and hands out the
    /// answers.
    async fn flush(&self, target: NodeId, node: &PeerNode, call: SendCall) {
        let waiting = {
            let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
            let queue = peers.entry(target).or_default();
            queue.scheduled = false;
            queue.last_sent = Some(Instant::now());
            std::mem::take(&mut queue.waiting)
        };
        let (appends, answers): (Vec<ShardAppend>, Vec<_>) = waiting.into_iter().unzip();
        metrics::histogram!(HEARTBEATS_PER_CALL).record(appends.len() as f64);
        let sent = call(appends).await;
        match sent {
            Ok(results) if results.len() == answers.len() => {
                for (result, answer) in results.into_iter().zip(answers) {
                    let result = result.map_err(|error| {
                        RPCError::RemoteError(RemoteError::new_with_node(
                            target,
                            node.clone(),
                            error,
                        ))
                    });
                    let _ = answer.send(result);
                }
            }
            Ok(results) => {
                let why = format!("the peer answered {} of the heartbeats", results.len());
                fail_all(answers, &why);
            }
            Err(error) => fail_all(answers, &error),
        }
    }
}

/// Fails every heartbeat of a call that got no usable answer.
fn fail_all(answers: Vec<oneshot::Sender<Answer>>, why: &str) {
    for answer in answers {
        let error = std::io::Error::other(why.to_owned());
        let _ = answer.send(Err(RPCError::Network(NetworkError::new(&error))));
    }
}
