//! Proposing one log entry on the leader and waiting for its apply result.
//!
//! A proposal races the leadership: if this node stops leading the term it
//! proposed in, the caller is told at once (`LeaderChanged`) instead of waiting
//! for openraft to give up. The entry may still commit under the next leader; that
//! is the "reply lost after commit" case the design accepts.

use openraft::error::{ClientWriteError, RaftError};
use permitd_storage::{Command, CommandResult, NodeId};
use tokio::sync::watch;

use crate::leader::leadership::{lost, Leadership};
use crate::raft::Raft;

/// Why a proposal got no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProposeError {
    #[error("this node is not the leader")]
    NotLeader { leader: Option<NodeId> },
    #[error("leadership changed while the entry was pending")]
    LeaderChanged,
    #[error("the node is shutting down")]
    ShuttingDown,
    #[error("raft: {0}")]
    Raft(String),
}

/// Proposes `command` if this node leads, and waits for its apply result.
pub async fn propose(
    raft: &Raft,
    leadership: &watch::Receiver<Leadership>,
    command: Command,
) -> Result<(CommandResult, u64), ProposeError> {
    let started = *leadership.borrow();
    if !started.is_leader {
        return Err(ProposeError::NotLeader {
            leader: started.leader,
        });
    }
    tokio::select! {
        result = raft.client_write(command) => result
            .map(|response| (response.data, response.log_id.index))
            .map_err(map_write_error),
        () = lost(leadership.clone(), started) => Err(ProposeError::LeaderChanged),
    }
}

fn map_write_error(
    error: RaftError<NodeId, ClientWriteError<NodeId, permitd_storage::PeerNode>>,
) -> ProposeError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
            ProposeError::NotLeader {
                leader: forward.leader_id,
            }
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(error)) => {
            ProposeError::Raft(error.to_string())
        }
        RaftError::Fatal(openraft::error::Fatal::Stopped) => ProposeError::ShuttingDown,
        RaftError::Fatal(fatal) => ProposeError::Raft(fatal.to_string()),
    }
}
