//! Whether this follower can reach its leader's API: what `/readyz` says.
//!
//! A follower that hears the leader's appends knows a leader, but that says
//! nothing of the other direction: with its own calls to the leader cut, every
//! call it forwards fails while Raft looks healthy. So readiness follows the
//! forwarding path itself: every forwarded call that the leader answers (with
//! anything but a 503) counts as a contact, every call that cannot reach it as
//! a failure, and while no call told it within [`ForwardTimings::reach`], a
//! task asks the leader's `/readyz` over the same transport (the same pool, the
//! same limits) at that interval, and at once when the leader changes.
//!
//! Rules:
//! - a leader this node has not tried yet counts as reachable (a new leader
//!   is ready on every follower at once; the probe follows straight away);
//! - the last word about the current leader decides, whether it came from a
//!   call or a probe;
//! - a leader that answered its probe with 503 (it cannot commit) makes this
//!   node unready too: its forwarded calls would get that 503.
//!
//! [`ForwardTimings::reach`]: super::deadline::ForwardTimings::reach

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::Request;
use permitd_core::contract::{headers, paths, ErrorAnswer, Serving};
use permitd_storage::NodeId;
use permitd_transport::{Deadline, Transport, TransportError, TransportErrorKind};
use tokio::time::Instant;

use crate::edge::error::ApiError;

/// The last thing learned about reaching a leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contact {
    /// The leader answered a call or a probe.
    Answered,
    /// The leader answered its probe, but is not ready: its error message.
    NotReady(String),
    /// No answer: no connection, or nothing acknowledged in time.
    Unreached,
}

/// What this node last learned about reaching each leader's API (with
/// shards, several nodes lead at once; at most one entry per node of the
/// cluster).
#[derive(Debug, Default)]
pub struct LeaderReach {
    /// A std mutex: held for a copy, never across an await.
    last: Mutex<BTreeMap<NodeId, (Contact, Instant)>>,
}

impl LeaderReach {
    /// Records what a call or probe to `leader` found.
    pub fn record(&self, leader: NodeId, contact: Contact) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        // Logged when the kind changes, not the wording (a stalled leader's
        // message counts the ms it has been stalled).
        let kind = std::mem::discriminant(&contact);
        let seen = last
            .get(&leader)
            .map(|(seen, _)| std::mem::discriminant(seen));
        if seen != Some(kind) {
            tracing::info!(leader, ?contact, "reaching the leader's API");
        }
        last.insert(leader, (contact, Instant::now()));
    }

    /// The last contact with `leader`, and when; `None` if it was never tried.
    pub fn with(&self, leader: NodeId) -> Option<(Contact, Instant)> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.get(&leader).cloned()
    }
}

/// How a follower that names `leader` answers v1 calls, from what it last
/// learned about reaching it (`None`: not tried yet): forwarded, or the error a
/// call would get now.
pub fn follower_serving(leader: NodeId, last: Option<Contact>) -> Result<Serving, ApiError> {
    match last {
        Some(Contact::Unreached) => Err(ApiError::LeaderUnreachable { leader }),
        Some(Contact::NotReady(why)) => Err(ApiError::CommitStalled(format!(
            "the leader (node {leader}) is not ready: {why}"
        ))),
        Some(Contact::Answered) | None => Ok(Serving::Forwarded),
    }
}

impl LeaderReach {
    /// Whether `leader` is due a probe: no call or probe answered within
    /// `every`.
    pub fn due(&self, leader: NodeId, every: Duration) -> bool {
        match self.with(leader) {
            Some((Contact::Answered, at)) => at.elapsed() >= every,
            _ => true,
        }
    }
}

/// Asks the `/readyz` of the leader at `base` about `shard`, one it leads,
/// within `timeout`. About that shard alone: a node's readiness over every
/// shard depends on the leaders it follows, and asking that would chain
/// every node's readiness to every other's.
pub async fn probe(transport: &Transport, base: &str, shard: u32, timeout: Duration) -> Contact {
    match ask_readyz(transport, base, shard, timeout).await {
        Ok(contact) => contact,
        Err(error) => {
            tracing::debug!(%error, base, "probing the leader failed");
            Contact::Unreached
        }
    }
}

/// What the leader's `/readyz` answered; an error when it did not answer.
async fn ask_readyz(
    transport: &Transport,
    base: &str,
    shard: u32,
    timeout: Duration,
) -> Result<Contact, TransportError> {
    let mut request = Request::get(format!("{base}{}", paths::READYZ))
        .header(headers::SHARD, shard)
        .body(Bytes::new())
        .map_err(|error| TransportError::new(TransportErrorKind::Request, error))?;
    request.extensions_mut().insert(Deadline(timeout));
    let answer = transport.send(request).await?;
    if answer.status().is_success() {
        return Ok(Contact::Answered);
    }
    let body = permitd_transport::collect(answer.into_body()).await?;
    Ok(match serde_json::from_slice::<ErrorAnswer>(&body) {
        Ok(error) => Contact::NotReady(error.error.message),
        Err(_) => Contact::Unreached,
    })
}

#[cfg(test)]
mod tests {
    use permitd_core::contract::ErrorCode;

    use super::*;

    fn code(result: Result<Serving, ApiError>) -> ErrorCode {
        result.expect_err("not ready").body().error.code
    }

    #[test]
    fn the_last_word_about_the_current_leader_decides() {
        let reach = LeaderReach::default();
        assert_eq!(reach.with(1), None);
        reach.record(1, Contact::Answered);
        reach.record(1, Contact::Unreached);
        assert_eq!(
            reach.with(1).map(|(contact, _)| contact),
            Some(Contact::Unreached)
        );
        // Another leader's contact says nothing of this one.
        assert_eq!(reach.with(2), None);
        reach.record(1, Contact::Answered);
        assert_eq!(
            reach.with(1).map(|(contact, _)| contact),
            Some(Contact::Answered)
        );
    }

    #[test]
    fn a_follower_is_ready_unless_its_leader_was_not_reached_or_not_ready() {
        assert_eq!(follower_serving(1, None).ok(), Some(Serving::Forwarded));
        let answered = follower_serving(1, Some(Contact::Answered));
        assert_eq!(answered.ok(), Some(Serving::Forwarded));
        let unreached = follower_serving(1, Some(Contact::Unreached));
        assert_eq!(code(unreached), ErrorCode::Timeout);
        let stalled = follower_serving(1, Some(Contact::NotReady("no quorum".into())));
        assert_eq!(code(stalled), ErrorCode::NoQuorum);
    }
}
