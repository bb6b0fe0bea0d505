//! The crate's one error enum, and its mapping onto openraft's storage errors.

use std::path::PathBuf;

use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};

use crate::NodeId;

/// Everything that can go wrong in this crate.
///
/// Start-up errors name the data dir so that an operator knows which one to look
/// at; none of them is a panic.
#[derive(thiserror::Error, Debug)]
pub enum StorageError {
    #[error("cannot use the data dir {dir}: {detail}")]
    Locked { dir: PathBuf, detail: String },
    #[error("cannot create the data dir {dir}: {source}")]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the data dir {dir} is not compatible with this build: {detail}")]
    Incompatible { dir: PathBuf, detail: String },
    #[error("a store holds 1 to {max} shards, not {asked}")]
    ShardCount { asked: u32, max: u32 },
    #[error("the data dir {dir} holds corrupt data: {detail}")]
    Corrupt { dir: PathBuf, detail: String },
    #[error("encoding: {0}")]
    Codec(#[from] crate::codec::CodecError),
    #[error("snapshot: {0}")]
    Snapshot(String),
    /// A file operation of the write-ahead log failed.
    #[error("write-ahead log: cannot {action} {path}: {source}")]
    WalIo {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An earlier write or fsync of the write-ahead log failed: the page cache
    /// may hold anything, so the log refuses every later write (the node stops
    /// and a restart recovers from what is on disk).
    #[error("the write-ahead log failed earlier and refuses writes: {0}")]
    WalFailed(String),
    /// A record over `max` bytes is refused before it is written.
    #[error("a write-ahead log record of {bytes} bytes is over the limit of {max} bytes")]
    RecordTooLarge { bytes: usize, max: usize },
    /// Entries given to the log out of order (openraft never does this).
    #[error("log entries out of order: {0}")]
    OutOfOrder(String),
}

/// openraft's error type, as its traits return it.
pub type RaftError = openraft::StorageError<NodeId>;

impl StorageError {
    /// This error as openraft's storage error about `subject` while doing `verb`.
    pub(crate) fn into_raft(self, subject: ErrorSubject<NodeId>, verb: ErrorVerb) -> RaftError {
        StorageIOError::new(subject, verb, AnyError::new(&self)).into()
    }
}

/// Shorthands for the subjects openraft's errors name.
pub(crate) fn read_logs(error: impl Into<StorageError>) -> RaftError {
    error.into().into_raft(ErrorSubject::Logs, ErrorVerb::Read)
}

pub(crate) fn write_logs(error: impl Into<StorageError>) -> RaftError {
    error.into().into_raft(ErrorSubject::Logs, ErrorVerb::Write)
}

pub(crate) fn write_vote(error: impl Into<StorageError>) -> RaftError {
    error.into().into_raft(ErrorSubject::Vote, ErrorVerb::Write)
}

pub(crate) fn read_state_machine(error: impl Into<StorageError>) -> RaftError {
    error
        .into()
        .into_raft(ErrorSubject::StateMachine, ErrorVerb::Read)
}

pub(crate) fn read_snapshot(error: impl Into<StorageError>) -> RaftError {
    error
        .into()
        .into_raft(ErrorSubject::Snapshot(None), ErrorVerb::Read)
}

pub(crate) fn write_snapshot(error: impl Into<StorageError>) -> RaftError {
    error
        .into()
        .into_raft(ErrorSubject::Snapshot(None), ErrorVerb::Write)
}
