//! The API token registry in the replicated state: applying token commands and
//! the one `state` row ([`TOKENS`]) that holds the registry.
//!
//! The registry is small (at most `MAX_TOKENS` records of bounded size) and
//! changes rarely, so each token command rewrites its one row whole, in the same
//! batch as the entry's other rows. It is also a field of the snapshot, so a
//! revocation survives restarts, snapshot installs and log compaction alike.

use permitd_core::tokens::TokenRegistry;
use permitd_core::InvalidInput;

use crate::rows::WriteSet;
use crate::{Command, CommandResult, StorageError};

/// The `state` tree's row holding the JSON of the whole [`TokenRegistry`].
pub const TOKENS: &[u8] = b"\x00tokens";

/// Applies `CreateToken` or `RevokeToken` (the entry at `log_index`); a refused
/// command changes nothing and answers `Rejected`.
pub(crate) fn apply(
    tokens: &mut TokenRegistry,
    write: &mut WriteSet,
    log_index: u64,
    command: &Command,
) -> Result<CommandResult, StorageError> {
    let result = match command {
        Command::CreateToken { now_ms, hash, spec } => {
            match tokens.create(log_index, *now_ms, hash, spec) {
                Ok(token) => CommandResult::TokenCreated { token },
                Err(error) => return Ok(CommandResult::from(InvalidInput::from(error))),
            }
        }
        Command::RevokeToken { id } => {
            if !tokens.revoke(*id) {
                let error = InvalidInput::Malformed(format!("no token {id}"));
                return Ok(CommandResult::from(error));
            }
            CommandResult::Done
        }
        other => {
            let error = InvalidInput::Malformed(format!("not a token command: {other:?}"));
            return Ok(CommandResult::from(error));
        }
    };
    write.put(TOKENS, tokens)?;
    Ok(result)
}
