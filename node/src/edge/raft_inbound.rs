//! Inbound Raft RPCs: `/raft/vote`, `/raft/append`, `/raft/snapshot`, and the
//! election guard's `/raft/prevote` (`election_guard.rs`), each for the shard
//! its `?shard=k` names (shard 0 without one); and, for every shard at once,
//! the coalesced `/raft/heartbeats` (`heartbeats.rs`) and the quiet shards'
//! `/raft/liveness` (`liveness.rs`).
//!
//! Bodies are in the storage codec ([`crate::raft::wire`]). Each answers the local
//! Raft's `Result`, error included, so the caller can tell a remote Raft error
//! from a transport failure; a body that does not decode is a 400.

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use permitd_storage::{codec, NodeId, ShardId, TypeConfig};
use serde::{Deserialize, Serialize};

use crate::app::App;
use crate::leader::handover::{elect_after, ElectRequest};
use crate::raft::election_guard::PreVoteRequest;
use crate::raft::heartbeats::{ShardAnswer, ShardAppend};
use crate::raft::liveness::LivenessCall;
use crate::raft::wire::SnapshotChunk;
use crate::shard::Shard;

/// The `/raft/*` routes (the caller adds the secret check).
pub fn router() -> Router<App> {
    Router::new()
        .route("/raft/vote", post(vote))
        .route("/raft/prevote", post(prevote))
        .route("/raft/append", post(append))
        .route("/raft/snapshot", post(snapshot))
        .route("/raft/elect", post(elect))
        .route("/raft/heartbeats", post(heartbeats))
        .route("/raft/liveness", post(liveness))
}

/// The 400 for a body that does not decode.
fn undecodable(error: codec::CodecError) -> Response {
    let message = format!("undecodable Raft RPC body: {error}");
    (StatusCode::BAD_REQUEST, message).into_response()
}

/// An answer in the codec.
fn encoded(answer: &impl Serialize) -> Response {
    match codec::encode(answer) {
        Ok(bytes) => ([(header::CONTENT_TYPE, codec::CONTENT_TYPE)], bytes).into_response(),
        Err(error) => {
            tracing::error!(%error, "cannot encode a Raft answer");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// `?shard=k` of a Raft RPC: the group it is for (none: shard 0).
#[derive(Debug, Default, Deserialize)]
pub struct ShardQuery {
    #[serde(default)]
    shard: ShardId,
}

/// The shard `query` names, or the 404 for one this node does not have (a
/// peer configured with another shard count).
fn shard_of<'a>(app: &'a App, query: &ShardQuery) -> Result<&'a Shard, (StatusCode, String)> {
    app.shard(query.shard).ok_or_else(|| {
        let message = format!("no shard {} on this node", query.shard);
        (StatusCode::NOT_FOUND, message)
    })
}

async fn vote(State(app): State<App>, Query(query): Query<ShardQuery>, body: Bytes) -> Response {
    let shard = match shard_of(&app, &query) {
        Ok(shard) => shard,
        Err(missing) => return missing.into_response(),
    };
    match codec::decode::<VoteRequest<NodeId>>(&body) {
        Ok(request) => {
            shard
                .election_guard
                .note_vote_request(&shard.raft, &request);
            encoded(&shard.raft.vote(request).await)
        }
        Err(error) => undecodable(error),
    }
}

async fn prevote(State(app): State<App>, Query(query): Query<ShardQuery>, body: Bytes) -> Response {
    let shard = match shard_of(&app, &query) {
        Ok(shard) => shard,
        Err(missing) => return missing.into_response(),
    };
    match codec::decode::<PreVoteRequest>(&body) {
        Ok(request) => {
            let answer = shard.election_guard.answer(&shard.raft, &request);
            encoded(&Ok::<_, openraft::error::Infallible>(answer))
        }
        Err(error) => undecodable(error),
    }
}

/// Append bodies from this size are decoded on a blocking thread, so that the
/// heartbeats arriving meanwhile are answered in time.
const DECODE_APART_BYTES: usize = 64 * 1024;

async fn append(State(app): State<App>, Query(query): Query<ShardQuery>, body: Bytes) -> Response {
    // Taken before decoding: a large body decoded apart must not delay it.
    let arrived = tokio::time::Instant::now();
    let shard = match shard_of(&app, &query) {
        Ok(shard) => shard,
        Err(missing) => return missing.into_response(),
    };
    // The leader counts as heard until this append has been handled.
    let mut receiving = shard.leader_contact.receiving();
    let decoded = if body.len() < DECODE_APART_BYTES {
        codec::decode::<AppendEntriesRequest<TypeConfig>>(&body)
    } else {
        match app.seams.blocking(move || codec::decode(&body)).await {
            Ok(decoded) => decoded,
            Err(error) => {
                tracing::error!(%error, "decoding an append failed");
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            }
        }
    };
    match decoded {
        Ok(request) => {
            receiving.decoded(&request.vote, arrived);
            encoded(&shard.raft.append_entries(request).await)
        }
        Err(error) => undecodable(error),
    }
}

/// Every shard's heartbeats from one leader node (`raft/heartbeats.rs`): each
/// handled as its own `/raft/append`, the answers in the same order.
async fn heartbeats(State(app): State<App>, body: Bytes) -> Response {
    let arrived = tokio::time::Instant::now();
    let appends = match codec::decode::<Vec<ShardAppend>>(&body) {
        Ok(appends) => appends,
        Err(error) => return undecodable(error),
    };
    if appends.len() > app.shards.len() * MAX_HEARTBEATS_PER_SHARD {
        let message = format!("{} heartbeats in one call", appends.len());
        return (StatusCode::BAD_REQUEST, message).into_response();
    }
    if let Some((shard, _)) = appends
        .iter()
        .find(|(shard, _)| app.shard(*shard).is_none())
    {
        let message = format!("no shard {shard} on this node");
        return (StatusCode::NOT_FOUND, message).into_response();
    }
    let handled = appends.into_iter().map(|(shard, request)| {
        let shard = app.shard(shard).expect("checked above");
        let mut receiving = shard.leader_contact.receiving();
        receiving.decoded(&request.vote, arrived);
        async move {
            let answer: ShardAnswer = shard.raft.append_entries(request).await;
            drop(receiving);
            answer
        }
    });
    let answers: Vec<ShardAnswer> = futures_util::future::join_all(handled).await;
    encoded(&Ok::<_, openraft::error::Infallible>(answers))
}

/// Most heartbeats of one shard in one `/raft/heartbeats` call: a leader
/// sends one per shard, and a few more when a commit index follows one.
const MAX_HEARTBEATS_PER_SHARD: usize = 4;

/// A shard's leader hands the shard over to this node (`leader/handover.rs`).
async fn elect(State(app): State<App>, Query(query): Query<ShardQuery>, body: Bytes) -> Response {
    let shard = match shard_of(&app, &query) {
        Ok(shard) => shard,
        Err(missing) => return missing.into_response(),
    };
    match codec::decode::<ElectRequest>(&body) {
        Ok(request) => {
            elect_after(shard.raft.clone(), shard.election_guard.clone(), request);
            encoded(&Ok::<_, openraft::error::Infallible>(()))
        }
        Err(error) => undecodable(error),
    }
}

async fn snapshot(
    State(app): State<App>,
    Query(query): Query<ShardQuery>,
    body: Bytes,
) -> Response {
    let shard = match shard_of(&app, &query) {
        Ok(shard) => shard,
        Err(missing) => return missing.into_response(),
    };
    match codec::decode::<SnapshotChunk>(&body) {
        Ok(chunk) => encoded(&shard.raft.install_snapshot(chunk.into()).await),
        Err(error) => undecodable(error),
    }
}

/// A peer's liveness call (`raft/liveness.rs`): its quiet shards this node
/// follows in that term count as their leader heard; the answer names those
/// the caller should wake, and this node's own quiet shards.
async fn liveness(State(app): State<App>, body: Bytes) -> Response {
    let call = match codec::decode::<LivenessCall>(&body) {
        Ok(call) => call,
        Err(error) => return undecodable(error),
    };
    let shards = app.shard_count() as usize;
    if call.leads.len() > shards || call.wake.len() > shards {
        let message = format!(
            "{} claims and {} wakes in one liveness call, of {shards} shards",
            call.leads.len(),
            call.wake.len()
        );
        return (StatusCode::BAD_REQUEST, message).into_response();
    }
    encoded(&Ok::<_, openraft::error::Infallible>(
        app.liveness.answer(&call),
    ))
}
