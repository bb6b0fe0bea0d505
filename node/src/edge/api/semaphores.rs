//! `/v1/semaphores`: requests and syncs, usage, key and group configuration.
//!
//! These handlers run on the leader (followers forward). Everything is validated
//! before it is proposed, so a rejected call changes nothing; reads wait for
//! `ensure_linearizable` so they see every write acknowledged before them.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use permitd_core::config::{GroupConfig, KeyConfig, KeyConfigUpdate};
use permitd_core::contract::protocol::{SemaphoreRequest, SemaphoreResponse};
use permitd_core::contract::validate::{
    parse_request, validate_group, validate_group_config, validate_key, validate_key_config,
};
use permitd_core::contract::{paths, ErrorAnswer, KeyList, KeyUsage, ListQuery};
use permitd_core::{InvalidInput, Usage};
use permitd_storage::{Command, CommandResult, Refused};

use super::extract::{ApiJson, ApiPath, JsonBytes};
use crate::app::App;
use crate::edge::api::extract::{routed, RouteShard};
use crate::edge::error::ApiError;
use crate::leader::propose::propose;
use crate::shard::Shard;

/// How long a linearizable read waits for the leader to confirm its leadership.
pub const LINEARIZABLE_TIMEOUT_MS: u64 = 5_000;
/// How long a leader goes on asking its followers to confirm its leadership
/// for a read. openraft 0.9 gives one confirmation a heartbeat interval (40 ms
/// shipped): followers busy with large appends missed it, and reads were
/// answered 503 while the leader led (the mixed-load scenario, 1 read in
/// ~150,000). A leader that cannot be confirmed for this long is cut off.
pub const CONFIRM_LEADERSHIP_FOR_MS: u64 = 1_000;
/// Pause between two confirmations.
const CONFIRM_AGAIN_AFTER: Duration = Duration::from_millis(10);
/// Keys per page of `GET /v1/semaphores` when the caller names no `limit`.
pub const DEFAULT_LIST_KEYS: usize = 1_000;
/// Most keys per page of `GET /v1/semaphores`.
pub const MAX_LIST_KEYS: usize = 10_000;

/// `POST /v1/semaphores/{key}`: a `request` waits for the key's round, a `sync`
/// for the next entry to leave (shared with other syncs and keys' rounds).
#[utoipa::path(
    post, path = paths::SEMAPHORE, tag = "semaphores",
    params(("key" = String, Path, description = "The semaphore key (1 to 256 bytes, percent-encoded).")),
    request_body = SemaphoreRequest,
    responses(
        (status = 200, description = "The round's answer to a `request`, or a `sync`'s.", body = SemaphoreResponse),
        (status = 429, description = "`too_many_pending` (the key's queue is full) or `too_many_keys`.", body = ErrorAnswer),
    ),
)]
pub async fn post(
    State(app): State<App>,
    ApiPath(key): ApiPath<String>,
    JsonBytes(body): JsonBytes,
) -> Result<Json<SemaphoreResponse>, ApiError> {
    validate_key(&key)?;
    let message = parse_off_the_runtime(&app, body.clone(), parse_request).await?;
    let answer = deliver(&app, &key, message, body.len()).await?;
    Ok(Json(answer))
}

/// Hands one checked message to the rounds driver and waits for its answer:
/// a `request` for the key's round, a `sync` for the next entry. `bytes` is the
/// message as received, what it weighs in an entry. The one path of both
/// `POST /v1/semaphores/{key}` and every item of `POST /v1/batch`.
pub(crate) async fn deliver(
    app: &App,
    key: &str,
    message: SemaphoreRequest,
    bytes: usize,
) -> Result<SemaphoreResponse, ApiError> {
    let shard = app.key_shard(key);
    check_room_for(shard, key)?;
    Ok(match message {
        SemaphoreRequest::Request(request) => {
            SemaphoreResponse::Grant(shard.rounds.request(key, request, bytes).await?)
        }
        SemaphoreRequest::Sync(sync) => {
            SemaphoreResponse::Synced(shard.rounds.sync(key, sync, bytes).await?)
        }
    })
}

/// Bodies from this size are parsed on a blocking thread, one at a time:
/// parsing a 1 MiB message takes milliseconds, and a burst of them on the async
/// workers, or on as many blocking threads, would starve the Raft heartbeats
/// the followers wait for (they elected a new leader).
const PARSE_APART_BYTES: usize = 64 * 1024;

/// Large bodies being parsed: one at a time.
static LARGE_PARSES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Parses and validates a body with `parse`, large ones on a blocking thread.
pub(crate) async fn parse_off_the_runtime<T: Send + 'static>(
    app: &App,
    body: Bytes,
    parse: fn(&[u8]) -> Result<T, InvalidInput>,
) -> Result<T, ApiError> {
    if body.len() < PARSE_APART_BYTES {
        return Ok(parse(&body)?);
    }
    let _turn = LARGE_PARSES
        .acquire()
        .await
        .map_err(|error| ApiError::Internal(error.to_string()))?;
    app.seams
        .blocking(move || parse(&body))
        .await
        .map_err(|error| ApiError::Internal(error.to_string()))?
        .map_err(ApiError::from)
}

/// A new key may not push its shard past the key limit. Checked before
/// proposing so a full shard answers at once; apply checks again
/// (`Semaphores::room_for`).
fn check_room_for(shard: &Shard, key: &str) -> Result<(), ApiError> {
    shard
        .state
        .read(|semaphores| semaphores.room_for([key]))
        .map_err(|error| Refused::KeyLimit(error).into())
}

/// `GET /v1/semaphores/{key}/usage`, linearizable.
#[utoipa::path(
    get, path = paths::USAGE, tag = "semaphores",
    params(("key" = String, Path, description = "The semaphore key (1 to 256 bytes, percent-encoded).")),
    responses((status = 200, description = "The key's usage, linearizable.", body = Usage)),
)]
pub async fn usage(
    State(app): State<App>,
    ApiPath(key): ApiPath<String>,
) -> Result<Json<Usage>, ApiError> {
    validate_key(&key)?;
    let shard = app.key_shard(&key);
    linearizable(shard).await?;
    let now_ms = app.seams.clock.now_ms();
    Ok(Json(
        shard
            .state
            .read(|semaphores| semaphores.usage(&key, now_ms)),
    ))
}

/// `GET /v1/semaphores/{key}/config`, linearizable.
#[utoipa::path(
    get, path = paths::KEY_CONFIG, tag = "semaphores",
    params(("key" = String, Path, description = "The semaphore key (1 to 256 bytes, percent-encoded).")),
    responses((status = 200, description = "The key's effective configuration.", body = KeyConfig)),
)]
pub async fn get_config(
    State(app): State<App>,
    ApiPath(key): ApiPath<String>,
) -> Result<Json<KeyConfig>, ApiError> {
    validate_key(&key)?;
    let shard = app.key_shard(&key);
    linearizable(shard).await?;
    Ok(Json(
        shard
            .state
            .read(|semaphores| semaphores.config(&key).clone()),
    ))
}

/// `PUT /v1/semaphores/{key}/config`: replaces the key's configuration.
#[utoipa::path(
    put, path = paths::KEY_CONFIG, tag = "semaphores",
    params(("key" = String, Path, description = "The semaphore key (1 to 256 bytes, percent-encoded).")),
    request_body = KeyConfigUpdate,
    responses(
        (status = 200, description = "The configuration now in force.", body = KeyConfig),
        (status = 429, description = "`too_many_keys`: the cluster holds the most keys it may.", body = ErrorAnswer),
    ),
)]
pub async fn put_config(
    State(app): State<App>,
    ApiPath(key): ApiPath<String>,
    ApiJson(update): ApiJson<KeyConfigUpdate>,
) -> Result<Json<KeyConfig>, ApiError> {
    validate_key(&key)?;
    let shard = app.key_shard(&key);
    let resolved = shard
        .state
        .read(|semaphores| update.resolve(semaphores.defaults()));
    validate_key_config(&resolved)?;
    check_room_for(shard, &key)?;
    let command = Command::SetKeyConfig {
        key: key.clone(),
        update,
    };
    let config = write(shard, command).await?.into_key_config()?;
    // A raised limit may serve the requests the leader holds for the key.
    shard.rounds.wake(&key);
    Ok(Json(config))
}

/// `PUT /v1/semaphores/{key}/groups/{group}`: one group's cap and permission.
#[utoipa::path(
    put, path = paths::GROUP, tag = "semaphores",
    params(("key" = String, Path, description = "The semaphore key (1 to 256 bytes, percent-encoded)."), ("group" = String, Path, description = "The group (1 to 256 bytes).")),
    request_body = GroupConfig,
    responses(
        (status = 200, description = "The group's configuration now in force.", body = GroupConfig),
        (status = 429, description = "`too_many_keys`: the cluster holds the most keys it may.", body = ErrorAnswer),
    ),
)]
pub async fn put_group(
    State(app): State<App>,
    ApiPath((key, group)): ApiPath<(String, String)>,
    ApiJson(config): ApiJson<GroupConfig>,
) -> Result<Json<GroupConfig>, ApiError> {
    validate_key(&key)?;
    validate_group(&group)?;
    validate_group_config(&config)?;
    let shard = app.key_shard(&key);
    check_room_for(shard, &key)?;
    let command = Command::SetGroup {
        key: key.clone(),
        group,
        config: config.clone(),
    };
    write(shard, command).await?.into_done()?;
    shard.rounds.wake(&key);
    Ok(Json(config))
}

/// `DELETE /v1/semaphores/{key}/groups/{group}`: back to no cap, permitted. On a
/// key or group without settings it changes nothing and creates no key.
#[utoipa::path(
    delete, path = paths::GROUP, tag = "semaphores",
    params(("key" = String, Path, description = "The semaphore key (1 to 256 bytes, percent-encoded)."), ("group" = String, Path, description = "The group (1 to 256 bytes).")),
    responses((status = 204, description = "The group's configuration is gone (or never existed).")),
)]
pub async fn delete_group(
    State(app): State<App>,
    ApiPath((key, group)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    validate_key(&key)?;
    validate_group(&group)?;
    let command = Command::RemoveGroup {
        key: key.clone(),
        group,
    };
    let shard = app.key_shard(&key);
    write(shard, command).await?.into_done()?;
    shard.rounds.wake(&key);
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/semaphores`: keys in order, with their usage; linearizable.
#[utoipa::path(
    get, path = paths::SEMAPHORES, tag = "semaphores",
    params(ListQuery),
    responses((status = 200, description = "One page of keys in byte order.", body = KeyList)),
)]
pub async fn list(
    State(app): State<App>,
    Extension(RouteShard(shard)): Extension<RouteShard>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<KeyList>, ApiError> {
    let shard = routed(&app, shard)?;
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let limit = query
        .limit
        .unwrap_or(DEFAULT_LIST_KEYS)
        .clamp(1, MAX_LIST_KEYS);
    linearizable(shard).await?;
    let now_ms = app.seams.clock.now_ms();
    let list = shard.state.read(|semaphores| {
        let mut keys: Vec<KeyUsage> = semaphores
            .keys_after(query.after.as_deref())
            .take(limit + 1)
            .map(|(key, _)| KeyUsage {
                key: key.to_string(),
                usage: semaphores.usage(key, now_ms),
            })
            .collect();
        let next = (keys.len() > limit).then(|| {
            keys.truncate(limit);
            keys.last().map(|last| last.key.clone())
        });
        KeyList {
            keys,
            next: next.flatten(),
        }
    });
    Ok(Json(list))
}

/// Waits until this node has confirmed it still leads, so a read that follows sees
/// every entry committed before the call.
pub async fn linearizable(shard: &Shard) -> Result<(), ApiError> {
    use openraft::error::{CheckIsLeaderError, RaftError};
    let started = tokio::time::Instant::now();
    let timeout = Duration::from_millis(LINEARIZABLE_TIMEOUT_MS);
    let confirm_until = started + Duration::from_millis(CONFIRM_LEADERSHIP_FOR_MS);
    loop {
        let result = tokio::time::timeout_at(started + timeout, shard.raft.ensure_linearizable())
            .await
            .map_err(|_| ApiError::NoQuorum)?;
        return match result {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward))) => {
                Err(ApiError::to_leader(forward.leader_id))
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_))) => {
                if tokio::time::Instant::now() + CONFIRM_AGAIN_AFTER < confirm_until {
                    metrics::counter!(crate::observe::metrics::READS_CONFIRMED_AGAIN).increment(1);
                    tokio::time::sleep(CONFIRM_AGAIN_AFTER).await;
                    continue;
                }
                Err(ApiError::NoQuorum)
            }
            Err(RaftError::Fatal(_)) => Err(ApiError::ShuttingDown),
        };
    }
}

/// Proposes `command` and hands back its result; the caller reads it with the
/// accessor of the command it proposed (`into_key_config`, `into_done`, ...),
/// which turns a rejection inside apply into a 400 naming the field.
pub async fn write(shard: &Shard, command: Command) -> Result<CommandResult, ApiError> {
    let (result, _) = propose(&shard.raft, &shard.leadership, command).await?;
    Ok(result)
}
