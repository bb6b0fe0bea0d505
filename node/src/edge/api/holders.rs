//! Operators' view of one key's holders, and the admin force release.
//!
//! `GET /v1/semaphores/{key}/holders` answers per clientId the grants, the leases
//! and the demand waiting for the next round. Waiting demand exists only on the
//! leader (requests are parked there until their round), so a follower forwards
//! the call like every v1 call; the leader reads linearizably, so the grants and
//! leases include every write acknowledged before the call.
//!
//! `POST /v1/semaphores/{key}/clients/{clientId}/release` drops one client's whole
//! footprint on the key through a replicated `ForceRelease` entry: every replica
//! frees the same rows and emits `client_released`. It sits in the router's admin
//! section, which is where an access check for operators belongs.

use axum::extract::State;
use axum::Json;
use permitd_core::contract::paths;
use permitd_core::contract::validate::{validate_client_id, validate_key};
use permitd_core::engine::force_release::ForceReleased;
use permitd_core::engine::holders::{holders, KeyHolders};
use permitd_storage::Command;

use super::extract::ApiPath;
use super::semaphores::{linearizable, write};
use crate::app::App;
use crate::edge::error::ApiError;

/// `GET /v1/semaphores/{key}/holders`, on the leader, linearizable.
#[utoipa::path(
    get, path = paths::HOLDERS, tag = "semaphores",
    params(("key" = String, Path, description = "The semaphore key (1 to 256 bytes, percent-encoded).")),
    responses((status = 200, description = "Every client's footprint and waiting demand on the key.", body = KeyHolders)),
)]
pub async fn get(
    State(app): State<App>,
    ApiPath(key): ApiPath<String>,
) -> Result<Json<KeyHolders>, ApiError> {
    validate_key(&key)?;
    let shard = app.key_shard(&key);
    linearizable(shard).await?;
    let waiting = shard.rounds.waiting(&key);
    let view = shard
        .state
        .read(|semaphores| holders(&key, semaphores.key(&key), &waiting));
    Ok(Json(view))
}

/// `POST /v1/semaphores/{key}/clients/{clientId}/release` (admin): answers what
/// was dropped, zeros when the client held nothing.
#[utoipa::path(
    post, path = paths::CLIENT_RELEASE, tag = "semaphores",
    params(("key" = String, Path, description = "The semaphore key (1 to 256 bytes, percent-encoded)."), ("clientId" = String, Path, description = "The client whose grants and leases are dropped.")),
    responses((status = 200, description = "What was dropped; zeros when the client held nothing.", body = ForceReleased)),
)]
pub async fn force_release(
    State(app): State<App>,
    ApiPath((key, client_id)): ApiPath<(String, String)>,
) -> Result<Json<ForceReleased>, ApiError> {
    validate_key(&key)?;
    validate_client_id(&client_id)?;
    let command = Command::ForceRelease {
        now_ms: app.seams.clock.now_ms(),
        key: key.clone(),
        client_id: client_id.clone(),
    };
    let released = write(app.key_shard(&key), command).await?.into_released()?;
    tracing::warn!(key, client_id, ?released, "operator force release");
    Ok(Json(released))
}
