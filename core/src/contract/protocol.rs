//! The wire protocol, version 1: the semaphore messages as serde types
//! (docs/protocol.md, "Messages").
//!
//! JSON field names are camelCase and exact; every message carries `"v": 1`, and an
//! unknown `type` or `v` fails to parse. Parsing checks shapes and types (a negative
//! or fractional count is a parse error); [`crate::contract::validate`] then checks limits.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::{GrantId, LogIndex};

/// The protocol version marker: serialises as `1`, parses only `1`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct V1;

impl Serialize for V1 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(1)
    }
}

/// In the OpenAPI document: the integer `1` and nothing else.
impl utoipa::PartialSchema for V1 {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::Integer)
            .enum_values(Some([1]))
            .description(Some("The protocol version: always 1."))
            .into()
    }
}

impl utoipa::ToSchema for V1 {
    fn name() -> std::borrow::Cow<'static, str> {
        "ProtocolVersion".into()
    }
}

impl<'de> Deserialize<'de> for V1 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match u64::deserialize(deserializer)? {
            1 => Ok(V1),
            other => Err(serde::de::Error::custom(format!(
                "unsupported protocol version {other}, expected 1"
            ))),
        }
    }
}

/// A message a client sends to `POST /v1/semaphores/{key}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum SemaphoreRequest {
    /// Demand plus reports; answered when the key's next round runs.
    Request(PermitRequest),
    /// Reports only; applied at once, without waiting for a round.
    Sync(PermitSync),
}

/// Asks for permits per group and reports on the grants and leases the client holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermitRequest {
    pub v: V1,
    pub client_id: String,
    /// Lets a retried request get the original answer instead of new grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(default)]
    pub demand: Vec<Demand>,
    #[serde(default)]
    pub grants: Vec<GrantReport>,
    /// Present (even empty) when the client supports leases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases: Option<Vec<LeaseReport>>,
    /// How long, in ms from its arrival at the leader, this request may wait
    /// for a round that grants it something. A pure demand request (no
    /// reports) that a round leaves with nothing is then not answered but held
    /// for the key's next round, until this much time has passed (at most
    /// `MAX_REQUEST_WAIT_MS`). Absent or 0: answered by the first round, as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// Cumulative reports without demand.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermitSync {
    pub v: V1,
    pub client_id: String,
    #[serde(default)]
    pub grants: Vec<GrantReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases: Option<Vec<LeaseReport>>,
}

/// Permits wanted for one group; `oldest_at_ms` orders demand across clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Demand {
    pub group: String,
    pub count: u64,
    #[serde(rename = "oldestAt")]
    pub oldest_at_ms: u64,
}

/// Cumulative high-water marks for one grant: permits claimed, and of those released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantReport {
    pub grant_id: String,
    pub claimed: u64,
    pub released: u64,
}

/// Cumulative high-water marks for one lease, and whether the client stopped drawing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseReport {
    pub lease_id: String,
    pub drawn: u64,
    pub released: u64,
    #[serde(default)]
    pub retired: bool,
}

/// The holder's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum SemaphoreResponse {
    Grant(PermitGrant),
    Synced(PermitSyncResult),
}

/// The answer to a [`PermitRequest`], once its round ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermitGrant {
    pub v: V1,
    pub grants: Vec<GrantedPermits>,
    pub blocked: Vec<Blocked>,
    pub grant_results: Vec<GrantResult>,
    /// Only for clients that sent `leases`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases: Option<Vec<LeaseGrant>>,
    /// Only when true, and only for clients that sent `leases`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub contended: bool,
    #[serde(rename = "nextRequestAt")]
    pub next_request_at_ms: u64,
}

/// The answer to a [`PermitSync`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermitSyncResult {
    pub v: V1,
    pub grant_results: Vec<GrantResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases: Option<Vec<LeaseGrant>>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub contended: bool,
}

fn is_false(value: &bool) -> bool {
    !value
}

/// Permits newly granted to the asking client for one group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantedPermits {
    pub grant_id: GrantId,
    pub group: String,
    pub permits: u64,
    /// Log index of the round that created the grant: strictly increasing per key.
    pub fence: LogIndex,
}

/// Why some of a group's demand stayed queued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Blocked {
    pub group: String,
    pub reason: BlockedReason,
}

/// The gate that held demand back.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum BlockedReason {
    /// The group's own cap is used up (checked before the key's).
    GroupLimit,
    /// The key's limit is used up.
    Limit,
    /// The group is configured `permitted: false`.
    NotPermitted,
    /// The group's stored configuration cannot be resolved; it fails closed.
    LimitResolutionError,
}

impl BlockedReason {
    /// The reason's wire name, for metrics labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GroupLimit => "group_limit",
            Self::Limit => "limit",
            Self::NotPermitted => "not_permitted",
            Self::LimitResolutionError => "limit_resolution_error",
        }
    }
}

/// The holder's view of one reported grant after applying the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantResult {
    pub grant_id: String,
    pub claimed: u64,
    pub status: GrantStatus,
}

/// Outcome of a grant report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum GrantStatus {
    Ok,
    /// The claim came after the claim deadline and was clamped.
    Expired,
    /// Unknown grant, or another client's.
    NotFound,
}

/// A lease as the holder sees it. `expires_at_ms <= now` means: stop drawing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseGrant {
    pub lease_id: String,
    pub group: String,
    pub permits: u64,
    #[serde(rename = "expiresAt")]
    pub expires_at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_parses_the_design_example() {
        let text = r#"{"type": "request", "v": 1, "clientId": "runner-7", "requestId": "r-42",
            "demand": [{"group": "wf-1", "count": 5, "oldestAt": 1764460800000}],
            "grants": [{"grantId": "g", "claimed": 3, "released": 1}],
            "leases": [{"leaseId": "l", "drawn": 10, "released": 4, "retired": false}]}"#;
        let SemaphoreRequest::Request(request) = serde_json::from_str(text).unwrap() else {
            panic!("expected a request");
        };
        assert_eq!(request.client_id, "runner-7");
        assert_eq!(request.demand[0].oldest_at_ms, 1_764_460_800_000);
        assert_eq!(request.leases.unwrap()[0].drawn, 10);
    }

    #[test]
    fn omitted_lists_default_and_leases_stay_absent() {
        let text = r#"{"type":"request","v":1,"clientId":"c"}"#;
        let SemaphoreRequest::Request(request) = serde_json::from_str(text).unwrap() else {
            panic!("expected a request");
        };
        assert!(request.demand.is_empty() && request.grants.is_empty());
        assert_eq!(request.leases, None);
    }

    #[test]
    fn wrong_version_type_and_numbers_fail_to_parse() {
        for text in [
            r#"{"type":"request","v":2,"clientId":"c"}"#,
            r#"{"type":"nope","v":1,"clientId":"c"}"#,
            r#"{"v":1,"clientId":"c"}"#,
            r#"{"type":"request","clientId":"c"}"#,
            r#"{"type":"request","v":1,"clientId":"c","demand":[{"group":"g","count":-1,"oldestAt":0}]}"#,
            r#"{"type":"request","v":1,"clientId":"c","demand":[{"group":"g","count":1.5,"oldestAt":0}]}"#,
            r#"{"type":"sync","v":1,"clientId":"c","grants":[{"grantId":"g","claimed":"1","released":0}]}"#,
        ] {
            assert!(
                serde_json::from_str::<SemaphoreRequest>(text).is_err(),
                "{text}"
            );
        }
    }

    #[test]
    fn grant_answer_omits_false_contended_and_absent_leases() {
        let answer = SemaphoreResponse::Grant(PermitGrant {
            v: V1,
            grants: vec![],
            blocked: vec![Blocked {
                group: "g".into(),
                reason: BlockedReason::GroupLimit,
            }],
            grant_results: vec![],
            leases: None,
            contended: false,
            next_request_at_ms: 5,
        });
        assert_eq!(
            serde_json::to_string(&answer).unwrap(),
            r#"{"type":"grant","v":1,"grants":[],"blocked":[{"group":"g","reason":"group_limit"}],"grantResults":[],"nextRequestAt":5}"#
        );
    }
}
