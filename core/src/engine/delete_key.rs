//! An operator's delete of a key: its settings, groups, grants, leases and
//! remembered answers go, in one entry (`DELETE /v1/semaphores/{key}`).
//!
//! A key exists in permitd without being created: an unknown key runs with the
//! cluster defaults, and a key that holds nothing is dropped by itself. What an
//! operator could not drop was a key's own settings (`PUT …/config`, groups).
//! A delete drops them, so the key afterwards is exactly an unknown key: it
//! follows the defaults, holds nothing and is not listed.
//!
//! The rules, applied like any entry (time and ids from the entry, holders in
//! the state's order, so every replica does the same):
//! - a key with grants or leases is *in use*: without `force` the delete is
//!   refused ([`KeyInUse`]) and changes nothing; with `force` every holder is
//!   released as a force release does ([`crate::engine::force_release`]), one
//!   `client_released` event per client, then the key goes;
//! - a key that holds nothing is deleted (`existed: true`), or, already
//!   unknown, the delete changes nothing and answers `existed: false`: a
//!   delete is idempotent, and a retry after a lost answer succeeds;
//! - a delete that changed something emits `key_deleted`;
//! - with a `requestId`, the answer of an applied delete is remembered per
//!   (key, requestId) for [`DELETE_ANSWER_TTL_MS`], at most
//!   [`MAX_REMEMBERED_DELETES`] of them (the one due first is forgotten
//!   first): a replay gets that answer again, byte for byte, and changes
//!   nothing, even if the key was used again meanwhile. A refusal is not
//!   remembered (it changed nothing): asked again, it is decided again.
//!
//! Demand waiting on the leader for the key's round is not replicated state:
//! the leader refuses a delete without `force` while requests wait there, and
//! entries order everything else (docs/protocol.md, "Deleting a key").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::force_release::{release_client, released_event, ForceReleased};
use crate::engine::lifecycle::Event;
use crate::engine::semaphores::Semaphores;
use crate::limits::{DELETE_ANSWER_TTL_MS, MAX_REMEMBERED_DELETES};

/// What `DELETE /v1/semaphores/{key}` did; a replay by `requestId` gets it again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyDeleted {
    /// The key held settings or state, now gone. `false`: nothing was kept for
    /// it (never configured, or deleted before), and nothing changed.
    pub existed: bool,
    /// What a forced delete released, all clients together; zeros otherwise.
    pub released: ForceReleased,
    /// Clients whose grants or leases were released.
    pub clients: u64,
    /// The log index of the entry that deleted the key.
    pub log_index: u64,
}

/// Why a delete without `force` was refused: the key is in use. Nothing changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "camelCase")]
#[error(
    "the key is in use: {grants} grants, {leases} leases, {waiting} requests waiting for a round; \
     delete with force=true to release them"
)]
pub struct KeyInUse {
    pub grants: u64,
    pub leases: u64,
    /// Requests waiting on the leader (known there only; 0 when apply refused).
    pub waiting: u64,
}

/// A delete's answer, kept for its `requestId`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RememberedDelete {
    pub answer: KeyDeleted,
    /// Forgotten once an entry's `now` reaches this.
    pub forget_at_ms: u64,
}

/// Remembered deletes: key, then requestId.
pub type RememberedDeletes = BTreeMap<String, BTreeMap<String, RememberedDelete>>;

/// One delete, as its entry carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteKey<'a> {
    pub key: &'a str,
    pub force: bool,
    pub request_id: Option<&'a str>,
    /// The leader's clock when it proposed the delete.
    pub now_ms: u64,
    /// The entry's log index.
    pub log_index: u64,
}

impl Semaphores {
    /// Applies one delete (see the module rules): the answer and its events, or
    /// the refusal of a key in use.
    /// A replay and a refusal change nothing, not even the clock.
    pub fn delete_key(
        &mut self,
        delete: DeleteKey<'_>,
    ) -> Result<(KeyDeleted, Vec<Event>), KeyInUse> {
        let now_ms = delete.now_ms.max(self.last_now_ms());
        if let Some(answer) = self.remembered_delete(delete.key, delete.request_id, now_ms) {
            return Ok((answer, Vec::new()));
        }
        let in_use = self.in_use(delete.key);
        if !delete.force && in_use != KeyInUse::default() {
            return Err(in_use);
        }
        let now_ms = self.advance_clock(delete.now_ms);
        self.forget_deletes(now_ms);
        let (answer, events) = self.drop_key(delete.key, now_ms, delete.log_index);
        if let Some(request_id) = delete.request_id {
            self.remember_delete(delete.key, request_id, answer, now_ms);
        }
        Ok((answer, events))
    }

    /// The grants and leases that keep `key` in use.
    pub fn in_use(&self, key: &str) -> KeyInUse {
        self.key(key)
            .map_or_else(KeyInUse::default, |state| KeyInUse {
                grants: state.grants().len() as u64,
                leases: state.leases().len() as u64,
                waiting: 0,
            })
    }

    /// Releases every holder of `key` (in client order), then drops the key.
    fn drop_key(&mut self, key: &str, now_ms: u64, log_index: u64) -> (KeyDeleted, Vec<Event>) {
        let mut answer = KeyDeleted {
            log_index,
            ..KeyDeleted::default()
        };
        let Some(state) = self.key(key) else {
            return (answer, Vec::new());
        };
        answer.existed = true;
        let clients: std::collections::BTreeSet<String> = state
            .grants()
            .values()
            .map(|grant| grant.client_id.clone())
            .chain(state.leases().values().map(|lease| lease.client_id.clone()))
            .collect();
        let mut events = Vec::with_capacity(clients.len() + 1);
        for client_id in clients {
            let released = self.with_key(key, |state, _| release_client(state, &client_id));
            answer.clients += 1;
            answer.released.grants += released.grants;
            answer.released.leases += released.leases;
            answer.released.permits += released.permits;
            events.extend(released_event(now_ms, &client_id, released));
        }
        self.remove_key(key);
        assert!(self.key(key).is_none(), "a deleted key keeps nothing");
        events.push(Event::KeyDeleted {
            timestamp_ms: now_ms,
            grants: answer.released.grants,
            leases: answer.released.leases,
            permits: answer.released.permits,
        });
        (answer, events)
    }

    /// The answer kept for `request_id`, unless its time is up at `now_ms`.
    fn remembered_delete(
        &self,
        key: &str,
        request_id: Option<&str>,
        now_ms: u64,
    ) -> Option<KeyDeleted> {
        let remembered = self.deletes().get(key)?.get(request_id?)?;
        (remembered.forget_at_ms > now_ms).then_some(remembered.answer)
    }

    /// Keeps `answer` for a replay of `request_id`, forgetting the delete due
    /// to be forgotten first beyond the bound.
    fn remember_delete(&mut self, key: &str, request_id: &str, answer: KeyDeleted, now_ms: u64) {
        let deletes = self.deletes_mut();
        let remembered = RememberedDelete {
            answer,
            forget_at_ms: now_ms.saturating_add(DELETE_ANSWER_TTL_MS),
        };
        deletes
            .entry(key.to_owned())
            .or_default()
            .insert(request_id.to_owned(), remembered);
        while deletes.values().map(BTreeMap::len).sum::<usize>() > MAX_REMEMBERED_DELETES {
            let first = deletes
                .iter()
                .flat_map(|(key, by_id)| {
                    by_id
                        .iter()
                        .map(move |(id, kept)| (kept.forget_at_ms, key.clone(), id.clone()))
                })
                .min()
                .expect("more than the bound: not empty");
            forget_one(deletes, &first.1, &first.2);
        }
    }

    /// Forgets the deletes whose time is up at `now_ms`.
    fn forget_deletes(&mut self, now_ms: u64) {
        let due: Vec<(String, String)> = self
            .deletes()
            .iter()
            .flat_map(|(key, by_id)| {
                by_id
                    .iter()
                    .filter(|(_, kept)| kept.forget_at_ms <= now_ms)
                    .map(move |(id, _)| (key.clone(), id.clone()))
            })
            .collect();
        if due.is_empty() {
            return;
        }
        let deletes = self.deletes_mut();
        for (key, request_id) in due {
            forget_one(deletes, &key, &request_id);
        }
    }
}

fn forget_one(deletes: &mut RememberedDeletes, key: &str, request_id: &str) {
    if let Some(by_id) = deletes.get_mut(key) {
        by_id.remove(request_id);
        if by_id.is_empty() {
            deletes.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GroupConfig, KeyConfig, KeyConfigUpdate};
    use crate::contract::protocol::{Demand, PermitRequest, V1};
    use crate::IdAllocator;

    const T0: u64 = 1_764_460_800_000;

    fn request(client: &str, count: u64) -> PermitRequest {
        PermitRequest {
            v: V1,
            client_id: client.into(),
            request_id: Some(format!("{client}-1")),
            demand: vec![Demand {
                group: "g".into(),
                count,
                oldest_at_ms: T0,
            }],
            grants: Vec::new(),
            leases: None,
            wait_ms: None,
        }
    }

    fn delete(
        key: &'static str,
        force: bool,
        request_id: Option<&'static str>,
        now_ms: u64,
    ) -> DeleteKey<'static> {
        DeleteKey {
            key,
            force,
            request_id,
            now_ms,
            log_index: 40,
        }
    }

    /// A configured key with a capped group, and two clients holding grants.
    fn configured_and_held() -> Semaphores {
        let mut sem = Semaphores::new(KeyConfig::default()).expect("valid defaults");
        let update = KeyConfigUpdate {
            limit: Some(50),
            ..KeyConfigUpdate::default()
        };
        sem.set_key_config("k", &update).expect("valid");
        let capped = GroupConfig {
            limit: Some(9),
            permitted: true,
        };
        sem.set_group("k", "g", capped).expect("valid");
        let requests = [request("a", 4), request("b", 3)];
        sem.round("k", &mut IdAllocator::new(1), T0, &requests);
        sem.take_changes();
        sem
    }

    #[test]
    fn a_key_in_use_is_refused_without_force_and_nothing_changes() {
        let mut sem = configured_and_held();
        let before = sem.clone();
        let refused = sem.delete_key(delete("k", false, Some("r1"), T0 + 1_000));
        assert_eq!(
            refused,
            Err(KeyInUse {
                grants: 2,
                leases: 0,
                waiting: 0
            })
        );
        assert_eq!(sem, before, "not even the clock moves");
        assert!(sem.deletes().is_empty(), "a refusal is not remembered");
    }

    #[test]
    fn force_releases_every_holder_and_the_key_follows_the_defaults_again() {
        let mut sem = configured_and_held();
        let (answer, events) = sem
            .delete_key(delete("k", true, None, T0 + 1))
            .expect("forced");
        assert_eq!(
            answer,
            KeyDeleted {
                existed: true,
                released: ForceReleased {
                    grants: 2,
                    leases: 0,
                    permits: 7
                },
                clients: 2,
                log_index: 40,
            }
        );
        let names: Vec<_> = events.iter().map(Event::name).collect();
        assert_eq!(names, ["client_released", "client_released", "key_deleted"]);
        assert!(sem.key("k").is_none());
        assert_eq!(sem.config("k"), sem.defaults());
        assert_eq!(sem.usage("k", T0 + 1).granted, 0);
        let changes = sem.take_changes();
        assert_eq!(changes.keys, vec![("k".to_owned(), None)], "every row goes");
    }

    #[test]
    fn an_idle_key_goes_and_an_unknown_one_answers_existed_false() {
        let mut sem = Semaphores::default();
        sem.set_group("k", "g", GroupConfig::default())
            .expect("valid");
        let (first, events) = sem.delete_key(delete("k", false, None, T0)).expect("idle");
        assert!(first.existed && first.clients == 0);
        assert_eq!(events.len(), 1, "key_deleted");
        let (again, events) = sem.delete_key(delete("k", false, None, T0)).expect("idle");
        assert!(!again.existed);
        assert!(events.is_empty());
        assert!(sem.keys().is_empty(), "deleting nothing creates nothing");
    }

    #[test]
    fn a_replay_by_request_id_gets_the_first_answer_until_it_is_forgotten() {
        let mut sem = configured_and_held();
        let (first, _) = sem
            .delete_key(delete("k", true, Some("r1"), T0))
            .expect("forced");
        // The key is used again; the replay must not delete it a second time.
        sem.round("k", &mut IdAllocator::new(50), T0 + 2, &[request("c", 1)]);
        let before = sem.clone();
        let (replayed, events) = sem
            .delete_key(delete("k", false, Some("r1"), T0 + 3))
            .expect("replayed");
        assert_eq!(replayed, first);
        assert!(events.is_empty());
        assert_eq!(sem, before, "a replay changes nothing");
        assert_eq!(
            sem.usage("k", T0 + 3).granted,
            1,
            "the replay changed nothing"
        );
        // Another key's delete with the same requestId is its own delete.
        let (other, _) = sem
            .delete_key(delete("other", false, Some("r1"), T0 + 3))
            .expect("idle");
        assert!(!other.existed);
        // Past its time the answer is forgotten and the delete decided again.
        let later = T0 + DELETE_ANSWER_TTL_MS;
        let refused = sem.delete_key(delete("k", false, Some("r1"), later));
        assert!(refused.is_err(), "c holds a grant now");
        let forced = sem.delete_key(delete("k", true, Some("r2"), later));
        assert_eq!(forced.map(|(answer, _)| answer.released.grants), Ok(1));
        assert!(
            !sem.deletes()["k"].contains_key("r1"),
            "forgotten once its time is up"
        );
    }

    #[test]
    fn remembered_deletes_stay_within_their_bound() {
        let mut sem = Semaphores::default();
        let ids: Vec<String> = (0..=MAX_REMEMBERED_DELETES)
            .map(|n| format!("r{n}"))
            .collect();
        for (offset, id) in ids.iter().enumerate() {
            let delete = DeleteKey {
                key: "k",
                force: false,
                request_id: Some(id),
                now_ms: T0 + offset as u64,
                log_index: 1,
            };
            sem.delete_key(delete).expect("idle");
        }
        let kept: usize = sem.deletes().values().map(BTreeMap::len).sum();
        assert_eq!(kept, MAX_REMEMBERED_DELETES);
        assert!(
            !sem.deletes()["k"].contains_key("r0"),
            "the oldest went first"
        );
    }
}
