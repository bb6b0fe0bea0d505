//! `/cluster/*`: status, initialisation, membership and the replicated defaults.
//! Every call needs the admin token (checked by the router's auth layer).

use std::collections::BTreeSet;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
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
use crate::edge::error::ApiError;

/// How long `/cluster/init` waits for the first leader to write the defaults.
pub const INIT_DEFAULTS_TIMEOUT_MS: u64 = 15_000;

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

/// The node serves one shard, shard 0, whose group is the node's Raft group
/// (docs/scaling.md says what comes next).
pub fn current_shards(app: &App) -> ShardMap {
    let status = current_status(app);
    let members = status
        .members
        .iter()
        .filter(|member| member.role == MemberRole::Voter)
        .map(|member| member.id)
        .collect();
    ShardMap {
        id: status.id,
        shards: vec![ShardStatus {
            shard: 0,
            leader: status.leader,
            term: status.term,
            members,
            applied_index: status.last_applied,
        }],
    }
}

pub fn current_status(app: &App) -> ClusterStatus {
    let metrics = app.raft.metrics().borrow().clone();
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
        leader: app.leadership.borrow().leader,
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

/// Initialises a new cluster of the configured members and waits for its
/// defaults. The leader writes them (`crate::leader::seed_defaults`), and every later
/// leader again until one write is applied, so a failure here is not final.
pub async fn initialize(app: &App) -> Result<(), ApiError> {
    let members = (*app.initial_members).clone();
    match app.raft.initialize(members).await {
        Ok(()) => {}
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
            return Err(ApiError::Conflict {
                code: ErrorCode::AlreadyInitialized,
                message: "this node already belongs to an initialised cluster".into(),
            })
        }
        Err(error) => return Err(ApiError::Internal(error.to_string())),
    }
    tracing::info!(members = ?app.initial_members.keys(), "cluster initialised");
    wait_for_defaults(app).await
}

/// Waits until this node has applied a `SetDefaults`.
async fn wait_for_defaults(app: &App) -> Result<(), ApiError> {
    let deadline = Instant::now() + Duration::from_millis(INIT_DEFAULTS_TIMEOUT_MS);
    while Instant::now() < deadline {
        if app.state.read(|semaphores| semaphores.defaults_written()) {
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
    write(&app, command).await?.into_done()?;
    app.rounds.wake_all();
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
    ApiJson(change): ApiJson<MembershipChange>,
) -> Result<Json<ClusterStatus>, ApiError> {
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
            app.raft.add_learner(id, node, true).await
        }
        MembershipChange::ChangeMembership { voters } => {
            if voters.is_empty() {
                let field = "voters".into();
                return Err(InvalidInput::Empty { field }.into());
            }
            app.raft.change_membership(voters, false).await
        }
    };
    match result {
        Ok(_) => Ok(Json(current_status(&app))),
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
