//! Remembering and honouring each key's `nextRequestAt`.
//!
//! A grant answers when the key's holder will run its next round; a `request`
//! sent sooner would only wait at the holder, holding a connection and an
//! attempt's deadline. So the client remembers the time per key (shared by
//! every clone) and `request` sleeps until then before sending, inside its
//! call's deadline. Two limits keep a bad value from doing harm: a time is
//! believed at most [`MAX_NEXT_REQUEST_AHEAD_MS`] ahead, and at most
//! `MAX_REMEMBERED_KEYS` keys are remembered (past times are dropped first).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::handle::SemaphoreClient;
use crate::error::ClientError;

/// Keys whose `nextRequestAt` is remembered before past entries are pruned.
const MAX_REMEMBERED_KEYS: usize = 100_000;
/// Furthest in the future a `nextRequestAt` is believed, in ms from receipt. A
/// later one (a node's clock far ahead, a huge `roundPeriodMs`) is taken as
/// this: asking sooner than the holder's round only waits at the holder,
/// while believing it could stall a key for days.
pub const MAX_NEXT_REQUEST_AHEAD_MS: u64 = 60_000;

impl SemaphoreClient {
    /// The key's `nextRequestAt` from its last answer, in ms since the epoch.
    pub fn next_request_at_ms(&self, key: &str) -> Option<u64> {
        let known = self.inner.next_request_at_ms.lock().expect("schedule lock");
        known.get(key).copied()
    }

    /// Remembers the key's `nextRequestAt`, believed at most
    /// [`MAX_NEXT_REQUEST_AHEAD_MS`] ahead.
    pub(super) fn remember_next_request_at(&self, key: &str, at_ms: u64) {
        let at_ms = believed_next_request_at(at_ms, self.now_ms());
        let mut known = self.inner.next_request_at_ms.lock().expect("schedule lock");
        if known.len() >= MAX_REMEMBERED_KEYS {
            let now = self.now_ms();
            known.retain(|_, at| *at > now);
        }
        if known.len() < MAX_REMEMBERED_KEYS {
            known.insert(key.to_string(), at_ms);
        }
    }

    /// Sleeps until the key's `nextRequestAt`, if it is still ahead. When it
    /// falls at or after `deadline`, fails at once with
    /// [`ClientError::DeadlineExceeded`] instead of sleeping past the deadline.
    pub(super) async fn wait_for_next_request_at(
        &self,
        key: &str,
        deadline: Instant,
    ) -> Result<(), ClientError> {
        let Some(wait_ms) = self
            .next_request_at_ms(key)
            .map(|at| at.saturating_sub(self.now_ms()))
            .filter(|wait| *wait > 0)
        else {
            return Ok(());
        };
        let wake = Instant::now() + Duration::from_millis(wait_ms);
        if wake >= deadline {
            return Err(ClientError::DeadlineExceeded {
                deadline: self.inner.config.call_timeout,
                attempts: 0,
                last: format!("the key's nextRequestAt is {wait_ms} ms away"),
            });
        }
        tokio::time::sleep_until(wake).await;
        Ok(())
    }
}

/// The `nextRequestAt` a client acts on: the holder's, but at most
/// [`MAX_NEXT_REQUEST_AHEAD_MS`] after `now_ms`.
pub fn believed_next_request_at(at_ms: u64, now_ms: u64) -> u64 {
    at_ms.min(now_ms.saturating_add(MAX_NEXT_REQUEST_AHEAD_MS))
}

/// Milliseconds since the Unix epoch by this machine's clock.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use permitd_core::contract::protocol::PermitRequest;

    use super::*;
    use crate::client::config::ClientConfig;

    #[test]
    fn next_request_at_is_believed_at_most_a_bounded_time_ahead() {
        let now = 1_000_000;
        assert_eq!(believed_next_request_at(now + 5, now), now + 5);
        assert_eq!(believed_next_request_at(now - 5, now), now - 5);
        let cap = now + MAX_NEXT_REQUEST_AHEAD_MS;
        assert_eq!(believed_next_request_at(now + 86_400_000, now), cap);
        assert_eq!(believed_next_request_at(u64::MAX, now), cap);
    }

    /// A client of a port nothing listens on, with a short call deadline.
    fn unreachable_client(call_timeout_ms: u64) -> SemaphoreClient {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let mut config = ClientConfig::new([format!("http://{address}")]);
        config.call_timeout = Duration::from_millis(call_timeout_ms);
        config.backoff_initial_ms = 10;
        config.backoff_max_ms = 20;
        SemaphoreClient::new(config).unwrap()
    }

    fn a_request() -> PermitRequest {
        PermitRequest {
            client_id: "c".into(),
            ..PermitRequest::default()
        }
    }

    #[tokio::test]
    async fn a_remembered_next_request_at_is_capped() {
        let client = unreachable_client(200);
        client.remember_next_request_at("k", u64::MAX);
        let believed = client.next_request_at_ms("k").unwrap();
        assert!(believed <= now_ms() + MAX_NEXT_REQUEST_AHEAD_MS);
    }

    #[tokio::test]
    async fn a_request_never_sleeps_past_its_deadline_for_next_request_at() {
        let client = unreachable_client(300);
        client.remember_next_request_at("k", now_ms() + 10_000);
        let started = Instant::now();
        let error = client.request("k", a_request()).await.unwrap_err();
        assert!(
            matches!(error, ClientError::DeadlineExceeded { attempts: 0, .. }),
            "{error}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "failed at once"
        );
    }

    #[tokio::test]
    async fn the_wait_for_next_request_at_counts_against_the_deadline() {
        let client = unreachable_client(600);
        client.remember_next_request_at("k", now_ms() + 400);
        let started = Instant::now();
        let error = client.request("k", a_request()).await.unwrap_err();
        assert!(
            matches!(error, ClientError::DeadlineExceeded { .. }),
            "{error}"
        );
        // 400 ms of waiting, then retries until the same 600 ms deadline: not
        // 400 + 600.
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "{:?}",
            started.elapsed()
        );
    }
}
