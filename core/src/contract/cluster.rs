//! `/cluster/*` shapes: a node's view of the cluster and membership changes.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// A node's id in the Raft group: unique in the cluster, never reused.
pub type NodeId = u64;

/// The answer of `GET /cluster/status` (and of `/cluster/init` and
/// `/cluster/members`): the answering node's view, which may lag the leader's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The answering node's id.
    pub id: NodeId,
    /// The leader this node knows of, if any.
    pub leader: Option<NodeId>,
    /// The Raft term this node is in.
    pub term: u64,
    /// The index of the last entry in this node's log.
    pub last_log_index: Option<u64>,
    /// The index of the last entry this node's state machine applied.
    pub last_applied: Option<u64>,
    /// Whether this node belongs to an initialised cluster (`permitd up` or
    /// `POST /cluster/init` has run).
    pub initialized: bool,
    /// Every member of the current membership, voters and learners.
    pub members: Vec<ClusterMember>,
}

/// The answer of `GET /cluster/shards`: every shard of the cluster (a Raft
/// group each, over the same nodes) as the answering node sees it, in shard
/// order. A key belongs to shard `shard_of(key, number of shards)`
/// (docs/protocol.md, "A key's shard"); a client sends its calls on the key
/// to that shard's leader. Today's clusters serve one shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardMap {
    /// The answering node's id.
    pub id: NodeId,
    /// Shard `k` at position `k`.
    pub shards: Vec<ShardStatus>,
}

/// One shard as the answering node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShardStatus {
    /// The shard's number, from 0.
    pub shard: u32,
    /// The node that leads the shard, as this node knows it, if any.
    pub leader: Option<NodeId>,
    /// The shard's Raft term on this node.
    pub term: u64,
    /// The voters of the shard's group, ascending.
    pub members: Vec<NodeId>,
    /// The index of the last entry of the shard that this node applied.
    pub applied_index: Option<u64>,
}

/// One member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterMember {
    pub id: NodeId,
    /// `host:port` of its public API.
    pub addr: String,
    /// `host:port` where its peers reach its Raft listener.
    pub raft_addr: String,
    pub role: MemberRole,
}

/// Whether a member votes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum MemberRole {
    /// Counts towards quorum and may lead.
    Voter,
    /// Receives the log but does not vote (a node catching up before promotion).
    Learner,
}

impl MemberRole {
    /// The wire spelling, for tables.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Voter => "voter",
            Self::Learner => "learner",
        }
    }
}

/// The body of `POST /cluster/members` (served by the leader).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "action", rename_all = "camelCase", deny_unknown_fields)]
pub enum MembershipChange {
    /// Adds a node as a learner and waits until it has caught up.
    #[serde(rename_all = "camelCase")]
    AddLearner {
        id: NodeId,
        api_addr: String,
        raft_addr: String,
    },
    /// Makes exactly these nodes the voters; every one must already be a member.
    #[serde(rename_all = "camelCase")]
    ChangeMembership { voters: BTreeSet<NodeId> },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reads_the_documented_shape() {
        let text = r#"{"id":1,"leader":2,"term":3,"lastLogIndex":10,"lastApplied":9,
            "initialized":true,
            "members":[{"id":1,"addr":"127.0.0.1:7001","raftAddr":"127.0.0.1:7101","role":"voter"}]}"#;
        let status: ClusterStatus = serde_json::from_str(text).unwrap();
        assert_eq!((status.leader, status.members.len()), (Some(2), 1));
        assert_eq!(status.members[0].role, MemberRole::Voter);
        assert_eq!(status.members[0].raft_addr, "127.0.0.1:7101");
    }

    #[test]
    fn membership_changes_are_tagged_by_action() {
        let change: MembershipChange =
            serde_json::from_str(r#"{"action":"changeMembership","voters":[1,2]}"#).unwrap();
        assert_eq!(
            change,
            MembershipChange::ChangeMembership {
                voters: BTreeSet::from([1, 2])
            }
        );
    }
}
