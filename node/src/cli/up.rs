//! `permitd up`: every node of a cluster file as a child process of this one.
//!
//! Starts the nodes, waits until each answers `/healthz`, initialises the cluster
//! only when no node has any Raft state (a restart with existing data resumes),
//! waits for a leader and prints it with the URLs. Ctrl+C or SIGTERM stops every
//! child with SIGTERM (their graceful shutdown), SIGKILL after a grace period.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::cli::LogFormat;
use crate::config::{ClusterConfig, ConfigError, NodeConfig};
use crate::credentials::tls::Tls;
use permitd_core::contract::{paths, ClusterStatus};

/// How long a child may take to answer `/healthz`, and the cluster to elect.
const START_TIMEOUT_MS: u64 = 30_000;
/// How long a child may take to stop after SIGTERM before it is killed.
const STOP_GRACE_MS: u64 = 10_000;
/// Pause between two polls of a starting node.
const POLL_INTERVAL_MS: u64 = 100;

#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot start node {id}: {source}")]
    Spawn { id: u64, source: std::io::Error },
    #[error("node {0} did not become healthy in time")]
    NotHealthy(u64),
    #[error("the cluster did not elect a leader in time")]
    NoLeader,
    #[error("initialising the cluster failed: {0}")]
    Init(String),
    #[error("http client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("node {0} exited")]
    ChildExited(u64),
    #[error(transparent)]
    Tls(#[from] crate::credentials::tls::TlsError),
}

/// A started child and its node.
#[derive(Debug)]
struct Running {
    node: NodeConfig,
    child: Child,
}

pub async fn run(
    path: &Path,
    log_format: LogFormat,
    worker_threads: Option<u16>,
) -> Result<(), UpError> {
    let config = ClusterConfig::load(path)?;
    let threads = worker_threads.unwrap_or_else(|| share_of_cores(config.nodes.len()));
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(5));
    if let Some(tls) = &config.tls {
        builder = Tls::load(tls)?.client(builder)?;
    }
    let http = builder.build()?;
    let mut children = Vec::new();
    for node in &config.nodes {
        let child = spawn(path, node.id, log_format, threads).map_err(|source| UpError::Spawn {
            id: node.id,
            source,
        })?;
        children.push(Running {
            node: node.clone(),
            child,
        });
    }
    let outcome = bring_up(&config, &http).await;
    if let Err(error) = &outcome {
        tracing::error!(%error, "cluster did not come up");
    } else {
        wait_for_stop(&mut children).await;
    }
    stop_all(&mut children).await;
    outcome.map(|_| ())
}

/// Worker threads of each of `nodes` nodes on this machine: their share of its
/// cores, at least one. Every node on the default (one per core) made each
/// message cost two runtimes' worth of cross-thread wake-ups on a small machine.
pub fn share_of_cores(nodes: usize) -> u16 {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    u16::try_from((cores / nodes.max(1)).max(1)).unwrap_or(u16::MAX)
}

fn spawn(
    config: &Path,
    id: u64,
    log_format: LogFormat,
    worker_threads: u16,
) -> std::io::Result<Child> {
    let exe = std::env::current_exe()?;
    let format = match log_format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    Command::new(exe)
        .arg("--log-format")
        .arg(format)
        .arg("--worker-threads")
        .arg(worker_threads.to_string())
        .arg("serve")
        .arg("--config")
        .arg(PathBuf::from(config))
        .arg("--id")
        .arg(id.to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
}

async fn bring_up(
    config: &ClusterConfig,
    http: &reqwest::Client,
) -> Result<ClusterStatus, UpError> {
    for node in &config.nodes {
        wait_healthy(http, config, node).await?;
    }
    let mut initialized = false;
    for node in &config.nodes {
        initialized |= status(http, config, node).await?.initialized;
    }
    if initialized {
        println!("permitd: resuming an existing cluster");
    } else {
        init(http, config).await?;
        println!("permitd: initialised a new cluster");
    }
    let status = wait_for_leader(http, config).await?;
    print_summary(config, &status);
    Ok(status)
}

/// `http(s)://api_addr/path` of a node.
fn node_url(config: &ClusterConfig, node: &NodeConfig, path: &str) -> String {
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    format!("{scheme}://{}{path}", node.api_addr)
}

/// `builder` with the admin token, when there is one.
fn as_admin(builder: reqwest::RequestBuilder, config: &ClusterConfig) -> reqwest::RequestBuilder {
    match &config.auth.admin_token {
        Some(token) => builder.bearer_auth(token.expose()),
        None => builder,
    }
}

async fn wait_healthy(
    http: &reqwest::Client,
    config: &ClusterConfig,
    node: &NodeConfig,
) -> Result<(), UpError> {
    let deadline = Instant::now() + Duration::from_millis(START_TIMEOUT_MS);
    let url = node_url(config, node, paths::HEALTHZ);
    while Instant::now() < deadline {
        if let Ok(answer) = http.get(&url).send().await {
            if answer.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
    }
    Err(UpError::NotHealthy(node.id))
}

async fn status(
    http: &reqwest::Client,
    config: &ClusterConfig,
    node: &NodeConfig,
) -> Result<ClusterStatus, UpError> {
    let url = node_url(config, node, paths::CLUSTER_STATUS);
    let answer = as_admin(http.get(url), config)
        .send()
        .await?
        .error_for_status()?;
    Ok(answer.json().await?)
}

async fn init(http: &reqwest::Client, config: &ClusterConfig) -> Result<(), UpError> {
    let first = &config.nodes[0];
    let answer = as_admin(
        http.post(node_url(config, first, paths::CLUSTER_INIT)),
        config,
    )
    .timeout(Duration::from_millis(START_TIMEOUT_MS))
    .json(&serde_json::json!({}))
    .send()
    .await?;
    if answer.status().is_success() {
        Ok(())
    } else {
        Err(UpError::Init(answer.text().await.unwrap_or_default()))
    }
}

async fn wait_for_leader(
    http: &reqwest::Client,
    config: &ClusterConfig,
) -> Result<ClusterStatus, UpError> {
    let deadline = Instant::now() + Duration::from_millis(START_TIMEOUT_MS);
    while Instant::now() < deadline {
        for node in &config.nodes {
            if let Ok(status) = status(http, config, node).await {
                if status.leader.is_some() {
                    return Ok(status);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(POLL_INTERVAL_MS)).await;
    }
    Err(UpError::NoLeader)
}

fn print_summary(config: &ClusterConfig, status: &ClusterStatus) {
    let leader = status.leader.unwrap_or_default();
    println!("permitd: leader is node {leader} (term {})", status.term);
    for node in &config.nodes {
        let role = if node.id == leader { " (leader)" } else { "" };
        println!(
            "  node {}{role}: {}  raft {}  data {}",
            node.id,
            node_url(config, node, ""),
            node.raft_addr,
            node.data_dir.display()
        );
    }
    println!("permitd: Ctrl+C stops every node");
}

/// Resolves on Ctrl+C, SIGTERM, or when any child exits by itself.
async fn wait_for_stop(children: &mut [Running]) {
    let exited = async {
        loop {
            for running in children.iter_mut() {
                if let Ok(Some(code)) = running.child.try_wait() {
                    tracing::error!(id = running.node.id, %code, "node exited");
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::select! {
        () = crate::shutdown::signal() => {}
        () = exited => {}
    }
}

async fn stop_all(children: &mut [Running]) {
    for running in children.iter() {
        if let Some(pid) = running.child.id() {
            terminate(pid);
        }
    }
    for running in children.iter_mut() {
        let grace = Duration::from_millis(STOP_GRACE_MS);
        if tokio::time::timeout(grace, running.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                id = running.node.id,
                "node did not stop in time; killing it"
            );
            let _ = running.child.kill().await;
        }
    }
    println!("permitd: all nodes stopped");
}

fn terminate(pid: u32) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let Ok(raw) = i32::try_from(pid) else {
        return;
    };
    // The child may already be gone; then there is nothing to stop.
    let _ = kill(Pid::from_raw(raw), Signal::SIGTERM);
}
