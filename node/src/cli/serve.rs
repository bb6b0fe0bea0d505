//! `permitd serve`: run one node until Ctrl+C or SIGTERM.
//!
//! With `--config FILE --id N` the node takes its addresses, data directory,
//! secret and timings from the cluster file and waits to be initialised (by
//! `permitd up` or `POST /cluster/init`). Without `--config` it is a one-node
//! cluster in `./data` that initialises itself: the zero-setup default, with a
//! peer secret and an admin token generated from the OS random source into
//! `<data dir>/cluster-secret` and `<data dir>/admin-token` (mode 0600) unless
//! `PERMITD_SECRET` / `PERMITD_ADMIN_TOKEN` name them. Either way, a node with
//! existing data resumes and never initialises again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use permitd_core::KeyConfig;

use crate::app::{self, NodeSettings, StartError, Started};
use crate::config::{
    ClusterConfig, ConfigError, EdgeLimits, RaftTimings, ADMIN_TOKEN_ENV, MIN_ADMIN_TOKEN_BYTES,
    MIN_SECRET_BYTES,
};
use crate::credentials::tls::Tls;
use crate::credentials::{random_hex, write_private_file, AuthSettings, Secret};
use crate::edge::serve;
use crate::raft::runtime::RaftRuntime;
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
    #[error("cannot start the Raft runtime or its listener: {0}")]
    RaftRuntime(std::io::Error),
    #[error("secret file {path}: {source}")]
    Secret {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{name} must be at least {min} bytes")]
    ShortSecret { name: &'static str, min: usize },
    #[error("the OS random source failed: {0}")]
    Random(getrandom::Error),
    #[error(transparent)]
    Tls(#[from] crate::credentials::tls::TlsError),
}

/// Runs a node until a signal; `raft_runtime` carries openraft and the peer
/// listener (built by `main` before the API runtime: see [`crate::raft::runtime`]).
pub async fn run(args: ServeArgs, raft_runtime: RaftRuntime) -> Result<(), ServeError> {
    let settings = match &args.config {
        Some(path) => clustered(path, args.id.ok_or(ServeError::MissingId)?)?,
        None => embedded(&args)?,
    };
    if !settings.auth.enabled {
        tracing::warn!(
            "[auth] enabled = false: every route is open to anyone who can reach this node; \
             for local development only"
        );
    }
    let started = app::start(&settings, &raft_runtime.handle()).await?;
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
    serve_until_signal(started, raft_runtime, settings.edge, settings.tls.clone()).await
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
        auth: AuthSettings::new(config.auth.enabled, config.auth.admin_token.clone()),
        tls: config.tls.as_ref().map(Tls::load).transpose()?,
        peer_source_ip: node.peer_source_ip,
        timings: config.raft.clone(),
        defaults: config.key_defaults(),
        initial_members: members,
        initialize_at_start: false,
        rounds: config.limits.rounds(),
        edge: config.limits.edge(),
        reclaim_horizon: Duration::from_millis(config.limits.reclaim_horizon_ms),
        seams: crate::seams::Seams::production(),
        shards: config.cluster.shards,
    })
}

fn embedded(args: &ServeArgs) -> Result<NodeSettings, ServeError> {
    let secret = embedded_secret(
        &args.data_dir,
        "PERMITD_SECRET",
        "cluster-secret",
        MIN_SECRET_BYTES,
    )?;
    let admin_token = embedded_secret(
        &args.data_dir,
        ADMIN_TOKEN_ENV,
        "admin-token",
        MIN_ADMIN_TOKEN_BYTES,
    )?;
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
        auth: AuthSettings::new(true, Some(admin_token)),
        tls: None,
        peer_source_ip: None,
        timings: RaftTimings::default(),
        defaults: KeyConfig::default(),
        initial_members: BTreeMap::from([(1, peer)]),
        initialize_at_start: true,
        rounds: crate::leader::rounds::RoundLimits::default(),
        edge: EdgeLimits::default(),
        reclaim_horizon: Duration::from_millis(crate::leader::reclaim::DEFAULT_HORIZON_MS),
        seams: crate::seams::Seams::production(),
        shards: crate::config::DEFAULT_SHARDS,
    })
}

/// A secret of the single node: the environment variable `env` (an error when
/// shorter than `min` bytes), else the one kept in `<data dir>/<file>`, else a
/// new one from the OS random source, written there with mode 0600.
fn embedded_secret(
    data_dir: &Path,
    env: &'static str,
    file: &str,
    min: usize,
) -> Result<Secret, ServeError> {
    if let Ok(secret) = std::env::var(env) {
        if secret.len() < min {
            return Err(ServeError::ShortSecret { name: env, min });
        }
        return Ok(Secret::from(secret));
    }
    let path = data_dir.join(file);
    let error = |source| ServeError::Secret {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(secret) if secret.trim().len() >= min => Ok(Secret::from(secret.trim())),
        Ok(_) => Err(ServeError::ShortSecret {
            name: "the secret file",
            min,
        }),
        Err(missing) if missing.kind() == std::io::ErrorKind::NotFound => {
            permitd_storage::fsync::durable_create_dir_all(data_dir).map_err(error)?;
            let secret = random_hex(32).map_err(ServeError::Random)?;
            write_private_file(&path, &secret).map_err(error)?;
            tracing::info!(path = %path.display(), "generated {file} (mode 0600)");
            println!("permitd: generated {file} in {}", path.display());
            Ok(Secret::from(secret))
        }
        Err(other) => Err(error(other)),
    }
}

async fn initialize_if_new(app: app::App) {
    match app.meta().raft.is_initialized().await {
        Ok(true) => tracing::info!("resuming from existing data"),
        Ok(false) => match crate::edge::api::cluster::initialize(&app).await {
            Ok(()) => tracing::info!("initialised a new single-node cluster"),
            Err(error) => tracing::error!(%error, "cannot initialise the single node"),
        },
        Err(error) => tracing::error!(%error, "cannot read the Raft state"),
    }
}

async fn serve_until_signal(
    started: Started,
    raft_runtime: RaftRuntime,
    edge: EdgeLimits,
    tls: Option<Tls>,
) -> Result<(), ServeError> {
    let Started {
        app,
        api_listener,
        raft_listener,
    } = started;
    let stop_api = Shutdown::default();
    let stop_raft = Shutdown::default();
    let public = crate::edge::api::public_router(app.clone());
    let api_task = tokio::spawn(serve::serve(
        api_listener,
        (public, serve::Takes::Http),
        edge,
        tls.as_ref().map(Tls::api_acceptor),
        stop_api.clone(),
    ));
    // Peers' calls are accepted and answered on the Raft runtime: the listener
    // moves to its reactor, so a busy API runtime delays no append or vote.
    let internal = crate::edge::api::internal_router(app.clone());
    let raft_listener = raft_listener.into_std().map_err(ServeError::RaftRuntime)?;
    let raft_acceptor = tls.as_ref().map(Tls::raft_acceptor);
    let stop = stop_raft.clone();
    let raft_task = raft_runtime.handle().spawn(async move {
        match tokio::net::TcpListener::from_std(raft_listener) {
            Ok(listener) => {
                let takes = (internal, serve::Takes::HttpAndPeerStreams);
                serve::serve(listener, takes, edge, raft_acceptor, stop).await
            }
            Err(error) => tracing::error!(%error, "cannot listen for peers"),
        }
    });
    // A core that stopped on its own ends the process with an error, after the
    // same orderly stop as a signal, so a supervisor restarts it.
    let fatal = tokio::select! {
        () = crate::shutdown::signal() => None,
        reason = app.fatal() => Some(reason),
    };
    if let Some(reason) = &fatal {
        tracing::error!(%reason, "the Raft core stopped; stopping the node");
    }
    // Stop taking calls, then fail the ones parked for a round: their clients
    // retry on another node. In-flight answers drain before the server returns.
    stop_api.trigger();
    app.stop_serving();
    let stop_timeout = Duration::from_millis(STOP_TIMEOUT_MS);
    let api_result = tokio::time::timeout(stop_timeout, api_task).await;
    app.shutdown_raft().await;
    stop_raft.trigger();
    let _ = tokio::time::timeout(stop_timeout, raft_task).await;
    drop(raft_runtime);
    tracing::info!("stopped");
    if api_result.is_err() {
        tracing::warn!("open API connections did not finish in time");
    }
    fatal.map_or(Ok(()), |reason| Err(ServeError::RaftStopped(reason)))
}
