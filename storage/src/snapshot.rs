//! The snapshot format: one versioned JSON document of the whole state machine.
//!
//! `{"version": 1, "lastApplied": …, "membership": …, "semaphores": …}`. The
//! semaphores serialise only their canonical part (settings, grants, leases,
//! remembered answers, in `BTreeMap` order), so two replicas at the same log id
//! produce the same bytes, and the derived indexes are rebuilt on load.
//!
//! The version is read on its own first, so a snapshot from a newer build fails
//! with "version N" rather than with whatever field it changed.

use openraft::{LogId, StoredMembership};
use permitd_core::tokens::TokenRegistry;
use permitd_core::Semaphores;
use serde::{Deserialize, Serialize};

use crate::{NodeId, PeerNode, StorageError};

/// The snapshot format this build writes and reads.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ImageRef<'a> {
    version: u32,
    last_applied: &'a Option<LogId<NodeId>>,
    membership: &'a StoredMembership<NodeId, PeerNode>,
    semaphores: &'a Semaphores,
    tokens: &'a TokenRegistry,
}

#[derive(Deserialize)]
struct Header {
    version: u32,
}

/// A decoded snapshot.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
/// (`version` is checked through [`Header`] before the full decode.)
pub(crate) struct SnapshotImage {
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, PeerNode>,
    pub semaphores: Semaphores,
    /// Absent from snapshots written before tokens existed.
    #[serde(default)]
    pub tokens: TokenRegistry,
}

/// Serialises the state machine at `last_applied`.
pub(crate) fn encode(
    last_applied: &Option<LogId<NodeId>>,
    membership: &StoredMembership<NodeId, PeerNode>,
    semaphores: &Semaphores,
    tokens: &TokenRegistry,
) -> Result<Vec<u8>, StorageError> {
    let image = ImageRef {
        version: SNAPSHOT_FORMAT_VERSION,
        last_applied,
        membership,
        semaphores,
        tokens,
    };
    Ok(serde_json::to_vec(&image)?)
}

/// Parses a snapshot, refusing any other format version.
pub(crate) fn decode(bytes: &[u8]) -> Result<SnapshotImage, StorageError> {
    let header: Header = serde_json::from_slice(bytes)
        .map_err(|error| StorageError::Snapshot(format!("unreadable snapshot: {error}")))?;
    if header.version != SNAPSHOT_FORMAT_VERSION {
        return Err(StorageError::Snapshot(format!(
            "snapshot format version {}, this build reads {SNAPSHOT_FORMAT_VERSION}",
            header.version
        )));
    }
    serde_json::from_slice(bytes)
        .map_err(|error| StorageError::Snapshot(format!("unreadable snapshot: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_round_trips_and_checks_its_version() {
        let semaphores = Semaphores::default();
        let membership = StoredMembership::default();
        let bytes = encode(&None, &membership, &semaphores, &TokenRegistry::default()).unwrap();
        let image = decode(&bytes).unwrap();
        assert_eq!(image.semaphores, semaphores);
        assert_eq!(image.last_applied, None);

        let newer = String::from_utf8(bytes)
            .unwrap()
            .replace("\"version\":1", "\"version\":2");
        let error = decode(newer.as_bytes()).unwrap_err().to_string();
        assert!(error.contains("version 2"), "{error}");
        assert!(decode(b"garbage").is_err());
    }

    #[test]
    fn tokens_travel_in_snapshots_and_older_snapshots_have_none() {
        use permitd_core::tokens::{Role, TokenSpec};
        let mut tokens = TokenRegistry::default();
        let spec = TokenSpec {
            name: "r".into(),
            role: Role::Reader,
            keys: Vec::new(),
            client_ids: Vec::new(),
        };
        tokens.create(9, 1, &"ab".repeat(32), &spec).unwrap();
        let membership = StoredMembership::default();
        let bytes = encode(&None, &membership, &Semaphores::default(), &tokens).unwrap();
        assert_eq!(decode(&bytes).unwrap().tokens, tokens);

        let without = encode(
            &None,
            &membership,
            &Semaphores::default(),
            &TokenRegistry::default(),
        )
        .unwrap();
        let mut value: serde_json::Value = serde_json::from_slice(&without).unwrap();
        value.as_object_mut().unwrap().remove("tokens");
        let older = serde_json::to_vec(&value).unwrap();
        assert!(decode(&older).unwrap().tokens.is_empty());
    }
}
