//! `permitd restore --from FILE --config cluster.toml`: write a backup into the
//! new cluster the file describes.
//!
//! The cluster must be running and initialised (`permitd up`, or `serve` on each
//! host and `permitctl init`), and hold no key yet: start it on empty data dirs.
//! The backup is checked here first, then sent with the admin token to the leader's Raft listener
//! (whose body limit fits large backups; the public one takes 1 MiB), which
//! replicates it as one entry.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use permitd_core::contract::{paths, ClusterStatus};
use permitd_core::engine::restore::{BackupFile, BACKUP_FORMAT};

use crate::config::{ClusterConfig, ConfigError};
use crate::credentials::tls::Tls;

/// How long to wait for the new cluster to have a leader.
const LEADER_TIMEOUT_MS: u64 = 30_000;
/// How long the leader may take to replicate and apply the backup.
const RESTORE_TIMEOUT_MS: u64 = 120_000;

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The backup file (`permitctl snapshot save FILE`).
    #[arg(long)]
    pub from: PathBuf,
    /// The new cluster's file.
    #[arg(long, env = "PERMITD_CONFIG", default_value = "cluster.toml")]
    pub config: PathBuf,
}

/// Why a restore failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreCommandError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot read the backup {path}: {reason}")]
    Backup { path: PathBuf, reason: String },
    #[error(
        "no leader in the new cluster after {LEADER_TIMEOUT_MS} ms: is it up and initialised?"
    )]
    NoLeader,
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    #[error("the leader refused the backup: {0}")]
    Refused(String),
    #[error(transparent)]
    Tls(#[from] crate::credentials::tls::TlsError),
}

/// `request` with the admin token, when the file (or `PERMITD_ADMIN_TOKEN`) has one.
fn as_admin(request: reqwest::RequestBuilder, config: &ClusterConfig) -> reqwest::RequestBuilder {
    match &config.auth.admin_token {
        Some(token) => request.bearer_auth(token.expose()),
        None => request,
    }
}

pub async fn run(args: RestoreArgs) -> Result<(), RestoreCommandError> {
    let config = ClusterConfig::load(&args.config)?;
    let file = read_backup(&args.from)?;
    let keys = file.state.keys.len();
    let mut builder = reqwest::Client::builder();
    if let Some(tls) = &config.tls {
        builder = Tls::load(tls)?.client(builder)?;
    }
    let http = builder.build()?;
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let leader = find_leader(&http, &config, scheme).await?;
    let raft_addr = config
        .node(leader)
        .map(|node| node.peer().raft_addr)
        .ok_or(RestoreCommandError::NoLeader)?;
    let url = format!("{scheme}://{raft_addr}{}", paths::CLUSTER_RESTORE);
    let answer = as_admin(http.post(url), &config)
        .timeout(Duration::from_millis(RESTORE_TIMEOUT_MS))
        .json(&file)
        .send()
        .await?;
    if !answer.status().is_success() {
        return Err(RestoreCommandError::Refused(
            answer.text().await.unwrap_or_default(),
        ));
    }
    println!(
        "permitd: restored {keys} keys (saved at log index {}) into the cluster led by node {leader}",
        file.applied_index
    );
    Ok(())
}

fn read_backup(path: &Path) -> Result<BackupFile, RestoreCommandError> {
    let failed = |reason: String| RestoreCommandError::Backup {
        path: path.to_owned(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|error| failed(error.to_string()))?;
    let file: BackupFile =
        serde_json::from_slice(&bytes).map_err(|error| failed(error.to_string()))?;
    if file.format != BACKUP_FORMAT {
        return Err(failed(format!(
            "format {:?} is not {BACKUP_FORMAT:?}",
            file.format
        )));
    }
    file.state
        .check()
        .map_err(|error| failed(error.to_string()))?;
    Ok(file)
}

async fn find_leader(
    http: &reqwest::Client,
    config: &ClusterConfig,
    scheme: &str,
) -> Result<u64, RestoreCommandError> {
    let deadline = Instant::now() + Duration::from_millis(LEADER_TIMEOUT_MS);
    while Instant::now() < deadline {
        for node in &config.nodes {
            let url = format!("{scheme}://{}{}", node.api_addr, paths::CLUSTER_STATUS);
            let answer = as_admin(http.get(url), config)
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            let Ok(answer) = answer else { continue };
            if let Ok(ClusterStatus {
                leader: Some(leader),
                ..
            }) = answer.json::<ClusterStatus>().await
            {
                return Ok(leader);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(RestoreCommandError::NoLeader)
}
