//! The HTTP surface: the public router (v1, `/cluster`, metrics, health) and the
//! internal router (`/raft`, `/cluster`) that peers call.
//!
//! Layers, outermost first: a trace span per request, the body limit, then per
//! route group forwarding to the leader (v1, membership) and inside it the token
//! check ([`crate::edge::auth`]), so the leader decides. `/metrics` and `/v1/events`
//! are answered by the node called, from its own state; the dashboard (`/ui`)
//! is open and static. The internal router serves `/raft/*` only, behind the
//! peer secret. `/healthz`, `/readyz` and `/openapi.json` are open.
//! Unknown routes and methods answer the JSON error shape.

pub mod backup;
pub mod batch;
pub mod cluster;
pub mod delete_key;
pub mod event_stream;
pub mod extract;
pub mod forward;
pub mod holders;
pub mod openapi;
pub mod semaphores;
pub mod tokens;
pub mod ui;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use permitd_core::contract::{paths, Health, HealthStatus, Readiness, ReadyStatus, Serving};
use permitd_core::limits::MAX_BODY_BYTES;
use tower_http::trace::{DefaultMakeSpan, DefaultOnResponse, TraceLayer};
use tracing::Level;

use crate::app::App;
use crate::edge::auth::middleware::require_token;
use crate::edge::error::ApiError;

/// Largest body a peer may send on the internal listener (append entries carry
/// whole rounds; snapshots come in chunks).
pub const MAX_RAFT_BODY_BYTES: usize = 128 * 1024 * 1024;

/// The public API, served on `api_addr`.
pub fn public_router(app: App) -> Router {
    let to_leader = forward::ToLeader::start(&app);
    let v1 = Router::new()
        .route(paths::SEMAPHORES, get(semaphores::list))
        .route(paths::SEMAPHORE, post(semaphores::post))
        .route(paths::BATCH, post(batch::post))
        .route(paths::USAGE, get(semaphores::usage))
        .route(paths::HOLDERS, get(holders::get))
        .route(
            paths::KEY_CONFIG,
            get(semaphores::get_config).put(semaphores::put_config),
        )
        .route(
            paths::GROUP,
            put(semaphores::put_group).delete(semaphores::delete_group),
        )
        .route(paths::TOKENS, post(tokens::create).get(tokens::list))
        .route(paths::TOKEN, delete(tokens::revoke))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_token))
        .route_layer(middleware::from_fn_with_state(
            to_leader.clone(),
            forward::to_leader,
        ))
        .route_layer(middleware::from_fn_with_state(
            to_leader.clone(),
            forward::scatter::every_shard,
        ));
    // Answered by the node called, from its own state: never forwarded.
    let local = Router::new()
        .route(paths::METRICS, get(metrics))
        .route(paths::EVENTS, get(event_stream::stream))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_token));
    Router::new()
        .merge(v1)
        .merge(admin_router(app.clone(), &to_leader))
        .merge(cluster_router(app.clone(), &to_leader))
        .merge(local)
        .merge(ui::router())
        .route(paths::HEALTHZ, get(healthz))
        .route(
            paths::READYZ,
            get(readyz).with_state((app.clone(), to_leader)),
        )
        .route(paths::OPENAPI, get(openapi::document))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(crate::observe::http_metrics::track_api))
        .layer(trace_layer(Level::INFO))
        .with_state(app)
}

/// The peer-facing API, served on `raft_addr`: `/raft/*` behind the peer
/// secret, and `/cluster/restore` behind the admin token (here for its larger
/// body limit: a backup can pass the public 1 MiB).
pub fn internal_router(app: App) -> Router {
    let raft = crate::edge::raft_inbound::router()
        .route_layer(middleware::from_fn_with_state(app.clone(), require_secret));
    let restore = Router::new()
        .route(paths::CLUSTER_RESTORE, post(backup::restore))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_token))
        .route_layer(middleware::from_fn_with_state(
            forward::ToLeader::new(&app),
            forward::scatter::every_shard,
        ));
    Router::new()
        .merge(raft)
        .merge(restore)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_RAFT_BODY_BYTES))
        .layer(middleware::from_fn(crate::observe::http_metrics::track_raft))
        // Peers call `/raft/append` for every heartbeat and entry: a span per call
        // at INFO would cost more than the call and drown the log.
        .layer(trace_layer(Level::DEBUG))
        .with_state(app)
}

/// Operator actions that change other clients' state. Every route here is for
/// administrators only: an access check for them is added to this router alone.
fn admin_router(app: App, to_leader: &Arc<forward::ToLeader>) -> Router<App> {
    Router::new()
        .route(paths::CLIENT_RELEASE, post(holders::force_release))
        .route(paths::SEMAPHORE, delete(delete_key::delete_key))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_token))
        .route_layer(middleware::from_fn_with_state(
            to_leader.clone(),
            forward::to_leader,
        ))
}

fn cluster_router(app: App, to_leader: &Arc<forward::ToLeader>) -> Router<App> {
    let leader_only = Router::new()
        .route(paths::CLUSTER_MEMBERS, post(cluster::members))
        .route(paths::CLUSTER_DEFAULTS, put(cluster::put_defaults))
        .route(paths::CLUSTER_SNAPSHOT, get(backup::save))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_token))
        .route_layer(middleware::from_fn_with_state(
            to_leader.clone(),
            forward::to_leader,
        ))
        .route_layer(middleware::from_fn_with_state(
            to_leader.clone(),
            forward::scatter::every_shard,
        ));
    let restore = Router::new()
        .route(paths::CLUSTER_RESTORE, post(backup::restore))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_token))
        .route_layer(middleware::from_fn_with_state(
            to_leader.clone(),
            forward::scatter::every_shard,
        ));
    Router::new()
        .route(paths::CLUSTER_STATUS, get(cluster::status))
        .route(paths::CLUSTER_SHARDS, get(cluster::shards))
        .route(paths::CLUSTER_INIT, post(cluster::init))
        .route_layer(middleware::from_fn_with_state(app.clone(), require_token))
        .merge(restore)
        .merge(leader_only)
}

/// A span per request at `level` (responses are logged at DEBUG).
fn trace_layer(
    level: Level,
) -> TraceLayer<tower_http::classify::SharedClassifier<tower_http::classify::ServerErrorsAsFailures>>
{
    TraceLayer::new_for_http()
        .make_span_with(DefaultMakeSpan::new().level(level))
        .on_response(DefaultOnResponse::new().level(Level::DEBUG))
}

/// Rejects peer calls without the peer secret (401).
async fn require_secret(State(app): State<App>, request: Request, next: Next) -> Response {
    let expected = crate::raft::bearer(app.secret.expose());
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.as_bytes())
        .unwrap_or_default();
    if !crate::edge::auth::constant_time_eq(given, expected.as_bytes()) {
        return ApiError::Unauthorized("the cluster secret is missing or wrong").into_response();
    }
    next.run(request).await
}

#[utoipa::path(
    get, path = paths::METRICS, tag = "operations",
    responses((status = 200, description = "Prometheus text.", content_type = "text/plain", body = String)),
)]
async fn metrics(State(app): State<App>) -> impl IntoResponse {
    let states: Vec<_> = app.shards.iter().map(|shard| shard.state.clone()).collect();
    let clock = app.seams.clock.clone();
    // Adding up every key's usage is CPU work: keep it off the async workers.
    let publish = move || crate::observe::metrics::publish_totals(&states, &clock);
    if let Err(error) = app.seams.blocking(publish).await {
        tracing::warn!(%error, "adding up the usage gauges failed");
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
}

/// Healthy while the Raft core runs: a node whose core stopped serves HTTP but
/// can never apply again, and is about to exit (`crate::leader::fatal`).
#[utoipa::path(
    get, path = paths::HEALTHZ, tag = "operations",
    responses((status = 200, description = "The node serves and its Raft core runs.", body = Health)),
)]
async fn healthz(State(app): State<App>) -> Result<Json<Health>, ApiError> {
    match app.stopped() {
        None => Ok(Json(Health {
            status: HealthStatus::Ok,
        })),
        Some(reason) => {
            tracing::error!(%reason, "unhealthy: the Raft core stopped");
            Err(ApiError::ShuttingDown)
        }
    }
}

/// Ready while v1 calls can be answered: as the leader, while it can commit;
/// as a follower, while its leader is known and was reached (see
/// `forward/reach.rs`). Otherwise the error such a call would get now.
#[utoipa::path(
    get, path = paths::READYZ, tag = "operations",
    responses((status = 200, description = "The node answers v1 calls (writes and linearizable reads), itself or through the leader; else 503 with the error a call would get.", body = Readiness)),
)]
async fn readyz(
    State((app, to_leader)): State<(App, Arc<forward::ToLeader>)>,
    headers: axum::http::HeaderMap,
) -> Result<Json<Readiness>, ApiError> {
    // One shard when named (a follower's probe of its leader asks about a
    // shard that leader leads), else every shard.
    let named = forward::named_shard(&headers, app.shard_count())?;
    let mut ready = None;
    for shard in app
        .shards
        .iter()
        .filter(|shard| named.is_none_or(|named| named == shard.id))
    {
        let serving = shard_serving(shard, &to_leader)?;
        ready.get_or_insert(serving);
    }
    let (leader, serving) = ready.ok_or(ApiError::NoQuorum)?;
    Ok(Json(Readiness {
        status: ReadyStatus::Ready,
        leader,
        serving: Some(serving),
    }))
}

/// Whether this node answers `shard`'s calls, and through which leader.
fn shard_serving(
    shard: &crate::shard::Shard,
    to_leader: &forward::ToLeader,
) -> Result<(u64, Serving), ApiError> {
    let leadership = *shard.leadership.borrow();
    let leader = leadership.leader.ok_or(ApiError::NoQuorum)?;
    if leadership.is_leader {
        if let Some(stalled) = shard.rounds.stalled() {
            return Err(stalled.into());
        }
        return Ok((leader, Serving::Local));
    }
    let last = to_leader.reach.with(leader).map(|(contact, _)| contact);
    Ok((leader, forward::reach::follower_serving(leader, last)?))
}

async fn not_found(request: Request) -> ApiError {
    ApiError::NotFound(format!("no route for {}", request.uri().path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
