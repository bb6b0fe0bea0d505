//! The client crate's errors: one enum for calls to the cluster, one for
//! acquiring a permit, one for the queue.

use std::path::PathBuf;
use std::time::Duration;

use permitd_core::contract::ErrorCode;

/// Why a call to the cluster failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The client was built without any node URL.
    #[error("no endpoints configured")]
    NoEndpoints,
    /// A node URL could not be parsed or cannot serve as a base URL.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    /// The HTTP client could not be built (TLS backend, for instance).
    #[error("cannot build the HTTP client: {0}")]
    Build(String),
    /// The server answered with a non-retryable error (4xx other than 429) in
    /// the contract's error body.
    #[error("{status} {code}: {message}")]
    Rejected {
        status: u16,
        code: ErrorCode,
        message: String,
        /// The offending input field, when the server named one.
        field: Option<String>,
    },
    /// Something answered an error without the contract's body (a proxy in
    /// front of the cluster, say); `body` is its start.
    #[error("{status}: {body}")]
    Http { status: u16, body: String },
    /// The per-call deadline passed while the call was still being retried.
    #[error("no answer within {deadline:?} after {attempts} attempts; last error: {last}")]
    DeadlineExceeded {
        deadline: Duration,
        attempts: u32,
        last: String,
    },
    /// The server answered 2xx with a body that is not the expected shape.
    #[error("unexpected answer from {url}: {reason}")]
    UnexpectedAnswer { url: String, reason: String },
}

impl ClientError {
    /// The server's error code, when the server rejected the call.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Rejected { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The input field the server named in its rejection, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Rejected { field, .. } => field.as_deref(),
            _ => None,
        }
    }
}

/// Why [`crate::SemaphoreClient::acquire`] gave up. Whatever was granted by
/// then is released.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    /// A permit of zero permits was asked for.
    #[error("a permit needs a count of at least 1")]
    ZeroCount,
    /// The group is configured `permitted: false`: waiting would never end.
    #[error("group {group:?} of key {key:?} is not permitted")]
    NotPermitted { key: String, group: String },
    /// The caller's timeout passed before enough was granted.
    #[error("no permit of key {key:?} within {waited:?}")]
    Timeout { key: String, waited: Duration },
    /// The caller cancelled the acquisition.
    #[error("acquiring a permit of key {key:?} was cancelled")]
    Cancelled { key: String },
    /// A call to the cluster failed.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Why a queue operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The queue's dir or journal could not be opened, read, written or synced.
    #[error("queue store: {0}")]
    Store(#[from] std::io::Error),
    /// The queue's journal is not one this build can read.
    #[error("queue store {path:?} cannot be read: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// The queue dir was written by the sled store of an earlier build.
    #[error(
        "queue dir {path:?} holds a queue in the sled format of permitd builds before \
         the journal store, which this build does not read: finish its work with the \
         build that wrote it (release every item, then shut the queue down), or \
         force-release this client's permits (POST /v1/semaphores/{{key}}/clients/{{clientId}}/release), \
         then remove the dir (docs/operations.md, \"The queue's store\")"
    )]
    SledFormat { path: PathBuf },
    /// Another handle (this process or another) has the queue dir open.
    #[error("queue dir {path:?} is open in another queue (its lock is held)")]
    Locked { path: PathBuf },
    /// A record larger than the journal takes.
    #[error("queue store record of {bytes} bytes is over the {max} bytes a record may hold")]
    RecordTooLarge { bytes: usize, max: usize },
    /// A stored record could not be encoded or decoded.
    #[error("queue store record {record:?}: {source}")]
    Codec {
        record: String,
        #[source]
        source: serde_json::Error,
    },
    /// The queue's store belongs to another client id.
    #[error("the queue store belongs to client {stored:?}, not {configured:?}")]
    ClientIdMismatch { stored: String, configured: String },
    /// An enqueued item breaks a limit (empty or overlong id, key or group).
    #[error("invalid item {id:?}: {reason}")]
    InvalidItem { id: String, reason: String },
    /// The queue was shut down.
    #[error("the queue is shut down")]
    Shutdown,
    /// A write of the queue's store failed, so the queue stopped: it admits
    /// and sends nothing more (what it would could not be made durable, and a
    /// crash would then lose a claim or a drawn permit). Every later call fails
    /// with this; start a new queue on a working store, which reports and
    /// admits again what was durable.
    #[error("the queue stopped: its store failed: {0}")]
    StoreFailed(String),
}
