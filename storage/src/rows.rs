//! The state machine's rows in the `state` tree: writing changes, loading it all.
//!
//! Each row's value is one core value in the [`crate::codec`] encoding (a `Grant`, a `Lease`, a
//! `RememberedAnswer`, a `KeyMeta`), so a key's state on disk is exactly the
//! canonical part of `KeyState`; the derived tally is rebuilt on load.

use std::collections::BTreeMap;
use std::path::Path;

use openraft::{LogId, StoredMembership};
use permitd_core::state::{Changes, KeyImage, KeyMeta, KeyState};
use permitd_core::{KeyConfig, Semaphores, StateChanges};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::codec;
use crate::keys::{self, Row};
use crate::{NodeId, PeerNode, StorageError};

/// The cluster-wide row: defaults and the replicated clock.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClusterRow {
    defaults: KeyConfig,
    last_now_ms: u64,
    /// See `Semaphores::defaults_written`; rows written before it existed
    /// belong to clusters whose init wrote the defaults.
    #[serde(default = "written_by_older_versions")]
    defaults_written: bool,
}

fn written_by_older_versions() -> bool {
    true
}

/// Rows to write (`Some`) or delete (`None`) in one atomic batch.
///
/// A map rather than a list so that a row written twice by one batch is written
/// once, with its last value.
#[derive(Debug, Default)]
pub(crate) struct WriteSet {
    rows: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl WriteSet {
    pub fn put(
        &mut self,
        row: impl Into<Vec<u8>>,
        value: &impl Serialize,
    ) -> Result<(), StorageError> {
        self.rows.insert(row.into(), Some(codec::encode(value)?));
        Ok(())
    }

    pub fn delete(&mut self, row: impl Into<Vec<u8>>) {
        self.rows.insert(row.into(), None);
    }

    pub fn into_batch(self) -> sled::Batch {
        let mut batch = sled::Batch::default();
        for (row, value) in self.rows {
            match value {
                Some(value) => batch.insert(row, value),
                None => batch.remove(row),
            }
        }
        batch
    }

    /// Deletes every row `tree` holds now (rows put afterwards are kept).
    pub fn delete_all(&mut self, tree: &sled::Tree) -> Result<(), StorageError> {
        for row in tree.iter().keys() {
            self.delete(row?.to_vec());
        }
        Ok(())
    }

    /// Records the rows `changes` names, with their values read from `semaphores`.
    /// Costs what changed, not what is held.
    pub fn record(
        &mut self,
        tree: &sled::Tree,
        semaphores: &Semaphores,
        changes: StateChanges,
    ) -> Result<(), StorageError> {
        if changes.cluster {
            self.put_cluster(semaphores)?;
        }
        for (key, key_changes) in changes.keys {
            match (key_changes, semaphores.key(&key)) {
                (Some(key_changes), Some(state)) => self.record_key(&key, state, &key_changes)?,
                _ => self.drop_key(tree, &key)?,
            }
        }
        Ok(())
    }

    fn put_cluster(&mut self, semaphores: &Semaphores) -> Result<(), StorageError> {
        let row = ClusterRow {
            defaults: semaphores.defaults().clone(),
            last_now_ms: semaphores.last_now_ms(),
            defaults_written: semaphores.defaults_written(),
        };
        self.put(keys::CLUSTER, &row)
    }

    fn record_key(
        &mut self,
        key: &str,
        state: &KeyState,
        changes: &Changes,
    ) -> Result<(), StorageError> {
        if changes.meta {
            self.put_meta(key, state.meta())?;
        }
        for &id in &changes.grants {
            match state.grants().get(&id) {
                Some(grant) => self.put(keys::grant_row(key, id), grant)?,
                None => self.delete(keys::grant_row(key, id)),
            }
        }
        for &id in &changes.leases {
            match state.leases().get(&id) {
                Some(lease) => self.put(keys::lease_row(key, id), lease)?,
                None => self.delete(keys::lease_row(key, id)),
            }
        }
        for (client_id, request_id) in &changes.answers {
            let row = keys::answer_row(key, client_id, request_id);
            match state
                .answers()
                .get(client_id)
                .and_then(|answers| answers.get(request_id))
            {
                Some(answer) => self.put(row, answer)?,
                None => self.delete(row),
            }
        }
        Ok(())
    }

    /// Default settings are stored as no row, so that an emptied key leaves nothing.
    fn put_meta(&mut self, key: &str, meta: &KeyMeta) -> Result<(), StorageError> {
        if *meta == KeyMeta::default() {
            self.delete(keys::meta_row(key));
            Ok(())
        } else {
            self.put(keys::meta_row(key), meta)
        }
    }

    /// A key the engine dropped (it holds nothing) or removed: delete all its rows,
    /// those on disk and those written earlier in this batch. The rows on disk are
    /// ones this entry emptied or removed, so the cost is still the entry's.
    fn drop_key(&mut self, tree: &sled::Tree, key: &str) -> Result<(), StorageError> {
        let prefix = keys::key_prefix(key);
        let pending: Vec<Vec<u8>> = self
            .rows
            .range(prefix.clone()..)
            .take_while(|(row, _)| row.starts_with(&prefix))
            .map(|(row, _)| row.clone())
            .collect();
        for row in pending {
            self.delete(row);
        }
        for row in tree.scan_prefix(&prefix).keys() {
            self.delete(row?.to_vec());
        }
        Ok(())
    }

    /// Records every row of `semaphores` (for installing a snapshot).
    pub fn record_all(&mut self, semaphores: &Semaphores) -> Result<(), StorageError> {
        self.put_cluster(semaphores)?;
        for (key, state) in semaphores.keys() {
            self.put_meta(key, state.meta())?;
            for (&id, grant) in state.grants() {
                self.put(keys::grant_row(key, id), grant)?;
            }
            for (&id, lease) in state.leases() {
                self.put(keys::lease_row(key, id), lease)?;
            }
            for (client_id, answers) in state.answers() {
                for (request_id, answer) in answers {
                    self.put(keys::answer_row(key, client_id, request_id), answer)?;
                }
            }
        }
        Ok(())
    }
}

/// The state machine as read back from disk.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub semaphores: Semaphores,
    pub tokens: permitd_core::tokens::TokenRegistry,
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, PeerNode>,
}

fn corrupt(dir: &Path, row: &[u8], detail: impl std::fmt::Display) -> StorageError {
    StorageError::Corrupt {
        dir: dir.to_owned(),
        detail: format!("state row {:?}: {detail}", String::from_utf8_lossy(row)),
    }
}

fn decode<T: DeserializeOwned>(dir: &Path, row: &[u8], value: &[u8]) -> Result<T, StorageError> {
    codec::decode(value).map_err(|error| corrupt(dir, row, error))
}

fn system_row<T: DeserializeOwned>(
    tree: &sled::Tree,
    dir: &Path,
    row: &[u8],
) -> Result<Option<T>, StorageError> {
    match tree.get(row)? {
        Some(value) => decode(dir, row, &value).map(Some),
        None => Ok(None),
    }
}

/// Reads the whole state machine from the `state` tree. Every row is decoded and
/// checked; anything unreadable is a [`StorageError::Corrupt`] naming `dir`.
pub(crate) fn load(tree: &sled::Tree, dir: &Path) -> Result<Loaded, StorageError> {
    let cluster: Option<ClusterRow> = system_row(tree, dir, keys::CLUSTER)?;
    let last_applied = system_row(tree, dir, keys::LAST_APPLIED)?.flatten();
    let membership = system_row(tree, dir, keys::MEMBERSHIP)?.unwrap_or_default();
    let mut images: BTreeMap<String, KeyImage> = BTreeMap::new();
    for row in tree.scan_prefix([keys::TAG_KEY]) {
        let (row, value) = row?;
        let parsed = keys::parse_row(&row).ok_or_else(|| corrupt(dir, &row, "malformed key"))?;
        let image = images.entry(parsed.key().to_owned()).or_default();
        match parsed {
            Row::Meta { .. } => image.meta = decode(dir, &row, &value)?,
            Row::Grant { id, .. } => {
                image.grants.insert(id, decode(dir, &row, &value)?);
            }
            Row::Lease { id, .. } => {
                image.leases.insert(id, decode(dir, &row, &value)?);
            }
            Row::Answer {
                client_id,
                request_id,
                ..
            } => {
                let answer = decode(dir, &row, &value)?;
                image
                    .answers
                    .entry(client_id)
                    .or_default()
                    .insert(request_id, answer);
            }
        }
    }
    let keys = images
        .into_iter()
        .map(|(key, image)| (key, KeyState::from(image)))
        .collect();
    let (defaults, last_now_ms, defaults_written) = match cluster {
        Some(row) => (row.defaults, row.last_now_ms, row.defaults_written),
        None => (KeyConfig::default(), 0, false),
    };
    let semaphores =
        Semaphores::from_parts(defaults, last_now_ms, keys).with_defaults_written(defaults_written);
    Ok(Loaded {
        semaphores,
        tokens: system_row(tree, dir, crate::token_state::TOKENS)?.unwrap_or_default(),
        last_applied,
        membership,
    })
}
