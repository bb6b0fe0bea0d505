//! The error answer: `{"error": {"code", "message", "field"?}}` with the status
//! its code implies.
//!
//! Codes are stable, snake_case, and each maps to exactly one HTTP status
//! ([`ErrorCode::status`]); the unavailable ones (429 and 503) come with
//! `Retry-After`. `message` is for people and may change; `field` names the
//! offending input field when validation knows it.

use serde::{Deserialize, Serialize};

use crate::contract::validate::InvalidInput;

/// Every error code a node answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the body, path or query is malformed or breaks a limit.
    BadRequest,
    /// 401: no bearer token, or an unknown or revoked one (or, on `/raft/*`,
    /// not the peer secret).
    Unauthorized,
    /// 403: a known token outside its role, keys or client ids.
    Forbidden,
    /// 404: no such route.
    NotFound,
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 409: `POST /cluster/init` on a node that already belongs to a cluster.
    AlreadyInitialized,
    /// 409: openraft refused a membership change (say, a voter that is no member).
    MembershipConflict,
    /// 409: the cluster already holds the most API tokens it may.
    TooManyTokens,
    /// 409: `DELETE /v1/semaphores/{key}` without `force` of a key with
    /// grants, leases or requests waiting for its round.
    KeyInUse,
    /// 410: an event stream's `from` is older than the oldest event this node
    /// still keeps, or the stream fell further behind than the buffer.
    TooFarBehind,
    /// 413: the body is larger than the limit.
    PayloadTooLarge,
    /// 415: the body is not `application/json`.
    UnsupportedMediaType,
    /// 429: too many requests already wait for this key's round.
    TooManyPending,
    /// 429: the cluster already holds the most keys it may.
    TooManyKeys,
    /// 429: this node already serves the most event streams it may.
    TooManySubscribers,
    /// 503: this node does not lead; the leader header names the one that does.
    NotLeader,
    /// 503: no leader is known (no quorum, or an election is running), or the
    /// leader has not been able to commit for `[limits] commit_timeout_ms` (its
    /// followers do not answer); a call that may have entered the log is safe to
    /// retry with the same `requestId`.
    NoQuorum,
    /// 503: leadership changed before the call was answered; the entry may or
    /// may not have committed, so ask again (a `requestId` makes that safe).
    LeaderChanged,
    /// 503: the key was deleted right after the request's round committed: the
    /// grants it answered were released with the key, so ask again (a new
    /// round, on the key as the delete left it).
    KeyDeleted,
    /// 503: the node is shutting down.
    ShuttingDown,
    /// 503: the leader already holds its most waiting requests and syncs, or
    /// their most bytes (`[limits] max_parked_messages`, `max_parked_bytes`).
    Overloaded,
    /// 503: the leader did not answer a forwarded call in time.
    Timeout,
    /// 500: a bug; the node logged the details.
    Internal,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [Self; 23] = [
        Self::BadRequest,
        Self::Unauthorized,
        Self::Forbidden,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::AlreadyInitialized,
        Self::MembershipConflict,
        Self::TooManyTokens,
        Self::KeyInUse,
        Self::TooFarBehind,
        Self::PayloadTooLarge,
        Self::UnsupportedMediaType,
        Self::TooManyPending,
        Self::TooManyKeys,
        Self::TooManySubscribers,
        Self::NotLeader,
        Self::NoQuorum,
        Self::LeaderChanged,
        Self::KeyDeleted,
        Self::ShuttingDown,
        Self::Overloaded,
        Self::Timeout,
        Self::Internal,
    ];

    /// The wire spelling (what serde writes).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::AlreadyInitialized => "already_initialized",
            Self::MembershipConflict => "membership_conflict",
            Self::TooManyTokens => "too_many_tokens",
            Self::KeyInUse => "key_in_use",
            Self::TooFarBehind => "too_far_behind",
            Self::PayloadTooLarge => "payload_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::TooManyPending => "too_many_pending",
            Self::TooManyKeys => "too_many_keys",
            Self::TooManySubscribers => "too_many_subscribers",
            Self::NotLeader => "not_leader",
            Self::NoQuorum => "no_quorum",
            Self::LeaderChanged => "leader_changed",
            Self::KeyDeleted => "key_deleted",
            Self::ShuttingDown => "shutting_down",
            Self::Overloaded => "overloaded",
            Self::Timeout => "timeout",
            Self::Internal => "internal",
        }
    }

    /// The one HTTP status this code is sent with.
    pub const fn status(self) -> u16 {
        match self {
            Self::BadRequest => 400,
            Self::Unauthorized => 401,
            Self::Forbidden => 403,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::AlreadyInitialized
            | Self::MembershipConflict
            | Self::TooManyTokens
            | Self::KeyInUse => 409,
            Self::TooFarBehind => 410,
            Self::PayloadTooLarge => 413,
            Self::UnsupportedMediaType => 415,
            Self::TooManyPending | Self::TooManyKeys | Self::TooManySubscribers => 429,
            Self::NotLeader
            | Self::NoQuorum
            | Self::LeaderChanged
            | Self::KeyDeleted
            | Self::ShuttingDown
            | Self::Overloaded
            | Self::Timeout => 503,
            Self::Internal => 500,
        }
    }

    /// Whether the answer carries `Retry-After`: the call may succeed later, on
    /// this node or another, without changing it.
    pub const fn retry_after(self) -> bool {
        matches!(self.status(), 429 | 503)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorAnswer {
    pub error: ErrorBody,
}

/// What went wrong, for programs (`code`, `field`) and for people (`message`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    /// The offending input field as the wire spells it (`demand.count`,
    /// `clientId`), when validation named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ErrorAnswer {
    /// An answer without a field.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            error: ErrorBody {
                code,
                message: message.into(),
                field: None,
            },
        }
    }
}

impl From<&InvalidInput> for ErrorAnswer {
    fn from(error: &InvalidInput) -> Self {
        let mut answer = Self::new(ErrorCode::BadRequest, error.to_string());
        answer.error.field = error.field().map(str::to_owned);
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialise_as_their_wire_spelling() {
        for code in ErrorCode::ALL {
            let text = serde_json::to_string(&code).unwrap();
            assert_eq!(text, format!("\"{code}\""));
            assert_eq!(serde_json::from_str::<ErrorCode>(&text).unwrap(), code);
        }
        assert_eq!(ErrorCode::TooManyPending.as_str(), "too_many_pending");
    }

    #[test]
    fn unavailable_codes_and_only_they_ask_for_a_retry() {
        assert!(ErrorCode::NoQuorum.retry_after());
        assert!(ErrorCode::TooManyKeys.retry_after());
        assert!(!ErrorCode::BadRequest.retry_after());
        assert!(!ErrorCode::Internal.retry_after());
    }

    #[test]
    fn a_validation_error_names_its_field() {
        let error = InvalidInput::Empty {
            field: "clientId".into(),
        };
        let body = serde_json::to_value(ErrorAnswer::from(&error)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {
                "code": "bad_request",
                "message": "clientId must not be empty",
                "field": "clientId"
            }})
        );
    }
}
