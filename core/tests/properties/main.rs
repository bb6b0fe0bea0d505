//! Property tests of the round engine.
//!
//! Each case builds a small world: two keys, three groups, four clients (some of
//! which support leases), one lease policy, and a sequence of up to 30 log entries
//! (rounds, syncs, reclaim passes, settings changes, operators' force releases)
//! interleaved with client-local work (claiming, releasing, drawing from leases, retiring them). The clients are
//! modelled: each keeps, per key, the grants and leases it was told about and the
//! cumulative counts it reports, as a queue does. On top of that honest
//! behaviour the generators add what a network does to reports: duplicates (the
//! same request twice in one round), stale reports replayed from a client's
//! history, reports of unknown ids and of other clients' ids, requestId retries and
//! lost replies (only for clients without lease support: a lost lease reply strands
//! its footprint by design).
//!
//! Time comes from the entries: mostly forward, sometimes past every claim deadline
//! or lease TTL, sometimes backwards (the state keeps the max). Log indexes grow
//! strictly, as Raft's do.
//!
//! Any panic inside the engine (u64 underflow included) fails a case like a broken
//! assertion does.
//!
//! Layout: the properties are below; [`world`] holds the generated world and its
//! operations, [`strategies`] the proptest generators, [`model`] the client model,
//! [`harness`] what applies an operation to the engine and the model, and
//! [`checks`] the observations the properties assert. The shared imports and
//! constants live here; every module takes them with `use super::*`.

mod checks;
mod harness;
mod model;
mod strategies;
mod world;

use std::collections::{BTreeMap, BTreeSet};

use checks::*;
use harness::*;
use model::*;
use permitd_core::config::{Amount, LimitedGroups};
use permitd_core::contract::protocol::{
    Demand, GrantReport, GrantResult, GrantStatus, GrantedPermits, LeaseGrant, LeaseReport,
    PermitRequest, PermitSync, SemaphoreRequest, V1,
};
use permitd_core::contract::validate::validate_request;
use permitd_core::engine::delete_key::{DeleteKey, KeyDeleted, KeyInUse};
use permitd_core::engine::force_release::ForceReleased;
use permitd_core::engine::permit_sync::SyncOutcome;
use permitd_core::engine::round::RoundOutcome;
use permitd_core::engine::state::KeyState;
use permitd_core::engine::usage::UsageCounts;
use permitd_core::{
    Event, GroupConfig, IdAllocator, InvalidInput, KeyConfig, KeyConfigUpdate, LeasePolicy,
    Provisioning, Semaphores,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use strategies::*;
use world::*;

/// 2025-11-30T00:00:00Z: the first entry's clock.
const T0: u64 = 1_764_460_800_000;
const KEYS: [&str; 2] = ["acct-a", "acct-b"];
const GROUPS: [&str; 3] = ["wf-1", "wf-2", "wf-3"];
const CLIENTS: [&str; 4] = ["runner-0", "runner-1", "runner-2", "runner-3"];
/// Longest operation sequence: keeps 1000 cases of every property in a few seconds.
const MAX_OPS: usize = 30;
/// Longest lease TTL the generators pick.
const MAX_TTL_MS: u64 = 20_000;

/// Honours `PROPTEST_CASES` (CI sets 1000). Persistence is off: a failure prints
/// its minimal case, which belongs in a named regression test, not a side file.
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// With `strict`, `under` or no leases, outstanding grants plus live lease
    /// footprint never exceed the limit; a lowered limit evicts nothing, and while
    /// usage is above it no step increases it. Group caps hold the same way.
    #[test]
    fn grants_plus_lease_footprint_never_exceed_the_limit_with_strict_under_or_no_leases(
        (setup, ops) in scenario(Modes::NoneStrictOrUnder)
    ) {
        run_never_over(&setup, &ops)?;
    }

    /// With `over`, the ceiling is `limit + extra`, with the same rule for a
    /// lowered limit.
    #[test]
    fn grants_plus_lease_footprint_never_exceed_limit_plus_extra_with_over_leases(
        (setup, ops) in scenario(Modes::Over)
    ) {
        run_never_over(&setup, &ops)?;
    }

    /// Two replicas applying the same entries agree byte for byte, after every
    /// entry and in every answer, also when one restarts from a snapshot.
    #[test]
    fn replaying_the_same_entries_gives_byte_identical_state_and_answers(
        (setup, ops) in scenario(Modes::Any),
        restore in any::<Index>(),
    ) {
        let (outcomes, images) = run_recorded(&setup, &ops, None);
        let (replayed, replayed_images) = run_recorded(&setup, &ops, None);
        let restore_before = restore.index(ops.len());
        let (restored, restored_images) = run_recorded(&setup, &ops, Some(restore_before));
        for step in 0..ops.len() {
            prop_assert_eq!(&outcomes[step], &replayed[step], "answers differ at step {}", step);
            prop_assert!(
                images[step] == replayed_images[step],
                "state bytes differ after step {}",
                step
            );
            prop_assert_eq!(
                &outcomes[step],
                &restored[step],
                "answers differ at step {} after a snapshot restore before step {}",
                step,
                restore_before
            );
            prop_assert!(
                images[step] == restored_images[step],
                "state bytes differ after step {} with a snapshot restore before step {}",
                step,
                restore_before
            );
        }
    }

    /// Reports are cumulative: a sync applied twice equals one, and a stale
    /// report after a newer one changes nothing. Checked at every sync entry and,
    /// at the end, for every client and key.
    #[test]
    fn a_report_applied_twice_or_after_a_newer_one_changes_nothing(
        (setup, ops) in scenario(Modes::Any)
    ) {
        let mut harness = Harness::new(&setup);
        for (step, op) in ops.iter().enumerate() {
            if let Op::Sync { key, when, client, reports, stale } = op {
                let (now_ms, sync) = harness.prepare_sync(*key, *when, *client, reports);
                let holdings = &harness.clients[*client][*key];
                let newer = harness.sync_message(*client, holdings.current());
                let stale = pick(stale, holdings.sent.len())
                    .map(|i| harness.sync_message(*client, holdings.sent[i].clone()));
                check_report_idempotence(
                    &harness, *key, now_ms, &sync, &newer, stale.as_ref(), step,
                )?;
                harness.apply_sync(*key, now_ms, *client, &sync);
            } else {
                harness.step(op);
            }
            check_usage(&harness.sem, step)?;
        }
        let now_ms = harness.clock();
        for client in 0..CLIENTS.len() {
            for key in 0..KEYS.len() {
                let holdings = &harness.clients[client][key];
                let newer = harness.sync_message(client, holdings.current());
                let oldest = holdings
                    .sent
                    .first()
                    .map(|reports| harness.sync_message(client, reports.clone()));
                check_report_idempotence(
                    &harness, key, now_ms, &newer, &newer, oldest.as_ref(), ops.len(),
                )?;
            }
        }
    }

    /// Usage never underflows, and once every client has finished, returned and
    /// reported everything and the claim deadlines have passed, nothing is held.
    #[test]
    fn usage_returns_to_zero_once_every_client_settles(
        (setup, ops) in scenario(Modes::Any)
    ) {
        let mut harness = Harness::new(&setup);
        for (step, op) in ops.iter().enumerate() {
            harness.step(op);
            check_usage(&harness.sem, step)?;
        }
        harness.settle();
        let now_ms = harness.clock();
        for key in KEYS {
            let usage = harness.sem.usage(key, now_ms);
            let state = harness.sem.key(key);
            prop_assert!(
                usage.granted == 0 && usage.leased == 0,
                "{} still holds {} granted and {} leased after everything settled: {:?}",
                key,
                usage.granted,
                usage.leased,
                state
            );
            prop_assert!(
                state.is_none_or(|state| state.grants().is_empty() && state.leases().is_empty()),
                "{} still keeps grants or leases after everything settled: {:?}",
                key,
                state
            );
        }
    }

    /// The derived totals and indexes always equal a full recount.
    #[test]
    fn derived_tally_always_equals_a_recount(
        (setup, ops) in scenario(Modes::Any)
    ) {
        let mut harness = Harness::new(&setup);
        for (step, op) in ops.iter().enumerate() {
            harness.step(op);
            for (key, state) in harness.sem.keys() {
                prop_assert_eq!(
                    state.tally(),
                    &state.recount(),
                    "step {}: the tally of {} drifted from a recount\nop: {:?}",
                    step,
                    key,
                    op
                );
            }
        }
    }

    /// A force release drops exactly one client's grants and leases on one key,
    /// returns exactly their footprint, keeps the tally exact and leaves every
    /// other client's rows as they were; the key stays within its ceiling.
    #[test]
    fn a_force_release_frees_exactly_that_clients_footprint(
        (setup, ops) in scenario(Modes::Any),
        key in 0..KEYS.len(),
        client in 0..CLIENTS.len(),
    ) {
        let mut harness = Harness::new(&setup);
        for op in &ops {
            harness.step(op);
        }
        let (key, client) = (KEYS[key], CLIENTS[client]);
        let before = harness.sem.key(key).cloned();
        let held = Exposure::of_client(before.as_ref(), client);
        let others_before = Exposure::of(before.as_ref()).total() - held.total();
        let now_ms = harness.clock();
        let (released, events) = harness.sem.force_release(key, client, now_ms);
        prop_assert_eq!(released.permits, held.total());
        prop_assert_eq!(events.len(), usize::from(released != ForceReleased::default()));
        let after = harness.sem.key(key);
        prop_assert_eq!(Exposure::of_client(after, client).total(), 0);
        prop_assert_eq!(Exposure::of(after).total(), others_before);
        prop_assert!(Exposure::of(after).total() <= ceiling(harness.sem.config(key))
            .max(Exposure::of(before.as_ref()).total()));
        if let (Some(before), Some(after)) = (before.as_ref(), after) {
            prop_assert_eq!(after.tally(), &after.recount());
            let others = |state: &KeyState| {
                let grants: Vec<_> = state.grants().iter()
                    .filter(|(_, grant)| grant.client_id != client).collect();
                let leases: Vec<_> = state.leases().iter()
                    .filter(|(_, lease)| lease.client_id != client).collect();
                format!("{grants:?} {leases:?}")
            };
            prop_assert_eq!(others(before), others(after));
            prop_assert!(!after.answers().contains_key(client));
        }
    }

}

/// Ids of the rows (grants or leases) another client than `client` holds.
fn foreign_ids<K: ToString + Ord, V>(
    rows: &permitd_core::engine::small_map::SmallMap<K, V>,
    owner: impl Fn(&V) -> &String,
    client: &str,
) -> Vec<String> {
    rows.iter()
        .filter(|(_, row)| owner(row) != client)
        .map(|(id, _)| id.to_string())
        .collect()
}
