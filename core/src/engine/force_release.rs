//! An operator's force release: drop one client's whole footprint on one key.
//!
//! For a runner that died for good: its grants and leases would otherwise hold
//! their permits until the claim deadline (unclaimed grants), the lease TTL (leases
//! stop being drawn but keep their footprint until settled) or forever (claimed
//! grants are only freed by their holder's reports). Applied like any entry:
//! time comes from the entry, the order is the state's key order, so every replica
//! frees the same rows.
//!
//! What goes, for that (key, clientId):
//! - every grant and every lease, whatever their claims and draws;
//! - every remembered answer, so a retried `requestId` of the released client is
//!   served as a new request instead of naming grants that no longer exist.
//!
//! A client that was not dead after all finds its grants and leases unknown at its
//! next report; reports of unknown ids free nothing, so no permit is freed twice.
//! The release only lowers the footprint: the budget invariant (grants plus lease
//! footprint within the ceiling) holds after it if it held before.

use serde::{Deserialize, Serialize};

use crate::engine::lifecycle::Event;
use crate::engine::semaphores::Semaphores;
use crate::engine::state::KeyState;

/// What a force release dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForceReleased {
    pub grants: u64,
    pub leases: u64,
    /// Outstanding grant permits plus lease footprint returned to the key.
    pub permits: u64,
}

impl Semaphores {
    /// Drops `client_id`'s grants, leases and remembered answers on `key` at the
    /// entry's `now_ms`. Emits one `client_released` event when anything went.
    pub fn force_release(
        &mut self,
        key: &str,
        client_id: &str,
        now_ms: u64,
    ) -> (ForceReleased, Vec<Event>) {
        if self.key(key).is_none() {
            // Nothing held: do not create (and mark dirty) an empty key.
            return (ForceReleased::default(), Vec::new());
        }
        let timestamp_ms = self.advance_clock(now_ms);
        let released = self.with_key(key, |state, _| release_client(state, client_id));
        let events = released_event(timestamp_ms, client_id, released)
            .into_iter()
            .collect();
        (released, events)
    }
}

/// The `client_released` event of a release, if it released anything.
pub(crate) fn released_event(
    timestamp_ms: u64,
    client_id: &str,
    released: ForceReleased,
) -> Option<Event> {
    (released != ForceReleased::default()).then(|| Event::ClientReleased {
        timestamp_ms,
        client_id: client_id.to_owned(),
        grants: released.grants,
        leases: released.leases,
        permits: released.permits,
    })
}

/// Deletes the client's rows from one key's state through the tallying setters.
pub(crate) fn release_client(state: &mut KeyState, client_id: &str) -> ForceReleased {
    let mut released = ForceReleased::default();
    let grants: Vec<_> = state
        .grants()
        .iter()
        .filter(|(_, grant)| grant.client_id == client_id)
        .map(|(id, grant)| (*id, grant.outstanding()))
        .collect();
    for (id, outstanding) in grants {
        state.put_grant(id, None);
        released.grants += 1;
        released.permits += outstanding;
    }
    let leases: Vec<_> = state
        .leases()
        .iter()
        .filter(|(_, lease)| lease.client_id == client_id)
        .map(|(id, lease)| (*id, lease.footprint()))
        .collect();
    for (id, footprint) in leases {
        state.put_lease(id, None);
        released.leases += 1;
        released.permits += footprint;
    }
    let request_ids: Vec<String> = state
        .answers()
        .get(client_id)
        .map(|answers| answers.keys().cloned().collect())
        .unwrap_or_default();
    for request_id in request_ids {
        state.put_answer(client_id, &request_id, None);
    }
    released
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyConfig;
    use crate::contract::protocol::{Demand, PermitRequest, V1};
    use crate::IdAllocator;

    const T0: u64 = 1_764_460_800_000;

    fn request(client: &str, group: &str, count: u64) -> PermitRequest {
        PermitRequest {
            v: V1,
            client_id: client.into(),
            request_id: Some(format!("{client}-1")),
            demand: vec![Demand {
                group: group.into(),
                count,
                oldest_at_ms: T0,
            }],
            grants: Vec::new(),
            leases: None,
            wait_ms: None,
        }
    }

    fn state_with_two_clients() -> Semaphores {
        let mut sem = Semaphores::new(KeyConfig {
            limit: 10,
            ..KeyConfig::default()
        })
        .expect("valid defaults");
        let requests = [request("dead", "g", 4), request("alive", "g", 3)];
        sem.round("k", &mut IdAllocator::new(1), T0, &requests);
        sem
    }

    #[test]
    fn frees_only_that_clients_footprint_and_answers() {
        let mut sem = state_with_two_clients();
        assert_eq!(sem.usage("k", T0).granted, 7);
        let (released, events) = sem.force_release("k", "dead", T0 + 5);
        assert_eq!(
            released,
            ForceReleased {
                grants: 1,
                leases: 0,
                permits: 4
            }
        );
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].name(), "client_released");
        let state = sem.key("k").expect("alive still holds");
        assert!(state.grants().values().all(|g| g.client_id == "alive"));
        assert!(!state.answers().contains_key("dead"));
        assert!(state.answers().contains_key("alive"));
        assert_eq!(state.tally(), &state.recount());
        assert_eq!(sem.usage("k", T0 + 5).granted, 3);
        assert_eq!(sem.last_now_ms(), T0 + 5, "time comes from the entry");
    }

    #[test]
    fn releasing_nothing_changes_nothing() {
        let mut sem = state_with_two_clients();
        let before = sem.clone();
        let (released, events) = sem.force_release("k", "stranger", T0);
        assert_eq!(released, ForceReleased::default());
        assert!(events.is_empty());
        assert_eq!(sem.keys(), before.keys());
        let (released, _) = sem.force_release("unknown-key", "dead", T0);
        assert_eq!(released, ForceReleased::default());
        assert!(sem.key("unknown-key").is_none(), "no empty key is created");
    }

    #[test]
    fn releasing_the_last_holder_drops_the_key() {
        let mut sem = state_with_two_clients();
        sem.force_release("k", "dead", T0);
        sem.force_release("k", "alive", T0);
        assert!(sem.key("k").is_none(), "a key holding nothing is dropped");
        let changes = sem.take_changes();
        assert!(
            changes
                .keys
                .iter()
                .any(|(key, rows)| key == "k" && rows.is_none()),
            "storage is told to delete the key's rows: {changes:?}"
        );
    }
}
