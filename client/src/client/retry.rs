//! The call loop: one call is attempts with backoff until a success, a final
//! error or the call's deadline.
//!
//! Each attempt goes to the node the tracker picks (the remembered leader
//! first) with a limit of `attempt_timeout` or what is left of the deadline.
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
use super::http::{decode, is_retryable, leader_hint, rejected, retry_after_ms, url_of};
use crate::backoff::Backoff;
use crate::error::ClientError;
use crate::leader::{Endpoint, LeaderHint};
use crate::outgoing::Outgoing;

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
        loop {
            attempts += 1;
            let endpoint = self.tracker().pick();
            let remaining = deadline.saturating_duration_since(Instant::now());
            let timeout = remaining.min(config.attempt_timeout);
            let url = url_of(&endpoint, path, query);
            let attempt = self
                .attempt(&endpoint, method.clone(), &url, body.clone(), timeout)
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

    /// Sends the call once to `endpoint` and reads the whole answer.
    async fn attempt(
        &self,
        endpoint: &Endpoint,
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
                let reason = format!("{endpoint:?}: {error}", endpoint = endpoint.as_str());
                return self.unreachable(endpoint, None, reason);
            }
        };
        let status = response.status();
        let hint = leader_hint(response.headers());
        let retry_after_ms = retry_after_ms(response.headers());
        match permitd_transport::collect(response.into_body()).await {
            Ok(body) => self.judge(endpoint, status, hint, retry_after_ms, body),
            Err(error) => {
                let reason = format!("{}: reading the answer: {error}", endpoint.as_str());
                self.unreachable(endpoint, hint.as_ref(), reason)
            }
        }
    }

    /// The attempt's answer as the call sees it: a success, a retry (the node
    /// moves down the tracker's order unless it only asked to slow down, 429),
    /// or a final rejection.
    fn judge(
        &self,
        endpoint: &Endpoint,
        status: StatusCode,
        hint: Option<LeaderHint>,
        retry_after_ms: Option<u64>,
        body: Bytes,
    ) -> Attempt {
        if is_retryable(status) {
            let overloaded = status == StatusCode::TOO_MANY_REQUESTS;
            if !overloaded {
                self.tracker().failed(endpoint, hint.as_ref());
            }
            return Attempt::Retry(Retry {
                reason: rejected(status, &body).to_string(),
                retry_after_ms,
                unavailable: !overloaded,
            });
        }
        if status.is_success() {
            self.note_answer(endpoint, hint.as_ref());
            return Attempt::Done(Ok(body));
        }
        Attempt::Done(Err(rejected(status, &body)))
    }

    /// An attempt that got no answer from `endpoint`: the next pick moves on
    /// (to the leader it named, if it named one), and another node may serve.
    fn unreachable(
        &self,
        endpoint: &Endpoint,
        hint: Option<&LeaderHint>,
        reason: String,
    ) -> Attempt {
        self.tracker().failed(endpoint, hint);
        Attempt::Retry(Retry {
            reason,
            retry_after_ms: None,
            unavailable: true,
        })
    }
}
