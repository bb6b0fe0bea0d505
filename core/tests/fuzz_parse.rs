//! Fuzzing on stable Rust: arbitrary bytes and structure-aware mutations of valid
//! messages fed to the edge parsers (`validate::parse_request`, the key and group
//! configuration parsers) and, when accepted, to the engine. Nothing may panic;
//! a rejected configuration leaves the state exactly as it was; an accepted
//! message passes validation and runs a round without panicking.

use permitd_core::config::{GroupConfig, KeyConfigUpdate};
use permitd_core::contract::protocol::SemaphoreRequest;
use permitd_core::contract::validate::{parse_request, validate_request};
use permitd_core::{IdAllocator, Semaphores};
use proptest::prelude::*;
use serde_json::{json, Value};

/// Valid messages the mutations start from: a request with every part, a sync.
fn valid_messages() -> Vec<Value> {
    vec![
        json!({"type": "request", "v": 1, "clientId": "c1", "requestId": "r1",
            "demand": [{"group": "g", "count": 3, "oldestAt": 5}],
            "grants": [{"grantId": "x", "claimed": 1, "released": 0}],
            "leases": [{"leaseId": "l", "drawn": 1, "released": 0}]}),
        json!({"type": "sync", "v": 1, "clientId": "c2",
            "grants": [{"grantId": "x", "claimed": 2, "released": 1}], "leases": []}),
        json!({"limit": 10, "roundWaitMs": 5, "grantTimeoutMs": 1000,
            "leases": {"ttlMs": 100, "provisioning": {"mode": "under", "reserve": {"ratio": 0.5}}}}),
        json!({"limit": 3, "permitted": false}),
    ]
}

/// JSON values a field may be replaced with: the edges of every type.
fn edge_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|number| json!(number)),
        Just(json!(u64::MAX)),
        Just(json!(1u64 << 53)),
        Just(json!(-1)),
        Just(json!(0)),
        ".{0,8}".prop_map(Value::from),
        Just(json!("x".repeat(300))),
        Just(json!("\u{0}\u{1f}")),
        Just(json!([])),
        Just(json!({})),
        Just(json!([[[[]]]])),
    ]
}

/// One structural change to a JSON value, at a path chosen by `picks`.
#[derive(Debug, Clone)]
enum Mutation {
    Replace(Value),
    Remove,
    Duplicate,
    AddField(String, Value),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        edge_value().prop_map(Mutation::Replace),
        Just(Mutation::Remove),
        Just(Mutation::Duplicate),
        ("[a-zA-Z]{1,6}", edge_value()).prop_map(|(name, value)| Mutation::AddField(name, value)),
    ]
}

/// Applies `mutation` at the node reached by following `picks` into `value`.
fn mutate(value: &mut Value, picks: &[usize], mutation: &Mutation) {
    let (pick, rest) = match picks.split_first() {
        Some(split) => split,
        None => return apply_here(value, mutation),
    };
    let child = match value {
        Value::Object(map) if !map.is_empty() => {
            let key = map.keys().nth(pick % map.len()).cloned();
            key.and_then(|key| map.get_mut(&key))
        }
        Value::Array(items) if !items.is_empty() => {
            let len = items.len();
            items.get_mut(pick % len)
        }
        _ => None,
    };
    match child {
        Some(child) if !rest.is_empty() || pick % 3 != 0 => mutate(child, rest, mutation),
        _ => apply_here(value, mutation),
    }
}

fn apply_here(value: &mut Value, mutation: &Mutation) {
    match (mutation, &mut *value) {
        (Mutation::Replace(new), _) => *value = new.clone(),
        (Mutation::Remove, Value::Object(map)) => {
            let first = map.keys().next().cloned();
            if let Some(first) = first {
                map.remove(&first);
            }
        }
        (Mutation::Remove, Value::Array(items)) => {
            items.pop();
        }
        (Mutation::Duplicate, Value::Array(items)) => {
            let copies = items.to_vec();
            items.extend(copies);
        }
        (Mutation::AddField(name, new), Value::Object(map)) => {
            map.insert(name.clone(), new.clone());
        }
        _ => *value = Value::Null,
    }
}

/// Feeds bytes to every parser; an accepted message must validate and run.
fn feed(bytes: &[u8]) {
    if let Ok(message) = parse_request(bytes) {
        assert_eq!(validate_request(&message), Ok(()), "accepted means valid");
        if let SemaphoreRequest::Request(request) = message {
            let mut semaphores = Semaphores::default();
            let mut ids = IdAllocator::new(1);
            semaphores.round("k", &mut ids, 1_000, &[request]);
        }
    }
    if let Ok(update) = serde_json::from_slice::<KeyConfigUpdate>(bytes) {
        let mut semaphores = Semaphores::default();
        let before = semaphores.clone();
        if semaphores.set_key_config("k", &update).is_err() {
            assert_eq!(
                semaphores, before,
                "a refused configuration changes nothing"
            );
        }
    }
    if let Ok(group) = serde_json::from_slice::<GroupConfig>(bytes) {
        let mut semaphores = Semaphores::default();
        let before = semaphores.clone();
        if semaphores.set_group("k", "g", group).is_err() {
            assert_eq!(
                semaphores, before,
                "a refused group setting changes nothing"
            );
        }
    }
}

/// The mutations start from valid messages: each parses and is accepted.
#[test]
fn the_starting_messages_are_valid() {
    let messages = valid_messages();
    for message in &messages[..2] {
        parse_request(message.to_string().as_bytes()).expect("a valid message");
    }
    let update: KeyConfigUpdate = serde_json::from_value(messages[2].clone()).expect("a config");
    let mut semaphores = Semaphores::default();
    semaphores.set_key_config("k", &update).expect("valid");
    let group: GroupConfig = serde_json::from_value(messages[3].clone()).expect("a group");
    semaphores.set_group("k", "g", group).expect("valid");
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        feed(&bytes);
    }

    #[test]
    fn mutated_valid_messages_never_panic(
        message in 0..4usize,
        edits in proptest::collection::vec(
            (proptest::collection::vec(any::<usize>(), 0..4), mutation()), 1..4),
    ) {
        let mut value = valid_messages()[message].clone();
        for (picks, mutation) in &edits {
            mutate(&mut value, picks, mutation);
        }
        feed(value.to_string().as_bytes());
    }

    #[test]
    fn cut_or_flipped_valid_messages_never_panic(
        message in 0..4usize,
        cut in any::<usize>(),
        flip in any::<(usize, u8)>(),
    ) {
        let text = valid_messages()[message].to_string().into_bytes();
        feed(&text[..cut % (text.len() + 1)]);
        let mut flipped = text.clone();
        let at = flip.0 % flipped.len();
        flipped[at] ^= flip.1;
        feed(&flipped);
    }
}
