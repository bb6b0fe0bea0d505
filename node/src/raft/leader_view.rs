//! Who leads a shard, as this node sees it: the few facts the round batcher,
//! the API and the quiet shards act on. Made by `leader/leadership.rs` from
//! openraft's server metrics, the election guard and a handover; kept here,
//! below both, so that the Raft layer (`quiescence.rs`, `liveness.rs`) reads it
//! without depending on the leader layer.

use permitd_storage::NodeId;

/// This node's view of the leadership.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Leadership {
    /// The leader as last known; `None` while an election runs or quorum is lost.
    pub leader: Option<NodeId>,
    pub term: u64,
    /// This node is the leader in `term` (and is not handing the shard over).
    pub is_leader: bool,
}

impl Leadership {
    /// Whether `self` is still the leadership a task started under: the same term,
    /// still led by this node. Anything else means the task's answer may be lost.
    pub fn holds(&self, started: &Leadership) -> bool {
        self.is_leader && started.is_leader && self.term == started.term
    }
}
