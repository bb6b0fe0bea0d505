//! Inbound Raft RPCs: `/raft/vote`, `/raft/append`, `/raft/snapshot`.
//!
//! Each answers the local Raft's `Result` as JSON, error included, so the caller
//! can tell a remote Raft error from a transport failure.

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use permitd_storage::{NodeId, TypeConfig};

use crate::api::extract::ApiJson;
use crate::app::App;

/// The `/raft/*` routes (the caller adds the secret check).
pub fn router() -> Router<App> {
    Router::new()
        .route("/raft/vote", post(vote))
        .route("/raft/append", post(append))
        .route("/raft/snapshot", post(snapshot))
}

async fn vote(
    State(app): State<App>,
    ApiJson(request): ApiJson<VoteRequest<NodeId>>,
) -> Json<Result<VoteResponse<NodeId>, RaftError<NodeId>>> {
    Json(app.raft.vote(request).await)
}

async fn append(
    State(app): State<App>,
    ApiJson(request): ApiJson<AppendEntriesRequest<TypeConfig>>,
) -> Json<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>> {
    Json(app.raft.append_entries(request).await)
}

type SnapshotResult =
    Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

async fn snapshot(
    State(app): State<App>,
    ApiJson(request): ApiJson<InstallSnapshotRequest<TypeConfig>>,
) -> Json<SnapshotResult> {
    Json(app.raft.install_snapshot(request).await)
}
