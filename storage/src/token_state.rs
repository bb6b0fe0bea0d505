//! The API token registry in the replicated state: applying token commands.
//!
//! The registry is a field of the snapshot, and its commands are log entries,
//! so a revocation survives restarts, snapshot installs and log compaction
//! alike.

use permitd_core::tokens::TokenRegistry;
use permitd_core::InvalidInput;

use crate::{Command, CommandResult};

/// Applies `CreateToken` or `RevokeToken` (the entry at `log_index`); a refused
/// command changes nothing and answers `Rejected`.
pub(crate) fn apply(
    tokens: &mut TokenRegistry,
    log_index: u64,
    command: &Command,
) -> CommandResult {
    match command {
        Command::CreateToken { now_ms, hash, spec } => {
            match tokens.create(log_index, *now_ms, hash, spec) {
                Ok(token) => CommandResult::TokenCreated { token },
                Err(error) => CommandResult::from(InvalidInput::from(error)),
            }
        }
        Command::RevokeToken { id } => {
            if tokens.revoke(*id) {
                CommandResult::Done
            } else {
                CommandResult::from(InvalidInput::Malformed(format!("no token {id}")))
            }
        }
        other => {
            let error = InvalidInput::Malformed(format!("not a token command: {other:?}"));
            CommandResult::from(error)
        }
    }
}
