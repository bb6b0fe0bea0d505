//! The TypeScript client's wire types are checked against the Rust ones.
//!
//! This test serialises a sample of every wire type, from the Rust types
//! themselves, and compares the result with the committed
//! `client/typescript/test/fixtures/wire-samples.json`. The TypeScript tests
//! parse each sample with the TypeScript validators and check that it
//! serialises back unchanged. A change to a Rust wire type thus fails here until
//! the file is regenerated (`PERMITD_BLESS=1 cargo test -p permitd-tests --test
//! wire_samples`), and the regenerated file fails the TypeScript tests until the
//! TypeScript types follow.
//!
//! Besides the wire types, `Contract` holds the header names and each error
//! code's status and `Retry-After`, which the TypeScript client checks its
//! own constants against.

use std::path::PathBuf;

use permitd_core::config::{Amount, LimitedGroups};
use permitd_core::contract::batch::{BatchItem, BatchItemAnswer, BatchRequest, BatchResponse};
use permitd_core::contract::protocol::{
    Blocked, BlockedReason, Demand, GrantReport, GrantResult, GrantStatus, GrantedPermits,
    LeaseGrant, LeaseReport, PermitGrant, PermitRequest, PermitSync, PermitSyncResult,
    SemaphoreRequest, SemaphoreResponse, V1,
};
use permitd_core::contract::{
    headers, ClusterMember, ClusterStatus, ErrorAnswer, ErrorCode, KeyList, KeyUsage, MemberRole,
    ShardMap, ShardStatus,
};
use permitd_core::engine::delete_key::KeyDeleted;
use permitd_core::engine::force_release::ForceReleased;
use permitd_core::engine::usage::GroupUsage;
use permitd_core::{
    GroupConfig, IdAllocator, KeyConfig, KeyConfigUpdate, LeasePolicy, Provisioning, Usage,
};
use serde_json::{json, Value};

fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../client/typescript/test/fixtures/wire-samples.json")
}

fn requests(grant_id: &str, lease_id: &str) -> Vec<SemaphoreRequest> {
    let grant = GrantReport {
        grant_id: grant_id.into(),
        claimed: 3,
        released: 1,
    };
    let lease = LeaseReport {
        lease_id: lease_id.into(),
        drawn: 10,
        released: 4,
        retired: true,
    };
    vec![
        SemaphoreRequest::Request(PermitRequest {
            v: V1,
            client_id: "runner-7".into(),
            request_id: Some("r-42".into()),
            demand: vec![Demand {
                group: "wf-1".into(),
                count: 5,
                oldest_at_ms: 1_764_460_800_000,
            }],
            grants: vec![grant.clone()],
            leases: Some(vec![lease.clone()]),
            wait_ms: None,
        }),
        SemaphoreRequest::Request(PermitRequest {
            v: V1,
            client_id: "plain".into(),
            request_id: None,
            demand: vec![],
            grants: vec![],
            leases: None,
            wait_ms: None,
        }),
        SemaphoreRequest::Sync(PermitSync {
            v: V1,
            client_id: "runner-7".into(),
            grants: vec![grant],
            leases: Some(vec![lease]),
        }),
    ]
}

fn responses(grant_id: &str, lease_id: &str) -> Vec<SemaphoreResponse> {
    let result = |status| GrantResult {
        grant_id: grant_id.into(),
        claimed: 3,
        status,
    };
    let lease = LeaseGrant {
        lease_id: lease_id.into(),
        group: "wf-1".into(),
        permits: 16,
        expires_at_ms: 1_764_462_600_000,
    };
    let blocked = [
        BlockedReason::GroupLimit,
        BlockedReason::Limit,
        BlockedReason::NotPermitted,
        BlockedReason::LimitResolutionError,
    ]
    .map(|reason| Blocked {
        group: format!("wf-{}", reason.as_str()),
        reason,
    });
    vec![
        SemaphoreResponse::Grant(PermitGrant {
            v: V1,
            grants: vec![GrantedPermits {
                grant_id: IdAllocator::new(1042).grant_id(),
                group: "wf-1".into(),
                permits: 5,
                fence: 1042,
            }],
            blocked: blocked.to_vec(),
            grant_results: vec![result(GrantStatus::Ok), result(GrantStatus::Expired)],
            leases: Some(vec![lease.clone()]),
            contended: true,
            next_request_at_ms: 1_764_460_802_000,
        }),
        SemaphoreResponse::Grant(PermitGrant {
            v: V1,
            grants: vec![],
            blocked: vec![],
            grant_results: vec![],
            leases: None,
            contended: false,
            next_request_at_ms: 5,
        }),
        SemaphoreResponse::Synced(PermitSyncResult {
            v: V1,
            grant_results: vec![result(GrantStatus::NotFound)],
            leases: Some(vec![lease]),
            contended: true,
        }),
    ]
}

fn configs() -> Vec<KeyConfig> {
    let policy = |provisioning| LeasePolicy {
        limited_groups: LimitedGroups::WithinGroupLimit,
        ..LeasePolicy::with_provisioning(provisioning)
    };
    vec![
        KeyConfig::default(),
        KeyConfig {
            leases: Some(LeasePolicy::with_provisioning(Provisioning::Strict)),
            ..KeyConfig::default()
        },
        KeyConfig {
            leases: Some(policy(Provisioning::Under {
                reserve: Amount::Permits(10),
            })),
            ..KeyConfig::default()
        },
        KeyConfig {
            leases: Some(policy(Provisioning::Over {
                extra: Amount::Ratio { ratio: 0.25 },
            })),
            ..KeyConfig::default()
        },
    ]
}

fn usage() -> Usage {
    Usage {
        limit: 100,
        granted: 12,
        leased: 16,
        available: 72,
        groups: [
            (
                "wf-1".to_string(),
                GroupUsage {
                    granted: 12,
                    limit: Some(20),
                },
            ),
            (
                "wf-2".to_string(),
                GroupUsage {
                    granted: 0,
                    limit: None,
                },
            ),
        ]
        .into(),
    }
}

/// Every sample, by the TypeScript validator's name.
fn samples() -> Value {
    let mut ids = IdAllocator::new(7);
    let (grant_id, lease_id) = (ids.grant_id().to_string(), ids.lease_id().to_string());
    let updates = [
        KeyConfigUpdate {
            limit: Some(5),
            ..KeyConfigUpdate::default()
        },
        KeyConfigUpdate {
            leases: Some(None),
            ..KeyConfigUpdate::default()
        },
        KeyConfigUpdate {
            round_wait_ms: Some(10),
            leases: Some(Some(LeasePolicy::with_provisioning(Provisioning::Strict))),
            ..KeyConfigUpdate::default()
        },
    ];
    let shard_map = ShardMap {
        id: 1,
        shards: vec![
            ShardStatus {
                shard: 0,
                leader: Some(2),
                term: 3,
                members: vec![1, 2, 3],
                applied_index: Some(10),
            },
            ShardStatus {
                shard: 1,
                leader: None,
                term: 0,
                members: vec![1, 2, 3],
                applied_index: None,
            },
        ],
    };
    let status = ClusterStatus {
        id: 1,
        leader: Some(2),
        term: 3,
        last_log_index: Some(10),
        last_applied: None,
        initialized: true,
        members: [MemberRole::Voter, MemberRole::Learner]
            .into_iter()
            .enumerate()
            .map(|(index, role)| ClusterMember {
                id: index as u64 + 1,
                addr: format!("127.0.0.1:700{}", index + 1),
                raft_addr: format!("127.0.0.1:710{}", index + 1),
                role,
            })
            .collect(),
    };
    let keys = KeyUsage {
        key: "acct-1".into(),
        usage: usage(),
    };
    let lists = [
        KeyList {
            keys: vec![keys],
            next: Some("acct-1".into()),
        },
        KeyList {
            keys: vec![],
            next: None,
        },
    ];
    let mut errors: Vec<ErrorAnswer> = ErrorCode::ALL
        .iter()
        .map(|code| ErrorAnswer::new(*code, format!("a {code} answer")))
        .collect();
    errors[0].error.field = Some("demand.count".into());
    let contract = json!({
        "leaderHeader": headers::LEADER,
        "errorCodes": ErrorCode::ALL.iter().map(|code| json!({
            "code": code, "status": code.status(), "retryAfter": code.retry_after(),
        })).collect::<Vec<_>>(),
    });
    let batch = BatchRequest {
        v: V1,
        items: requests(&grant_id, &lease_id)
            .into_iter()
            .map(|message| BatchItem {
                key: "acct-1".into(),
                message,
            })
            .collect(),
    };
    let mut batch_answers: Vec<BatchItemAnswer> = responses(&grant_id, &lease_id)
        .into_iter()
        .map(BatchItemAnswer::answered)
        .collect();
    batch_answers.push(BatchItemAnswer::failed(errors[0].clone()));
    json!({
        "BatchRequest": [batch],
        "BatchResponse": [BatchResponse { v: V1, items: batch_answers }],
        "SemaphoreRequest": requests(&grant_id, &lease_id),
        "SemaphoreResponse": responses(&grant_id, &lease_id),
        "Usage": [usage(), Usage::default()],
        "KeyConfig": configs(),
        "KeyConfigUpdate": updates,
        "GroupConfig": [GroupConfig { limit: Some(5), permitted: true }, GroupConfig { limit: None, permitted: false }],
        "KeyDeleted": [
            KeyDeleted {
                existed: true,
                released: ForceReleased { grants: 2, leases: 1, permits: 70 },
                clients: 2,
                log_index: 1_234,
            },
            KeyDeleted { log_index: 9, ..KeyDeleted::default() },
        ],
        "KeyList": lists,
        "ClusterStatus": [status],
        "ShardMap": [shard_map],
        "ErrorAnswer": errors,
        "Contract": [contract],
    })
}

#[test]
fn the_committed_wire_samples_match_the_rust_types() {
    let mut text = serde_json::to_string_pretty(&samples()).expect("json");
    text.push('\n');
    let path = fixture_path();
    if std::env::var_os("PERMITD_BLESS").is_some() {
        std::fs::write(&path, &text).expect("fixture written");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "{} differs from the Rust wire types: regenerate it with \
         PERMITD_BLESS=1 cargo test -p permitd-tests --test wire_samples, then make \
         the TypeScript types follow",
        path.display()
    );
}
