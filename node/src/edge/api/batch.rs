//! `POST /v1/batch`: many semaphore messages, for many keys, in one call.
//!
//! Each item goes the way `POST /v1/semaphores/{key}` goes ([`deliver`]): its
//! own validation, its own permission check ([`ItemGate`]), its own `requestId`
//! replay and its own answer or error. The items run side by side, so the call
//! is answered when its slowest item is: a `request` when its key's round runs,
//! a `sync` with the next entry. At one shard a follower forwards the batch
//! as one call; at several, the node called splits it by shard
//! (`forward/scatter.rs`).

use axum::extract::State;
use axum::{Extension, Json};
use futures_util::future::join_all;
use permitd_core::contract::batch::{
    parse_batch, BatchItemAnswer, BatchRequest, BatchResponse, ParsedItem,
};
use permitd_core::contract::paths;
use permitd_core::contract::protocol::{SemaphoreRequest, SemaphoreResponse, V1};

use super::extract::JsonBytes;
use super::semaphores::{deliver, parse_off_the_runtime};
use crate::app::App;
use crate::edge::auth::roles::ItemGate;
use crate::edge::error::ApiError;

/// `POST /v1/batch`.
#[utoipa::path(
    post, path = paths::BATCH, tag = "semaphores",
    request_body = BatchRequest,
    responses(
        (status = 200, description = "One answer per item, in order: each with the status its own \
            `POST /v1/semaphores/{key}` would have had, and its answer or error.", body = BatchResponse),
    ),
)]
pub async fn post(
    State(app): State<App>,
    gate: Option<Extension<ItemGate>>,
    JsonBytes(body): JsonBytes,
) -> Result<Json<BatchResponse>, ApiError> {
    // The auth layer always leaves a gate; without one, refuse rather than
    // let every item through.
    let Some(Extension(gate)) = gate else {
        return Err(ApiError::Internal(
            "batch reached without an item gate".into(),
        ));
    };
    let items = parse_off_the_runtime(&app, body, parse_batch).await?;
    metrics::counter!("permitd_batch_items_total").increment(items.len() as u64);
    let answers = join_all(items.into_iter().map(|item| answer(&app, &gate, item))).await;
    Ok(Json(BatchResponse {
        v: V1,
        items: answers,
    }))
}

/// One item's answer, or its error as its own call would have answered it.
async fn answer(app: &App, gate: &ItemGate, item: ParsedItem) -> BatchItemAnswer {
    match run(app, gate, item).await {
        Ok(answer) => BatchItemAnswer::answered(answer),
        Err(error) => BatchItemAnswer::failed(error.body()),
    }
}

async fn run(app: &App, gate: &ItemGate, item: ParsedItem) -> Result<SemaphoreResponse, ApiError> {
    let (key, message) = item.message?;
    gate.decide(&key, client_id(&message))
        .map_err(|refusal| ApiError::Forbidden(refusal.message()))?;
    deliver(app, &key, message, item.bytes).await
}

fn client_id(message: &SemaphoreRequest) -> &str {
    match message {
        SemaphoreRequest::Request(request) => &request.client_id,
        SemaphoreRequest::Sync(sync) => &sync.client_id,
    }
}
