//! Backup and restore of the replicated state, with the cluster secret.
//!
//! `GET /cluster/snapshot` (leader; followers forward) answers a backup file: the
//! state the leader has applied, read after confirming leadership, so it holds
//! every write acknowledged before the call. It is one consistent view: taken
//! under the state's read lock, with no entry applied half-way.
//!
//! `POST /cluster/restore` (leader only, no forwarding: a backup may exceed the
//! public listener's body limit, so send it to the leader's Raft listener) writes
//! a backup into a new cluster through one replicated `Restore` entry; apply
//! refuses it when the cluster holds any key already, and checks every row.

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use permitd_core::contract::paths;
use permitd_core::engine::restore::{BackupFile, Restored, BACKUP_FORMAT};
use permitd_storage::Command;
use serde_json::json;

use super::extract::ApiJson;
use super::semaphores::{linearizable, write};
use crate::app::App;
use crate::edge::api::extract::{routed, RouteShard};
use crate::edge::error::ApiError;
use crate::shard::META_SHARD;

/// `GET /cluster/snapshot`.
#[utoipa::path(
    get, path = paths::CLUSTER_SNAPSHOT, tag = "cluster",
    responses((status = 200, description = "A backup of the leader's applied state.", body = BackupFile)),
)]
pub async fn save(
    State(app): State<App>,
    Extension(RouteShard(shard)): Extension<RouteShard>,
) -> Result<Response, ApiError> {
    let shard = routed(&app, shard)?;
    linearizable(shard).await?;
    let applied_index = shard
        .raft
        .metrics()
        .borrow()
        .last_applied
        .map_or(0, |log_id| log_id.index);
    let body = shard.state.read(|semaphores| {
        let file = json!({
            "format": BACKUP_FORMAT,
            "appliedIndex": applied_index,
            "state": semaphores,
        });
        serde_json::to_vec(&file)
    });
    let body = body.map_err(|error| ApiError::Internal(error.to_string()))?;
    tracing::info!(
        applied_index,
        shard = shard.id,
        bytes = body.len(),
        "backup saved"
    );
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `POST /cluster/restore` with a backup file.
#[utoipa::path(
    post, path = paths::CLUSTER_RESTORE, tag = "cluster",
    request_body = BackupFile,
    responses((status = 200, description = "The backup is the new cluster's state.", body = Restored)),
)]
pub async fn restore(
    State(app): State<App>,
    headers: HeaderMap,
    ApiJson(file): ApiJson<BackupFile>,
) -> Result<Json<Restored>, ApiError> {
    let shard = crate::edge::api::forward::named_shard(&headers, app.shard_count())?;
    let shard = routed(&app, shard.unwrap_or(META_SHARD))?;
    if file.format != BACKUP_FORMAT {
        return Err(ApiError::BadRequest(format!(
            "unknown backup format {:?}; this node reads {BACKUP_FORMAT:?}",
            file.format
        )));
    }
    // Refuse a bad file before it becomes a log entry (apply checks again).
    file.state
        .check()
        .map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let leadership = *shard.leadership.borrow();
    if !leadership.is_leader {
        return Err(ApiError::NotLeader {
            leader: leadership.leader,
        });
    }
    let command = Command::Restore { backup: file.state };
    let keys = write(shard, command).await?.into_restored()?;
    shard.rounds.wake_all();
    tracing::warn!(keys, from_index = file.applied_index, "backup restored");
    Ok(Json(Restored {
        restored_keys: keys,
    }))
}
