//! [`ClientConfig`]: how a [`SemaphoreClient`](super::SemaphoreClient) reaches
//! the cluster (endpoints, deadlines, backoff, token, TLS, HTTP version), its
//! defaults, and the one transport every call goes through: the one given, or
//! the production reqwest client built from it.

use std::sync::Arc;
use std::time::Duration;

use permitd_transport::{ReqwestTransport, Transport};

use crate::backoff::{DEFAULT_INITIAL_DELAY_MS, DEFAULT_MAX_DELAY_MS};
use crate::error::ClientError;

/// Default deadline of one call, retries included.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 30_000;
/// Default limit of one HTTP attempt. A request waits for its round (`roundWaitMs`,
/// at least `roundPeriodMs` after the previous round), so this is generous.
pub const DEFAULT_ATTEMPT_TIMEOUT_MS: u64 = 15_000;
/// Default limit on opening a connection to one node.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 1_000;

/// How a [`SemaphoreClient`](super::SemaphoreClient) reaches the cluster.
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
    /// What carries every HTTP exchange of the client (its calls, probes and
    /// event streams, and so those of a [`SemaphoreQueue`](crate::SemaphoreQueue)
    /// built on it). `None`, the default: a reqwest client built from the
    /// fields above. A given transport is used as it is, so `connect_timeout`,
    /// `ca_file` and `http2` do not apply to it; attempt limits still do, as
    /// each request's [`Deadline`](permitd_transport::Deadline). The
    /// deterministic simulator passes its simulated network here.
    pub transport: Option<Transport>,
    /// Seeds the client's random draws (backoff jitter, request and client
    /// ids); `None`, the default: the OS's entropy. The simulator seeds it so
    /// that a run replays.
    pub seed: Option<u64>,
    /// The wall clock the client stamps and compares times with (`oldestAtMs`,
    /// `nextRequestAt`), in ms since the epoch; `None`, the default: the
    /// system's. The simulator passes its simulated clock.
    pub wall_clock: Option<WallClock>,
}

/// A wall clock: milliseconds since the Unix epoch.
pub type WallClock = Arc<dyn Fn() -> u64 + Send + Sync>;

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("endpoints", &self.endpoints)
            .field("call_timeout", &self.call_timeout)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .field("http2", &self.http2)
            .field("transport", &self.transport)
            .field("seed", &self.seed)
            .field("wall_clock", &self.wall_clock.as_ref().map(|_| "<given>"))
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
            transport: None,
            seed: None,
            wall_clock: None,
        }
    }

    /// This configuration, sending through `transport` instead of the reqwest
    /// client it would build (see [`Self::transport`](#structfield.transport)).
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = Some(transport);
        self
    }
}

/// The transport of `config`: the one it names, else the production one.
pub(super) fn transport(config: &ClientConfig) -> Result<Transport, ClientError> {
    match &config.transport {
        Some(transport) => Ok(transport.clone()),
        None => Ok(Arc::new(ReqwestTransport::new(http_client(config)?))),
    }
}

/// The production HTTP client of `config`: trusting only `ca_file` when one is
/// named. The only code of the crate that uses reqwest.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_never_shows_in_debug() {
        let mut config = ClientConfig::new(["http://n:1"]);
        config.token = Some("pmt_secret".into());
        assert!(!format!("{config:?}").contains("pmt_secret"));
    }
}
