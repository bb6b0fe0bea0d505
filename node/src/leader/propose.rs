//! Proposing one log entry on the leader and waiting for its apply result.
//!
//! A proposal races the leadership: if this node stops leading the term it
//! proposed in, the caller is told at once (`LeaderChanged`) instead of waiting
//! for openraft to give up. The entry may still commit under the next leader; that
//! is the "reply lost after commit" case the design accepts.

use openraft::error::{ClientWriteError, RaftError};
use permitd_storage::{Command, CommandResult, EncodedCommand, NodeId, TypeConfig};
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
    /// The command could not be encoded for the log: a bug, never a matter of input.
    #[error("cannot encode the command for the log: {0}")]
    Encode(String),
}

/// The apply result of a submitted entry, once it commits.
type ResultReceiver = tokio::sync::oneshot::Receiver<openraft::raft::ClientWriteResult<TypeConfig>>;

/// An entry handed to openraft, not yet answered.
#[derive(Debug)]
pub struct Uncommitted {
    result: ResultReceiver,
    /// The leadership it was submitted under.
    started: Leadership,
}

/// Hands `command` to openraft if this node leads, without waiting for it to
/// commit. Entries submitted one after the other from one task take log
/// indexes in that order; [`propose`] from separate tasks does not promise it.
pub async fn submit(
    raft: &Raft,
    leadership: &watch::Receiver<Leadership>,
    command: Command,
) -> Result<Uncommitted, ProposeError> {
    let started = *leadership.borrow();
    if !started.is_leader {
        return Err(ProposeError::NotLeader {
            leader: started.leader,
        });
    }
    let command =
        EncodedCommand::new(command).map_err(|error| ProposeError::Encode(error.to_string()))?;
    let result = raft
        .client_write_ff(command)
        .await
        .map_err(|fatal| map_write_error(RaftError::Fatal(fatal)))?;
    Ok(Uncommitted { result, started })
}

/// Waits for a submitted entry's apply result (and its log index), or for the
/// leadership it was submitted under to end.
pub async fn outcome(
    submitted: Uncommitted,
    leadership: &watch::Receiver<Leadership>,
) -> Result<(CommandResult, u64), ProposeError> {
    tokio::select! {
        result = submitted.result => match result {
            Ok(written) => written
                .map(|response| (response.data, response.log_id.index))
                .map_err(|error| map_write_error(RaftError::APIError(error))),
            // openraft's core dropped the answer: it stopped.
            Err(_) => Err(ProposeError::ShuttingDown),
        },
        () = lost(leadership.clone(), submitted.started) => Err(ProposeError::LeaderChanged),
    }
}

/// Proposes `command` if this node leads, and waits for its apply result.
pub async fn propose(
    raft: &Raft,
    leadership: &watch::Receiver<Leadership>,
    command: Command,
) -> Result<(CommandResult, u64), ProposeError> {
    let submitted = submit(raft, leadership, command).await?;
    outcome(submitted, leadership).await
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
