//! One running node: storage opened, Raft started, the leader-side tasks spawned,
//! both HTTP listeners bound ([`start`]; [`start_unbound`] binds none). [`App`] is the state every handler shares.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use permitd_core::KeyConfig;
use permitd_storage::{NodeId, PeerNode, ShardId};
use permitd_transport::{ReqwestTransport, StreamTransport, Transport};
use tokio::net::TcpListener;
use tokio::runtime::Handle;

use crate::config::{ForwardTimings, RaftTimings};
use crate::credentials::tls::Tls;
use crate::credentials::{AuthSettings, Secret};
use crate::observe::event_log::EventHub;
use crate::raft::liveness::Liveness;
use crate::raft::network::Network;
use crate::raft::peer_connector::PeerConnector;
use crate::raft::stall_clock::StallClock;
use crate::seams::Seams;
use crate::shard::{Shard, ShardStart, META_SHARD};

/// Everything needed to start one node.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    pub id: NodeId,
    pub api_addr: String,
    pub raft_addr: String,
    pub data_dir: PathBuf,
    /// Opens `/raft/*` between peers.
    pub secret: Secret,
    /// Who may call the public API.
    pub auth: AuthSettings,
    /// Both listeners serve HTTPS when set; clients to peers use it too.
    pub tls: Option<Tls>,
    /// Local address of outgoing Raft connections (`[[node]] peer_source_ip`).
    pub peer_source_ip: Option<std::net::IpAddr>,
    pub timings: RaftTimings,
    /// Written into the replicated state right after initialisation.
    pub defaults: KeyConfig,
    /// The voters `/cluster/init` creates: every node of the config file.
    pub initial_members: BTreeMap<NodeId, PeerNode>,
    /// Initialise a new cluster of `initial_members` at start (embedded mode).
    pub initialize_at_start: bool,
    /// What may wait on the leader, and for how long (`[limits]`).
    pub rounds: crate::leader::rounds::RoundLimits,
    /// Timeouts and connection limits of the node's listeners.
    pub edge: crate::config::EdgeLimits,
    /// Claim deadlines the leader keeps a timer for: those at most this far
    /// ahead (`[limits] reclaim_horizon_ms`; see `leader/reclaim.rs`).
    pub reclaim_horizon: Duration,
    /// Clock, timer and randomness: the real world's, or the simulator's.
    pub seams: Seams,
    /// Raft groups the keys are spread over (`[cluster] shards`).
    pub shards: u32,
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("storage: {0}")]
    Storage(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("http client: {0}")]
    Http(#[from] reqwest::Error),
    #[error(transparent)]
    Tls(#[from] crate::credentials::tls::TlsError),
}

/// The state every handler shares: one [`Node`] behind an `Arc`. Every request
/// clones it (axum's `State`, each middleware layer), so a clone is one
/// reference count, not one per field (the profile of a busy leader showed
/// field-by-field clones and drops at 7 % of its CPU).
#[derive(Clone, Debug)]
pub struct App(Arc<Node>);

impl std::ops::Deref for App {
    type Target = Node;

    fn deref(&self) -> &Node {
        &self.0
    }
}

/// What a running node's handlers use.
pub struct Node {
    pub id: NodeId,
    /// Every shard of the cluster, shard k at position k; never empty.
    pub shards: Vec<Shard>,
    /// What followers forward leader-only calls with: the pooled client to
    /// the leader, unless a transport was injected.
    pub leader_transport: Transport,
    /// Its limits, and how long a forwarded call may take (`edge/api/forward/`).
    pub forward_timings: ForwardTimings,
    pub secret: Secret,
    pub auth: Arc<AuthSettings>,
    /// `http` or `https`: how this node reaches its peers' listeners.
    pub scheme: &'static str,
    pub initial_members: Arc<BTreeMap<NodeId, PeerNode>>,
    pub defaults: Arc<KeyConfig>,
    pub metrics: PrometheusHandle,
    /// Its clock (usage reads count lease expiry from it), blocking work.
    pub seams: Seams,
    /// What the shards' event logs share: the node's limit on open event
    /// streams, which a stream of every shard takes once.
    pub events: EventHub,
    /// The liveness exchanges with the peers that stand for quiet shards'
    /// heartbeats (`raft/liveness.rs`; several shards only).
    pub liveness: Arc<Liveness>,
}

impl Node {
    /// The meta shard: tokens and cluster defaults (`shard.rs`).
    pub fn meta(&self) -> &Shard {
        &self.shards[META_SHARD as usize]
    }

    /// Shard `id`, if the cluster has it.
    pub fn shard(&self, id: ShardId) -> Option<&Shard> {
        self.shards.get(usize::try_from(id).ok()?)
    }

    /// The cluster's shard count.
    pub fn shard_count(&self) -> u32 {
        u32::try_from(self.shards.len()).unwrap_or(u32::MAX)
    }

    /// The shard that holds `key`.
    pub fn key_shard(&self, key: &str) -> &Shard {
        let shard = permitd_core::shard::shard_of(key, self.shard_count()).unwrap_or(META_SHARD);
        &self.shards[shard as usize]
    }

    /// Why a shard's Raft core stopped, if one did (`leader/fatal.rs`).
    pub fn stopped(&self) -> Option<String> {
        self.shards.iter().find_map(|shard| {
            crate::leader::fatal::stopped(&shard.raft)
                .map(|reason| format!("shard {}: {reason}", shard.id))
        })
    }

    /// Resolves when any shard's Raft core stops, with the reason: a node
    /// that can no longer apply one shard must stop as a whole.
    pub async fn fatal(&self) -> String {
        let waits = self.shards.iter().map(|shard| {
            Box::pin(async move {
                let reason = crate::leader::fatal::wait(&shard.raft).await;
                format!("shard {}: {reason}", shard.id)
            })
        });
        futures_util::future::select_all(waits).await.0
    }

    /// Fails every parked call and ends every event stream: the node stops.
    pub fn stop_serving(&self) {
        for shard in &self.shards {
            shard
                .rounds
                .fail_all(crate::leader::propose::ProposeError::ShuttingDown);
            shard.events.close();
        }
    }

    /// Shuts every shard's Raft core down.
    pub async fn shutdown_raft(&self) {
        for shard in &self.shards {
            if let Err(error) = shard.raft.shutdown().await {
                tracing::error!(%error, shard = shard.id, "raft shutdown failed");
            }
        }
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("id", &self.id)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

/// A started node and its bound listeners.
#[derive(Debug)]
pub struct Started {
    pub app: App,
    pub api_listener: TcpListener,
    pub raft_listener: TcpListener,
}

/// Binds both listeners, then starts the node ([`start_unbound`]). Bound
/// first, so an address in use fails before the data dir is opened.
pub async fn start(settings: &NodeSettings, raft_runtime: &Handle) -> Result<Started, StartError> {
    let api_listener = bind(&settings.api_addr).await?;
    let raft_listener = bind(&settings.raft_addr).await?;
    let app = start_unbound(settings, raft_runtime).await?;
    Ok(Started {
        app,
        api_listener,
        raft_listener,
    })
}

/// Opens storage, starts every shard's Raft group and the leader-side tasks;
/// listens nowhere. The caller serves the routers (`edge::api`) on the
/// connections it accepts (`edge::connection`): [`start`]'s listeners, or the
/// simulator's. openraft's tasks, the election guards and the Raft probes are
/// spawned on `raft_runtime` ([`crate::raft::runtime`]); the rest on the
/// caller's runtime.
pub async fn start_unbound(
    settings: &NodeSettings,
    raft_runtime: &Handle,
) -> Result<App, StartError> {
    let options = settings.seams.storage(settings.data_dir.clone());
    let count = settings.shards;
    // On the Raft runtime: the WAL's sync thread starts from the thread that
    // opens the store and inherits its CPU priority, which must be Raft's.
    let opened = raft_runtime
        .spawn(async move { permitd_storage::open_shards(&options, count).await })
        .await
        .map_err(|error| StartError::Storage(error.to_string()))?
        .map_err(|error| StartError::Storage(error.to_string()))?;
    let timings = &settings.timings;
    let rpc_timeout = Duration::from_millis(timings.rpc_timeout_ms);
    let tls = settings.tls.as_ref();
    let network = Network::new(
        settings.id,
        settings.secret.clone(),
        (
            rpc_timeout,
            Duration::from_millis(timings.heartbeat_interval_ms),
        ),
        crate::credentials::tls::scheme(tls),
        peer_transport(settings, rpc_timeout)?,
    )
    .with_seams(settings.seams.clone())
    .with_shards(count, Duration::from_millis(timings.heartbeat_interval_ms));
    let events = EventHub::default();
    let liveness = Liveness::new(settings.id);
    let start = ShardStart {
        node: settings.id,
        timings,
        rounds: settings.rounds,
        reclaim_horizon: settings.reclaim_horizon,
        seams: &settings.seams,
        raft_runtime,
        network: &network,
        config: Arc::new(raft_config(settings.id, timings)?),
        shards: count,
        events: &events,
        liveness: &liveness,
        stalls: &Arc::new(StallClock::new(
            Duration::from_millis(timings.heartbeat_interval_ms) + crate::raft::stall_probe::TICK,
        )),
    };
    let mut shards = Vec::with_capacity(opened.len());
    for (id, opened) in (0..).zip(opened) {
        let shard = Shard::start(id, opened, &start).await;
        shards.push(shard.map_err(|error| StartError::Raft(error.to_string()))?);
    }
    if count > 1 {
        let _on_raft_runtime = raft_runtime.enter();
        let each = shards.iter().map(Shard::liveness).collect();
        let heartbeat = Duration::from_millis(timings.heartbeat_interval_ms);
        liveness.start(each, network.clone(), heartbeat);
    }
    // One follower of the meta shard's defaults per node, made only when
    // another shard needs it.
    let meta = crate::leader::seed_defaults::meta_defaults;
    let mut meta_defaults = None;
    for shard in &shards {
        shard.seed_defaults(settings.defaults.clone(), || {
            meta_defaults
                .get_or_insert_with(|| meta(&shards[META_SHARD as usize].state))
                .clone()
        });
    }
    let forward_timings = ForwardTimings::new(timings, settings.rounds.commit_timeout);
    // Dropped before the leader's listener would close it as idle, so no call
    // is sent on a connection the leader is closing.
    let pool_idle = settings.edge.header_read_timeout / 2;
    let leader_transport = transport_or(&settings.seams.transport, || {
        leader_client(&forward_timings, pool_idle, tls)
    })?;
    Ok(App(Arc::new(Node {
        id: settings.id,
        shards,
        leader_transport,
        forward_timings,
        secret: settings.secret.clone(),
        auth: Arc::new(settings.auth.clone()),
        scheme: crate::credentials::tls::scheme(settings.tls.as_ref()),
        initial_members: Arc::new(settings.initial_members.clone()),
        defaults: Arc::new(settings.defaults.clone()),
        metrics: crate::observe::metrics::install(),
        seams: settings.seams.clone(),
        events,
        liveness,
    })))
}

/// The injected transport, else the production client `build` makes.
fn transport_or(
    injected: &Option<Transport>,
    build: impl FnOnce() -> Result<reqwest::Client, reqwest::Error>,
) -> Result<Transport, StartError> {
    match injected {
        Some(transport) => Ok(transport.clone()),
        None => Ok(Arc::new(ReqwestTransport::new(build()?))),
    }
}

/// The injected transport of Raft calls, else the injected transport of every
/// call, else every shard's Raft calls to a peer on one stream
/// ([`StreamTransport`], `raft/peer_connector.rs`), with the pooled HTTP
/// client for calls too large for it.
fn peer_transport(settings: &NodeSettings, rpc_timeout: Duration) -> Result<Transport, StartError> {
    let seams = &settings.seams;
    if let Some(injected) = seams.peer_transport.as_ref().or(seams.transport.as_ref()) {
        return Ok(injected.clone());
    }
    let tls = settings.tls.as_ref();
    let larger = crate::raft::network::client(rpc_timeout, tls, settings.peer_source_ip)?;
    let connector = PeerConnector::new(
        tls.map(crate::raft::peer_connector::tls_connector),
        settings.peer_source_ip,
        rpc_timeout,
    );
    let larger = Arc::new(ReqwestTransport::new(larger));
    Ok(Arc::new(StreamTransport::new(Arc::new(connector), larger)))
}

/// The HTTP client followers forward with (`edge/api/forward/`); one
/// connection pool per node. With `tls`, the leader is reached over HTTPS,
/// trusting only the cluster CA. Built here, with the node's other clients, so
/// the edge gets it handed in (as a [`Transport`]). A path to the leader that
/// stops delivering fails a call within `timings.reach`: the connect timeout,
/// `TCP_USER_TIMEOUT` for what was sent and not acknowledged, and keep-alive
/// probes on an idle connection. Each call sets its own deadline
/// (`forward/deadline.rs`).
fn leader_client(
    timings: &ForwardTimings,
    pool_idle: Duration,
    tls: Option<&Tls>,
) -> Result<reqwest::Client, reqwest::Error> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(timings.reach)
        .tcp_user_timeout(timings.reach)
        .tcp_keepalive(KEEPALIVE)
        .tcp_keepalive_interval(KEEPALIVE)
        .pool_idle_timeout(pool_idle)
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        builder = tls.client(builder)?;
    }
    builder.build()
}

/// Idle time before a keep-alive probe of a pooled connection to the leader,
/// and between probes: the kernel counts them in whole seconds.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// Most entries in one AppendEntries. openraft's 300 made every step of a new
/// leader's search through a follower's log read and decode 300 entries (~10 ms
/// of ~4.6 KB entries); a busy leader appends a few entries at a time anyway.
const MAX_ENTRIES_PER_APPEND: u64 = 64;

fn raft_config(id: NodeId, timings: &RaftTimings) -> Result<openraft::Config, StartError> {
    // Staggered, so the nodes of a cluster do not build at the same log index.
    let every = crate::leader::snapshots::staggered(id, timings.snapshot_every_logs);
    let config = openraft::Config {
        cluster_name: "permitd".into(),
        heartbeat_interval: timings.heartbeat_interval_ms,
        election_timeout_min: timings.election_timeout_min_ms,
        election_timeout_max: timings.election_timeout_max_ms,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(every),
        max_in_snapshot_log_to_keep: timings.log_kept_after_snapshot,
        max_payload_entries: MAX_ENTRIES_PER_APPEND,
        // openraft's 200 ms default is too short for a chunk plus the install
        // of the last one on a busy node.
        install_snapshot_timeout: timings.rpc_timeout_ms,
        // openraft's timer stays off: the election guard decides when a node
        // stands and triggers the election (`raft/election_guard.rs`); a new
        // cluster's first election comes from `initialize`, which needs no timer.
        enable_elect: false,
        ..Default::default()
    };
    config
        .validate()
        .map_err(|error| StartError::Raft(error.to_string()))
}

async fn bind(addr: &str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind {
            addr: addr.to_owned(),
            source,
        })
}

/// The address a listener actually got (port 0 resolves here).
pub fn local_addr(listener: &TcpListener) -> Option<SocketAddr> {
    listener.local_addr().ok()
}
