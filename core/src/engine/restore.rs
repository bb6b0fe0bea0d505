//! Restoring a backup: a whole saved [`Semaphores`] written into a new cluster.
//!
//! A backup is the state a leader had applied (settings, grants, leases,
//! remembered answers, the clock). Restoring it is one replicated entry, applied
//! only to a cluster that holds no key yet, so it can never merge two histories.
//! The file comes from outside, so it is read as a [`Backup`] of plain rows and
//! [`Backup::check`] holds every row to the state's invariants before a
//! [`KeyState`] is built: a corrupt or edited file must not panic the replicas
//! (the tally's subtractions assume the invariants).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::KeyConfig;
use crate::contract::validate::{
    validate_client_id, validate_group, validate_key, validate_key_config,
};
use crate::engine::semaphores::Semaphores;
use crate::engine::state::{KeyImage, KeyState};
use crate::limits::MAX_KEYS;
use crate::InvalidInput;

/// The `format` of a backup file.
pub const BACKUP_FORMAT: &str = "permitd-backup-1";

/// A backup file: what `GET /cluster/snapshot` answers and `permitd restore`
/// reads. `state` is the leader's [`Semaphores`] as it serialises.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupFile {
    /// [`BACKUP_FORMAT`].
    pub format: String,
    /// The leader had applied at least this log index when it saved the state.
    pub applied_index: u64,
    /// The engine's own state rows: an object the OpenAPI document leaves
    /// open, since only `permitd restore` reads it.
    #[schema(value_type = Object)]
    pub state: Backup,
}

/// The answer of `POST /cluster/restore`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Restored {
    /// Keys the restored state holds.
    pub restored_keys: u64,
}

/// Why a backup cannot be restored.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RestoreError {
    #[error("the cluster already holds {keys} keys: restore only into a new cluster")]
    NotEmpty { keys: usize },
    #[error("the backup is invalid: {0}")]
    Invalid(#[from] InvalidInput),
    #[error("the backup is invalid: key {key:?}: {problem}")]
    BrokenRow { key: String, problem: String },
}

/// A saved state as read from a file: the JSON shape [`Semaphores`] serialises
/// to, but with each key as its plain [`KeyImage`], so that nothing is tallied
/// (and no invariant assumed) before [`Backup::check`] has run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    pub defaults: KeyConfig,
    #[serde(default)]
    pub last_now_ms: u64,
    #[serde(default)]
    pub keys: BTreeMap<String, KeyImage>,
}

impl Backup {
    /// Checks every key, configuration and row; answers the state to restore.
    pub fn check(&self) -> Result<Semaphores, RestoreError> {
        if self.keys.len() > MAX_KEYS {
            return Err(InvalidInput::TooMany {
                field: "keys".into(),
                len: self.keys.len(),
                max: MAX_KEYS,
            }
            .into());
        }
        validate_key_config(&self.defaults)?;
        for (key, image) in &self.keys {
            validate_key(key)?;
            check_rows(key, image)?;
        }
        let keys = self
            .keys
            .iter()
            .map(|(key, image)| (key.clone(), KeyState::from(image.clone())))
            .collect();
        Ok(Semaphores::from_parts(
            self.defaults.clone(),
            self.last_now_ms,
            keys,
        ))
    }
}

fn check_rows(key: &str, image: &KeyImage) -> Result<(), RestoreError> {
    let broken = |problem: String| RestoreError::BrokenRow {
        key: key.to_owned(),
        problem,
    };
    if let Some(config) = &image.meta.config {
        validate_key_config(config)?;
    }
    for (id, grant) in &image.grants {
        validate_client_id(&grant.client_id)?;
        validate_group(&grant.group)?;
        if !(grant.released <= grant.claimed && grant.claimed <= grant.permits) {
            return Err(broken(format!(
                "grant {id}: released <= claimed <= permits fails"
            )));
        }
    }
    for (id, lease) in &image.leases {
        validate_client_id(&lease.client_id)?;
        validate_group(&lease.group)?;
        if lease.released > lease.permits || lease.drawn > lease.permits {
            return Err(broken(format!(
                "lease {id}: released or drawn above permits"
            )));
        }
    }
    Ok(())
}

impl Semaphores {
    /// Replaces this (new, key-less) state with `backup`: its defaults, keys and
    /// clock (never moving the clock back). Every row is written. Nothing
    /// changes when it fails.
    pub fn restore(&mut self, backup: &Backup) -> Result<(), RestoreError> {
        if !self.keys().is_empty() {
            return Err(RestoreError::NotEmpty {
                keys: self.keys().len(),
            });
        }
        let backup = backup.check()?;
        self.set_defaults(backup.defaults().clone())?;
        self.advance_clock(backup.last_now_ms());
        for (key, saved) in backup.keys() {
            self.with_key(key, |state, _| {
                *state = KeyState::clone(saved);
                let rows = state.all_rows();
                state.carry_changes(rows);
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyConfig;
    use crate::contract::protocol::{Demand, PermitRequest, V1};
    use crate::IdAllocator;

    const T0: u64 = 1_764_460_800_000;

    fn backup_of(sem: &Semaphores) -> Backup {
        serde_json::from_value(serde_json::to_value(sem).expect("serialises")).expect("parses")
    }

    fn saved() -> Semaphores {
        let mut sem = Semaphores::new(KeyConfig {
            limit: 9,
            ..KeyConfig::default()
        })
        .expect("defaults");
        let request = PermitRequest {
            v: V1,
            client_id: "c".into(),
            request_id: Some("r1".into()),
            demand: vec![Demand {
                group: "g".into(),
                count: 4,
                oldest_at_ms: T0,
            }],
            grants: Vec::new(),
            leases: None,
            wait_ms: None,
        };
        sem.round("k", &mut IdAllocator::new(7), T0, &[request]);
        sem.take_changes();
        sem
    }

    #[test]
    fn a_restored_state_equals_the_saved_one_and_writes_every_row() {
        let backup = saved();
        let mut fresh = Semaphores::new(KeyConfig::default()).expect("defaults");
        fresh.restore(&backup_of(&backup)).expect("restores");
        assert_eq!(fresh.keys(), backup.keys());
        assert_eq!(fresh.defaults(), backup.defaults());
        assert_eq!(fresh.usage("k", T0), backup.usage("k", T0));
        let changes = fresh.take_changes();
        let (_, rows) = changes.keys.iter().find(|(key, _)| key == "k").expect("k");
        let rows = rows.as_ref().expect("k is held");
        assert!(rows.meta && rows.grants.len() == 1 && rows.answers.len() == 1);
        assert!(changes.cluster, "defaults and clock are written");
    }

    #[test]
    fn restores_only_into_a_key_less_cluster() {
        let backup = backup_of(&saved());
        let mut used = saved();
        assert_eq!(
            used.restore(&backup),
            Err(RestoreError::NotEmpty { keys: 1 })
        );
    }

    #[test]
    fn a_broken_row_is_refused_before_anything_changes() {
        let mut text = serde_json::to_value(saved()).expect("serialises");
        let grants = text["keys"]["k"]["grants"].as_object_mut().expect("grants");
        let grant = grants.values_mut().next().expect("one grant");
        grant["released"] = 3.into(); // above claimed (0)
        let broken: Backup = serde_json::from_value(text).expect("still parses");
        let mut fresh = Semaphores::new(KeyConfig::default()).expect("defaults");
        let before = fresh.clone();
        assert!(matches!(
            fresh.restore(&broken),
            Err(RestoreError::BrokenRow { .. })
        ));
        assert_eq!(fresh, before);
    }
}
