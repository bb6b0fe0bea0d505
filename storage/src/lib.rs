//! permitd's replicated state machine and Raft log over sled.
//!
//! (Being written: see the storage issue.)

pub mod command;

pub use command::{Command, CommandResult, KeyRound};

use serde::{Deserialize, Serialize};

/// A cluster member's addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerNode {
    /// `host:port` of the public v1 API.
    pub api_addr: String,
    /// `host:port` of the internal `/raft/` and `/cluster/` endpoints.
    pub raft_addr: String,
}

impl std::fmt::Display for PeerNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "api={} raft={}", self.api_addr, self.raft_addr)
    }
}

/// Raft node ids.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// permitd's openraft type configuration.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = NodeId,
        Node = PeerNode,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);
