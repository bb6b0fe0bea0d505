//! The log entry's command: what one Raft entry asks the state machine to do.
//!
//! Every variant carries what apply needs to be a pure function of (state,
//! entry): the leader's clock where time matters, requests in arrival order.
//! Ids come from the entry's log index, never from the command.

use permitd_core::config::{GroupConfig, KeyConfig, KeyConfigUpdate};
use permitd_core::contract::protocol::{PermitGrant, PermitRequest, PermitSync, PermitSyncResult};
use permitd_core::engine::delete_key::{KeyDeleted, KeyInUse};
use permitd_core::engine::force_release::ForceReleased;
use permitd_core::engine::restore::Backup;
use permitd_core::tokens::{TokenInfo, TokenSpec};
use permitd_core::{Event, InvalidInput, KeyLimitReached};
use serde::{Deserialize, Serialize};

use crate::command_decode::commands;

/// One key's share of a round entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyRound {
    pub key: String,
    /// In arrival order.
    pub requests: Vec<PermitRequest>,
}

/// One client's sync of one key, riding a round entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeySync {
    pub key: String,
    pub sync: PermitSync,
}

commands! {
    /// A Raft log entry's payload. Decoded by [`crate::command_decode`] (same
    /// format, without serde's copy of the whole map first).
    #[derive(Debug, Clone, PartialEq, Serialize)]
    #[serde(tag = "op", rename_all = "camelCase")]
    pub enum Command {
        /// Syncs that arrived since the last entry left, then the rounds of the keys
        /// that fell due, at the leader's `now`. Syncs apply first, in arrival
        /// order, so the permits they return are granted by the rounds of the same
        /// entry.
        #[serde(rename_all = "camelCase")]
        Round {
            now_ms: u64,
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            syncs: Vec<KeySync>,
            keys: Vec<KeyRound>,
        },
        /// One client's sync of one key, alone (logs from before syncs rode rounds).
        #[serde(rename_all = "camelCase")]
        Sync {
            now_ms: u64,
            key: String,
            sync: PermitSync,
        },
        /// Reclaim passes (claim-deadline timers) of one or more keys.
        #[serde(rename_all = "camelCase")]
        Reclaim { now_ms: u64, keys: Vec<String> },
        /// Replace a key's configuration; omitted fields take the defaults.
        #[serde(rename_all = "camelCase")]
        SetKeyConfig {
            key: String,
            update: KeyConfigUpdate,
        },
        /// Set one group's cap and permission.
        #[serde(rename_all = "camelCase")]
        SetGroup {
            key: String,
            group: String,
            config: GroupConfig,
        },
        /// Remove one group's settings.
        #[serde(rename_all = "camelCase")]
        RemoveGroup { key: String, group: String },
        /// Replace the cluster-wide defaults.
        #[serde(rename_all = "camelCase")]
        SetDefaults { defaults: KeyConfig },
        /// Drop everything kept for a key, unconditionally, without events. No
        /// route proposes it; it stays so that the op keeps its meaning in any
        /// log. An operator's delete is [`Command::DeleteKey`].
        #[serde(rename_all = "camelCase")]
        RemoveKey { key: String },
        /// An operator deletes a key's settings and state at the leader's `now`
        /// (`permitd_core::engine::delete_key`): refused while it has holders unless
        /// `force`; a `requestId` makes a replay answer as the first time.
        #[serde(rename_all = "camelCase")]
        DeleteKey {
            now_ms: u64,
            key: String,
            #[serde(default, skip_serializing_if = "std::ops::Not::not")]
            force: bool,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            request_id: Option<String>,
        },
        /// Add an API token; its id is the entry's log index. Carries the secret's
        /// hash only: the secret itself never enters the log.
        #[serde(rename_all = "camelCase")]
        CreateToken {
            now_ms: u64,
            hash: String,
            spec: TokenSpec,
        },
        /// Revoke an API token.
        #[serde(rename_all = "camelCase")]
        RevokeToken { id: u64 },
        /// An operator drops one client's grants, leases and remembered answers on a
        /// key (a runner that died for good), at the leader's `now`.
        #[serde(rename_all = "camelCase")]
        ForceRelease {
            now_ms: u64,
            key: String,
            client_id: String,
        },
        /// Write a backup into a new cluster (one that holds no key yet).
        #[serde(rename_all = "camelCase")]
        Restore { backup: Backup },
    }
}

/// What applying a [`Command`] answers; the leader replies from it.
///
/// openraft carries one result type for every entry, so this is one enum; callers
/// read it through the accessor of the command they proposed
/// ([`CommandResult::into_round`] for a `Round`, and so on), which hands back the
/// typed answer or the typed rejection. No caller matches on the variants.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum CommandResult {
    /// Entries without an answer: blank, membership, reclaim, removals,
    /// `SetGroup`, `SetDefaults`.
    #[default]
    Done,
    /// Per key of a round entry (same order), one answer per request (same
    /// order); one answer per sync of the entry (same order).
    Round {
        answers: Vec<Vec<PermitGrant>>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        synced: Vec<PermitSyncResult>,
    },
    /// The answer to a `Sync`.
    Synced { answer: PermitSyncResult },
    /// The effective configuration after `SetKeyConfig`.
    KeyConfig { config: KeyConfig },
    /// The token `CreateToken` added (without its secret).
    TokenCreated { token: TokenInfo },
    /// What `ForceRelease` dropped.
    Released { released: ForceReleased },
    /// What `DeleteKey` did (or, replayed by `requestId`, did the first time).
    KeyDeleted { deleted: KeyDeleted },
    /// `DeleteKey` without `force` found the key in use; nothing changed.
    KeyInUse { in_use: KeyInUse },
    /// `Restore` wrote this many keys.
    Restored { keys: u64 },
    /// `Restore` was refused (the cluster holds keys, or a row breaks an
    /// invariant); nothing changed.
    RestoreRefused { reason: String },
    /// The command was rejected by validation inside apply; nothing changed.
    Rejected { error: InvalidInput },
    /// The command would have created keys past the cluster's key limit; nothing
    /// changed.
    KeyLimit { max: usize },
}

/// Why a result does not hold the answer its caller expects.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refused {
    /// Validation inside apply rejected the command; nothing changed.
    #[error(transparent)]
    Rejected(#[from] InvalidInput),
    /// The command would have created keys past the key limit; nothing changed.
    #[error(transparent)]
    KeyLimit(#[from] KeyLimitReached),
    /// A backup could not be restored; nothing changed.
    #[error("{0}")]
    NotRestored(String),
    /// A delete without `force` of a key with holders; nothing changed.
    #[error(transparent)]
    KeyInUse(#[from] KeyInUse),
    /// The result is of another command: a bug, never a matter of input.
    #[error("apply answered {got} where {expected} was expected")]
    OtherAnswer {
        expected: &'static str,
        got: &'static str,
    },
}

impl CommandResult {
    /// The answers of a [`Command::Round`]: per key per request, and per sync.
    pub fn into_round(self) -> Result<(Vec<Vec<PermitGrant>>, Vec<PermitSyncResult>), Refused> {
        match self {
            Self::Round { answers, synced } => Ok((answers, synced)),
            other => Err(other.refused("round")),
        }
    }

    /// The answer of a [`Command::Sync`].
    pub fn into_synced(self) -> Result<PermitSyncResult, Refused> {
        match self {
            Self::Synced { answer } => Ok(answer),
            other => Err(other.refused("synced")),
        }
    }

    /// The effective configuration after a [`Command::SetKeyConfig`].
    pub fn into_key_config(self) -> Result<KeyConfig, Refused> {
        match self {
            Self::KeyConfig { config } => Ok(config),
            other => Err(other.refused("keyConfig")),
        }
    }

    /// The token a [`Command::CreateToken`] added.
    pub fn into_token_created(self) -> Result<TokenInfo, Refused> {
        match self {
            Self::TokenCreated { token } => Ok(token),
            other => Err(other.refused("tokenCreated")),
        }
    }

    /// What a [`Command::ForceRelease`] dropped.
    pub fn into_released(self) -> Result<ForceReleased, Refused> {
        match self {
            Self::Released { released } => Ok(released),
            other => Err(other.refused("released")),
        }
    }

    /// What a [`Command::DeleteKey`] did.
    pub fn into_key_deleted(self) -> Result<KeyDeleted, Refused> {
        match self {
            Self::KeyDeleted { deleted } => Ok(deleted),
            other => Err(other.refused("keyDeleted")),
        }
    }

    /// The keys a [`Command::Restore`] wrote.
    pub fn into_restored(self) -> Result<u64, Refused> {
        match self {
            Self::Restored { keys } => Ok(keys),
            other => Err(other.refused("restored")),
        }
    }

    /// The outcome of a command without an answer (`SetGroup`, `SetDefaults`,
    /// `RemoveGroup`, `RemoveKey`, `Reclaim`).
    pub fn into_done(self) -> Result<(), Refused> {
        match self {
            Self::Done => Ok(()),
            other => Err(other.refused("done")),
        }
    }

    fn refused(self, expected: &'static str) -> Refused {
        let got = match self {
            Self::Rejected { error } => return Refused::Rejected(error),
            Self::KeyLimit { max } => return Refused::KeyLimit(KeyLimitReached { max }),
            Self::RestoreRefused { reason } => return Refused::NotRestored(reason),
            Self::KeyInUse { in_use } => return Refused::KeyInUse(in_use),
            Self::KeyDeleted { .. } => "keyDeleted",
            Self::Released { .. } => "released",
            Self::Restored { .. } => "restored",
            Self::Done => "done",
            Self::Round { .. } => "round",
            Self::Synced { .. } => "synced",
            Self::KeyConfig { .. } => "keyConfig",
            Self::TokenCreated { .. } => "tokenCreated",
        };
        Refused::OtherAnswer { expected, got }
    }
}

impl From<KeyLimitReached> for CommandResult {
    fn from(error: KeyLimitReached) -> Self {
        Self::KeyLimit { max: error.max }
    }
}

impl From<InvalidInput> for CommandResult {
    fn from(error: InvalidInput) -> Self {
        Self::Rejected { error }
    }
}

/// Events of an applied entry, for the node to emit after the apply.
#[derive(Debug, Clone, Default)]
pub struct AppliedEvents {
    pub events: Vec<(String, Event)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors_hand_back_the_typed_answer_or_the_typed_rejection() {
        assert_eq!(CommandResult::Done.into_done(), Ok(()));
        let rejected = CommandResult::from(InvalidInput::Empty {
            field: "key".into(),
        });
        let Err(Refused::Rejected(error)) = rejected.into_key_config() else {
            panic!("a rejection stays a rejection");
        };
        assert_eq!(error.field(), Some("key"));
        assert_eq!(
            CommandResult::Done.into_round(),
            Err(Refused::OtherAnswer {
                expected: "round",
                got: "done"
            })
        );
    }

    #[test]
    fn a_rejection_survives_encoding_with_its_field() {
        let result = CommandResult::from(InvalidInput::TooLarge {
            field: "demand.count".into(),
            value: 7,
            max: 5,
        });
        let text = serde_json::to_string(&result).unwrap();
        let decoded: CommandResult = serde_json::from_str(&text).unwrap();
        assert_eq!(decoded, result);
    }
}
