//! `cluster.toml`: the nodes of a cluster, its secret, Raft timings, key
//! defaults, `[auth]` and `[tls]`.
//!
//! One file describes the whole cluster so that `permitd up` can start every node
//! and `permitd serve --id N` can find its own addresses and its peers'. Relative
//! data directories are resolved against the file's folder, so the same file works
//! from any working directory. `PERMITD_*` environment variables override any
//! setting of the file (see `config_env.rs`).

use permitd_core::limits::{
    BODY_READ_TIMEOUT_MS, COMMIT_TIMEOUT_MS, DEFAULT_ENTRIES_IN_FLIGHT, HEADER_READ_TIMEOUT_MS,
    MAX_BODY_BYTES, MAX_COMMIT_TIMEOUT_MS, MAX_CONNECTIONS_PER_LISTENER, MAX_ENTRIES_IN_FLIGHT,
    MAX_PARKED_BYTES, MAX_PARKED_MESSAGES, MAX_PENDING_REQUESTS_PER_KEY,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use permitd_core::config::{KeyConfig, KeyConfigUpdate};
use permitd_core::contract::validate::validate_key_config;
use permitd_storage::{NodeId, PeerNode};
use serde::Deserialize;

use crate::credentials::tls::TlsConfig;
use crate::credentials::Secret;

/// Shortest accepted cluster secret, in bytes: a guessable secret is no secret.
pub const MIN_SECRET_BYTES: usize = 16;
/// Shortest accepted admin token, in bytes.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;
/// The environment variable that overrides `[auth] admin_token`.
pub const ADMIN_TOKEN_ENV: &str = "PERMITD_ADMIN_TOKEN";

/// What is wrong with a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The whole `cluster.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Shared by every node; required on every `/raft/` call, and opens nothing else.
    pub secret: Secret,
    #[serde(default)]
    pub auth: AuthConfig,
    /// Absent: plain HTTP.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    #[serde(default)]
    pub raft: RaftTimings,
    /// Written into the replicated state when the cluster is initialised.
    #[serde(default)]
    pub defaults: KeyConfigUpdate,
    #[serde(default)]
    pub limits: NodeLimits,
    #[serde(default)]
    pub cluster: ClusterShape,
    #[serde(rename = "node")]
    pub nodes: Vec<NodeConfig>,
}

/// `[cluster]`: how the cluster's keys are laid out over Raft groups.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterShape {
    /// Shards: Raft groups over the same voters, each holding the keys that
    /// hash to it (`permitd_core::shard::shard_of`). Fixed when a node first
    /// writes its data dir; a dir written with another count refuses to open
    /// (docs/operations.md, "Changing the shard count").
    pub shards: u32,
}

impl Default for ClusterShape {
    fn default() -> Self {
        Self {
            shards: DEFAULT_SHARDS,
        }
    }
}

/// Shards of a cluster whose file names none (`[cluster] shards`).
pub const DEFAULT_SHARDS: u32 = 1;
/// Most shards a cluster may have: every node runs a Raft core, a rounds
/// driver and timers per shard, even an idle (quiet) one.
pub const MAX_NODE_SHARDS: u32 = 256;

/// `[auth]`: who may call the public API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// `false` opens every route to anyone: local development only (the node
    /// warns at every start).
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// The admin token; `PERMITD_ADMIN_TOKEN` overrides it. Required when enabled.
    #[serde(default)]
    pub admin_token: Option<Secret>,
}

fn enabled() -> bool {
    true
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            admin_token: None,
        }
    }
}

/// One node's identity and addresses.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub id: NodeId,
    /// `host:port` of the public v1 API.
    pub api_addr: String,
    /// `host:port` of the internal `/raft/` and `/cluster/` endpoints.
    pub raft_addr: String,
    /// `host:port` peers use to reach `raft_addr`, as stored in the Raft
    /// membership, when it differs from the bind address (a proxy, NAT, a
    /// container port mapping). Defaults to `raft_addr`.
    #[serde(default)]
    pub advertise_raft_addr: Option<String>,
    /// Local address this node's outgoing Raft connections bind to, on a host
    /// with several (tests give each node its own loopback address so that a
    /// fault-injecting proxy can tell senders apart even over TLS). Defaults to
    /// the system's choice.
    #[serde(default)]
    pub peer_source_ip: Option<std::net::IpAddr>,
    /// Where the node keeps its log and snapshots.
    pub data_dir: PathBuf,
}

/// Per-node bounds on what clients may park, tighter than the built-in maxima
/// where an operator wants it (and tests need a small one).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeLimits {
    /// Requests that may wait for one key's round on the leader; 429 beyond.
    pub max_pending_per_key: usize,
    /// Longest wait for a request header (and idle keep-alive), in ms.
    pub header_read_timeout_ms: u64,
    /// Longest pause between parts of a request body, in ms.
    pub body_read_timeout_ms: u64,
    /// Connections one listener serves at once.
    pub max_connections: usize,
    /// Round and sync entries the leader may have in flight at once.
    pub entries_in_flight: usize,
    /// Requests and syncs waiting on the leader, all keys together; 503 beyond.
    pub max_parked_messages: usize,
    /// Their bytes as received; 503 beyond.
    pub max_parked_bytes: usize,
    /// Longest an entry may wait to commit before the leader answers `no_quorum`.
    pub commit_timeout_ms: u64,
    /// Claim deadlines the leader keeps a timer for: those at most this far
    /// ahead; the rest wait for a scan of every key each half of it.
    pub reclaim_horizon_ms: u64,
}

impl Default for NodeLimits {
    fn default() -> Self {
        Self {
            max_pending_per_key: MAX_PENDING_REQUESTS_PER_KEY,
            header_read_timeout_ms: HEADER_READ_TIMEOUT_MS,
            body_read_timeout_ms: BODY_READ_TIMEOUT_MS,
            max_connections: MAX_CONNECTIONS_PER_LISTENER,
            entries_in_flight: DEFAULT_ENTRIES_IN_FLIGHT,
            max_parked_messages: MAX_PARKED_MESSAGES,
            max_parked_bytes: MAX_PARKED_BYTES,
            commit_timeout_ms: COMMIT_TIMEOUT_MS,
            reclaim_horizon_ms: crate::leader::reclaim::DEFAULT_HORIZON_MS,
        }
    }
}

impl NodeLimits {
    /// The HTTP edge's share of these limits.
    pub fn edge(&self) -> EdgeLimits {
        EdgeLimits {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            body_read_timeout: Duration::from_millis(self.body_read_timeout_ms),
            max_connections: self.max_connections,
        }
    }

    /// The leader's share of these limits: what may wait, and for how long.
    pub fn rounds(&self) -> crate::leader::rounds::RoundLimits {
        crate::leader::rounds::RoundLimits {
            max_pending_per_key: self.max_pending_per_key,
            entries_in_flight: self.entries_in_flight,
            max_parked_messages: self.max_parked_messages,
            max_parked_bytes: self.max_parked_bytes,
            commit_timeout: Duration::from_millis(self.commit_timeout_ms),
        }
    }

    fn validate(&self) -> Result<(), String> {
        let pending = self.max_pending_per_key;
        if !(1..=MAX_PENDING_REQUESTS_PER_KEY).contains(&pending) {
            return Err(format!(
                "[limits] max_pending_per_key must be 1 to {MAX_PENDING_REQUESTS_PER_KEY}"
            ));
        }
        for (name, value, max) in [
            (
                "header_read_timeout_ms",
                self.header_read_timeout_ms,
                HEADER_READ_TIMEOUT_MS,
            ),
            (
                "body_read_timeout_ms",
                self.body_read_timeout_ms,
                BODY_READ_TIMEOUT_MS,
            ),
        ] {
            if !(1..=max).contains(&value) {
                return Err(format!("[limits] {name} must be 1 to {max}"));
            }
        }
        if !(1..=MAX_CONNECTIONS_PER_LISTENER).contains(&self.max_connections) {
            return Err(format!(
                "[limits] max_connections must be 1 to {MAX_CONNECTIONS_PER_LISTENER}"
            ));
        }
        if !(1..=MAX_ENTRIES_IN_FLIGHT).contains(&self.entries_in_flight) {
            return Err(format!(
                "[limits] entries_in_flight must be 1 to {MAX_ENTRIES_IN_FLIGHT}"
            ));
        }
        if !(1..=MAX_PARKED_MESSAGES).contains(&self.max_parked_messages) {
            return Err(format!(
                "[limits] max_parked_messages must be 1 to {MAX_PARKED_MESSAGES}"
            ));
        }
        // One largest body must always fit.
        if !(MAX_BODY_BYTES..=MAX_PARKED_BYTES).contains(&self.max_parked_bytes) {
            return Err(format!(
                "[limits] max_parked_bytes must be {MAX_BODY_BYTES} to {MAX_PARKED_BYTES}"
            ));
        }
        if !(1..=MAX_COMMIT_TIMEOUT_MS).contains(&self.commit_timeout_ms) {
            return Err(format!(
                "[limits] commit_timeout_ms must be 1 to {MAX_COMMIT_TIMEOUT_MS}"
            ));
        }
        let (min, max) = (
            crate::leader::reclaim::MIN_HORIZON_MS,
            crate::leader::reclaim::MAX_HORIZON_MS,
        );
        if !(min..=max).contains(&self.reclaim_horizon_ms) {
            return Err(format!(
                "[limits] reclaim_horizon_ms must be {min} to {max}"
            ));
        }
        Ok(())
    }
}

/// Raft timings, in milliseconds. The defaults suit loopback or one LAN: a
/// follower stands for election after the leader lease (openraft 0.9 sets it to
/// `election_timeout_max_ms`) plus an election timeout drawn from min..max, and
/// a pre-vote (`raft/election_guard.rs`), so a dead leader is replaced in about
/// `2 × election_timeout_max_ms` at worst (see `cluster.toml`). A field the
/// `[raft]` table leaves out takes its default, as when the table is absent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftTimings {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Timeout of one Raft RPC to a peer.
    pub rpc_timeout_ms: u64,
    /// Log entries between two snapshots (node `i` waits `(1 + (i-1)/4)` times
    /// as many, so that the nodes of a cluster snapshot at different indexes).
    pub snapshot_every_logs: u64,
    /// Longest time between two snapshots while entries are applied, in ms
    /// (staggered per node like `snapshot_every_logs`).
    pub snapshot_every_ms: u64,
    /// Log entries kept behind a snapshot, so that a follower that lagged
    /// briefly (a restart, a pause) catches up from the log, not a snapshot.
    pub log_kept_after_snapshot: u64,
}

/// Shortest time budget between snapshots: building one costs a copy of the
/// state, so a smaller budget would spend the node on snapshots.
const MIN_SNAPSHOT_EVERY_MS: u64 = 1_000;

impl Default for RaftTimings {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 40,
            election_timeout_min_ms: 120,
            election_timeout_max_ms: 240,
            rpc_timeout_ms: 1_000,
            snapshot_every_logs: 5_000,
            snapshot_every_ms: 300_000,
            log_kept_after_snapshot: 10_000,
        }
    }
}

impl NodeConfig {
    pub fn peer(&self) -> PeerNode {
        PeerNode {
            api_addr: self.api_addr.clone(),
            raft_addr: self
                .advertise_raft_addr
                .clone()
                .unwrap_or_else(|| self.raft_addr.clone()),
        }
    }
}

/// How a follower forwards calls to the leader (`edge/api/forward/`), from the
/// Raft timings and the leader's commit timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardTimings {
    /// Longest wait to connect to the leader, and for the leader to acknowledge
    /// what was sent on a connection (`rpc_timeout_ms`, the patience Raft gives
    /// a peer's call); also how often an idle follower checks that it can reach
    /// the leader.
    pub reach: Duration,
    /// The leader's `[limits] commit_timeout_ms`: it answers every waiting
    /// message by then, with `no_quorum` if it cannot commit.
    pub commit_timeout: Duration,
}

impl ForwardTimings {
    pub fn new(raft: &RaftTimings, commit_timeout: Duration) -> Self {
        Self {
            reach: Duration::from_millis(raft.rpc_timeout_ms),
            commit_timeout,
        }
    }
}

/// The bounds one listener serves with (`[limits]` of the cluster file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeLimits {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub max_connections: usize,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        NodeLimits::default().edge()
    }
}

impl ClusterConfig {
    /// Reads, parses and checks a file; data directories become absolute.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let parse_error = |source| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        };
        let mut document: toml::Table = text.parse().map_err(parse_error)?;
        let applied = crate::config_env::apply(&mut document, std::env::vars())
            .map_err(|error| ConfigError::Invalid(error.to_string()))?;
        if !applied.is_empty() {
            tracing::info!(?applied, "settings overridden from the environment");
        }
        let mut config: Self = toml::Value::Table(document)
            .try_into()
            .map_err(parse_error)?;
        let base = path.parent().unwrap_or(Path::new("."));
        for node in &mut config.nodes {
            if node.data_dir.is_relative() {
                node.data_dir = base.join(&node.data_dir);
            }
        }
        if let Some(tls) = &mut config.tls {
            tls.resolve_paths(base);
        }
        if let Ok(token) = std::env::var(ADMIN_TOKEN_ENV) {
            config.auth.admin_token = Some(Secret::from(token));
        }
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| Err(ConfigError::Invalid(message));
        if self.secret.len() < MIN_SECRET_BYTES {
            return invalid(format!("secret must be at least {MIN_SECRET_BYTES} bytes"));
        }
        match &self.auth.admin_token {
            Some(token) if token.len() < MIN_ADMIN_TOKEN_BYTES => {
                return invalid(format!(
                    "[auth] admin_token must be at least {MIN_ADMIN_TOKEN_BYTES} bytes"
                ))
            }
            None if self.auth.enabled => {
                return invalid(format!(
                    "[auth] admin_token (or {ADMIN_TOKEN_ENV}) is required unless [auth] enabled = false"
                ))
            }
            _ => {}
        }
        if !(1..=MAX_NODE_SHARDS).contains(&self.cluster.shards) {
            return invalid(format!("[cluster] shards must be 1 to {MAX_NODE_SHARDS}"));
        }
        if self.nodes.is_empty() {
            return invalid("at least one [[node]] is needed".into());
        }
        let ids: BTreeSet<NodeId> = self.nodes.iter().map(|node| node.id).collect();
        if ids.len() != self.nodes.len() {
            return invalid("node ids must be unique".into());
        }
        let raft = &self.raft;
        if raft.heartbeat_interval_ms == 0
            || raft.election_timeout_min_ms <= raft.heartbeat_interval_ms
            || raft.election_timeout_max_ms <= raft.election_timeout_min_ms
        {
            return invalid("need 0 < heartbeat < election min < election max".into());
        }
        if raft.snapshot_every_ms < MIN_SNAPSHOT_EVERY_MS {
            return invalid(format!(
                "[raft] snapshot_every_ms must be at least {MIN_SNAPSHOT_EVERY_MS}"
            ));
        }
        if let Err(message) = self.limits.validate() {
            return invalid(message);
        }
        validate_key_config(&self.key_defaults())
            .or_else(|error| invalid(format!("[defaults]: {error}")))
    }

    /// The `[defaults]` over the built-in key defaults.
    pub fn key_defaults(&self) -> KeyConfig {
        self.defaults.resolve(&KeyConfig::default())
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeConfig> {
        self.nodes.iter().find(|node| node.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_cluster_toml_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cluster.toml");
        let config = ClusterConfig::load(&path).expect("cluster.toml loads");
        assert_eq!(config.nodes.len(), 3);
        assert!(config
            .nodes
            .iter()
            .all(|node| node.data_dir.is_absolute()
                || node.data_dir.starts_with(path.parent().unwrap())));
    }

    #[test]
    fn peers_reach_the_advertised_raft_address() {
        let text = r#"secret = "0123456789abcdef"
            [auth]
            admin_token = "0123456789abcdef"
            [[node]]
            id = 1
            api_addr = "127.0.0.1:1"
            raft_addr = "127.0.0.1:2"
            advertise_raft_addr = "127.0.0.1:3"
            data_dir = "d"
            [[node]]
            id = 2
            api_addr = "127.0.0.1:4"
            raft_addr = "127.0.0.1:5"
            data_dir = "d2""#;
        let config: ClusterConfig = toml::from_str(text).unwrap();
        assert_eq!(config.nodes[0].peer().raft_addr, "127.0.0.1:3");
        assert_eq!(config.nodes[0].raft_addr, "127.0.0.1:2");
        assert_eq!(config.nodes[1].peer().raft_addr, "127.0.0.1:5");
    }

    /// One `[[node]]` table, the last of a test's file.
    const ONE_NODE: &str =
        "[[node]]\nid = 1\napi_addr = \"127.0.0.1:1\"\nraft_addr = \"127.0.0.1:2\"\ndata_dir = \"d\"\n";

    #[test]
    fn a_raft_table_may_name_only_the_timings_it_changes() {
        let text = format!(
            "secret = \"0123456789abcdef\"\n[raft]\nheartbeat_interval_ms = 50\n{ONE_NODE}"
        );
        let config: ClusterConfig = toml::from_str(&text).unwrap();
        let defaults = RaftTimings::default();
        assert_eq!(config.raft.heartbeat_interval_ms, 50);
        assert_eq!(
            config.raft.election_timeout_max_ms,
            defaults.election_timeout_max_ms
        );
        assert_eq!(
            config.raft.snapshot_every_logs,
            defaults.snapshot_every_logs
        );
        let unknown = text.replace("heartbeat_interval_ms", "heartbeat_ms");
        assert!(toml::from_str::<ClusterConfig>(&unknown).is_err());
    }

    #[test]
    fn short_secrets_and_duplicate_ids_are_rejected() {
        let text = format!("secret = \"short\"\n{ONE_NODE}");
        let config: ClusterConfig = toml::from_str(&text).unwrap();
        assert!(config.check().is_err());
    }

    #[test]
    fn auth_needs_a_long_enough_admin_token_unless_switched_off() {
        for (auth, valid) in [
            ("", false),
            ("[auth]\nadmin_token = \"short\"\n", false),
            ("[auth]\nadmin_token = \"0123456789abcdef\"\n", true),
            ("[auth]\nenabled = false\n", true),
        ] {
            let text = format!("secret = \"0123456789abcdef\"\n{auth}{ONE_NODE}");
            let config: ClusterConfig = toml::from_str(&text).unwrap();
            assert_eq!(config.check().is_ok(), valid, "{auth}");
            assert!(!format!("{config:?}").contains("0123456789abcdef"));
        }
    }

    #[test]
    fn the_pending_bound_defaults_to_the_maximum_and_is_checked() {
        let node = ONE_NODE;
        let plain = format!(
            "secret = \"0123456789abcdef\"\n[auth]\nadmin_token = \"0123456789abcdef\"\n{node}"
        );
        let config: ClusterConfig = toml::from_str(&plain).unwrap();
        assert_eq!(
            config.limits.max_pending_per_key,
            MAX_PENDING_REQUESTS_PER_KEY
        );
        for (pending, valid) in [
            (0, false),
            (1, true),
            (MAX_PENDING_REQUESTS_PER_KEY + 1, false),
        ] {
            let text = format!(
                "secret = \"0123456789abcdef\"\n[auth]\nadmin_token = \"0123456789abcdef\"\n[limits]\nmax_pending_per_key = {pending}\n{node}"
            );
            let config: ClusterConfig = toml::from_str(&text).unwrap();
            assert_eq!(
                config.check().is_ok(),
                valid,
                "max_pending_per_key = {pending}"
            );
        }
    }

    /// A one-node configuration with `limits` as its `[limits]` table.
    fn with_limits(limits: &str) -> ClusterConfig {
        let node = ONE_NODE;
        let text = format!(
            "secret = \"0123456789abcdef\"\n[auth]\nadmin_token = \"0123456789abcdef\"\n[limits]\n{limits}\n{node}"
        );
        toml::from_str(&text).unwrap()
    }

    #[test]
    fn the_reclaim_horizon_defaults_to_a_minute_and_is_checked() {
        assert_eq!(with_limits("").limits.reclaim_horizon_ms, 60_000);
        for (horizon, valid) in [
            (999, false),
            (1_000, true),
            (3_600_000, true),
            (3_600_001, false),
        ] {
            let config = with_limits(&format!("reclaim_horizon_ms = {horizon}"));
            assert_eq!(
                config.check().is_ok(),
                valid,
                "reclaim_horizon_ms = {horizon}"
            );
        }
    }

    #[test]
    fn edge_limits_default_to_the_maxima_and_are_checked() {
        let edge = with_limits("").limits.edge();
        assert_eq!(
            edge.header_read_timeout,
            Duration::from_millis(HEADER_READ_TIMEOUT_MS)
        );
        assert_eq!(
            edge.body_read_timeout,
            Duration::from_millis(BODY_READ_TIMEOUT_MS)
        );
        assert_eq!(edge.max_connections, MAX_CONNECTIONS_PER_LISTENER);
        let short = with_limits("header_read_timeout_ms = 500\nbody_read_timeout_ms = 700");
        assert_eq!(
            short.limits.edge().header_read_timeout,
            Duration::from_millis(500)
        );
        assert!(short.check().is_ok());
        for invalid in [
            "header_read_timeout_ms = 0",
            "header_read_timeout_ms = 10001",
            "body_read_timeout_ms = 0",
            "max_connections = 0",
            "max_connections = 4097",
            "max_parked_messages = 0",
            "max_parked_messages = 100001",
            "max_parked_bytes = 1000",
            "max_parked_bytes = 268435457",
            "commit_timeout_ms = 0",
            "commit_timeout_ms = 60001",
        ] {
            assert!(with_limits(invalid).check().is_err(), "{invalid}");
        }
    }

    /// The environment's overrides, applied to a file as `load` does: tested
    /// here, on the config they produce, so `config_env.rs` need not know it.
    mod env_overrides {
        use toml::{Table, Value};

        use super::ClusterConfig;
        use crate::config_env::apply;

        const FILE: &str = r#"
            secret = "0123456789abcdef-file"
            [raft]
            heartbeat_interval_ms = 100
            election_timeout_min_ms = 400
            election_timeout_max_ms = 800
            rpc_timeout_ms = 1000
            snapshot_every_logs = 5000
            [defaults]
            limit = 100
            [[node]]
            id = 1
            api_addr = "127.0.0.1:7001"
            raft_addr = "127.0.0.1:7101"
            data_dir = "data/node-1"
            [[node]]
            id = 2
            api_addr = "127.0.0.1:7002"
            raft_addr = "127.0.0.1:7102"
            data_dir = "data/node-2"
        "#;

        fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect()
        }

        fn overridden(pairs: &[(&str, &str)]) -> Result<ClusterConfig, String> {
            let mut document: Table = FILE.parse().expect("test file parses");
            apply(&mut document, vars(pairs)).map_err(|error| error.to_string())?;
            Value::Table(document)
                .try_into()
                .map_err(|error: toml::de::Error| error.to_string())
        }

        #[test]
        fn every_kind_of_setting_is_overridden() {
            let config = overridden(&[
                ("PERMITD_SECRET", "1234567890123456789"),
                ("PERMITD_RAFT_RPC_TIMEOUT_MS", "2500"),
                ("PERMITD_DEFAULTS_ROUND_WAIT_MS", "50"),
                ("PERMITD_DEFAULTS_LIMIT", "7"),
                (
                    "PERMITD_DEFAULTS_LEASES",
                    r#"{ provisioning = { mode = "strict" }, ttlMs = 60000 }"#,
                ),
                ("PERMITD_LIMITS_MAX_PENDING_PER_KEY", "12"),
                ("PERMITD_NODE_2_API_ADDR", "10.0.0.2:7000"),
                ("PERMITD_NODE_2_ADVERTISE_RAFT_ADDR", "permitd-2:7100"),
                ("PERMITD_NODE_1_DATA_DIR", "/var/lib/permitd"),
            ])
            .expect("overrides apply");
            assert_eq!(
                config.secret.expose(),
                "1234567890123456789",
                "stays a string"
            );
            assert_eq!(config.raft.rpc_timeout_ms, 2_500);
            assert_eq!(config.raft.heartbeat_interval_ms, 100, "untouched");
            let defaults = config.key_defaults();
            assert_eq!(defaults.round_wait_ms, 50);
            assert_eq!(defaults.limit, 7);
            assert_eq!(defaults.leases.expect("leases set").ttl_ms, 60_000);
            assert_eq!(config.limits.max_pending_per_key, 12);
            assert_eq!(config.nodes[1].api_addr, "10.0.0.2:7000");
            assert_eq!(config.nodes[1].peer().raft_addr, "permitd-2:7100");
            assert_eq!(
                config.nodes[0].data_dir,
                std::path::PathBuf::from("/var/lib/permitd")
            );
        }

        #[test]
        fn other_permitd_variables_are_left_alone() {
            let config = overridden(&[
                ("PERMITD_ENDPOINTS", "http://x"),
                ("PERMITD_KEEP_DIRS", "1"),
                ("HOME", "/root"),
            ])
            .expect("nothing applies");
            assert_eq!(config.secret.expose(), "0123456789abcdef-file");
        }

        #[test]
        fn mistakes_are_errors_not_silence() {
            let error = overridden(&[("PERMITD_NODE_9_API_ADDR", "x:1")]).unwrap_err();
            assert!(error.contains("no [[node]] with id 9"), "{error}");
            let error = overridden(&[("PERMITD_NODE_1", "x")]).unwrap_err();
            assert!(error.contains("name a field"), "{error}");
            // A misspelt field reaches the file's own check (unknown field).
            let error = overridden(&[("PERMITD_RAFT_RPC_TIMEOUT", "5")]).unwrap_err();
            assert!(error.contains("rpc_timeout"), "{error}");
            // A wrong type is refused like the same mistake in the file.
            let error = overridden(&[("PERMITD_RAFT_RPC_TIMEOUT_MS", "soon")]).unwrap_err();
            assert!(error.contains("rpc_timeout_ms"), "{error}");
        }
    }
}
