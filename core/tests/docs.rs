//! `docs/protocol.md` must describe the whole wire contract: every route, header,
//! error code, blocked reason and JSON field the code can send or accept. A field
//! added to a wire type without a word in the document fails here.

use std::collections::{BTreeMap, BTreeSet};

use permitd_core::config::{Amount, GroupConfig, KeyConfig, LeasePolicy, Provisioning};
use permitd_core::contract::batch::{BatchItem, BatchItemAnswer, BatchRequest, BatchResponse};
use permitd_core::contract::protocol::{
    Blocked, BlockedReason, Demand, GrantReport, GrantResult, GrantStatus, GrantedPermits,
    LeaseGrant, LeaseReport, PermitGrant, PermitRequest, PermitSync, PermitSyncResult,
    SemaphoreRequest, SemaphoreResponse, V1,
};
use permitd_core::contract::{
    headers, paths, ClusterMember, ClusterStatus, DeleteKeyQuery, ErrorAnswer, ErrorCode, KeyList,
    KeyUsage, ListQuery, MemberRole, MembershipChange,
};
use permitd_core::engine::delete_key::KeyDeleted;
use permitd_core::engine::force_release::ForceReleased;
use permitd_core::engine::holders::{holders, KeyHolders};
use permitd_core::engine::state::{Grant, KeyState, Lease};
use permitd_core::engine::usage::GroupUsage;
use permitd_core::{IdAllocator, Usage};
use serde::Serialize;
use serde_json::Value;

fn protocol_md() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");
    std::fs::read_to_string(path).expect("docs/protocol.md is readable")
}

/// Whether the document names `word` as code (`` `word` ``) or as a JSON key or
/// string (`"word"`).
fn documents(doc: &str, word: &str) -> bool {
    doc.contains(&format!("`{word}`")) || doc.contains(&format!("\"{word}\""))
}

fn missing<'a>(doc: &str, words: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    words
        .into_iter()
        .filter(|word| !documents(doc, word))
        .collect()
}

#[test]
fn every_route_header_and_error_code_is_documented() {
    let doc = protocol_md();
    let routes: Vec<&str> = paths::ALL
        .into_iter()
        .filter(|path| !doc.contains(path))
        .collect();
    assert!(
        routes.is_empty(),
        "routes missing from protocol.md: {routes:?}"
    );
    assert_eq!(missing(&doc, headers::ALL), Vec::<&str>::new(), "headers");
    let codes = ErrorCode::ALL.map(ErrorCode::as_str);
    assert_eq!(missing(&doc, codes), Vec::<&str>::new(), "error codes");
    for code in ErrorCode::ALL {
        let row = format!("| `{code}` | {} |", code.status());
        assert!(doc.contains(&row), "protocol.md lacks the row {row}");
    }
    let reasons = [
        BlockedReason::GroupLimit,
        BlockedReason::Limit,
        BlockedReason::NotPermitted,
        BlockedReason::LimitResolutionError,
    ]
    .map(BlockedReason::as_str);
    assert_eq!(
        missing(&doc, reasons),
        Vec::<&str>::new(),
        "blocked reasons"
    );
}

/// Every object key and string value in `value`, recursively.
fn wire_words(value: &Value, words: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                words.insert(key.clone());
                wire_words(value, words);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| wire_words(item, words)),
        Value::String(text) if !text.contains(' ') && text.len() < 40 => {
            words.insert(text.clone());
        }
        _ => {}
    }
}

fn json(value: impl Serialize) -> Value {
    serde_json::to_value(value).expect("wire types serialise")
}

/// One value of every wire shape, with every optional field present.
fn every_shape() -> Vec<Value> {
    let mut ids = IdAllocator::new(7);
    let grant_id = ids.grant_id();
    let lease_id = ids.lease_id().to_string();
    let request = PermitRequest {
        v: V1,
        client_id: "runner".into(),
        request_id: Some("r".into()),
        demand: vec![Demand {
            group: "g".into(),
            count: 1,
            oldest_at_ms: 1,
        }],
        grants: vec![GrantReport {
            grant_id: grant_id.to_string(),
            claimed: 1,
            released: 0,
        }],
        leases: Some(vec![LeaseReport {
            lease_id: lease_id.clone(),
            drawn: 1,
            released: 0,
            retired: true,
        }]),
        wait_ms: None,
    };
    let sync = PermitSync {
        v: V1,
        client_id: "runner".into(),
        grants: request.grants.clone(),
        leases: request.leases.clone(),
    };
    let lease = LeaseGrant {
        lease_id,
        group: "g".into(),
        permits: 1,
        expires_at_ms: 1,
    };
    let result = GrantResult {
        grant_id: grant_id.to_string(),
        claimed: 1,
        status: GrantStatus::Expired,
    };
    let answer = PermitGrant {
        v: V1,
        grants: vec![GrantedPermits {
            grant_id,
            group: "g".into(),
            permits: 1,
            fence: 7,
        }],
        blocked: vec![Blocked {
            group: "g".into(),
            reason: BlockedReason::GroupLimit,
        }],
        grant_results: vec![result.clone()],
        leases: Some(vec![lease.clone()]),
        contended: true,
        next_request_at_ms: 1,
    };
    let synced = PermitSyncResult {
        v: V1,
        grant_results: vec![result],
        leases: Some(vec![lease]),
        contended: true,
    };
    let usage = Usage {
        limit: 1,
        granted: 1,
        leased: 0,
        available: 0,
        groups: BTreeMap::from([(
            "g".to_owned(),
            GroupUsage {
                granted: 1,
                limit: Some(1),
            },
        )]),
    };
    let policy = |provisioning| KeyConfig {
        leases: Some(LeasePolicy::with_provisioning(provisioning)),
        ..KeyConfig::default()
    };
    let status = ClusterStatus {
        id: 1,
        leader: Some(1),
        term: 1,
        last_log_index: Some(1),
        last_applied: Some(1),
        initialized: true,
        members: vec![ClusterMember {
            id: 1,
            addr: "a".into(),
            raft_addr: "b".into(),
            role: MemberRole::Learner,
        }],
    };
    let mut error = ErrorAnswer::new(ErrorCode::BadRequest, "m");
    error.error.field = Some("clientId".into());
    let batch = BatchRequest {
        v: V1,
        items: vec![BatchItem {
            key: "k".into(),
            message: SemaphoreRequest::Sync(sync.clone()),
        }],
    };
    let batch_answer = BatchResponse {
        v: V1,
        items: vec![
            BatchItemAnswer::answered(SemaphoreResponse::Synced(synced.clone())),
            BatchItemAnswer::failed(ErrorAnswer::new(ErrorCode::Forbidden, "not yours")),
        ],
    };
    vec![
        json(batch),
        json(batch_answer),
        json(SemaphoreRequest::Request(request)),
        json(SemaphoreRequest::Sync(sync)),
        json(SemaphoreResponse::Grant(answer)),
        json(SemaphoreResponse::Synced(synced)),
        json(&usage),
        json(policy(Provisioning::Strict)),
        json(policy(Provisioning::Under {
            reserve: Amount::Ratio { ratio: 0.5 },
        })),
        json(policy(Provisioning::Over {
            extra: Amount::Permits(1),
        })),
        json(GroupConfig::default()),
        json(KeyList {
            keys: vec![KeyUsage {
                key: "k".into(),
                usage,
            }],
            next: Some("k".into()),
        }),
        json(ListQuery {
            after: Some("k".into()),
            limit: Some(1),
        }),
        json(status),
        json(MembershipChange::AddLearner {
            id: 4,
            api_addr: "a".into(),
            raft_addr: "b".into(),
        }),
        json(MembershipChange::ChangeMembership {
            voters: BTreeSet::from([1]),
        }),
        json(error),
        json(holders_example()),
        json(ForceReleased {
            grants: 1,
            leases: 1,
            permits: 2,
        }),
        json(KeyDeleted {
            existed: true,
            released: ForceReleased::default(),
            clients: 1,
            log_index: 9,
        }),
        json(DeleteKeyQuery {
            force: true,
            request_id: Some("r".into()),
        }),
    ]
}

/// A holders answer with one grant, one lease and waiting demand.
fn holders_example() -> KeyHolders {
    let mut state = KeyState::default();
    let mut ids = IdAllocator::new(9);
    state.put_grant(
        ids.grant_id(),
        Some(Grant {
            client_id: "runner".into(),
            group: "g".into(),
            permits: 2,
            claimed: 1,
            released: 0,
            created_at_ms: 1,
            claim_deadline_ms: 2,
            fence: 9,
        }),
    );
    state.put_lease(
        ids.lease_id(),
        Some(Lease {
            client_id: "runner".into(),
            group: "g".into(),
            permits: 2,
            released: 0,
            drawn: 1,
            created_at_ms: 1,
            expires_at_ms: 3,
            retired: false,
            acknowledged: true,
            claim_deadline_ms: 2,
        }),
    );
    let waiting = PermitRequest {
        v: V1,
        client_id: "runner".into(),
        request_id: None,
        demand: vec![Demand {
            group: "g".into(),
            count: 3,
            oldest_at_ms: 1,
        }],
        grants: Vec::new(),
        leases: None,
        wait_ms: None,
    };
    holders("k", Some(&state), &[waiting])
}

#[test]
fn every_field_and_value_of_every_wire_shape_is_documented() {
    let doc = protocol_md();
    let mut words = BTreeSet::new();
    every_shape()
        .iter()
        .for_each(|shape| wire_words(shape, &mut words));
    // Example values of the shapes above, not names.
    for example in ["runner", "r", "g", "k", "a", "b", "m"] {
        words.remove(example);
    }
    let undocumented: Vec<&str> = words
        .iter()
        .map(String::as_str)
        .filter(|word| !documents(&doc, word) && uuid::Uuid::parse_str(word).is_err())
        .collect();
    assert!(
        undocumented.is_empty(),
        "wire fields or values missing from docs/protocol.md: {undocumented:?}"
    );
}
