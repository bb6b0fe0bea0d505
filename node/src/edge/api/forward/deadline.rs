//! How long a follower waits on the leader for a forwarded call, from the
//! node's Raft timings and what the call itself may wait.
//!
//! Two limits, for two different failures:
//!
//! - **Reaching the leader** ([`ForwardTimings::reach`], `rpc_timeout_ms`, the
//!   patience Raft gives a peer's call): the leader must accept a connection
//!   within it, and its kernel must acknowledge what was sent on a connection
//!   within it (`TCP_USER_TIMEOUT`; keep-alive probes check an idle pooled
//!   connection the same way). A cut path, in either direction, thus fails a
//!   call within about `rpc_timeout_ms`, however long the call could have
//!   waited: the kernel's acknowledgements do not wait for the leader's answer.
//!   A much shorter limit would make one lost packet look like a cut (the
//!   kernel sends a lost segment again after at least 200 ms, a SYN after 1 s).
//! - **The leader's answer** ([`deadline`]): what the call may
//!   legitimately wait on the leader, plus the leader's own commit timeout
//!   (after which the leader answers `no_quorum` itself), plus the reach limit
//!   twice (the way there and the answer's way back), plus the time the body
//!   takes to send at the Raft transport's slow rate. A request held for its
//!   round is never cut off by the follower before the leader answers it.
//!
//! What a call may wait ([`may_wait`]): a semaphore message waits for its key's
//! round (at most `max(roundWaitMs, roundPeriodMs)` after it arrives) and, when
//! held, for `waitMs` and the key's next round after that; a batch as long as
//! its slowest item. The key's timings are this node's replicated configuration
//! (a change not yet applied here can only have been made moments ago). A
//! backup (`GET /cluster/snapshot`) is built whole on the leader, under its
//! state's read lock, before a byte of it is sent: on a large state that takes
//! seconds, so it keeps [`BACKUP_MAY_WAIT`]. Every other call waits for one
//! commit or one read confirmation at most.

use std::borrow::Cow;
use std::time::Duration;

use permitd_core::limits::MAX_REQUEST_WAIT_MS;
use serde::Deserialize;

use crate::config::ForwardTimings;

/// How long a forwarded backup may take on the leader: the flat limit every
/// forwarded call had before deadlines followed the call (100,000 keys made a
/// 25 MB backup in well under a second; the state may hold ten times more).
pub const BACKUP_MAY_WAIT: Duration = Duration::from_secs(60);

/// The deadline of a forwarded call of `body_bytes` that may wait `may_wait`
/// on the leader before its round answers it.
pub fn deadline(timings: &ForwardTimings, may_wait: Duration, body_bytes: usize) -> Duration {
    let sending = crate::raft::network::append_timeout(Duration::ZERO, body_bytes);
    may_wait + timings.commit_timeout + 2 * timings.reach + sending
}

/// One semaphore message, as far as its wait goes.
#[derive(Deserialize)]
struct Held {
    #[serde(rename = "waitMs", default)]
    wait_ms: Option<u64>,
}

/// One batch item: its key and its message's wait.
#[derive(Deserialize)]
struct Item<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    message: Held,
}

#[derive(Deserialize)]
struct Batch<'a> {
    #[serde(borrow)]
    items: Vec<Item<'a>>,
}

/// The call a follower forwards, as far as its wait on the leader goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call<'a> {
    /// `POST /v1/semaphores/{key}` with its body.
    Message { key: &'a str, body: &'a [u8] },
    /// `POST /v1/batch` with its body.
    Batch { body: &'a [u8] },
    /// `GET /cluster/snapshot`: a backup of the whole state.
    Backup,
    /// Anything else: one commit or one read confirmation.
    Other,
}

/// How long `call` may wait on the leader before its round (or its hold) ends;
/// `config_of` gives a key's `(roundWaitMs, roundPeriodMs)`. A body that does not parse waits
/// for nothing: the leader refuses it at once.
pub fn may_wait(call: Call<'_>, config_of: impl Fn(&str) -> (u64, u64)) -> Duration {
    let wait_of = |key: &str, held: &Held| {
        let (round_wait_ms, round_period_ms) = config_of(key);
        let round_ms = round_wait_ms.max(round_period_ms);
        // A held request is answered by its key's next round after `waitMs`.
        let held_ms = held.wait_ms.unwrap_or(0).min(MAX_REQUEST_WAIT_MS);
        Duration::from_millis(held_ms + round_ms)
    };
    match call {
        Call::Message { key, body } => serde_json::from_slice::<Held>(body)
            .map(|held| wait_of(key, &held))
            .unwrap_or_default(),
        Call::Batch { body } => serde_json::from_slice::<Batch<'_>>(body)
            .map(|batch| {
                let waits = batch
                    .items
                    .iter()
                    .map(|item| wait_of(&item.key, &item.message));
                waits.max().unwrap_or_default()
            })
            .unwrap_or_default(),
        Call::Backup => BACKUP_MAY_WAIT,
        Call::Other => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timings() -> ForwardTimings {
        ForwardTimings {
            reach: Duration::from_millis(1_000),
            commit_timeout: Duration::from_millis(3_000),
        }
    }

    /// Key `slow` rounds every 2 s, every other key every 20 ms.
    fn config_of(key: &str) -> (u64, u64) {
        if key == "slow" {
            (5, 2_000)
        } else {
            (5, 20)
        }
    }

    #[test]
    fn a_call_that_waits_for_nothing_gets_the_commit_timeout_and_two_reaches() {
        let may_wait = may_wait(Call::Other, config_of);
        assert_eq!(
            deadline(&timings(), may_wait, 100),
            Duration::from_millis(5_000)
        );
    }

    #[test]
    fn a_large_body_gets_a_millisecond_per_kib() {
        let mib = 1024 * 1024;
        assert_eq!(
            deadline(&timings(), Duration::ZERO, mib),
            Duration::from_millis(6_024)
        );
    }

    #[test]
    fn a_request_may_wait_for_its_keys_round() {
        let body = br#"{"type":"request","v":1,"clientId":"c","demand":[]}"#;
        let message = |key| Call::Message { key, body };
        assert_eq!(may_wait(message("k"), config_of), Duration::from_millis(20));
        assert_eq!(
            may_wait(message("slow"), config_of),
            Duration::from_millis(2_000)
        );
    }

    #[test]
    fn a_held_request_may_wait_its_wait_and_one_more_round() {
        let body = br#"{"type":"request","v":1,"clientId":"c","waitMs":4000}"#;
        let call = Call::Message { key: "slow", body };
        assert_eq!(may_wait(call, config_of), Duration::from_millis(6_000));
        let absurd = br#"{"type":"request","waitMs":99999999}"#;
        let call = Call::Message {
            key: "k",
            body: absurd,
        };
        assert_eq!(
            may_wait(call, config_of),
            Duration::from_millis(MAX_REQUEST_WAIT_MS + 20)
        );
    }

    #[test]
    fn a_batch_waits_as_long_as_its_slowest_item() {
        let body = br#"{"v":1,"items":[
            {"key":"k","message":{"type":"request","waitMs":1000}},
            {"key":"sl\u006fw","message":{"type":"sync","clientId":"c"}}]}"#;
        assert_eq!(
            may_wait(Call::Batch { body }, config_of),
            Duration::from_millis(2_000)
        );
    }

    #[test]
    fn a_backup_keeps_the_long_wait() {
        assert_eq!(may_wait(Call::Backup, config_of), BACKUP_MAY_WAIT);
    }

    #[test]
    fn a_body_that_does_not_parse_waits_for_nothing() {
        let call = Call::Message {
            key: "slow",
            body: b"not json",
        };
        assert_eq!(may_wait(call, config_of), Duration::ZERO);
        let batch = Call::Batch {
            body: b"{\"items\": 3}",
        };
        assert_eq!(may_wait(batch, config_of), Duration::ZERO);
    }
}
