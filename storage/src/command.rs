//! The log entry's command: what one Raft entry asks the state machine to do.
//!
//! Every variant carries what apply needs to be a pure function of (state,
//! entry): the leader's clock where time matters, requests in arrival order.
//! Ids come from the entry's log index, never from the command.

use permitd_core::config::{GroupConfig, KeyConfig, KeyConfigUpdate};
use permitd_core::protocol::{PermitGrant, PermitRequest, PermitSync, PermitSyncResult};
use permitd_core::{Event, InvalidInput};
use serde::{Deserialize, Serialize};

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

/// A Raft log entry's payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Drop everything kept for a key.
    #[serde(rename_all = "camelCase")]
    RemoveKey { key: String },
}

/// What applying a [`Command`] answers; the leader replies from it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum CommandResult {
    /// Entries without an answer: blank, membership, reclaim, removals.
    #[default]
    Done,
    /// Per key of a round entry (same order), one answer per request (same
    /// order); one answer per sync of the entry (same order).
    Round {
        answers: Vec<Vec<PermitGrant>>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        synced: Vec<PermitSyncResult>,
    },
    Synced {
        answer: PermitSyncResult,
    },
    /// The effective configuration after `SetKeyConfig`.
    KeyConfig {
        config: KeyConfig,
    },
    /// The command was rejected by validation inside apply; nothing changed.
    Rejected {
        message: String,
    },
}

impl From<InvalidInput> for CommandResult {
    fn from(error: InvalidInput) -> Self {
        Self::Rejected {
            message: error.to_string(),
        }
    }
}

/// Events of an applied entry, for the node to emit after the apply.
#[derive(Debug, Clone, Default)]
pub struct AppliedEvents {
    pub events: Vec<(String, Event)>,
}
