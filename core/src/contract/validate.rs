//! Checks every input against [`crate::limits`] before it can reach the engine.
//!
//! A message that passes here cannot make a round panic, overflow or do unbounded
//! work; one that fails changes nothing and gets an error that names the field.

use std::borrow::Cow;
use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::config::{Amount, GroupConfig, KeyConfig, LeasePolicy, Provisioning};
use crate::contract::protocol::{
    Demand, GrantReport, LeaseReport, PermitRequest, PermitSync, SemaphoreRequest,
};
use crate::limits::*;

/// The name of the offending field, as the wire spells it (`demand.count`).
/// Borrowed when validation names it, owned when a rejection is decoded again.
pub type FieldName = Cow<'static, str>;

/// What is wrong with an input. Every variant but `Malformed` names the offending
/// field; the HTTP error body carries it as `field` ([`InvalidInput::field`]).
/// Serialisable, because a rejection inside apply travels back to the leader in
/// the entry's result.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum InvalidInput {
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("{field} must not be empty")]
    Empty { field: FieldName },
    #[error("{field} is {len} bytes long; the maximum is {max}")]
    TooLong {
        field: FieldName,
        len: usize,
        max: usize,
    },
    #[error("{field} must not contain control characters")]
    ControlCharacter { field: FieldName },
    #[error("{field} has {len} entries; the maximum is {max}")]
    TooMany {
        field: FieldName,
        len: usize,
        max: usize,
    },
    #[error("{field} is {value}; the maximum is {max}")]
    TooLarge {
        field: FieldName,
        value: u64,
        max: u64,
    },
    #[error("{field} must be at least 1")]
    NotPositive { field: FieldName },
    #[error("{field} must be a finite ratio between 0 and {max}")]
    BadRatio { field: FieldName, max: f64 },
    #[error("demand names group {group:?} more than once")]
    DuplicateGroup { group: String },
}

impl InvalidInput {
    /// The offending field; `None` when the message could not be parsed at all.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Malformed(_) => None,
            Self::Empty { field }
            | Self::TooLong { field, .. }
            | Self::ControlCharacter { field }
            | Self::TooMany { field, .. }
            | Self::TooLarge { field, .. }
            | Self::NotPositive { field }
            | Self::BadRatio { field, .. } => Some(field),
            Self::DuplicateGroup { .. } => Some("demand.group"),
        }
    }
}

type Checked = Result<(), InvalidInput>;

/// Parses and validates a JSON message: the one entry point for untrusted bytes.
pub fn parse_request(body: &[u8]) -> Result<SemaphoreRequest, InvalidInput> {
    let message: SemaphoreRequest =
        serde_json::from_slice(body).map_err(|error| InvalidInput::Malformed(error.to_string()))?;
    validate_request(&message)?;
    Ok(message)
}

/// Checks a parsed message against the limits.
pub fn validate_request(message: &SemaphoreRequest) -> Checked {
    match message {
        SemaphoreRequest::Request(request) => validate_permit_request(request),
        SemaphoreRequest::Sync(sync) => validate_sync(sync),
    }
}

/// Checks a `request` message against the limits.
pub fn validate_permit_request(request: &PermitRequest) -> Checked {
    name("clientId", &request.client_id, MAX_CLIENT_ID_BYTES)?;
    if let Some(request_id) = &request.request_id {
        name("requestId", request_id, MAX_REQUEST_ID_BYTES)?;
    }
    if let Some(wait_ms) = request.wait_ms {
        at_most("waitMs", wait_ms, MAX_REQUEST_WAIT_MS)?;
    }
    demand(&request.demand)?;
    grant_reports(&request.grants)?;
    lease_reports(request.leases.as_deref())
}

/// Checks a `sync` message against the limits.
pub fn validate_sync(sync: &PermitSync) -> Checked {
    name("clientId", &sync.client_id, MAX_CLIENT_ID_BYTES)?;
    grant_reports(&sync.grants)?;
    lease_reports(sync.leases.as_deref())
}

/// Checks a semaphore key (it arrives in the URL path).
pub fn validate_key(key: &str) -> Checked {
    name("key", key, MAX_KEY_BYTES)
}

/// Checks a group name given outside a message (in a URL path).
pub fn validate_group(group: &str) -> Checked {
    name("group", group, MAX_GROUP_BYTES)
}

/// Checks a clientId given outside a message (in a URL path).
pub fn validate_client_id(client_id: &str) -> Checked {
    name("clientId", client_id, MAX_CLIENT_ID_BYTES)
}

/// Checks a name-like text field: non-empty, at most `max` bytes, no control
/// characters.
pub fn name(field: &'static str, value: &str, max: usize) -> Checked {
    if value.is_empty() {
        return Err(InvalidInput::Empty {
            field: field.into(),
        });
    }
    if value.len() > max {
        return Err(InvalidInput::TooLong {
            field: field.into(),
            len: value.len(),
            max,
        });
    }
    if value.chars().any(char::is_control) {
        return Err(InvalidInput::ControlCharacter {
            field: field.into(),
        });
    }
    Ok(())
}

/// Checks a list's length against `max`.
pub fn count(field: &'static str, len: usize, max: usize) -> Checked {
    if len > max {
        return Err(InvalidInput::TooMany {
            field: field.into(),
            len,
            max,
        });
    }
    Ok(())
}

fn at_most(field: &'static str, value: u64, max: u64) -> Checked {
    if value > max {
        return Err(InvalidInput::TooLarge {
            field: field.into(),
            value,
            max,
        });
    }
    Ok(())
}

fn positive_at_most(field: &'static str, value: u64, max: u64) -> Checked {
    if value == 0 {
        return Err(InvalidInput::NotPositive {
            field: field.into(),
        });
    }
    at_most(field, value, max)
}

fn demand(entries: &[Demand]) -> Checked {
    count("demand", entries.len(), MAX_DEMAND_ENTRIES)?;
    let mut groups = BTreeSet::new();
    for entry in entries {
        name("demand.group", &entry.group, MAX_GROUP_BYTES)?;
        at_most("demand.count", entry.count, MAX_COUNT)?;
        at_most("demand.oldestAt", entry.oldest_at_ms, MAX_TIMESTAMP_MS)?;
        if !groups.insert(entry.group.as_str()) {
            return Err(InvalidInput::DuplicateGroup {
                group: entry.group.clone(),
            });
        }
    }
    Ok(())
}

fn grant_reports(reports: &[GrantReport]) -> Checked {
    count("grants", reports.len(), MAX_GRANT_REPORTS)?;
    for report in reports {
        name("grants.grantId", &report.grant_id, MAX_REPORTED_ID_BYTES)?;
        at_most("grants.claimed", report.claimed, MAX_COUNT)?;
        at_most("grants.released", report.released, MAX_COUNT)?;
    }
    Ok(())
}

fn lease_reports(reports: Option<&[LeaseReport]>) -> Checked {
    let reports = reports.unwrap_or_default();
    count("leases", reports.len(), MAX_LEASE_REPORTS)?;
    for report in reports {
        name("leases.leaseId", &report.lease_id, MAX_REPORTED_ID_BYTES)?;
        at_most("leases.drawn", report.drawn, MAX_COUNT)?;
        at_most("leases.released", report.released, MAX_COUNT)?;
    }
    Ok(())
}

/// Checks a key configuration (also the cluster defaults).
pub fn validate_key_config(config: &KeyConfig) -> Checked {
    at_most("limit", config.limit, MAX_LIMIT)?;
    positive_at_most("roundWaitMs", config.round_wait_ms, MAX_DELAY_MS)?;
    positive_at_most("roundPeriodMs", config.round_period_ms, MAX_DELAY_MS)?;
    positive_at_most("grantTimeoutMs", config.grant_timeout_ms, MAX_DELAY_MS)?;
    match &config.leases {
        Some(policy) => lease_policy(policy),
        None => Ok(()),
    }
}

fn lease_policy(policy: &LeasePolicy) -> Checked {
    positive_at_most(
        "leases.permitsPerLease",
        policy.permits_per_lease,
        MAX_LIMIT,
    )?;
    positive_at_most("leases.ttlMs", policy.ttl_ms, MAX_DELAY_MS)?;
    positive_at_most(
        "leases.maxGroups",
        policy.max_groups,
        MAX_DEMAND_ENTRIES as u64,
    )?;
    positive_at_most(
        "leases.maxClientsPerGroup",
        policy.max_clients_per_group,
        MAX_LIMIT,
    )?;
    match &policy.provisioning {
        Provisioning::Strict => Ok(()),
        Provisioning::Under { reserve } => amount("leases.provisioning.reserve", reserve),
        Provisioning::Over { extra } => amount("leases.provisioning.extra", extra),
    }
}

fn amount(field: &'static str, amount: &Amount) -> Checked {
    match amount {
        Amount::Permits(permits) => at_most(field, *permits, MAX_LIMIT),
        Amount::Ratio { ratio }
            if ratio.is_finite() && (0.0..=MAX_PROVISIONING_RATIO).contains(ratio) =>
        {
            Ok(())
        }
        Amount::Ratio { .. } => Err(InvalidInput::BadRatio {
            field: field.into(),
            max: MAX_PROVISIONING_RATIO,
        }),
    }
}

/// Checks a group configuration.
pub fn validate_group_config(config: &GroupConfig) -> Checked {
    match config.limit {
        Some(limit) => at_most("limit", limit, MAX_LIMIT),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_with(body: &str) -> Result<SemaphoreRequest, InvalidInput> {
        parse_request(format!(r#"{{"type":"request","v":1,"clientId":"c",{body}}}"#).as_bytes())
    }

    #[test]
    fn a_well_formed_request_passes() {
        let body = r#""demand":[{"group":"g","count":0,"oldestAt":1}],"leases":[]"#;
        assert!(request_with(body).is_ok());
    }

    #[test]
    fn malformed_json_is_named_malformed() {
        assert!(matches!(
            parse_request(b"{"),
            Err(InvalidInput::Malformed(_))
        ));
    }

    #[test]
    fn oversized_fields_name_their_field() {
        let long = "x".repeat(MAX_CLIENT_ID_BYTES + 1);
        let message = format!(r#"{{"type":"sync","v":1,"clientId":"{long}"}}"#);
        assert_eq!(
            parse_request(message.as_bytes()),
            Err(InvalidInput::TooLong {
                field: "clientId".into(),
                len: long.len(),
                max: MAX_CLIENT_ID_BYTES
            })
        );
        let body = format!(
            r#""demand":[{{"group":"g","count":{},"oldestAt":1}}]"#,
            MAX_COUNT + 1
        );
        let error = request_with(&body).unwrap_err();
        assert!(matches!(error, InvalidInput::TooLarge { .. }), "{error}");
        assert_eq!(error.field(), Some("demand.count"));
    }

    #[test]
    fn empty_names_control_characters_and_duplicate_groups_fail() {
        assert!(matches!(
            request_with(r#""requestId":"""#),
            Err(InvalidInput::Empty { .. })
        ));
        let body = r#""demand":[{"group":"a\u0000","count":1,"oldestAt":1}]"#;
        assert!(matches!(
            request_with(body),
            Err(InvalidInput::ControlCharacter { .. })
        ));
        let body = r#""demand":[{"group":"a","count":1,"oldestAt":1},{"group":"a","count":2,"oldestAt":1}]"#;
        assert!(matches!(
            request_with(body),
            Err(InvalidInput::DuplicateGroup { .. })
        ));
    }

    #[test]
    fn too_many_entries_fail() {
        let reports: Vec<String> = (0..=MAX_LEASE_REPORTS)
            .map(|n| format!(r#"{{"leaseId":"l{n}","drawn":0,"released":0}}"#))
            .collect();
        let body = format!(r#""leases":[{}]"#, reports.join(","));
        let error = request_with(&body).unwrap_err();
        assert!(matches!(error, InvalidInput::TooMany { .. }), "{error}");
        assert_eq!(error.field(), Some("leases"));
    }

    /// serde_json's default float parser may land one ULP off; the workspace
    /// turns on `float_roundtrip` so that a ratio just past the maximum, as
    /// JSON text, is past it after parsing too (schemathesis sent this one).
    #[test]
    fn a_ratio_one_ulp_past_the_maximum_is_refused() {
        let past: Amount = serde_json::from_str(r#"{"ratio": 1000.0000000000001}"#).unwrap();
        assert!(matches!(past, Amount::Ratio { ratio } if ratio > MAX_PROVISIONING_RATIO));
        assert!(amount("f", &past).is_err());
        let at_max: Amount = serde_json::from_str(r#"{"ratio": 1000.0}"#).unwrap();
        assert!(amount("f", &at_max).is_ok());
    }

    #[test]
    fn key_configuration_limits() {
        let mut config = KeyConfig {
            round_wait_ms: 0,
            ..KeyConfig::default()
        };
        assert_eq!(
            validate_key_config(&config),
            Err(InvalidInput::NotPositive {
                field: "roundWaitMs".into()
            })
        );
        config.round_wait_ms = MAX_DELAY_MS + 1;
        assert!(validate_key_config(&config).is_err());
        config.round_wait_ms = 5;
        let mut policy = LeasePolicy::with_provisioning(Provisioning::Over {
            extra: Amount::Ratio { ratio: f64::NAN },
        });
        config.leases = Some(policy.clone());
        assert!(matches!(
            validate_key_config(&config),
            Err(InvalidInput::BadRatio { .. })
        ));
        policy.provisioning = Provisioning::Strict;
        policy.permits_per_lease = 0;
        config.leases = Some(policy);
        assert!(validate_key_config(&config).is_err());
        assert!(validate_group_config(&GroupConfig {
            limit: Some(MAX_LIMIT + 1),
            permitted: true
        })
        .is_err());
    }
}
