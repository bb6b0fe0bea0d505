//! Why a request or sync parked on the leader got no answer: the one error of
//! the rounds driver, mapped to HTTP by the edge (`edge/error.rs`).

use permitd_storage::Refused;

use super::propose::ProposeError;
use super::schedule::CannotPark;

/// Why a request or sync got no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RoundError {
    #[error(transparent)]
    Propose(#[from] ProposeError),
    #[error("{pending} requests already wait for this key's round")]
    TooManyPending { pending: usize },
    #[error("the leader already holds {messages} waiting messages ({bytes} bytes), its limit")]
    LeaderFull { messages: usize, bytes: usize },
    #[error(
        "the leader has not committed for {for_ms} ms: no quorum answers it \
         (a retry with the same requestId is safe)"
    )]
    NoQuorum { for_ms: u64 },
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("the round's result did not match its requests")]
    Mismatch,
    #[error(
        "the key was deleted (entry {log_index}) right after this round: the grants it \
         answered were released with it; ask again"
    )]
    KeyDeleted { log_index: u64 },
}

impl From<CannotPark> for RoundError {
    fn from(refusal: CannotPark) -> Self {
        match refusal {
            CannotPark::KeyFull { pending } => Self::TooManyPending { pending },
            CannotPark::LeaderFull { messages, bytes } => Self::LeaderFull { messages, bytes },
            CannotPark::Stalled { for_ms } => Self::NoQuorum { for_ms },
        }
    }
}
