//! The one mapping from every failure the API can meet to an HTTP answer.
//!
//! Every error answers `{"error": {"code", "message"}}` with an exact status;
//! the unavailable ones (503, 429) carry `Retry-After`. Internal details are
//! logged here, not sent.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use permitd_core::InvalidInput;
use permitd_storage::NodeId;
use serde_json::json;

use crate::propose::ProposeError;
use crate::rounds::RoundError;

/// Seconds a client should wait before retrying an unavailable node.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// The header that names the leader on every v1 answer.
pub const LEADER_HEADER: &str = "x-permitd-leader";

/// Everything the API can answer other than success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("{0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    #[error("request body is larger than {max} bytes")]
    PayloadTooLarge { max: usize },
    #[error("expected Content-Type: application/json")]
    UnsupportedMediaType,
    #[error("{message}")]
    TooMany { code: &'static str, message: String },
    #[error("this node is not the leader")]
    NotLeader { leader: Option<NodeId> },
    #[error("no leader is known: the cluster has no quorum or is electing one")]
    NoQuorum,
    #[error("leadership changed before the request was answered; ask again")]
    LeaderChanged,
    #[error("the node is shutting down")]
    ShuttingDown,
    #[error("the leader did not answer in time")]
    Timeout,
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::Conflict { code, .. } => (StatusCode::CONFLICT, code),
            Self::PayloadTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Self::TooMany { code, .. } => (StatusCode::TOO_MANY_REQUESTS, code),
            Self::NotLeader { .. } => (StatusCode::SERVICE_UNAVAILABLE, "not_leader"),
            Self::NoQuorum => (StatusCode::SERVICE_UNAVAILABLE, "no_quorum"),
            Self::LeaderChanged => (StatusCode::SERVICE_UNAVAILABLE, "leader_changed"),
            Self::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            Self::Timeout => (StatusCode::SERVICE_UNAVAILABLE, "timeout"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    fn retry_after(&self) -> bool {
        matches!(
            self,
            Self::TooMany { .. }
                | Self::NotLeader { .. }
                | Self::NoQuorum
                | Self::LeaderChanged
                | Self::ShuttingDown
                | Self::Timeout
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if let Self::Internal(detail) = &self {
            tracing::error!(%detail, "internal error");
        }
        let body = json!({"error": {"code": code, "message": self.to_string()}});
        let mut response = (status, Json(body)).into_response();
        let headers = response.headers_mut();
        if self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        if let Self::NotLeader {
            leader: Some(leader),
        } = self
        {
            headers.insert(LEADER_HEADER, HeaderValue::from(leader));
        }
        response
    }
}

impl From<InvalidInput> for ApiError {
    fn from(error: InvalidInput) -> Self {
        Self::BadRequest(error.to_string())
    }
}

impl From<ProposeError> for ApiError {
    fn from(error: ProposeError) -> Self {
        match error {
            ProposeError::NotLeader { leader: None } => Self::NoQuorum,
            ProposeError::NotLeader { leader } => Self::NotLeader { leader },
            ProposeError::LeaderChanged => Self::LeaderChanged,
            ProposeError::ShuttingDown => Self::ShuttingDown,
            ProposeError::Raft(detail) => Self::Internal(detail),
        }
    }
}

impl From<RoundError> for ApiError {
    fn from(error: RoundError) -> Self {
        match error {
            RoundError::Propose(error) => error.into(),
            RoundError::TooManyPending { .. } => Self::TooMany {
                code: "too_many_pending",
                message: error.to_string(),
            },
            RoundError::Mismatch => Self::Internal(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_answers_carry_retry_after_and_the_leader() {
        let response = ApiError::NotLeader { leader: Some(2) }.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
        assert_eq!(response.headers()[LEADER_HEADER], "2");
        let response = ApiError::BadRequest("x".into()).into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn a_propose_error_without_leader_is_no_quorum() {
        let error: ApiError = ProposeError::NotLeader { leader: None }.into();
        assert_eq!(error.status_and_code().1, "no_quorum");
    }
}
