//! The one mapping from every failure the API can meet to an HTTP answer.
//!
//! Every error answers the contract's body (`{"error": {"code", "message",
//! "field"?}}`, [`permitd_core::contract::errors`]) with the status its code
//! implies; the unavailable ones (503, 429) carry `Retry-After`. A validation
//! error keeps its type up to here, so the answer names the offending field.
//! Internal details are logged here, not sent.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use permitd_core::contract::{headers, ErrorAnswer, ErrorCode};
use permitd_core::InvalidInput;
use permitd_storage::{NodeId, Refused};

use crate::leader::propose::ProposeError;
use crate::leader::round_error::RoundError;

/// Seconds a client should wait before retrying an unavailable node.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// Everything the API can answer other than success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A body, path or query that breaks a limit or cannot be parsed; the answer
    /// names the field when validation knew it.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// A path or query axum could not extract.
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("{0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("{message}")]
    Conflict { code: ErrorCode, message: String },
    #[error("request body is larger than {max} bytes")]
    PayloadTooLarge { max: usize },
    #[error("expected Content-Type: application/json")]
    UnsupportedMediaType,
    #[error("{message}")]
    TooMany { code: ErrorCode, message: String },
    /// An event stream's cursor that is not one (`field`: `cursor` or
    /// `Last-Event-ID`, where it came from).
    #[error("{error}")]
    Cursor {
        field: &'static str,
        error: permitd_core::contract::CursorError,
    },
    /// An event stream that cannot start (`too_far_behind`,
    /// `too_many_subscribers`).
    #[error("{message}")]
    Stream { code: ErrorCode, message: String },
    #[error("this node is not the leader")]
    NotLeader { leader: Option<NodeId> },
    #[error("no leader is known: the cluster has no quorum or is electing one")]
    NoQuorum,
    /// The leader leads but cannot commit: its followers do not answer.
    #[error("{0}")]
    CommitStalled(String),
    #[error("leadership changed before the request was answered; ask again")]
    LeaderChanged,
    /// The key was deleted right after the request's round: ask again.
    #[error("{0}")]
    KeyDeleted(String),
    #[error("the node is shutting down")]
    ShuttingDown,
    /// A follower could not reach the leader for a call, or the leader did not
    /// answer it in time; the answer names the leader, whom a client may reach.
    #[error("the leader (node {leader}) did not answer this node in time")]
    LeaderUnreachable { leader: NodeId },
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// openraft's "this node does not lead": `not_leader` naming the leader it
    /// knows, `no_quorum` while it knows none (an election runs).
    pub fn to_leader(leader: Option<NodeId>) -> Self {
        match leader {
            Some(leader) => Self::NotLeader {
                leader: Some(leader),
            },
            None => Self::NoQuorum,
        }
    }

    /// The code; its status follows from it ([`ErrorCode::status`]).
    fn code(&self) -> ErrorCode {
        match self {
            Self::Invalid(_) | Self::BadRequest(_) | Self::Cursor { .. } => ErrorCode::BadRequest,
            Self::Unauthorized(_) => ErrorCode::Unauthorized,
            Self::Forbidden(_) => ErrorCode::Forbidden,
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            Self::Conflict { code, .. }
            | Self::TooMany { code, .. }
            | Self::Stream { code, .. } => *code,
            Self::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::UnsupportedMediaType => ErrorCode::UnsupportedMediaType,
            Self::NotLeader { .. } => ErrorCode::NotLeader,
            Self::NoQuorum | Self::CommitStalled(_) => ErrorCode::NoQuorum,
            Self::LeaderChanged => ErrorCode::LeaderChanged,
            Self::KeyDeleted(_) => ErrorCode::KeyDeleted,
            Self::ShuttingDown => ErrorCode::ShuttingDown,
            Self::LeaderUnreachable { .. } => ErrorCode::Timeout,
            Self::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The answer's body, also what a batch item carries as its error.
    pub(crate) fn body(&self) -> ErrorAnswer {
        match self {
            Self::Invalid(error) => ErrorAnswer::from(error),
            Self::Cursor { field, error } => {
                let mut answer = ErrorAnswer::new(ErrorCode::BadRequest, error.to_string());
                answer.error.field = Some((*field).to_owned());
                answer
            }
            other => ErrorAnswer::new(other.code(), other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.code();
        let status =
            StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if let Self::Internal(detail) = &self {
            tracing::error!(%detail, "internal error");
        }
        let mut response = (status, Json(self.body())).into_response();
        let response_headers = response.headers_mut();
        if code.retry_after() {
            response_headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        if let Self::NotLeader {
            leader: Some(leader),
        }
        | Self::LeaderUnreachable { leader } = self
        {
            response_headers.insert(headers::LEADER, HeaderValue::from(leader));
        }
        response
    }
}

impl From<Refused> for ApiError {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::Rejected(error) => Self::Invalid(error),
            Refused::KeyLimit(error) => Self::TooMany {
                code: ErrorCode::TooManyKeys,
                message: error.to_string(),
            },
            Refused::NotRestored(reason) => Self::BadRequest(reason),
            Refused::KeyInUse(in_use) => Self::Conflict {
                code: ErrorCode::KeyInUse,
                message: in_use.to_string(),
            },
            other @ Refused::OtherAnswer { .. } => Self::Internal(other.to_string()),
        }
    }
}

impl From<ProposeError> for ApiError {
    fn from(error: ProposeError) -> Self {
        match error {
            ProposeError::NotLeader { leader } => Self::to_leader(leader),
            ProposeError::LeaderChanged => Self::LeaderChanged,
            ProposeError::ShuttingDown => Self::ShuttingDown,
            ProposeError::Raft(detail) | ProposeError::Encode(detail) => Self::Internal(detail),
        }
    }
}

impl From<RoundError> for ApiError {
    fn from(error: RoundError) -> Self {
        match error {
            RoundError::Propose(error) => error.into(),
            RoundError::TooManyPending { .. } => Self::TooMany {
                code: ErrorCode::TooManyPending,
                message: error.to_string(),
            },
            RoundError::LeaderFull { .. } => Self::TooMany {
                code: ErrorCode::Overloaded,
                message: error.to_string(),
            },
            RoundError::NoQuorum { .. } => Self::CommitStalled(error.to_string()),
            RoundError::Refused(refused) => refused.into(),
            RoundError::Mismatch => Self::Internal(error.to_string()),
            RoundError::KeyDeleted { .. } => Self::KeyDeleted(error.to_string()),
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
        assert_eq!(response.headers()[headers::LEADER], "2");
        let response = ApiError::BadRequest("x".into()).into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn a_propose_error_without_leader_is_no_quorum() {
        let error: ApiError = ProposeError::NotLeader { leader: None }.into();
        assert_eq!(error.code(), ErrorCode::NoQuorum);
    }

    #[test]
    fn a_full_or_stalled_leader_answers_503_with_its_own_code() {
        let full: ApiError = RoundError::LeaderFull {
            messages: 3,
            bytes: 9,
        }
        .into();
        assert_eq!(full.code(), ErrorCode::Overloaded);
        let stalled: ApiError = RoundError::NoQuorum { for_ms: 3_000 }.into();
        assert_eq!(stalled.code(), ErrorCode::NoQuorum);
        let response = stalled.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }

    #[tokio::test]
    async fn a_rejection_inside_apply_answers_400_naming_the_field() {
        let refused = Refused::Rejected(InvalidInput::TooMany {
            field: "groups".into(),
            len: 10_001,
            max: 10_000,
        });
        let response = ApiError::from(refused).into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let answer: ErrorAnswer = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer.error.code, ErrorCode::BadRequest);
        assert_eq!(answer.error.field.as_deref(), Some("groups"));
    }
}
