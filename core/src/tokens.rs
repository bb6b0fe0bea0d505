//! API tokens: roles, key and client-id patterns, and the replicated registry.
//!
//! A token is created by an admin and shown once; the registry keeps only the
//! SHA-256 of its secret (hex), its role and its patterns. The registry is part
//! of the replicated state: [`TokenRegistry::create`] and
//! [`TokenRegistry::revoke`] are applied from log entries, so a token's id is the
//! entry's log index and its creation time the leader's `now` in the entry. No
//! clock, no random source here: every replica reaches the same registry.
//!
//! Patterns are an exact string or a prefix ending in `*` (`acct-*`); `*` alone
//! matches everything.
//!
//! Invariants:
//! - at most [`MAX_TOKENS`] tokens; every field within its limit;
//! - a hash names at most one token (`by_hash` is the inverse of `tokens`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::contract::validate::{self, InvalidInput};
use crate::limits::{
    MAX_CLIENT_ID_BYTES, MAX_KEY_BYTES, MAX_TOKENS, MAX_TOKEN_NAME_BYTES, MAX_TOKEN_PATTERNS,
};

/// Length of a token hash: SHA-256 in lowercase hex.
pub const TOKEN_HASH_HEX_CHARS: usize = 64;

/// What a token may do.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    /// Request, sync and read usage, on its keys, as its client ids only.
    Runner,
    /// Read usage, configuration, the key list and metrics.
    Reader,
    /// Everything, tokens and `/cluster/*` included.
    Admin,
}

/// What an admin asks for in `POST /v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenSpec {
    pub name: String,
    pub role: Role,
    /// Key patterns a runner may use (ignored by the other roles' checks).
    #[serde(default)]
    pub keys: Vec<String>,
    /// `clientId` patterns a runner may send.
    #[serde(default)]
    pub client_ids: Vec<String>,
}

/// One token as the registry keeps it: no secret, only its hash.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRecord {
    /// The log index of the entry that created it.
    pub id: u64,
    /// SHA-256 of the secret, lowercase hex.
    pub hash: String,
    pub created_at_ms: u64,
    #[serde(flatten)]
    pub spec: TokenSpec,
}

// The hash is not a secret, but it is what a stolen state would be probed
// against: it stays out of logs all the same.
impl std::fmt::Debug for TokenRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRecord")
            .field("id", &self.id)
            .field("hash", &"<redacted>")
            .field("created_at_ms", &self.created_at_ms)
            .field("spec", &self.spec)
            .finish()
    }
}

/// What `GET /v1/tokens` shows of a token: everything but the hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    pub id: u64,
    pub created_at_ms: u64,
    #[serde(flatten)]
    pub spec: TokenSpec,
}

impl From<&TokenRecord> for TokenInfo {
    fn from(record: &TokenRecord) -> Self {
        Self {
            id: record.id,
            created_at_ms: record.created_at_ms,
            spec: record.spec.clone(),
        }
    }
}

/// The answer of `POST /v1/tokens`: the secret, shown this once, and the record.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreatedToken {
    pub token: String,
    #[serde(flatten)]
    pub info: TokenInfo,
}

impl std::fmt::Debug for CreatedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedToken")
            .field("token", &"<redacted>")
            .field("info", &self.info)
            .finish()
    }
}

/// The answer of `GET /v1/tokens`: no secrets, no hashes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenInfo>,
}

/// Why a registry change was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error("the cluster already holds {MAX_TOKENS} tokens; revoke one first")]
    Full,
    #[error("a token with this hash exists")]
    DuplicateHash,
}

impl From<TokenError> for InvalidInput {
    /// How a refusal inside apply travels back to the leader.
    fn from(error: TokenError) -> Self {
        match error {
            TokenError::Invalid(invalid) => invalid,
            TokenError::Full => InvalidInput::TooMany {
                field: "tokens".into(),
                len: MAX_TOKENS,
                max: MAX_TOKENS,
            },
            TokenError::DuplicateHash => InvalidInput::Malformed(error.to_string()),
        }
    }
}

/// Every live token, by id, with an index by hash.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<TokenRecord>", into = "Vec<TokenRecord>")]
pub struct TokenRegistry {
    tokens: BTreeMap<u64, TokenRecord>,
    by_hash: BTreeMap<String, u64>,
}

impl From<Vec<TokenRecord>> for TokenRegistry {
    fn from(records: Vec<TokenRecord>) -> Self {
        let mut registry = Self::default();
        for record in records {
            registry.by_hash.insert(record.hash.clone(), record.id);
            registry.tokens.insert(record.id, record);
        }
        registry
    }
}

impl From<TokenRegistry> for Vec<TokenRecord> {
    fn from(registry: TokenRegistry) -> Self {
        registry.tokens.into_values().collect()
    }
}

impl TokenRegistry {
    /// The token whose secret hashes to `hash`.
    pub fn by_hash(&self, hash: &str) -> Option<&TokenRecord> {
        self.by_hash.get(hash).and_then(|id| self.tokens.get(id))
    }

    /// Tokens in id order.
    pub fn list(&self) -> impl Iterator<Item = &TokenRecord> {
        self.tokens.values()
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Adds a token created by the entry at `log_index`.
    pub fn create(
        &mut self,
        log_index: u64,
        now_ms: u64,
        hash: &str,
        spec: &TokenSpec,
    ) -> Result<TokenInfo, TokenError> {
        validate_token_spec(spec)?;
        validate_hash(hash)?;
        if self.tokens.len() >= MAX_TOKENS {
            return Err(TokenError::Full);
        }
        if self.by_hash.contains_key(hash) {
            return Err(TokenError::DuplicateHash);
        }
        let record = TokenRecord {
            id: log_index,
            hash: hash.to_owned(),
            created_at_ms: now_ms,
            spec: spec.clone(),
        };
        let info = TokenInfo::from(&record);
        self.by_hash.insert(record.hash.clone(), log_index);
        self.tokens.insert(log_index, record);
        Ok(info)
    }

    /// Removes a token; `false` when there was none.
    pub fn revoke(&mut self, id: u64) -> bool {
        match self.tokens.remove(&id) {
            Some(record) => {
                self.by_hash.remove(&record.hash);
                true
            }
            None => false,
        }
    }
}

/// Whether `value` matches `pattern`: equal, or starting with the part of the
/// pattern before a trailing `*`.
pub fn pattern_matches(pattern: &str, value: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => value.starts_with(prefix),
        None => pattern == value,
    }
}

/// Whether any of `patterns` matches `value`.
pub fn any_matches(patterns: &[String], value: &str) -> bool {
    patterns
        .iter()
        .any(|pattern| pattern_matches(pattern, value))
}

/// Checks a spec against the limits: the one entry point for `POST /v1/tokens`.
pub fn validate_token_spec(spec: &TokenSpec) -> Result<(), InvalidInput> {
    validate::name("name", &spec.name, MAX_TOKEN_NAME_BYTES)?;
    check_patterns("keys", &spec.keys, MAX_KEY_BYTES)?;
    check_patterns("clientIds", &spec.client_ids, MAX_CLIENT_ID_BYTES)?;
    if spec.role == Role::Runner && (spec.keys.is_empty() || spec.client_ids.is_empty()) {
        return Err(InvalidInput::Empty {
            field: "keys and clientIds of a runner".into(),
        });
    }
    Ok(())
}

fn check_patterns(
    field: &'static str,
    patterns: &[String],
    max: usize,
) -> Result<(), InvalidInput> {
    validate::count(field, patterns.len(), MAX_TOKEN_PATTERNS)?;
    patterns
        .iter()
        .try_for_each(|pattern| validate::name(field, pattern, max))
}

fn validate_hash(hash: &str) -> Result<(), InvalidInput> {
    let well_formed = hash.len() == TOKEN_HASH_HEX_CHARS
        && hash
            .bytes()
            .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte));
    if well_formed {
        Ok(())
    } else {
        Err(InvalidInput::Malformed(
            "token hash must be 64 lowercase hex characters".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner(name: &str) -> TokenSpec {
        TokenSpec {
            name: name.into(),
            role: Role::Runner,
            keys: vec!["acct-*".into()],
            client_ids: vec!["eu-1".into()],
        }
    }

    fn hash(n: u8) -> String {
        format!("{n:02x}").repeat(32)
    }

    #[test]
    fn patterns_are_exact_or_a_trailing_star_prefix() {
        assert!(pattern_matches("acct-*", "acct-7"));
        assert!(pattern_matches("acct-*", "acct-"));
        assert!(!pattern_matches("acct-*", "acc"));
        assert!(pattern_matches("a", "a"));
        assert!(!pattern_matches("a", "ab"));
        assert!(pattern_matches("*", "anything"));
        // A star anywhere but last is a literal character.
        assert!(!pattern_matches("a*b", "axb"));
    }

    #[test]
    fn create_and_revoke_keep_the_hash_index() {
        let mut registry = TokenRegistry::default();
        let info = registry.create(7, 100, &hash(1), &runner("r")).unwrap();
        assert_eq!((info.id, info.created_at_ms), (7, 100));
        assert_eq!(registry.by_hash(&hash(1)).unwrap().id, 7);
        assert_eq!(
            registry.create(8, 100, &hash(1), &runner("r")),
            Err(TokenError::DuplicateHash)
        );
        assert!(registry.revoke(7));
        assert!(!registry.revoke(7));
        assert!(registry.by_hash(&hash(1)).is_none());
    }

    #[test]
    fn refusals_change_nothing() {
        let mut registry = TokenRegistry::default();
        let mut bad = runner("r");
        bad.client_ids.clear();
        assert!(registry.create(1, 0, &hash(1), &bad).is_err());
        assert!(registry.create(1, 0, "ABC", &runner("r")).is_err());
        let mut long = runner("r");
        long.name = "n".repeat(MAX_TOKEN_NAME_BYTES + 1);
        assert!(registry.create(1, 0, &hash(1), &long).is_err());
        assert!(registry.is_empty());
    }

    #[test]
    fn the_registry_is_bounded() {
        let mut registry = TokenRegistry::default();
        for index in 0..MAX_TOKENS as u64 {
            let hash = format!("{index:064x}");
            registry.create(index, 0, &hash, &runner("r")).unwrap();
        }
        let next = format!("{:064x}", MAX_TOKENS + 1);
        assert_eq!(
            registry.create(u64::MAX, 0, &next, &runner("r")),
            Err(TokenError::Full)
        );
    }

    #[test]
    fn the_registry_round_trips_through_json_without_changing() {
        let mut registry = TokenRegistry::default();
        registry.create(3, 1, &hash(3), &runner("a")).unwrap();
        registry.create(5, 2, &hash(5), &runner("b")).unwrap();
        let json = serde_json::to_string(&registry).unwrap();
        let back: TokenRegistry = serde_json::from_str(&json).unwrap();
        assert_eq!(back, registry);
        assert!(!format!("{:?}", registry.by_hash(&hash(3))).contains(&hash(3)));
    }
}
