//! The input limits of [`permitd_core::limits`], written into the document's
//! schemas, so that a generated client or a fuzzer knows them.
//!
//! The derives describe shapes; the limits live once, as constants, and reach
//! the document only through the table here. What a schema cannot say stays in
//! docs/protocol.md: a name's limit counts UTF-8 bytes (the document's
//! `maxLength` counts characters, so it is exact for ASCII only), a group may
//! appear once in `demand`, and a runner token needs keys and client ids.

use permitd_core::limits::*;
use std::collections::BTreeMap;
use utoipa::openapi::schema::{ArrayItems, Schema};

use utoipa::openapi::RefOr;
use utoipa::Number;

/// Names, ids and patterns: printable text, no control characters (Unicode
/// `Cc`: U+0000–U+001F and U+007F–U+009F), as `validate::name` checks.
pub const PRINTABLE: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// One input rule.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// Non-empty printable text of at most this many bytes.
    Name(usize),
    /// An integer from 0 to this.
    AtMost(u64),
    /// An integer from 1 to this.
    Positive(u64),
    /// A list of at most this many entries, each under the inner rule.
    Items(usize, Option<&'static Rule>),
    /// A number from 0 to this (a provisioning ratio).
    Ratio(f64),
}

const KEY_PATTERN: Rule = Rule::Name(MAX_KEY_BYTES);
const CLIENT_ID_PATTERN: Rule = Rule::Name(MAX_CLIENT_ID_BYTES);
const DELAY: Rule = Rule::Positive(MAX_DELAY_MS);

/// `(schema, property, rule)`: every limit `validate` checks on a body.
const PROPERTIES: &[(&str, &str, Rule)] = &[
    ("PermitRequest", "clientId", Rule::Name(MAX_CLIENT_ID_BYTES)),
    (
        "PermitRequest",
        "requestId",
        Rule::Name(MAX_REQUEST_ID_BYTES),
    ),
    (
        "PermitRequest",
        "demand",
        Rule::Items(MAX_DEMAND_ENTRIES, None),
    ),
    (
        "PermitRequest",
        "grants",
        Rule::Items(MAX_GRANT_REPORTS, None),
    ),
    (
        "PermitRequest",
        "leases",
        Rule::Items(MAX_LEASE_REPORTS, None),
    ),
    ("BatchRequest", "items", Rule::Items(MAX_BATCH_ITEMS, None)),
    ("BatchItem", "key", KEY_PATTERN),
    ("PermitSync", "clientId", Rule::Name(MAX_CLIENT_ID_BYTES)),
    ("PermitSync", "grants", Rule::Items(MAX_GRANT_REPORTS, None)),
    ("PermitSync", "leases", Rule::Items(MAX_LEASE_REPORTS, None)),
    ("Demand", "group", Rule::Name(MAX_GROUP_BYTES)),
    ("Demand", "count", Rule::AtMost(MAX_COUNT)),
    ("Demand", "oldestAt", Rule::AtMost(MAX_TIMESTAMP_MS)),
    ("GrantReport", "grantId", Rule::Name(MAX_REPORTED_ID_BYTES)),
    ("GrantReport", "claimed", Rule::AtMost(MAX_COUNT)),
    ("GrantReport", "released", Rule::AtMost(MAX_COUNT)),
    ("LeaseReport", "leaseId", Rule::Name(MAX_REPORTED_ID_BYTES)),
    ("LeaseReport", "drawn", Rule::AtMost(MAX_COUNT)),
    ("LeaseReport", "released", Rule::AtMost(MAX_COUNT)),
    ("KeyConfig", "limit", Rule::AtMost(MAX_LIMIT)),
    ("KeyConfig", "roundWaitMs", DELAY),
    ("KeyConfig", "roundPeriodMs", DELAY),
    ("KeyConfig", "grantTimeoutMs", DELAY),
    ("KeyConfigUpdate", "limit", Rule::AtMost(MAX_LIMIT)),
    ("KeyConfigUpdate", "roundWaitMs", DELAY),
    ("KeyConfigUpdate", "roundPeriodMs", DELAY),
    ("KeyConfigUpdate", "grantTimeoutMs", DELAY),
    ("LeasePolicy", "permitsPerLease", Rule::Positive(MAX_LIMIT)),
    ("LeasePolicy", "ttlMs", DELAY),
    (
        "LeasePolicy",
        "maxGroups",
        Rule::Positive(MAX_DEMAND_ENTRIES as u64),
    ),
    (
        "LeasePolicy",
        "maxClientsPerGroup",
        Rule::Positive(MAX_LIMIT),
    ),
    ("GroupConfig", "limit", Rule::AtMost(MAX_LIMIT)),
    ("TokenSpec", "name", Rule::Name(MAX_TOKEN_NAME_BYTES)),
    (
        "TokenSpec",
        "keys",
        Rule::Items(MAX_TOKEN_PATTERNS, Some(&KEY_PATTERN)),
    ),
    (
        "TokenSpec",
        "clientIds",
        Rule::Items(MAX_TOKEN_PATTERNS, Some(&CLIENT_ID_PATTERN)),
    ),
];

/// The rule of a path or query parameter, by name.
pub fn parameter(name: &str) -> Option<Rule> {
    match name {
        // Any page size parses (as a 64-bit unsigned integer); the node clamps it.
        "limit" => Some(Rule::AtMost(u64::MAX)),
        "key" => Some(Rule::Name(MAX_KEY_BYTES)),
        "group" => Some(Rule::Name(MAX_GROUP_BYTES)),
        "clientId" => Some(Rule::Name(MAX_CLIENT_ID_BYTES)),
        "requestId" => Some(Rule::Name(MAX_REQUEST_ID_BYTES)),
        _ => None,
    }
}

/// Writes every rule of [`PROPERTIES`] and the provisioning amount's into the
/// document's component schemas.
///
/// # Panics
/// When the table names a schema or property the document lacks: a renamed
/// field must rename its rule, caught by the document's test.
pub fn apply(schemas: &mut BTreeMap<String, RefOr<Schema>>) {
    for (schema, property, rule) in PROPERTIES {
        let Some(RefOr::T(Schema::Object(object))) = schemas.get_mut(*schema) else {
            panic!("no object schema {schema} for its limits");
        };
        let target = object
            .properties
            .get_mut(*property)
            .unwrap_or_else(|| panic!("no property {schema}.{property} for its limits"));
        constrain(target, *rule);
    }
    // `Amount` is a number of permits or `{"ratio"}` (untagged).
    if let Some(RefOr::T(Schema::OneOf(amount))) = schemas.get_mut("Amount") {
        for variant in &mut amount.items {
            match variant {
                RefOr::T(Schema::Object(object)) if object.properties.contains_key("ratio") => {
                    let ratio = object.properties.get_mut("ratio").expect("checked");
                    constrain(ratio, Rule::Ratio(MAX_PROVISIONING_RATIO));
                }
                other => constrain(other, Rule::AtMost(MAX_LIMIT)),
            }
        }
    }
}

/// Writes `rule` into `schema`, an integer, string, number or array schema.
pub fn constrain(schema: &mut RefOr<Schema>, rule: Rule) {
    match (schema, rule) {
        (RefOr::T(Schema::Object(object)), Rule::Name(max)) => {
            object.min_length = Some(1);
            object.max_length = Some(max);
            object.pattern = Some(PRINTABLE.to_owned());
        }
        (RefOr::T(Schema::Object(object)), Rule::AtMost(max)) => {
            object.minimum = Some(Number::UInt(0));
            object.maximum = Some(Number::UInt(max as usize));
        }
        (RefOr::T(Schema::Object(object)), Rule::Positive(max)) => {
            object.minimum = Some(Number::UInt(1));
            object.maximum = Some(Number::UInt(max as usize));
        }
        (RefOr::T(Schema::Object(object)), Rule::Ratio(max)) => {
            object.minimum = Some(Number::Float(0.0));
            object.maximum = Some(Number::Float(max));
        }
        (RefOr::T(Schema::Array(array)), Rule::Items(max, items)) => {
            array.max_items = Some(max);
            if let (Some(rule), ArrayItems::RefOrSchema(schema)) = (items, &mut array.items) {
                constrain(schema, *rule);
            }
        }
        (schema, rule) => panic!(
            "cannot write {rule:?} into {}",
            serde_json::to_string(schema).unwrap_or_default()
        ),
    }
}
