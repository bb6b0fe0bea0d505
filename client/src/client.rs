//! [`SemaphoreClient`]: every call of the v1 API against a list of nodes.
//!
//! One call is a loop of attempts inside a per-call deadline: pick a node (the
//! remembered leader first, see [`crate::leader`]), send, and on a retryable
//! failure (connection error, attempt timeout, 502/503/504, 429) back off with
//! capped exponential jitter ([`crate::backoff`]), never sooner than the
//! server's `Retry-After`, and try again. Anything else the server rejects ends
//! the call with [`ClientError::Rejected`].
//!
//! Retries are safe: a `request` always carries a `requestId` (a fresh UUID v4
//! when the caller set none), kept across the call's attempts, so the holder
//! answers a retry of a committed round with the original answer; reports are
//! cumulative and configuration writes replace whole values.
//!
//! `request` also honours the key's `nextRequestAt` from the previous answer: it
//! waits until then before sending (the holder would not run the round sooner).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use permitd_core::contract::batch::{BatchItem, BatchRequest, BatchResponse};
use permitd_core::contract::protocol::{
    PermitGrant, PermitRequest, PermitSync, PermitSyncResult, SemaphoreRequest, SemaphoreResponse,
    V1,
};
use permitd_core::contract::{headers, paths, ClusterStatus, ErrorAnswer};
use permitd_core::tokens::{CreatedToken, TokenInfo, TokenList, TokenSpec};
use permitd_core::{GroupConfig, KeyConfig, KeyConfigUpdate, Usage};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::backoff::{Backoff, DEFAULT_INITIAL_DELAY_MS, DEFAULT_MAX_DELAY_MS};
use crate::error::ClientError;
use crate::leader::{find_ready, parse_endpoints, Endpoint, LeaderHint, LeaderTracker};

/// Default deadline of one call, retries included.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 30_000;
/// Default limit of one HTTP attempt. A request waits for its round (`roundWaitMs`,
/// at least `roundPeriodMs` after the previous round), so this is generous.
pub const DEFAULT_ATTEMPT_TIMEOUT_MS: u64 = 15_000;
/// Default limit on opening a connection to one node.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Least time between two rounds of node-id discovery (`/cluster/status`).
const NODE_ID_DISCOVERY_INTERVAL_MS: u64 = 30_000;
/// Keys whose `nextRequestAt` is remembered before past entries are pruned.
const MAX_REMEMBERED_KEYS: usize = 100_000;
/// Furthest in the future a `nextRequestAt` is believed, in ms from receipt. A
/// later one (a node's clock far ahead, a huge `roundPeriodMs`) is taken as
/// this: asking sooner than the holder's round only waits at the holder,
/// while believing it could stall a key for days.
pub const MAX_NEXT_REQUEST_AHEAD_MS: u64 = 60_000;
/// Retries of one call that may skip their backoff because a readiness probe
/// found a node to ask; later retries back off in full (a node that is ready but
/// keeps failing the call must not be hammered).
const MAX_PROBED_RETRIES: u32 = 5;
/// Longest error body kept in an error message, in bytes.
const MAX_ERROR_BODY_BYTES: usize = 512;

/// One batch item's answer, or the error its own call would have had.
pub type ItemResult = Result<SemaphoreResponse, ClientError>;

/// How a [`SemaphoreClient`] reaches the cluster.
#[derive(Clone)]
pub struct ClientConfig {
    /// Node API base URLs, such as `http://127.0.0.1:7001`.
    pub endpoints: Vec<String>,
    /// Deadline of one call, retries included.
    pub call_timeout: Duration,
    /// Limit of one HTTP attempt.
    pub attempt_timeout: Duration,
    /// Limit on opening a connection.
    pub connect_timeout: Duration,
    /// First retry delay, in ms.
    pub backoff_initial_ms: u64,
    /// Largest retry delay, in ms.
    pub backoff_max_ms: u64,
    /// The API token sent as `Authorization: Bearer …` on every call (a runner,
    /// reader or admin token; see the README's "Security"). Never printed.
    pub token: Option<String>,
    /// PEM file of the CA that signed the nodes' certificates, for `https://`
    /// endpoints; it replaces the system roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Send every call over HTTP/2, many on one connection per node: by prior
    /// knowledge on `http://`, by ALPN on `https://`. Off by default: HTTP/1.1
    /// with a pool of connections, cheaper for a process with few calls in
    /// flight (docs/operations.md, "HTTP/2" has the measured costs).
    pub http2: bool,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("endpoints", &self.endpoints)
            .field("call_timeout", &self.call_timeout)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .field("http2", &self.http2)
            .finish_non_exhaustive()
    }
}

impl ClientConfig {
    /// Defaults for the given endpoints.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            call_timeout: Duration::from_millis(DEFAULT_CALL_TIMEOUT_MS),
            attempt_timeout: Duration::from_millis(DEFAULT_ATTEMPT_TIMEOUT_MS),
            connect_timeout: Duration::from_millis(DEFAULT_CONNECT_TIMEOUT_MS),
            backoff_initial_ms: DEFAULT_INITIAL_DELAY_MS,
            backoff_max_ms: DEFAULT_MAX_DELAY_MS,
            token: None,
            ca_file: None,
            http2: false,
        }
    }
}

/// A cheaply cloneable handle on the cluster; clones share the leader and the
/// per-key `nextRequestAt`.
#[derive(Debug, Clone)]
pub struct SemaphoreClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    config: ClientConfig,
    /// A std mutex: held for a pick or an update, never across an await.
    tracker: Mutex<LeaderTracker>,
    /// Per key, ms since the epoch before which a request is not sent.
    next_request_at_ms: Mutex<HashMap<String, u64>>,
    /// When node ids were last asked for, to bound discovery.
    last_discovery: Mutex<Option<Instant>>,
}

/// What one attempt came to.
enum Attempt {
    Done(Result<Vec<u8>, ClientError>),
    Retry {
        reason: String,
        retry_after_ms: Option<u64>,
        /// The node could not be reached or had no leader to serve the call (not a
        /// 429): another node may be able to, see [`crate::leader::find_ready`].
        unavailable: bool,
    },
}

impl SemaphoreClient {
    /// A client for `config`; fails on an empty or unparsable endpoint list.
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        let mut endpoints = Vec::new();
        for text in &config.endpoints {
            endpoints.extend(parse_endpoints(text)?);
        }
        let tracker = LeaderTracker::new(endpoints)?;
        let http = http_client(&config)?;
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                config,
                tracker: Mutex::new(tracker),
                next_request_at_ms: Mutex::new(HashMap::new()),
                last_discovery: Mutex::new(None),
            }),
        })
    }

    /// A client with default settings for `endpoints`.
    pub fn connect<S: Into<String>>(
        endpoints: impl IntoIterator<Item = S>,
    ) -> Result<Self, ClientError> {
        Self::new(ClientConfig::new(endpoints))
    }

    /// The node currently asked first.
    pub fn leader(&self) -> Option<String> {
        self.tracker()
            .leader()
            .map(|endpoint| endpoint.as_str().to_string())
    }

    /// The key's `nextRequestAt` from its last answer, in ms since the epoch.
    pub fn next_request_at_ms(&self, key: &str) -> Option<u64> {
        let known = self.inner.next_request_at_ms.lock().expect("schedule lock");
        known.get(key).copied()
    }

    /// Sends a `request` for `key` and waits for its round. Sets a `requestId`
    /// when the caller set none; waits for the key's `nextRequestAt` first,
    /// inside the call's deadline: when `nextRequestAt` falls after it, the
    /// call fails at once with [`ClientError::DeadlineExceeded`] instead of
    /// sleeping past it.
    ///
    /// `request` and [`Self::sync`] are independent calls on a cloneable
    /// client: a caller driving the protocol itself sends claims and releases
    /// with `sync` while a `request` waits for its round, as the queue does
    /// (one of each in flight per key; reports are cumulative, so their
    /// answers may come in either order).
    pub async fn request(
        &self,
        key: &str,
        mut request: PermitRequest,
    ) -> Result<PermitGrant, ClientError> {
        if request.request_id.is_none() {
            request.request_id = Some(uuid::Uuid::new_v4().to_string());
        }
        let deadline = Instant::now() + self.inner.config.call_timeout;
        if let Some(wait_ms) = self
            .next_request_at_ms(key)
            .map(|at| at.saturating_sub(now_ms()))
            .filter(|wait| *wait > 0)
        {
            let wake = Instant::now() + Duration::from_millis(wait_ms);
            if wake >= deadline {
                return Err(ClientError::DeadlineExceeded {
                    deadline: self.inner.config.call_timeout,
                    attempts: 0,
                    last: format!("the key's nextRequestAt is {wait_ms} ms away"),
                });
            }
            tokio::time::sleep_until(wake.into()).await;
        }
        let path = paths::segments(paths::SEMAPHORE, &[key]);
        let message = SemaphoreRequest::Request(request);
        let answer = self
            .call_until(Method::POST, &path, &[], Some(&message), deadline)
            .await?;
        match answer {
            SemaphoreResponse::Grant(grant) => {
                self.remember_next_request_at(key, grant.next_request_at_ms);
                Ok(grant)
            }
            SemaphoreResponse::Synced(_) => {
                Err(self.unexpected(key, "a synced answer to a request"))
            }
        }
    }

    /// Sends a `sync` (reports only) for `key`; applied without waiting for a round.
    pub async fn sync(&self, key: &str, sync: PermitSync) -> Result<PermitSyncResult, ClientError> {
        match self.send(key, SemaphoreRequest::Sync(sync)).await? {
            SemaphoreResponse::Synced(result) => Ok(result),
            SemaphoreResponse::Grant(_) => Err(self.unexpected(key, "a grant answer to a sync")),
        }
    }

    /// Sends many `request`s and `sync`s, for many keys, in one call
    /// (`POST /v1/batch`, at most `MAX_BATCH_ITEMS` items and `MAX_BATCH_KEYS`
    /// keys), and returns each item's own answer or error, in order: an item's
    /// error ([`ClientError::Rejected`], with the status its own call would have
    /// had) never fails its neighbours. `request` items get a `requestId` when
    /// they have none, so a retried call replays them. The call is answered
    /// when its slowest item is (a `request` when its key's round runs); unlike
    /// [`Self::request`] it does not wait for a key's `nextRequestAt` first.
    pub async fn batch(&self, mut items: Vec<BatchItem>) -> Result<Vec<ItemResult>, ClientError> {
        for item in &mut items {
            if let SemaphoreRequest::Request(request) = &mut item.message {
                request
                    .request_id
                    .get_or_insert_with(|| uuid::Uuid::new_v4().to_string());
            }
        }
        let path = paths::segments(paths::BATCH, &[]);
        let body = BatchRequest { v: V1, items };
        let answer: BatchResponse = self.call(Method::POST, &path, Some(&body)).await?;
        if answer.items.len() != body.items.len() {
            return Err(ClientError::UnexpectedAnswer {
                url: paths::BATCH.to_owned(),
                reason: format!(
                    "{} answers to {} items",
                    answer.items.len(),
                    body.items.len()
                ),
            });
        }
        let results = body.items.iter().zip(answer.items).map(|(item, answer)| {
            let status = answer.status;
            let result = answer.into_result().map_err(|error| ClientError::Rejected {
                status,
                code: error.code,
                message: error.message,
                field: error.field,
            });
            if let Ok(SemaphoreResponse::Grant(grant)) = &result {
                self.remember_next_request_at(&item.key, grant.next_request_at_ms);
            }
            result
        });
        Ok(results.collect())
    }

    /// The key's linearizable usage.
    pub async fn usage(&self, key: &str) -> Result<Usage, ClientError> {
        self.get(&paths::segments(paths::USAGE, &[key])).await
    }

    /// The key's effective configuration.
    pub async fn key_config(&self, key: &str) -> Result<KeyConfig, ClientError> {
        self.get(&paths::segments(paths::KEY_CONFIG, &[key])).await
    }

    /// Replaces the key's configuration (omitted fields take the cluster
    /// defaults); answers the effective configuration once applied.
    pub async fn set_key_config(
        &self,
        key: &str,
        update: &KeyConfigUpdate,
    ) -> Result<KeyConfig, ClientError> {
        self.put(&paths::segments(paths::KEY_CONFIG, &[key]), update)
            .await
    }

    /// Sets one group's cap and permission.
    pub async fn set_group(
        &self,
        key: &str,
        group: &str,
        config: &GroupConfig,
    ) -> Result<GroupConfig, ClientError> {
        let path = paths::segments(paths::GROUP, &[key, group]);
        let answer: serde_json::Value = self.put(&path, config).await?;
        // Whatever the node echoes, what it applied is what was sent.
        Ok(serde_json::from_value(answer).unwrap_or_else(|_| config.clone()))
    }

    /// Removes one group's settings (no cap, permitted).
    pub async fn delete_group(&self, key: &str, group: &str) -> Result<(), ClientError> {
        let _: serde_json::Value = self
            .call::<(), _>(
                Method::DELETE,
                &paths::segments(paths::GROUP, &[key, group]),
                None,
            )
            .await?;
        Ok(())
    }

    /// Creates an API token (admin only). The answer holds the secret `token`,
    /// shown this once. A retried call may create a second token; list and revoke.
    pub async fn create_token(&self, spec: &TokenSpec) -> Result<CreatedToken, ClientError> {
        let path = paths::segments(paths::TOKENS, &[]);
        self.call(Method::POST, &path, Some(spec)).await
    }

    /// Every API token, without secrets (admin only).
    pub async fn tokens(&self) -> Result<Vec<TokenInfo>, ClientError> {
        let answer: TokenList = self.get(&paths::segments(paths::TOKENS, &[])).await?;
        Ok(answer.tokens)
    }

    /// Revokes an API token (admin only).
    pub async fn revoke_token(&self, id: u64) -> Result<(), ClientError> {
        let path = paths::segments(paths::TOKEN, &[&id.to_string()]);
        let _: serde_json::Value = self.call::<(), _>(Method::DELETE, &path, None).await?;
        Ok(())
    }

    /// The cluster's membership, leader, term and indexes, as some node sees them.
    pub async fn cluster_status(&self) -> Result<ClusterStatus, ClientError> {
        self.get(&paths::segments(paths::CLUSTER_STATUS, &[])).await
    }

    /// The status of every endpoint, each asked directly (no leader routing);
    /// a node that does not answer yields its error.
    pub async fn cluster_status_of_each(
        &self,
    ) -> Vec<(String, Result<ClusterStatus, ClientError>)> {
        let endpoints: Vec<Endpoint> = self.tracker().endpoints().to_vec();
        let mut answers = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let answer = self.status_of(&endpoint).await;
            if let Ok(status) = &answer {
                self.tracker().learn_node_id(&endpoint, status.id);
            }
            answers.push((endpoint.as_str().to_string(), answer));
        }
        answers
    }

    /// Opens a streamed `GET` (no deadline on the body) on the first endpoint,
    /// in order, that answers; a refusal (4xx) is final, an unreachable or
    /// unavailable node passes the call to the next endpoint.
    pub(crate) async fn open_stream(
        &self,
        path: &[String],
        query: &[(&str, String)],
    ) -> Result<reqwest::Response, ClientError> {
        let endpoints = self.tracker().endpoints().to_vec();
        let mut last = String::from("no endpoint answered");
        for endpoint in &endpoints {
            let mut url = endpoint.url(path);
            if !query.is_empty() {
                url.query_pairs_mut().extend_pairs(query);
            }
            let mut builder = self.inner.http.get(url);
            if let Some(token) = &self.inner.config.token {
                builder = builder.bearer_auth(token);
            }
            let response = match builder.send().await {
                Ok(response) => response,
                Err(error) => {
                    last = format!("{}: {error}", endpoint.as_str());
                    continue;
                }
            };
            let status = response.status();
            if status.is_success() {
                return Ok(response);
            }
            let body = response.bytes().await.unwrap_or_default();
            let error = rejected(status, &body);
            if !is_retryable(status) {
                return Err(error);
            }
            last = error.to_string();
        }
        Err(ClientError::DeadlineExceeded {
            deadline: self.inner.config.connect_timeout,
            attempts: u32::try_from(endpoints.len()).unwrap_or(u32::MAX),
            last,
        })
    }

    async fn status_of(&self, endpoint: &Endpoint) -> Result<ClusterStatus, ClientError> {
        let url = endpoint.url(&paths::segments(paths::CLUSTER_STATUS, &[]));
        let mut builder = self
            .inner
            .http
            .get(url.clone())
            .timeout(self.inner.config.connect_timeout * 3);
        if let Some(token) = &self.inner.config.token {
            builder = builder.bearer_auth(token);
        }
        let response = builder
            .send()
            .await
            .map_err(|error| ClientError::DeadlineExceeded {
                deadline: self.inner.config.connect_timeout * 3,
                attempts: 1,
                last: error.to_string(),
            })?;
        let status = response.status();
        let body = response.bytes().await.unwrap_or_default();
        if !status.is_success() {
            return Err(rejected(status, &body));
        }
        decode(&url, &body)
    }

    /// Remembers the key's `nextRequestAt`, believed at most
    /// [`MAX_NEXT_REQUEST_AHEAD_MS`] ahead.
    fn remember_next_request_at(&self, key: &str, at_ms: u64) {
        let at_ms = believed_next_request_at(at_ms, now_ms());
        let mut known = self.inner.next_request_at_ms.lock().expect("schedule lock");
        if known.len() >= MAX_REMEMBERED_KEYS {
            let now = now_ms();
            known.retain(|_, at| *at > now);
        }
        if known.len() < MAX_REMEMBERED_KEYS {
            known.insert(key.to_string(), at_ms);
        }
    }

    fn unexpected(&self, key: &str, reason: &str) -> ClientError {
        ClientError::UnexpectedAnswer {
            url: paths::SEMAPHORE.replace("{key}", key),
            reason: reason.to_string(),
        }
    }

    /// Callers hold the guard for one pick or update, never across an await.
    fn tracker(&self) -> MutexGuard<'_, LeaderTracker> {
        self.inner.tracker.lock().expect("tracker lock")
    }

    /// Posts a `request` or `sync` to the key's semaphore.
    async fn send(
        &self,
        key: &str,
        message: SemaphoreRequest,
    ) -> Result<SemaphoreResponse, ClientError> {
        let path = paths::segments(paths::SEMAPHORE, &[key]);
        self.call(Method::POST, &path, Some(&message)).await
    }

    async fn get<R: DeserializeOwned>(&self, path: &[String]) -> Result<R, ClientError> {
        self.call::<(), R>(Method::GET, path, None).await
    }

    async fn put<B: Serialize, R: DeserializeOwned>(
        &self,
        path: &[String],
        body: &B,
    ) -> Result<R, ClientError> {
        self.call(Method::PUT, path, Some(body)).await
    }

    /// One call: attempts with backoff until success, a final error or the deadline.
    async fn call<B: Serialize, R: DeserializeOwned>(
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
    async fn call_until<B: Serialize, R: DeserializeOwned>(
        &self,
        method: Method,
        path: &[String],
        query: &[(&str, String)],
        body: Option<&B>,
        deadline: Instant,
    ) -> Result<R, ClientError> {
        let config = &self.inner.config;
        let body = body
            .map(serde_json::to_vec)
            .transpose()
            .expect("protocol values always serialise");
        let mut backoff = Backoff::new(config.backoff_initial_ms, config.backoff_max_ms);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let endpoint = self.tracker().pick();
            let remaining = deadline.saturating_duration_since(Instant::now());
            let timeout = remaining.min(config.attempt_timeout);
            let mut url = endpoint.url(path);
            if !query.is_empty() {
                url.query_pairs_mut().extend_pairs(query);
            }
            let attempt = self
                .attempt(&endpoint, method.clone(), &url, body.as_deref(), timeout)
                .await;
            let (reason, retry_after_ms, unavailable) = match attempt {
                Attempt::Done(Ok(bytes)) => return decode(&url, &bytes),
                Attempt::Done(Err(error)) => return Err(error),
                Attempt::Retry {
                    reason,
                    retry_after_ms,
                    unavailable,
                } => (reason, retry_after_ms, unavailable),
            };
            let delay_ms = backoff.next_delay_ms(rand::random::<f64>(), retry_after_ms);
            let wake = Instant::now() + Duration::from_millis(delay_ms);
            if wake >= deadline {
                return Err(ClientError::DeadlineExceeded {
                    deadline: config.call_timeout,
                    attempts,
                    last: reason,
                });
            }
            tracing::debug!(%url, attempts, delay_ms, %reason, "retrying");
            if unavailable && attempts <= MAX_PROBED_RETRIES {
                self.wait_for_a_ready_node(wake).await;
            } else {
                tokio::time::sleep_until(wake.into()).await;
            }
        }
    }

    /// Waits until `wake` or until some node knows a leader, whichever is first,
    /// and makes that node the next one asked.
    async fn wait_for_a_ready_node(&self, wake: Instant) {
        let endpoints = self.tracker().endpoints().to_vec();
        let floor = Instant::now() + Duration::from_millis(crate::leader::READY_PROBE_INTERVAL_MS);
        if let Some((endpoint, hint)) = find_ready(&self.inner.http, &endpoints, wake).await {
            self.tracker().answered(&endpoint, hint.as_ref());
            // Never faster than one probe interval per retry.
            tokio::time::sleep_until(floor.min(wake).into()).await;
        }
    }

    async fn attempt(
        &self,
        endpoint: &Endpoint,
        method: Method,
        url: &reqwest::Url,
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Attempt {
        let mut builder = self
            .inner
            .http
            .request(method, url.clone())
            .timeout(timeout);
        if let Some(body) = body {
            builder = builder
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_vec());
        }
        if let Some(token) = &self.inner.config.token {
            builder = builder.bearer_auth(token);
        }
        let response = match builder.send().await {
            Ok(response) => response,
            Err(error) => {
                self.tracker().failed(endpoint, None);
                return Attempt::Retry {
                    reason: format!("{endpoint:?}: {error}", endpoint = endpoint.as_str()),
                    retry_after_ms: None,
                    unavailable: true,
                };
            }
        };
        let status = response.status();
        let hint = response
            .headers()
            .get(headers::LEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(LeaderHint::parse);
        let retry_after_ms = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.trim().parse::<u64>().ok())
            .map(|seconds| seconds.saturating_mul(1_000));
        let body = match response.bytes().await {
            Ok(body) => body.to_vec(),
            Err(error) => {
                self.tracker().failed(endpoint, hint.as_ref());
                return Attempt::Retry {
                    reason: format!("{}: reading the answer: {error}", endpoint.as_str()),
                    retry_after_ms: None,
                    unavailable: true,
                };
            }
        };
        if is_retryable(status) {
            if status != StatusCode::TOO_MANY_REQUESTS {
                self.tracker().failed(endpoint, hint.as_ref());
            }
            return Attempt::Retry {
                reason: rejected(status, &body).to_string(),
                retry_after_ms,
                unavailable: status != StatusCode::TOO_MANY_REQUESTS,
            };
        }
        if status.is_success() {
            let wants_ids = {
                let mut tracker = self.tracker();
                tracker.answered(endpoint, hint.as_ref());
                tracker.wants_node_ids()
            };
            if wants_ids {
                self.discover_node_ids();
            }
            return Attempt::Done(Ok(body));
        }
        Attempt::Done(Err(rejected(status, &body)))
    }

    /// Learns which endpoint is which node id, in the background and rarely, so
    /// that a leader named by id can be asked directly.
    fn discover_node_ids(&self) {
        {
            let mut last = self.inner.last_discovery.lock().expect("discovery lock");
            let interval = Duration::from_millis(NODE_ID_DISCOVERY_INTERVAL_MS);
            if last.is_some_and(|at| at.elapsed() < interval) {
                return;
            }
            *last = Some(Instant::now());
        }
        let client = self.clone();
        tokio::spawn(async move {
            let answers = client.cluster_status_of_each().await;
            for (endpoint, answer) in answers {
                if let Err(error) = answer {
                    tracing::debug!(%endpoint, %error, "node id discovery");
                }
            }
        });
    }
}

/// The HTTP client of `config`: trusting only `ca_file` when one is named.
fn http_client(config: &ClientConfig) -> Result<reqwest::Client, ClientError> {
    let build = |error: String| ClientError::Build(error);
    let mut builder = reqwest::Client::builder()
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true);
    // Never HTTP/2 unasked, not even where a node's ALPN offers it.
    builder = if config.http2 {
        builder.http2_prior_knowledge()
    } else {
        builder.http1_only()
    };
    if let Some(path) = &config.ca_file {
        let pem = std::fs::read(path)
            .map_err(|error| build(format!("cannot read {}: {error}", path.display())))?;
        let ca = reqwest::Certificate::from_pem(&pem)
            .map_err(|error| build(format!("{}: {error}", path.display())))?;
        builder = builder
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca);
    }
    builder.build().map_err(|error| build(error.to_string()))
}

fn is_retryable(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
    )
}

/// The error of a non-success answer: the contract's error body, or the status
/// and the start of the body when something else answered.
fn rejected(status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorAnswer>(body) {
        Ok(ErrorAnswer { error }) => ClientError::Rejected {
            status: status.as_u16(),
            code: error.code,
            message: error.message,
            field: error.field,
        },
        Err(_) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(MAX_ERROR_BODY_BYTES)]);
            ClientError::Http {
                status: status.as_u16(),
                body: text.into_owned(),
            }
        }
    }
}

fn decode<R: DeserializeOwned>(url: &reqwest::Url, body: &[u8]) -> Result<R, ClientError> {
    serde_json::from_slice(body).map_err(|error| ClientError::UnexpectedAnswer {
        url: url.to_string(),
        reason: error.to_string(),
    })
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
    use permitd_core::contract::ErrorCode;

    use super::*;

    #[test]
    fn error_bodies_map_to_codes_and_fields() {
        let body = br#"{"error":{"code":"bad_request","message":"demand.count is 2000000000; the maximum is 1000000000","field":"demand.count"}}"#;
        let error = rejected(StatusCode::BAD_REQUEST, body);
        assert_eq!(error.code(), Some(ErrorCode::BadRequest));
        assert_eq!(error.field(), Some("demand.count"));
        assert_eq!(
            error.to_string(),
            "400 bad_request: demand.count is 2000000000; the maximum is 1000000000"
        );
        let plain = rejected(StatusCode::NOT_FOUND, b"nope");
        assert_eq!(plain.code(), None);
        assert_eq!(plain.to_string(), "404: nope");
    }

    #[test]
    fn retryable_statuses() {
        for status in [429, 502, 503, 504] {
            assert!(
                is_retryable(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
        for status in [200, 400, 404, 409, 413, 500] {
            assert!(
                !is_retryable(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
    }

    #[test]
    fn paths_put_the_key_in_one_segment() {
        let endpoint = Endpoint::parse("http://n:1").unwrap();
        let path = paths::segments(paths::GROUP, &["acct/7", "wf 1"]);
        assert_eq!(
            endpoint.url(&path).as_str(),
            "http://n:1/v1/semaphores/acct%2F7/groups/wf%201"
        );
    }

    #[test]
    fn the_token_never_shows_in_debug() {
        let mut config = ClientConfig::new(["http://n:1"]);
        config.token = Some("pmt_secret".into());
        assert!(!format!("{config:?}").contains("pmt_secret"));
    }

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

    #[test]
    fn bad_endpoints_fail_construction() {
        assert!(matches!(
            SemaphoreClient::new(ClientConfig::new(Vec::<String>::new())),
            Err(ClientError::NoEndpoints)
        ));
        assert!(SemaphoreClient::connect(["ftp://x"]).is_err());
        assert!(SemaphoreClient::connect(["127.0.0.1:7001,127.0.0.1:7002"]).is_ok());
    }
}
