//! The call loop: one call is attempts with backoff until a success, a final
//! error or the call's deadline.
//!
//! Each attempt goes to the node the tracker picks (for a call about a key,
//! the remembered leader of its shard; else the remembered leader) with a limit of `attempt_timeout` or what is left of the deadline.
//! A connection failure, a lost answer, 502/503/504 and 429 are retried after
//! a capped, jittered exponential delay ([`crate::backoff`]), never sooner
//! than the server's `Retry-After`; when the node could not serve the call at
//! all (not a 429), the first few retries may go sooner to a node a readiness
//! probe found (`discovery.rs`). Every other answer ends the call. The deadline
//! is checked before sleeping, so a call never sleeps past it.
//!
//! An attempt that got no answer is retried whatever the transport's
//! [`TransportErrorKind`](permitd_transport::TransportErrorKind): `Connect`
//! (not delivered: another node is asked), `Timeout` (the attempt's
//! `Deadline` passed), `Exchange` (the connection broke, maybe after the node
//! took the call: safe to repeat, see the module docs of `client`) and
//! `Request` (the request could not be built, as reqwest's builder errors
//! always were).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;
use url::Url;

use super::handle::SemaphoreClient;
use super::http::{
    decode, is_retryable, key_of, leader_hint, rejected, retry_after_ms, shard_hint, url_of,
};
use crate::backoff::Backoff;
use crate::error::ClientError;
use crate::leader::{Endpoint, LeaderHint};
use crate::outgoing::Outgoing;
use crate::shard_leaders::ShardHint;

/// Retries of one call that may skip their backoff because a readiness probe
/// found a node to ask; later retries back off in full (a node that is ready but
/// keeps failing the call must not be hammered).
const MAX_PROBED_RETRIES: u32 = 5;

/// What one attempt came to.
enum Attempt {
    Done(Result<Bytes, ClientError>),
    Retry(Retry),
}

/// Why an attempt is worth repeating, and how soon.
struct Retry {
    reason: String,
    retry_after_ms: Option<u64>,
    /// The node could not be reached or had no leader to serve the call (not a
    /// 429): another node may be able to, see [`crate::leader::find_ready`].
    unavailable: bool,
}

/// Where one attempt went, and the key its call is about (its shard's leader
/// is the one asked).
#[derive(Clone, Copy)]
struct Sent<'a> {
    endpoint: &'a Endpoint,
    key: Option<&'a str>,
}

/// What an answer's headers said about the leaders: `x-permitd-leader`, and
/// `x-permitd-shard` with `x-permitd-shards`.
#[derive(Default)]
struct Heard {
    leader: Option<LeaderHint>,
    shard: Option<ShardHint>,
}

impl SemaphoreClient {
    pub(super) async fn get<R: DeserializeOwned>(&self, path: &[String]) -> Result<R, ClientError> {
        self.call::<(), R>(Method::GET, path, None).await
    }

    pub(super) async fn put<B: Serialize, R: DeserializeOwned>(
        &self,
        path: &[String],
        body: &B,
    ) -> Result<R, ClientError> {
        self.call(Method::PUT, path, Some(body)).await
    }

    /// A `DELETE`: answered `204 No Content` once applied, so there is no body
    /// to decode.
    pub(super) async fn delete(&self, path: &[String]) -> Result<(), ClientError> {
        let deadline = Instant::now() + self.inner.config.call_timeout;
        self.exchange::<()>(Method::DELETE, path, &[], None, deadline)
            .await?;
        Ok(())
    }

    /// One call: attempts with backoff until success, a final error or the deadline.
    pub(super) async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        method: Method,
        path: &[String],
        body: Option<&B>,
    ) -> Result<R, ClientError> {
        self.call_with_query(method, path, &[], body).await
    }

    /// [`Self::call`] with query parameters (paging of listings).
    pub(crate) async fn call_with_query<B: Serialize, R: DeserializeOwned>(
        &self,
        method: Method,
        path: &[String],
        query: &[(&str, String)],
        body: Option<&B>,
    ) -> Result<R, ClientError> {
        let deadline = Instant::now() + self.inner.config.call_timeout;
        self.call_until(method, path, query, body, deadline).await
    }

    /// [`Self::call_with_query`] inside a deadline the caller already started.
    pub(super) async fn call_until<B: Serialize, R: DeserializeOwned>(
        &self,
        method: Method,
        path: &[String],
        query: &[(&str, String)],
        body: Option<&B>,
        deadline: Instant,
    ) -> Result<R, ClientError> {
        let (url, answer) = self.exchange(method, path, query, body, deadline).await?;
        decode(&url, &answer)
    }

    /// The call loop itself: the URL that answered with a success, and the
    /// answer's body, undecoded.
    async fn exchange<B: Serialize>(
        &self,
        method: Method,
        path: &[String],
        query: &[(&str, String)],
        body: Option<&B>,
        deadline: Instant,
    ) -> Result<(Url, Bytes), ClientError> {
        let config = &self.inner.config;
        let body = body
            .map(serde_json::to_vec)
            .transpose()
            .expect("protocol values always serialise")
            .map(Bytes::from);
        let mut backoff = Backoff::new(config.backoff_initial_ms, config.backoff_max_ms);
        let mut attempts = 0u32;
        let key = key_of(path);
        loop {
            attempts += 1;
            let endpoint = self.tracker().pick_for(key);
            let remaining = deadline.saturating_duration_since(Instant::now());
            let timeout = remaining.min(config.attempt_timeout);
            let url = url_of(&endpoint, path, query);
            let sent = Sent {
                endpoint: &endpoint,
                key,
            };
            let attempt = self
                .attempt(sent, method.clone(), &url, body.clone(), timeout)
                .await;
            let retry = match attempt {
                Attempt::Done(Ok(answer)) => return Ok((url, answer)),
                Attempt::Done(Err(error)) => return Err(error),
                Attempt::Retry(retry) => retry,
            };
            let delay_ms = backoff.next_delay_ms(self.random_unit(), retry.retry_after_ms);
            let wake = Instant::now() + Duration::from_millis(delay_ms);
            if wake >= deadline {
                return Err(ClientError::DeadlineExceeded {
                    deadline: config.call_timeout,
                    attempts,
                    last: retry.reason,
                });
            }
            tracing::debug!(%url, attempts, delay_ms, reason = %retry.reason, "retrying");
            if retry.unavailable && attempts <= MAX_PROBED_RETRIES {
                self.wait_for_a_ready_node(wake).await;
            } else {
                tokio::time::sleep_until(wake).await;
            }
        }
    }

    /// Sends the call once to `sent.endpoint` and reads the whole answer.
    async fn attempt(
        &self,
        sent: Sent<'_>,
        method: Method,
        url: &Url,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Attempt {
        let mut request = Outgoing::new(method, url)
            .bearer(self.inner.config.token.as_deref())
            .limit(timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = match request.send(&self.inner.transport).await {
            Ok(response) => response,
            Err(error) => {
                let reason = format!("{endpoint:?}: {error}", endpoint = sent.endpoint.as_str());
                return self.unreachable(sent, Heard::default(), reason);
            }
        };
        let status = response.status();
        let heard = Heard {
            leader: leader_hint(response.headers()),
            shard: shard_hint(response.headers()),
        };
        let retry_after_ms = retry_after_ms(response.headers());
        match permitd_transport::collect(response.into_body()).await {
            Ok(body) => self.judge(sent, status, heard, retry_after_ms, body),
            Err(error) => {
                let reason = format!("{}: reading the answer: {error}", sent.endpoint.as_str());
                self.unreachable(sent, heard, reason)
            }
        }
    }

    /// The attempt's answer as the call sees it: a success, a retry (the node
    /// moves down the tracker's order unless it only asked to slow down, 429),
    /// or a final rejection.
    fn judge(
        &self,
        sent: Sent<'_>,
        status: StatusCode,
        heard: Heard,
        retry_after_ms: Option<u64>,
        body: Bytes,
    ) -> Attempt {
        if is_retryable(status) {
            let overloaded = status == StatusCode::TOO_MANY_REQUESTS;
            if !overloaded {
                self.failed(sent, &heard);
            }
            return Attempt::Retry(Retry {
                reason: rejected(status, &body).to_string(),
                retry_after_ms,
                unavailable: !overloaded,
            });
        }
        if status.is_success() {
            self.note_answer(sent.endpoint, heard.leader.as_ref(), heard.shard.as_ref());
            return Attempt::Done(Ok(body));
        }
        Attempt::Done(Err(rejected(status, &body)))
    }

    /// An attempt that got no answer from `sent.endpoint`: the next pick
    /// moves on (to the leader it named, if it named one), and another node may serve.
    fn unreachable(&self, sent: Sent<'_>, heard: Heard, reason: String) -> Attempt {
        self.failed(sent, &heard);
        Attempt::Retry(Retry {
            reason,
            retry_after_ms: None,
            unavailable: true,
        })
    }

    /// The tracker hears that `sent` failed with what its answer said, if any.
    fn failed(&self, sent: Sent<'_>, heard: &Heard) {
        self.tracker().failed_for(
            sent.endpoint,
            sent.key,
            heard.leader.as_ref(),
            heard.shard.as_ref(),
        );
    }
}
