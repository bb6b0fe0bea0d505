//! Structure-aware fuzzing of apply, on stable Rust (proptest).
//!
//! Every case starts from a state with live grants, leases and group settings
//! and a valid command of one kind (round, sync, key configuration, group,
//! force release, key delete), then breaks exactly one field with a hostile value: empty,
//! one byte over its limit, far over it, control characters, zero, one over a
//! maximum, `u64::MAX`, a ratio that is NaN, infinite or negative, a list one
//! entry too long, a group demanded twice. The command is applied as a log
//! entry would be ([`apply_command`]). Nothing may panic; a refused command
//! (`Rejected`, `KeyLimit`) leaves the state exactly as it was; and apply agrees
//! with the edge: what `validate` refuses, apply refuses too, and a message the
//! edge parser accepts from its JSON is never refused by apply.

use permitd_core::config::{Amount, GroupConfig, KeyConfigUpdate, LeasePolicy, Provisioning};
use permitd_core::contract::protocol::{
    Demand, GrantReport, LeaseReport, PermitRequest, PermitSync, SemaphoreRequest, V1,
};
use permitd_core::contract::validate::{parse_request, validate_permit_request, validate_sync};
use permitd_core::limits::*;
use permitd_core::tokens::TokenRegistry;
use permitd_core::Semaphores;
use proptest::prelude::*;

use crate::apply::apply_command;
use crate::{Command, CommandResult, KeyRound, KeySync};

const KEY: &str = "acct-1";
const CLIENT: &str = "runner-1";
const NOW_MS: u64 = 10_000;

/// A value that breaks one field: text for names and ids, a number for counts,
/// limits and delays, a ratio for provisioning.
#[derive(Debug, Clone)]
struct Hostile {
    text: String,
    number: u64,
    ratio: f64,
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let text = prop_oneof![
        Just(String::new()),
        Just("k".repeat(MAX_KEY_BYTES + 1)),
        Just("r".repeat(MAX_REPORTED_ID_BYTES + 1)),
        Just("x".repeat(MAX_BODY_BYTES / 64)),
        Just("a\u{7}b".to_owned()),
        Just("\u{85}".to_owned()),
        Just("\u{0}".to_owned()),
        "\\PC{0,12}",
        ".{0,12}",
    ];
    let number = prop_oneof![
        Just(0),
        Just(MAX_COUNT + 1),
        Just(MAX_LIMIT + 1),
        Just(MAX_DELAY_MS + 1),
        Just(MAX_TIMESTAMP_MS + 1),
        Just(u64::MAX),
        any::<u64>(),
    ];
    let ratio = prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-1.0),
        Just(MAX_PROVISIONING_RATIO * 2.0),
        any::<f64>(),
    ];
    (text, number, ratio).prop_map(|(text, number, ratio)| Hostile {
        text,
        number,
        ratio,
    })
}

/// Applies `command` as entry `log_index`.
fn apply(semaphores: &mut Semaphores, log_index: u64, command: &Command) -> CommandResult {
    let mut tokens = TokenRegistry::default();
    apply_command(semaphores, &mut tokens, log_index, command).0
}

fn request(
    demand: Vec<Demand>,
    grants: Vec<GrantReport>,
    leases: Vec<LeaseReport>,
) -> PermitRequest {
    PermitRequest {
        v: V1,
        client_id: CLIENT.into(),
        request_id: Some("r-1".into()),
        demand,
        grants,
        leases: Some(leases),
        wait_ms: None,
    }
}

fn demand(group: &str, count: u64) -> Demand {
    Demand {
        group: group.into(),
        count,
        oldest_at_ms: 1_000,
    }
}

fn lease_config() -> KeyConfigUpdate {
    let policy = LeasePolicy::with_provisioning(Provisioning::Under {
        reserve: Amount::Ratio { ratio: 0.5 },
    });
    KeyConfigUpdate {
        limit: Some(20),
        round_wait_ms: Some(5),
        round_period_ms: Some(10),
        grant_timeout_ms: Some(60_000),
        leases: Some(Some(policy)),
    }
}

/// A key with a lease policy, a capped group, and live grants and leases of
/// [`CLIENT`]; answers the state and the ids it holds.
fn populated() -> (Semaphores, String, String) {
    let mut semaphores = Semaphores::default();
    let setup = [
        Command::SetKeyConfig {
            key: KEY.into(),
            update: lease_config(),
        },
        Command::SetGroup {
            key: KEY.into(),
            group: "capped".into(),
            config: GroupConfig {
                limit: Some(3),
                permitted: true,
            },
        },
    ];
    for (index, command) in setup.iter().enumerate() {
        apply(&mut semaphores, index as u64 + 1, command);
    }
    let round = Command::Round {
        now_ms: NOW_MS,
        syncs: vec![],
        keys: vec![KeyRound {
            key: KEY.into(),
            requests: vec![request(
                vec![demand("g", 4), demand("capped", 2)],
                vec![],
                vec![],
            )],
        }],
    };
    let CommandResult::Round { answers, .. } = apply(&mut semaphores, 3, &round) else {
        panic!("the setup round runs");
    };
    let answer = &answers[0][0];
    let grant_id = answer
        .grants
        .first()
        .map(|grant| grant.grant_id.to_string());
    let lease_id = answer
        .leases
        .iter()
        .flatten()
        .next()
        .map(|lease| lease.lease_id.clone());
    let unknown = "00000000-0000-8000-8000-000000000000".to_owned();
    (
        semaphores,
        grant_id.unwrap_or_else(|| unknown.clone()),
        lease_id.unwrap_or(unknown),
    )
}

/// The fields a mutation may break, per command kind.
const REQUEST_FIELDS: usize = 16;
const SYNC_FIELDS: usize = 8;
const CONFIG_FIELDS: usize = 11;
const GROUP_FIELDS: usize = 3;
const RELEASE_FIELDS: usize = 2;
/// `key`, `requestId`.
const DELETE_FIELDS: usize = 2;

/// Reports on the held grant and lease: one more claim, one release.
fn reports(grant_id: &str, lease_id: &str) -> (Vec<GrantReport>, Vec<LeaseReport>) {
    let grant = GrantReport {
        grant_id: grant_id.into(),
        claimed: 2,
        released: 1,
    };
    let lease = LeaseReport {
        lease_id: lease_id.into(),
        drawn: 1,
        released: 0,
        retired: false,
    };
    (vec![grant], vec![lease])
}

/// A valid `request` on [`KEY`] reporting on the held grant and lease, with
/// field `field` broken by `bad`.
fn broken_request(
    grant_id: &str,
    lease_id: &str,
    field: usize,
    bad: &Hostile,
) -> (String, PermitRequest) {
    let mut key = KEY.to_owned();
    let (grants, leases) = reports(grant_id, lease_id);
    let mut message = request(vec![demand("g", 2)], grants, leases);
    let too_many = |max: usize| max + 1;
    match field % REQUEST_FIELDS {
        0 => key = bad.text.clone(),
        1 => message.client_id = bad.text.clone(),
        2 => message.request_id = Some(bad.text.clone()),
        3 => message.demand[0].group = bad.text.clone(),
        4 => message.demand[0].count = bad.number,
        5 => message.demand[0].oldest_at_ms = bad.number,
        6 => message.demand.push(demand("g", 1)),
        7 => {
            let groups = (0..too_many(MAX_DEMAND_ENTRIES)).map(|n| demand(&format!("g{n}"), 1));
            message.demand = groups.collect();
        }
        8 => message.grants[0].grant_id = bad.text.clone(),
        9 => message.grants[0].claimed = bad.number,
        10 => message.grants[0].released = bad.number,
        11 => message.grants = vec![message.grants[0].clone(); too_many(MAX_GRANT_REPORTS)],
        12 => message.leases.as_mut().expect("leases")[0].lease_id = bad.text.clone(),
        13 => message.leases.as_mut().expect("leases")[0].drawn = bad.number,
        14 => message.leases.as_mut().expect("leases")[0].released = bad.number,
        _ => {
            let lease = message.leases.as_ref().expect("leases")[0].clone();
            message.leases = Some(vec![lease; too_many(MAX_LEASE_REPORTS)]);
        }
    }
    (key, message)
}

/// A valid `sync` of the held grant and lease with field `field` broken.
fn broken_sync(
    grant_id: &str,
    lease_id: &str,
    field: usize,
    bad: &Hostile,
) -> (String, PermitSync) {
    let mut key = KEY.to_owned();
    let (grants, leases) = reports(grant_id, lease_id);
    let mut sync = PermitSync {
        v: V1,
        client_id: CLIENT.into(),
        grants,
        leases: Some(leases),
    };
    match field % SYNC_FIELDS {
        0 => key = bad.text.clone(),
        1 => sync.client_id = bad.text.clone(),
        2 => sync.grants[0].grant_id = bad.text.clone(),
        3 => sync.grants[0].claimed = bad.number,
        4 => sync.grants[0].released = bad.number,
        5 => sync.leases.as_mut().expect("leases")[0].lease_id = bad.text.clone(),
        6 => sync.leases.as_mut().expect("leases")[0].drawn = bad.number,
        _ => sync.grants = vec![sync.grants[0].clone(); MAX_GRANT_REPORTS + 1],
    }
    (key, sync)
}

/// The lease policy of an update made by [`lease_config`].
fn policy(update: &mut KeyConfigUpdate) -> &mut LeasePolicy {
    update
        .leases
        .as_mut()
        .and_then(Option::as_mut)
        .expect("a policy")
}

/// A valid key configuration with field `field` broken.
fn broken_config(field: usize, bad: &Hostile) -> Command {
    let mut update = lease_config();
    let mut key = KEY.to_owned();
    match field % CONFIG_FIELDS {
        0 => key = bad.text.clone(),
        1 => update.limit = Some(bad.number),
        2 => update.round_wait_ms = Some(bad.number),
        3 => update.round_period_ms = Some(bad.number),
        4 => update.grant_timeout_ms = Some(bad.number),
        5 => policy(&mut update).permits_per_lease = bad.number,
        6 => policy(&mut update).ttl_ms = bad.number,
        7 => policy(&mut update).max_groups = bad.number,
        8 => policy(&mut update).max_clients_per_group = bad.number,
        9 => {
            policy(&mut update).provisioning = Provisioning::Over {
                extra: Amount::Ratio { ratio: bad.ratio },
            }
        }
        _ => {
            policy(&mut update).provisioning = Provisioning::Under {
                reserve: Amount::Permits(bad.number),
            }
        }
    }
    Command::SetKeyConfig { key, update }
}

fn broken_group(field: usize, bad: &Hostile) -> Command {
    let (mut key, mut group) = (KEY.to_owned(), "capped".to_owned());
    let mut config = GroupConfig {
        limit: Some(2),
        permitted: true,
    };
    match field % GROUP_FIELDS {
        0 => key = bad.text.clone(),
        1 => group = bad.text.clone(),
        _ => config.limit = Some(bad.number),
    }
    Command::SetGroup { key, group, config }
}

fn broken_release(field: usize, bad: &Hostile) -> Command {
    let (mut key, mut client_id) = (KEY.to_owned(), CLIENT.to_owned());
    match field % RELEASE_FIELDS {
        0 => key = bad.text.clone(),
        _ => client_id = bad.text.clone(),
    }
    Command::ForceRelease {
        now_ms: NOW_MS,
        key,
        client_id,
    }
}

/// A delete without `force` of the populated key (in use: refused whatever
/// else), with one broken field.
fn broken_delete(field: usize, bad: &Hostile) -> Command {
    let (mut key, mut request_id) = (KEY.to_owned(), "delete-1".to_owned());
    match field % DELETE_FIELDS {
        0 => key = bad.text.clone(),
        _ => request_id = bad.text.clone(),
    }
    Command::DeleteKey {
        now_ms: NOW_MS + 5,
        key,
        force: false,
        request_id: Some(request_id),
    }
}

fn refused(result: &CommandResult) -> bool {
    matches!(
        result,
        CommandResult::Rejected { .. }
            | CommandResult::KeyLimit { .. }
            | CommandResult::KeyInUse { .. }
    )
}

/// What the edge says of a message: its own validation, and the JSON parser
/// fed the message's wire form (which must agree with it).
fn edge_accepts(message: SemaphoreRequest) -> bool {
    let json = serde_json::to_vec(&message).expect("serialises");
    let parsed = parse_request(&json);
    let validated = match &message {
        SemaphoreRequest::Request(request) => validate_permit_request(request),
        SemaphoreRequest::Sync(sync) => validate_sync(sync),
    };
    assert_eq!(
        parsed.is_ok(),
        validated.is_ok(),
        "parser and validation agree"
    );
    validated.is_ok()
}

proptest! {
    #[test]
    fn one_broken_field_never_panics_and_a_refusal_changes_nothing(
        kind in 0..6usize,
        field in any::<usize>(),
        bad in hostile(),
    ) {
        let (mut semaphores, grant_id, lease_id) = populated();
        let (command, edge) = match kind {
            0 => {
                let (key, request) = broken_request(&grant_id, &lease_id, field, &bad);
                let key_ok = permitd_core::contract::validate::validate_key(&key).is_ok();
                let edge = key_ok && edge_accepts(SemaphoreRequest::Request(request.clone()));
                let round = KeyRound { key, requests: vec![request] };
                (Command::Round { now_ms: NOW_MS + 5, syncs: vec![], keys: vec![round] }, Some(edge))
            }
            1 => {
                let (key, sync) = broken_sync(&grant_id, &lease_id, field, &bad);
                let key_ok = permitd_core::contract::validate::validate_key(&key).is_ok();
                let edge = key_ok && edge_accepts(SemaphoreRequest::Sync(sync.clone()));
                let syncs = vec![KeySync { key, sync }];
                (Command::Round { now_ms: NOW_MS + 5, syncs, keys: vec![] }, Some(edge))
            }
            2 => (broken_config(field, &bad), None),
            3 => (broken_group(field, &bad), None),
            4 => (broken_release(field, &bad), None),
            _ => (broken_delete(field, &bad), None),
        };
        let before = semaphores.clone();
        let result = apply(&mut semaphores, 4, &command);
        if refused(&result) {
            prop_assert_eq!(&semaphores, &before, "a refused {:?} changed the state", command);
        }
        if let Some(edge) = edge {
            prop_assert_eq!(edge, !refused(&result), "edge and apply disagree on {:?}: {:?}", command, result);
        }
    }
}
