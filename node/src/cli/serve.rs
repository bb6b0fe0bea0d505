//! `permitd serve`: run one node until Ctrl+C or SIGTERM.
//!
//! With `--config FILE --id N` the node takes its addresses, data directory,
//! secret and timings from the cluster file and waits to be initialised (by
//! `permitd up` or `POST /cluster/init`). Without `--config` it is a one-node
//! cluster in `./data` that initialises itself: the zero-setup default. Either way,
//! a node with existing data resumes and never initialises again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use permitd_core::KeyConfig;

use crate::app::{self, NodeSettings, StartError, Started};
use crate::config::{ClusterConfig, ConfigError, RaftTimings, StorageSettings, MIN_SECRET_BYTES};
use crate::edge::{self, EdgeLimits};
use crate::propose::ProposeError;
use crate::shutdown::Shutdown;

/// How long stopping may take before the listeners are abandoned.
const STOP_TIMEOUT_MS: u64 = 10_000;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The cluster file; without it, run one self-initialising node.
    #[arg(long, env = "PERMITD_CONFIG")]
    pub config: Option<PathBuf>,
    /// This node's id in the cluster file.
    #[arg(long, env = "PERMITD_ID", requires = "config")]
    pub id: Option<u64>,
    /// Data directory of the single node (without --config).
    #[arg(long, default_value = "data", conflicts_with = "config")]
    pub data_dir: PathBuf,
    /// API address of the single node (without --config).
    #[arg(long, default_value = "127.0.0.1:7000", conflicts_with = "config")]
    pub api_addr: String,
    /// Raft address of the single node (without --config).
    #[arg(long, default_value = "127.0.0.1:7100", conflicts_with = "config")]
    pub raft_addr: String,
}

/// Why `serve` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("--id is required with --config")]
    MissingId,
    #[error("node {0} is not in the cluster file")]
    UnknownNode(u64),
    #[error("the Raft core stopped: {0}")]
    RaftStopped(String),
    #[error("secret file {path}: {source}")]
    Secret {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub async fn run(args: ServeArgs) -> Result<(), ServeError> {
    let settings = match &args.config {
        Some(path) => clustered(path, args.id.ok_or(ServeError::MissingId)?)?,
        None => embedded(&args)?,
    };
    let started = app::start(&settings).await?;
    tracing::info!(
        id = settings.id,
        api = ?app::local_addr(&started.api_listener),
        raft = ?app::local_addr(&started.raft_listener),
        data_dir = %settings.data_dir.display(),
        "node started"
    );
    if settings.initialize_at_start {
        tokio::spawn(initialize_if_new(started.app.clone()));
    }
    serve_until_signal(started, settings.edge).await
}

fn clustered(path: &Path, id: u64) -> Result<NodeSettings, ServeError> {
    let config = ClusterConfig::load(path)?;
    let node = config.node(id).ok_or(ServeError::UnknownNode(id))?;
    let members = config
        .nodes
        .iter()
        .map(|node| (node.id, node.peer()))
        .collect();
    Ok(NodeSettings {
        id,
        api_addr: node.api_addr.clone(),
        raft_addr: node.raft_addr.clone(),
        data_dir: node.data_dir.clone(),
        secret: config.secret.clone(),
        timings: config.raft.clone(),
        storage: config.storage.clone(),
        defaults: config.key_defaults(),
        initial_members: members,
        initialize_at_start: false,
        max_pending_per_key: config.limits.max_pending_per_key,
        edge: config.limits.edge(),
        entries_in_flight: config.limits.entries_in_flight,
    })
}

fn embedded(args: &ServeArgs) -> Result<NodeSettings, ServeError> {
    let secret = embedded_secret(&args.data_dir)?;
    let peer = permitd_storage::PeerNode {
        api_addr: args.api_addr.clone(),
        raft_addr: args.raft_addr.clone(),
    };
    Ok(NodeSettings {
        id: 1,
        api_addr: args.api_addr.clone(),
        raft_addr: args.raft_addr.clone(),
        data_dir: args.data_dir.clone(),
        secret,
        timings: RaftTimings::default(),
        storage: StorageSettings::default(),
        defaults: KeyConfig::default(),
        initial_members: BTreeMap::from([(1, peer)]),
        initialize_at_start: true,
        max_pending_per_key: permitd_core::limits::MAX_PENDING_REQUESTS_PER_KEY,
        edge: crate::edge::EdgeLimits::default(),
        entries_in_flight: permitd_core::limits::DEFAULT_ENTRIES_IN_FLIGHT,
    })
}

/// The single node's cluster secret: `PERMITD_SECRET`, else one generated on
/// first start and kept in `<data dir>/cluster-secret`.
fn embedded_secret(data_dir: &Path) -> Result<String, ServeError> {
    if let Ok(secret) = std::env::var("PERMITD_SECRET") {
        if secret.len() >= MIN_SECRET_BYTES {
            return Ok(secret);
        }
    }
    let path = data_dir.join("cluster-secret");
    let error = |source| ServeError::Secret {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(secret) if secret.trim().len() >= MIN_SECRET_BYTES => Ok(secret.trim().to_owned()),
        _ => {
            std::fs::create_dir_all(data_dir).map_err(error)?;
            let secret = random_hex();
            std::fs::write(&path, &secret).map_err(error)?;
            tracing::info!(path = %path.display(), "generated the cluster secret");
            Ok(secret)
        }
    }
}

/// 128 random bits as hex, from the standard library's per-process random keys.
fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    (0..2)
        .map(|round| {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(crate::now_ms() ^ round);
            format!("{:016x}", hasher.finish())
        })
        .collect()
}

async fn initialize_if_new(app: app::App) {
    match app.raft.is_initialized().await {
        Ok(true) => tracing::info!("resuming from existing data"),
        Ok(false) => match crate::api::cluster::initialize(&app).await {
            Ok(()) => tracing::info!("initialised a new single-node cluster"),
            Err(error) => tracing::error!(%error, "cannot initialise the single node"),
        },
        Err(error) => tracing::error!(%error, "cannot read the Raft state"),
    }
}

async fn serve_until_signal(started: Started, edge: EdgeLimits) -> Result<(), ServeError> {
    let Started {
        app,
        api_listener,
        raft_listener,
    } = started;
    let stop_api = Shutdown::default();
    let stop_raft = Shutdown::default();
    let public = crate::api::public_router(app.clone());
    let api_task = tokio::spawn(edge::serve(api_listener, public, edge, stop_api.clone()));
    let internal = crate::api::internal_router(app.clone());
    let raft_task = tokio::spawn(edge::serve(
        raft_listener,
        internal,
        edge,
        stop_raft.clone(),
    ));
    // A core that stopped on its own ends the process with an error, after the
    // same orderly stop as a signal, so a supervisor restarts it.
    let fatal = tokio::select! {
        () = crate::shutdown::signal() => None,
        reason = crate::fatal::wait(&app.raft) => Some(reason),
    };
    if let Some(reason) = &fatal {
        tracing::error!(%reason, "the Raft core stopped; stopping the node");
    }
    // Stop taking calls, then fail the ones parked for a round: their clients
    // retry on another node. In-flight answers drain before the server returns.
    stop_api.trigger();
    app.rounds.fail_all(ProposeError::ShuttingDown);
    let stop_timeout = Duration::from_millis(STOP_TIMEOUT_MS);
    let api_result = tokio::time::timeout(stop_timeout, api_task).await;
    if let Err(error) = app.raft.shutdown().await {
        tracing::error!(%error, "raft shutdown failed");
    }
    stop_raft.trigger();
    let _ = tokio::time::timeout(stop_timeout, raft_task).await;
    if let Err(error) = app.state.flush().await {
        tracing::error!(%error, "flushing the store failed");
    }
    tracing::info!("stopped");
    if api_result.is_err() {
        tracing::warn!("open API connections did not finish in time");
    }
    fatal.map_or(Ok(()), |reason| Err(ServeError::RaftStopped(reason)))
}
