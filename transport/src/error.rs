//! Why a call through a transport failed, in the few kinds callers act on.

use crate::BoxError;

/// What went wrong, as far as a caller decides anything by it: a peer that
/// could not be reached is tried elsewhere or reported unreachable; a timeout
/// is reported as one; anything else is a failed exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportErrorKind {
    /// No connection could be made (refused, unreachable, connect timeout):
    /// the request was certainly not delivered.
    Connect,
    /// The request's [`crate::Deadline`] passed.
    Timeout,
    /// The request could not be built (a bad URI or header).
    Request,
    /// The connection failed during the exchange, or a body could not be read:
    /// the request may have been delivered.
    Exchange,
}

/// A failed call.
#[derive(Debug, thiserror::Error)]
#[error("{kind:?}: {source}")]
pub struct TransportError {
    pub kind: TransportErrorKind,
    #[source]
    pub source: BoxError,
}

impl TransportError {
    pub fn new(kind: TransportErrorKind, source: impl Into<BoxError>) -> Self {
        Self {
            kind,
            source: source.into(),
        }
    }

    pub fn is_connect(&self) -> bool {
        self.kind == TransportErrorKind::Connect
    }

    pub fn is_timeout(&self) -> bool {
        self.kind == TransportErrorKind::Timeout
    }

    /// The peer's host answered that nothing listens there (`ECONNREFUSED`):
    /// the process is gone, not merely slow or cut off, whose connection
    /// attempts time out instead.
    pub fn is_refused(&self) -> bool {
        if !self.is_connect() {
            return false;
        }
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*self.source);
        while let Some(error) = cause {
            if let Some(io) = error.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::ConnectionRefused {
                    return true;
                }
            }
            cause = error.source();
        }
        false
    }

    /// A body error: a transport's own error inside it keeps its kind, any
    /// other is an [`TransportErrorKind::Exchange`] failure.
    pub fn from_body(error: BoxError) -> Self {
        match error.downcast::<TransportError>() {
            Ok(error) => *error,
            Err(other) => match other.downcast::<reqwest::Error>() {
                Ok(error) => Self::from(*error),
                Err(other) => Self::new(TransportErrorKind::Exchange, other),
            },
        }
    }
}

impl From<reqwest::Error> for TransportError {
    fn from(error: reqwest::Error) -> Self {
        let kind = if error.is_timeout() {
            TransportErrorKind::Timeout
        } else if error.is_connect() {
            TransportErrorKind::Connect
        } else if error.is_builder() {
            TransportErrorKind::Request
        } else {
            TransportErrorKind::Exchange
        };
        Self::new(kind, error)
    }
}
