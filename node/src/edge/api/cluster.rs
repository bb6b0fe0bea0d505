//! `/cluster/*`: status, initialisation, membership and the replicated defaults.
//! Every call needs the admin token (checked by the router's auth layer).

use std::collections::BTreeSet;
use std::time::Duration;

use axum::extract::State;
use axum::{Extension, Json};
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use permitd_core::config::{KeyConfig, KeyConfigUpdate};
use permitd_core::contract::validate::validate_key_config;
use permitd_core::contract::{
    paths, ClusterMember, ClusterStatus, ErrorAnswer, ErrorCode, MemberRole, MembershipChange,
    ShardMap, ShardStatus,
};
use permitd_core::InvalidInput;
use permitd_storage::{Command, NodeId, PeerNode};
use tokio::time::Instant;

use super::extract::ApiJson;
use super::semaphores::write;
use crate::app::App;
use crate::edge::api::extract::{routed, RouteShard};
use crate::edge::error::ApiError;
use crate::shard::Shard;

/// How long `/cluster/init` waits for the first leader to write the defaults.
pub const INIT_DEFAULTS_TIMEOUT_MS: u64 = 15_000;
/// And this much more per shard.
pub const INIT_DEFAULTS_PER_SHARD_MS: u64 = 250;

/// `GET /cluster/status`: this node's view.
#[utoipa::path(
    get, path = paths::CLUSTER_STATUS, tag = "cluster",
    responses((status = 200, description = "This node's view of the cluster.", body = ClusterStatus)),
)]
pub async fn status(State(app): State<App>) -> Json<ClusterStatus> {
    Json(current_status(&app))
}

/// `GET /cluster/shards`: this node's view of every shard and its leader.
#[utoipa::path(
    get, path = paths::CLUSTER_SHARDS, tag = "cluster",
    responses((status = 200, description = "This node's view of every shard, in shard order.", body = ShardMap)),
)]
pub async fn shards(State(app): State<App>) -> Json<ShardMap> {
    Json(current_shards(&app))
}

/// Every shard as this node sees it: its leader, term, voters and applied index.
pub fn current_shards(app: &App) -> ShardMap {
    let shards = app
        .shards
        .iter()
        .map(|shard| {
            let status = shard_status(app, shard);
            let members = status
                .members
                .iter()
                .filter(|member| member.role == MemberRole::Voter)
                .map(|member| member.id)
                .collect();
            ShardStatus {
                shard: shard.id,
                leader: status.leader,
                term: status.term,
                members,
                applied_index: status.last_applied,
            }
        })
        .collect();
    ShardMap { id: app.id, shards }
}

/// This node's view of the cluster: the meta shard's group, whose
/// membership every shard shares.
pub fn current_status(app: &App) -> ClusterStatus {
    shard_status(app, app.meta())
}

fn shard_status(app: &App, shard: &Shard) -> ClusterStatus {
    let metrics = shard.raft.metrics().borrow().clone();
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let members = membership
        .nodes()
        .map(|(id, node)| ClusterMember {
            id: *id,
            addr: node.api_addr.clone(),
            raft_addr: node.raft_addr.clone(),
            role: if voters.contains(id) {
                MemberRole::Voter
            } else {
                MemberRole::Learner
            },
        })
        .collect();
    ClusterStatus {
        id: app.id,
        // The node's view (`leader/leadership.rs`): no leader once the one openraft
        // names has been silent past the lease, as `/readyz` says.
        leader: shard.leadership.borrow().leader,
        term: metrics.current_term,
        last_log_index: metrics.last_log_index,
        last_applied: metrics.last_applied.map(|log_id| log_id.index),
        initialized: metrics.membership_config.log_id().is_some() || metrics.current_term > 0,
        members,
    }
}

/// `POST /cluster/init` with `{}`: every node of the config file becomes a voter,
/// then the answer waits until the first leader has written its `[defaults]`.
#[utoipa::path(
    post, path = paths::CLUSTER_INIT, tag = "cluster",
    request_body(content = Object, description = "`{}`: the members come from the config file."),
    responses(
        (status = 200, description = "The cluster is initialised.", body = ClusterStatus),
        (status = 409, description = "`already_initialized`.", body = ErrorAnswer),
    ),
)]
pub async fn init(
    State(app): State<App>,
    ApiJson(_): ApiJson<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<ClusterStatus>, ApiError> {
    initialize(&app).await?;
    Ok(Json(current_status(&app)))
}

/// Initialises a new cluster of the configured members, every shard of it,
/// and waits for its defaults. The leaders write them
/// (`crate::leader::seed_defaults`), and every later leader again until one
/// write is applied, so a failure here is not final. The meta shard first: a
/// node refused there (already initialised) touches no other shard.
pub async fn initialize(app: &App) -> Result<(), ApiError> {
    initialize_shard(app.meta(), app).await?;
    // The other shards at once: each is an election and a membership entry.
    let others = app
        .shards
        .iter()
        .skip(1)
        .map(|shard| initialize_shard(shard, app));
    for initialized in futures_util::future::join_all(others).await {
        match initialized {
            // A shard initialised by an earlier, interrupted init.
            Ok(()) | Err(ApiError::Conflict { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    tracing::info!(members = ?app.initial_members.keys(), shards = app.shards.len(), "cluster initialised");
    wait_for_defaults(app).await
}

/// Initialises one shard's group with the configured members.
async fn initialize_shard(shard: &Shard, app: &App) -> Result<(), ApiError> {
    match shard.raft.initialize((*app.initial_members).clone()).await {
        Ok(()) => Ok(()),
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Err(ApiError::Conflict {
            code: ErrorCode::AlreadyInitialized,
            message: "this node already belongs to an initialised cluster".into(),
        }),
        Err(error) => Err(ApiError::Internal(error.to_string())),
    }
}

/// Waits until this node has applied a `SetDefaults` in every shard (the
/// deadline grows with the shard count: every shard elects and copies).
async fn wait_for_defaults(app: &App) -> Result<(), ApiError> {
    let per_shard = Duration::from_millis(INIT_DEFAULTS_PER_SHARD_MS) * app.shard_count();
    let deadline = Instant::now() + Duration::from_millis(INIT_DEFAULTS_TIMEOUT_MS) + per_shard;
    while Instant::now() < deadline {
        let written = app
            .shards
            .iter()
            .all(|shard| shard.state.read(|semaphores| semaphores.defaults_written()));
        if written {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(ApiError::NoQuorum)
}

/// `PUT /cluster/defaults`: replaces the replicated key defaults (leader only).
#[utoipa::path(
    put, path = paths::CLUSTER_DEFAULTS, tag = "cluster",
    request_body = KeyConfigUpdate,
    responses((status = 200, description = "The defaults now in force.", body = KeyConfig)),
)]
pub async fn put_defaults(
    State(app): State<App>,
    ApiJson(update): ApiJson<KeyConfigUpdate>,
) -> Result<Json<KeyConfig>, ApiError> {
    let defaults = update.resolve(&KeyConfig::default());
    validate_key_config(&defaults)?;
    let command = Command::SetDefaults {
        defaults: defaults.clone(),
    };
    write(app.meta(), command).await?.into_done()?;
    app.meta().rounds.wake_all();
    Ok(Json(defaults))
}

/// `POST /cluster/members` (leader only).
#[utoipa::path(
    post, path = paths::CLUSTER_MEMBERS, tag = "cluster",
    request_body = MembershipChange,
    responses(
        (status = 200, description = "The membership after the change.", body = ClusterStatus),
        (status = 409, description = "`membership_conflict`: openraft refused the change.", body = ErrorAnswer),
    ),
)]
pub async fn members(
    State(app): State<App>,
    Extension(RouteShard(shard)): Extension<RouteShard>,
    ApiJson(change): ApiJson<MembershipChange>,
) -> Result<Json<ClusterStatus>, ApiError> {
    let shard = routed(&app, shard)?;
    let result = match change {
        MembershipChange::AddLearner {
            id,
            api_addr,
            raft_addr,
        } => {
            let node = PeerNode {
                api_addr,
                raft_addr,
            };
            shard.raft.add_learner(id, node, true).await
        }
        MembershipChange::ChangeMembership { voters } => {
            if voters.is_empty() {
                let field = "voters".into();
                return Err(InvalidInput::Empty { field }.into());
            }
            shard.raft.change_membership(voters, false).await
        }
    };
    match result {
        Ok(_) => Ok(Json(shard_status(&app, shard))),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
            Err(ApiError::to_leader(forward.leader_id))
        }
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(error))) => {
            Err(ApiError::Conflict {
                code: ErrorCode::MembershipConflict,
                message: error.to_string(),
            })
        }
        Err(RaftError::Fatal(_)) => Err(ApiError::ShuttingDown),
    }
}
