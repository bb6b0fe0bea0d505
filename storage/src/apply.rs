//! Applying one entry's [`Command`] to the engine and noting the keys it changed.
//!
//! Apply is a pure function of (state, entry): time comes from the command's
//! `now_ms`, ids from [`IdAllocator::new`] on the entry's log index (one allocator
//! shared by every key of the entry, so ids never repeat within it).

use permitd_core::contract::validate::{
    name, validate_client_id, validate_group, validate_key, validate_permit_request, validate_sync,
};
use permitd_core::engine::delete_key::DeleteKey;
use permitd_core::limits::MAX_REQUEST_ID_BYTES;
use permitd_core::tokens::TokenRegistry;
use permitd_core::{Event, IdAllocator, InvalidInput, KeyLimitReached, Semaphores};

use crate::state_machine::Applied;
use crate::{Command, CommandResult, KeySync};

/// Runs engine calls for one entry and notes what each changed.
struct Applier<'a> {
    semaphores: &'a mut Semaphores,
    tokens: &'a mut TokenRegistry,
    applied: Applied,
}

impl Applier<'_> {
    /// Notes the keys the last engine call changed (and empties the engine's
    /// change record, which would otherwise grow with every call).
    fn note_changes(&mut self) {
        let changes = self.semaphores.take_changes();
        for (key, _) in &changes.keys {
            if !self.applied.keys.contains(key) {
                self.applied.keys.push(key.clone());
            }
        }
    }

    fn push_events(&mut self, key: &str, events: Vec<Event>) {
        let events = events.into_iter().map(|event| (key.to_owned(), event));
        self.applied.events.extend(events);
    }
}

/// Applies `command` (the entry at `log_index`). Returns the answer for the
/// leader and what the node is told about the apply.
pub(crate) fn apply_command(
    semaphores: &mut Semaphores,
    tokens: &mut TokenRegistry,
    log_index: u64,
    command: &Command,
) -> (CommandResult, Applied) {
    let mut applier = Applier {
        semaphores,
        tokens,
        applied: Applied {
            log_index,
            keys: Vec::new(),
            events: Vec::new(),
            installed_snapshot: false,
        },
    };
    let result = match check(command) {
        Err(error) => CommandResult::from(error),
        Ok(()) => match check_room(applier.semaphores, command) {
            Err(error) => CommandResult::from(error),
            Ok(()) => run(&mut applier, log_index, command),
        },
    };
    (result, applier.applied)
}

/// The leader validates at the edge; apply checks again, because the engine
/// assumes valid input (it may panic on, say, a group demanded twice) and one bad
/// entry must not stop every replica. Every replica rejects alike. Checked by
/// reference: no copy of the entry's requests.
fn check(command: &Command) -> Result<(), InvalidInput> {
    match command {
        Command::Round { keys, syncs, .. } => {
            syncs.iter().try_for_each(|sync| {
                validate_key(&sync.key)?;
                validate_sync(&sync.sync)
            })?;
            keys.iter().try_for_each(|round| {
                validate_key(&round.key)?;
                round.requests.iter().try_for_each(validate_permit_request)
            })
        }
        Command::Sync { key, sync, .. } => {
            validate_key(key)?;
            validate_sync(sync)
        }
        Command::Reclaim { keys, .. } => keys.iter().try_for_each(|key| validate_key(key)),
        Command::SetKeyConfig { key, .. } | Command::RemoveKey { key } => validate_key(key),
        Command::SetGroup { key, group, .. } | Command::RemoveGroup { key, group } => {
            validate_key(key)?;
            validate_group(group)
        }
        Command::SetDefaults { .. } => Ok(()),
        Command::ForceRelease { key, client_id, .. } => {
            validate_key(key)?;
            validate_client_id(client_id)
        }
        Command::DeleteKey {
            key, request_id, ..
        } => {
            validate_key(key)?;
            request_id
                .as_deref()
                .map_or(Ok(()), |id| name("requestId", id, MAX_REQUEST_ID_BYTES))
        }
        // Checked row by row inside `Semaphores::restore`.
        Command::Restore { .. } => Ok(()),
        // The registry validates token commands itself (see `token_state`).
        Command::CreateToken { .. } | Command::RevokeToken { .. } => Ok(()),
    }
}

/// The key limit, enforced here and not only before proposing: two entries
/// proposed while the cluster sat just below the limit must not both create keys.
/// A round entry is refused whole (its callers get `too_many_keys` and retry), since
/// its answer has no place for one key's refusal; the leader's own check before
/// proposing makes that a race at the limit, not a habit. Commands that never
/// create a key (reclaim, removals, force release, deletes, tokens) always pass.
fn check_room(semaphores: &Semaphores, command: &Command) -> Result<(), KeyLimitReached> {
    match command {
        Command::Round { keys, syncs, .. } => semaphores.room_for(
            keys.iter()
                .map(|round| round.key.as_str())
                .chain(syncs.iter().map(|sync| sync.key.as_str())),
        ),
        Command::Sync { key, .. }
        | Command::SetKeyConfig { key, .. }
        | Command::SetGroup { key, .. } => semaphores.room_for([key.as_str()]),
        // Restore checks its own key count (`Backup::check`, into an empty state);
        // force release acts only on a key held already.
        Command::Reclaim { .. }
        | Command::RemoveGroup { .. }
        | Command::RemoveKey { .. }
        | Command::SetDefaults { .. }
        | Command::ForceRelease { .. }
        | Command::DeleteKey { .. }
        | Command::Restore { .. }
        | Command::CreateToken { .. }
        | Command::RevokeToken { .. } => Ok(()),
    }
}

/// The one match over the command enum.
fn run(applier: &mut Applier<'_>, log_index: u64, command: &Command) -> CommandResult {
    let result = match command {
        Command::Round {
            now_ms,
            syncs,
            keys,
        } => {
            let mut synced = Vec::with_capacity(syncs.len());
            for KeySync { key, sync } in syncs {
                let outcome = applier.semaphores.sync(key, *now_ms, sync);
                applier.note_changes();
                applier.push_events(key, outcome.events);
                synced.push(outcome.answer);
            }
            let mut ids = IdAllocator::new(log_index);
            let mut answers = Vec::with_capacity(keys.len());
            for round in keys {
                let outcome =
                    applier
                        .semaphores
                        .round(&round.key, &mut ids, *now_ms, &round.requests);
                applier.note_changes();
                applier.push_events(&round.key, outcome.events);
                answers.push(outcome.answers);
            }
            CommandResult::Round { answers, synced }
        }
        Command::Sync { now_ms, key, sync } => {
            let outcome = applier.semaphores.sync(key, *now_ms, sync);
            applier.push_events(key, outcome.events);
            CommandResult::Synced {
                answer: outcome.answer,
            }
        }
        Command::Reclaim { now_ms, keys } => {
            for key in keys {
                let events = applier.semaphores.reclaim(key, *now_ms);
                applier.note_changes();
                applier.push_events(key, events);
            }
            CommandResult::Done
        }
        Command::SetKeyConfig { key, update } => {
            match applier.semaphores.set_key_config(key, update) {
                Ok(config) => CommandResult::KeyConfig { config },
                Err(error) => error.into(),
            }
        }
        Command::SetGroup { key, group, config } => {
            match applier.semaphores.set_group(key, group, config.clone()) {
                Ok(()) => CommandResult::Done,
                Err(error) => error.into(),
            }
        }
        Command::RemoveGroup { key, group } => {
            applier.semaphores.remove_group(key, group);
            CommandResult::Done
        }
        Command::SetDefaults { defaults } => {
            match applier.semaphores.set_defaults(defaults.clone()) {
                Ok(()) => CommandResult::Done,
                Err(error) => error.into(),
            }
        }
        Command::RemoveKey { key } => {
            applier.semaphores.remove_key(key);
            CommandResult::Done
        }
        Command::CreateToken { .. } | Command::RevokeToken { .. } => {
            crate::token_state::apply(applier.tokens, log_index, command)
        }
        Command::ForceRelease {
            now_ms,
            key,
            client_id,
        } => {
            let (released, events) = applier.semaphores.force_release(key, client_id, *now_ms);
            applier.push_events(key, events);
            CommandResult::Released { released }
        }
        Command::DeleteKey {
            now_ms,
            key,
            force,
            request_id,
        } => {
            let delete = DeleteKey {
                key,
                force: *force,
                request_id: request_id.as_deref(),
                now_ms: *now_ms,
                log_index,
            };
            match applier.semaphores.delete_key(delete) {
                Ok((deleted, events)) => {
                    applier.push_events(key, events);
                    CommandResult::KeyDeleted { deleted }
                }
                Err(in_use) => CommandResult::KeyInUse { in_use },
            }
        }
        Command::Restore { backup } => match applier.semaphores.restore(backup) {
            Ok(()) => CommandResult::Restored {
                keys: backup.keys.len() as u64,
            },
            Err(error) => CommandResult::RestoreRefused {
                reason: error.to_string(),
            },
        },
    };
    // Single-call commands (and a rejected one, which changed nothing) land here.
    applier.note_changes();
    result
}

#[cfg(test)]
mod tests {
    use permitd_core::config::GroupConfig;
    use permitd_core::contract::protocol::{Demand, PermitRequest, V1};

    use super::*;
    use crate::KeyRound;

    /// Applies `command` as entry `log_index`.
    fn apply(semaphores: &mut Semaphores, log_index: u64, command: Command) -> CommandResult {
        let mut tokens = TokenRegistry::default();
        apply_command(semaphores, &mut tokens, log_index, &command).0
    }

    fn set_group(key: &str) -> Command {
        Command::SetGroup {
            key: key.into(),
            group: "g".into(),
            config: GroupConfig {
                limit: Some(1),
                permitted: true,
            },
        }
    }

    fn round(keys: &[&str]) -> Command {
        let request = PermitRequest {
            v: V1,
            client_id: "c".into(),
            request_id: None,
            demand: vec![Demand {
                group: "g".into(),
                count: 1,
                oldest_at_ms: 0,
            }],
            grants: vec![],
            leases: None,
            wait_ms: None,
        };
        Command::Round {
            now_ms: 1_000,
            keys: keys
                .iter()
                .map(|key| KeyRound {
                    key: (*key).into(),
                    requests: vec![request.clone()],
                })
                .collect(),
            syncs: vec![],
        }
    }

    #[test]
    fn apply_refuses_keys_past_the_limit_and_changes_nothing() {
        let mut semaphores = Semaphores::default().with_max_keys(2);
        assert_eq!(
            apply(&mut semaphores, 1, set_group("a")),
            CommandResult::Done
        );
        let before = semaphores.clone();
        let refused = CommandResult::KeyLimit { max: 2 };
        assert_eq!(apply(&mut semaphores, 2, round(&["a", "b", "c"])), refused);
        assert_eq!(semaphores, before, "a refused round entry changes nothing");
        assert!(matches!(
            apply(&mut semaphores, 3, round(&["a", "b", "b"])),
            CommandResult::Round { .. }
        ));
        assert_eq!(semaphores.keys().len(), 2);
        assert_eq!(apply(&mut semaphores, 4, set_group("c")), refused);
        assert_eq!(
            apply(&mut semaphores, 5, set_group("a")),
            CommandResult::Done,
            "keys held already always fit"
        );
        let remove = Command::RemoveGroup {
            key: "c".into(),
            group: "g".into(),
        };
        assert_eq!(apply(&mut semaphores, 6, remove), CommandResult::Done);
        assert_eq!(
            semaphores.keys().len(),
            2,
            "removing from a new key creates none"
        );
    }
    fn delete(force: bool, request_id: Option<&str>) -> Command {
        Command::DeleteKey {
            now_ms: 2_000,
            key: "a".into(),
            force,
            request_id: request_id.map(str::to_owned),
        }
    }

    #[test]
    fn a_delete_is_refused_while_held_forced_with_events_and_replayed_alike() {
        let mut semaphores = Semaphores::default();
        let mut tokens = TokenRegistry::default();
        apply_command(&mut semaphores, &mut tokens, 1, &round(&["a"]));
        let before = semaphores.clone();
        let (refused, applied) =
            apply_command(&mut semaphores, &mut tokens, 2, &delete(false, Some("r")));
        assert!(
            matches!(refused, CommandResult::KeyInUse { .. }),
            "{refused:?}"
        );
        assert_eq!(
            semaphores.keys(),
            before.keys(),
            "a refusal changes nothing"
        );
        assert!(applied.events.is_empty());
        let forced = delete(true, Some("r"));
        let (first, applied) = apply_command(&mut semaphores, &mut tokens, 3, &forced);
        let names: Vec<_> = applied
            .events
            .iter()
            .map(|(key, e)| (key.as_str(), e.name()))
            .collect();
        assert_eq!(names, [("a", "client_released"), ("a", "key_deleted")]);
        assert_eq!(applied.keys, ["a"], "the key's rows are noted");
        assert!(semaphores.keys().is_empty());
        let (replayed, applied) = apply_command(&mut semaphores, &mut tokens, 4, &forced);
        assert_eq!(replayed, first, "the replay answers as the first time");
        assert!(applied.events.is_empty());
        let deleted = first.into_key_deleted().expect("deleted");
        assert_eq!((deleted.log_index, deleted.released.grants), (3, 1));
    }
}
