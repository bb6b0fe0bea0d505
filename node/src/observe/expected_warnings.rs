//! Warnings a dependency logs for what is normal here, kept off the node's log
//! so that a healthy start prints no `WARN` line and a real one stands out.
//!
//! - openraft 0.9 warns "A message will be ignored because vote changed ...
//!   (VoteResponse)" for every vote answer that reaches a candidate after it
//!   has already won (or left) the election. With three voters the candidate
//!   wins on the first answer, so the second one arrives late in every
//!   election: five such lines on a first `permitd up`. Dropping a late answer
//!   is exactly right; nothing is wrong. The same warning for any other message
//!   (a stale `HigherVote`, a replication answer from an old term) is kept.
//!
//! The filter looks at events of openraft's core at `WARN` only, so every
//! other event pays one target comparison.

use std::fmt::Debug;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata};
use tracing_subscriber::layer::{Context, Filter};

/// Where openraft logs the late vote answer.
const RAFT_CORE_TARGET: &str = "openraft::core::raft_core";
/// How its message begins and ends when the late message is a vote answer.
const VOTE_CHANGED: &str = "A message will be ignored because vote changed";
const LATE_VOTE_RESPONSE: &str = "when (VoteResponse)";

/// A per-layer filter that drops the expected warnings listed above.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExpectedWarnings;

impl<S> Filter<S> for ExpectedWarnings {
    fn enabled(&self, _metadata: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        !is_late_vote_response(event)
    }
}

fn is_late_vote_response(event: &Event<'_>) -> bool {
    let metadata = event.metadata();
    if *metadata.level() != Level::WARN || metadata.target() != RAFT_CORE_TARGET {
        return false;
    }
    let mut message = Message::default();
    event.record(&mut message);
    is_late_vote_response_message(&message.0)
}

fn is_late_vote_response_message(message: &str) -> bool {
    message.starts_with(VOTE_CHANGED) && message.ends_with(LATE_VOTE_RESPONSE)
}

/// The formatted `message` field of an event.
#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_late_vote_answer_is_expected() {
        let late = "A message will be ignored because vote changed: msg sent by vote: \
                    T1-N1:uncommitted; current my vote: None; when (VoteResponse)";
        assert!(is_late_vote_response_message(late));
        let higher = "A message will be ignored because vote changed: msg sent by vote: \
                      T2-N3:uncommitted; current my vote: None; when (HigherVote)";
        assert!(!is_late_vote_response_message(higher));
        assert!(!is_late_vote_response_message("the Raft core stopped"));
    }
}
