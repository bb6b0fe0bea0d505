//! `DELETE /v1/semaphores/{key}` (admin): deletes a key's settings and state in
//! one replicated `DeleteKey` entry (`permitd_core::engine::delete_key` has the rules
//! apply keeps).
//!
//! What only the leader can add: requests waiting for the key's round live in
//! its schedule, not in the replicated state. Without `force` the leader
//! refuses while any wait, or while the state shows grants or leases, before
//! proposing anything, so a refusal usually writes no entry. Apply checks the
//! grants and leases again: a round that commits between this check and the
//! delete makes apply refuse, and nothing changes.
//!
//! A delete during a round: requests still waiting on the leader when a forced
//! delete commits stay parked; their round is a later entry, so it runs on the
//! key as the delete left it (no settings: the cluster defaults; no holders).
//! A round that committed before the delete is counted by it: its grants are
//! released with the rest and named in `client_released` events. No grant made
//! under the deleted settings survives the delete, and none is handed out
//! after it: a round whose answers had not gone out when the delete applied
//! fails them with 503 `key_deleted` (`leader/rounds.rs`), and its callers ask
//! again. After the delete the key's held requests are woken, as after any
//! settings change.

use axum::extract::{Query, State};
use axum::Json;
use permitd_core::contract::validate::{name, validate_key};
use permitd_core::contract::{paths, DeleteKeyQuery, ErrorAnswer};
use permitd_core::engine::delete_key::{KeyDeleted, KeyInUse};
use permitd_core::limits::MAX_REQUEST_ID_BYTES;
use permitd_storage::{Command, Refused};

use super::extract::ApiPath;
use super::semaphores::write;
use crate::app::App;
use crate::edge::error::ApiError;

/// `DELETE /v1/semaphores/{key}` (admin): deletes the key's settings and state.
#[utoipa::path(
    delete, path = paths::SEMAPHORE, tag = "semaphores",
    params(
        ("key" = String, Path, description = "The semaphore key (1 to 256 bytes, percent-encoded)."),
        DeleteKeyQuery,
    ),
    responses(
        (status = 200, description = "The key is deleted: what it released, and whether anything was kept for it (`existed: false`: nothing changed). A replay of the same `requestId` answers as the first time.", body = KeyDeleted),
        (status = 409, description = "`key_in_use`: without `force=true`, the key has grants, leases or requests waiting for its round; nothing changed.", body = ErrorAnswer),
    ),
)]
pub async fn delete_key(
    State(app): State<App>,
    ApiPath(key): ApiPath<String>,
    query: Result<Query<DeleteKeyQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<KeyDeleted>, ApiError> {
    validate_key(&key)?;
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    if let Some(request_id) = &query.request_id {
        name("requestId", request_id, MAX_REQUEST_ID_BYTES)?;
    }
    if !query.force {
        refuse_in_use(&app, &key, query.request_id.as_deref())?;
    }
    let command = Command::DeleteKey {
        now_ms: app.seams.clock.now_ms(),
        key: key.clone(),
        force: query.force,
        request_id: query.request_id.clone(),
    };
    let shard = app.key_shard(&key);
    let deleted = write(shard, command).await?.into_key_deleted()?;
    // The key now runs with the defaults, which may serve its held requests.
    shard.rounds.wake(&key);
    tracing::warn!(key, force = query.force, ?deleted, "operator deleted a key");
    Ok(Json(deleted))
}

/// Refuses a delete without `force` of a key in use, before anything is
/// proposed. A replay of a remembered delete is not refused: apply answers it
/// as the first time, whatever the key holds now.
fn refuse_in_use(app: &App, key: &str, request_id: Option<&str>) -> Result<(), ApiError> {
    let shard = app.key_shard(key);
    let (remembered, mut in_use) = shard.state.read(|semaphores| {
        let remembered = request_id.is_some_and(|id| {
            semaphores
                .deletes()
                .get(key)
                .is_some_and(|by_id| by_id.contains_key(id))
        });
        (remembered, semaphores.in_use(key))
    });
    in_use.waiting = shard.rounds.waiting_count(key) as u64;
    if remembered || in_use == KeyInUse::default() {
        return Ok(());
    }
    Err(Refused::KeyInUse(in_use).into())
}
