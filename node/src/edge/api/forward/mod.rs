//! Followers forward leader-only calls to the leader: one hop, within deadlines
//! that follow the Raft timings and what the call may wait ([`deadline`]).
//!
//! The caller's own `Authorization` goes along and the leader decides: a
//! follower never vouches for a caller, so its registry lagging a revocation
//! cannot let a revoked token through.
//!
//! A forwarded call carries [`headers::FORWARDED`]; a node that receives one and
//! does not lead answers `not_leader` instead of forwarding again, so a call never
//! bounces around a cluster that is changing leaders. Every answer names the
//! leader in [`headers::LEADER`].
//!
//! A call ends as soon as this node can tell it will get no answer: the leader
//! cannot be reached ([`deadline::ForwardTimings::reach`]: 503 `timeout`
//! naming the leader, so a client can call it directly), this node stops
//! naming that leader (503 `leader_changed`), or the leader took longer than
//! the call may wait (503 `timeout`). What the calls find is what `/readyz`
//! reports ([`reach`]).

pub mod deadline;
pub mod reach;
pub mod scatter;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use permitd_core::contract::{headers, paths};
use permitd_core::limits::MAX_BODY_BYTES;

use permitd_core::shard::shard_of;
use permitd_storage::{NodeId, PeerNode, ShardId, SharedState};
use permitd_transport::{Deadline, Transport, TransportError, TransportErrorKind};
use tokio::sync::watch;

use self::deadline::{deadline, may_wait, Call};
use self::reach::{Contact, LeaderReach};
use crate::app::App;
use crate::config::ForwardTimings;
use crate::edge::api::extract::{ApiPath, RouteShard};
use crate::edge::error::ApiError;
use crate::leader::leadership::Leadership;
use crate::raft::Raft;
use crate::shard::META_SHARD;

/// Headers copied in both directions; everything else is hop-by-hop or ours.
const REQUEST_HEADERS: &[&str] = &["content-type", "authorization", headers::SHARD];
const RESPONSE_HEADERS: &[HeaderName] = &[header::CONTENT_TYPE, header::RETRY_AFTER];

/// What forwarding needs from the node, built with the node (`app.rs`), so this
/// module does not depend on the node's whole state. Shared behind an `Arc`:
/// every forwarded call clones it, and one reference count is cheaper than one
/// per field (see `App`).
#[derive(Clone)]
pub struct ToLeader {
    /// This node, named in [`headers::LEADER`] when it leads.
    pub id: NodeId,
    /// Every shard's leadership and state, shard k at position k.
    pub shards: Vec<ShardRoute>,
    /// `http` or `https`: how this node reaches its peers' listeners.
    pub scheme: &'static str,
    /// What calls reach the leader through: the node's pooled client to the
    /// leader (TLS-configured when the cluster uses TLS; built in `app.rs`,
    /// with the limits of [`deadline`]), or the simulator's network.
    pub transport: Transport,
    pub timings: ForwardTimings,
    /// What calls and probes last found about reaching each leader.
    pub reach: Arc<LeaderReach>,
}

/// What forwarding needs of one shard.
#[derive(Clone)]
#[allow(missing_debug_implementations)] // openraft's handle and the state print nothing useful
pub struct ShardRoute {
    pub leadership: watch::Receiver<Leadership>,
    /// Where the current membership says the leader listens.
    pub raft: Raft,
    /// The replicated state: a key's round timings bound how long its calls
    /// may wait ([`deadline::may_wait`]).
    pub state: SharedState,
}

impl std::fmt::Debug for ToLeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToLeader")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ToLeader {
    /// Forwarding for `app`'s node, with its probe of the leaders started.
    pub fn start(app: &App) -> Arc<Self> {
        let to = Self::new(app);
        crate::seams::spawn(probe_leaders(to.clone()));
        to
    }

    /// Forwarding for `app`'s node, without a probe (the internal router's,
    /// which only restores shard by shard).
    pub fn new(app: &App) -> Arc<Self> {
        let shards = app
            .shards
            .iter()
            .map(|shard| ShardRoute {
                leadership: shard.leadership.clone(),
                raft: shard.raft.clone(),
                state: shard.state.clone(),
            })
            .collect();
        Arc::new(Self {
            id: app.id,
            shards,
            scheme: app.scheme,
            transport: app.leader_transport.clone(),
            timings: app.forward_timings,
            reach: Arc::default(),
        })
    }

    /// The shard count.
    pub fn count(&self) -> u32 {
        u32::try_from(self.shards.len()).unwrap_or(u32::MAX)
    }

    fn route(&self, shard: ShardId) -> &ShardRoute {
        &self.shards[usize::try_from(shard).unwrap_or(0)]
    }

    /// The peer entry of `id` in the current membership of any shard, the
    /// meta shard first. Not the meta shard's alone: while a membership
    /// change goes from shard to shard, a node the meta shard has dropped
    /// still leads others, and a call to one of those must still reach it
    /// (simulator, seed 10 at S = 3: every call to the removed node's shard
    /// got `no_quorum` and the change could never reach that shard).
    fn peer(&self, id: NodeId) -> Option<PeerNode> {
        self.shards
            .iter()
            .find_map(|shard| crate::raft::member(&shard.raft, id))
    }

    /// `scheme://api_addr` of `leader` in the current membership.
    pub fn base_of(&self, leader: NodeId) -> Option<String> {
        let peer = self.peer(leader)?;
        Some(format!("{}://{}", self.scheme, peer.api_addr))
    }

    /// `scheme://raft_addr` of `leader` in the current membership: its
    /// internal listener.
    pub fn raft_base_of(&self, leader: NodeId) -> Option<String> {
        let peer = self.peer(leader)?;
        Some(format!("{}://{}", self.scheme, peer.raft_addr))
    }

    /// The shard the call of `parts` is about ([`RouteShard`]).
    async fn shard_of_call(&self, parts: &mut Parts) -> Result<ShardId, ApiError> {
        let params = RawPathParams::from_request_parts(parts, &()).await.ok();
        let key = params
            .as_ref()
            .and_then(|params| params.iter().find(|(name, _)| *name == "key"))
            .map(|(_, key)| key);
        if let Some(key) = key {
            return Ok(shard_of(key, self.count()).unwrap_or(META_SHARD));
        }
        named_shard(&parts.headers, self.count()).map(|named| named.unwrap_or(META_SHARD))
    }

    /// How long the call of `parts` with `body` may wait on the leader.
    async fn may_wait(&self, parts: &mut Parts, body: &[u8]) -> Duration {
        let matched = parts
            .extensions
            .get::<MatchedPath>()
            .map(MatchedPath::as_str);
        let post = parts.method == Method::POST;
        let (message, batch, backup) = (
            post && matched == Some(paths::SEMAPHORE),
            post && matched == Some(paths::BATCH),
            matched == Some(paths::CLUSTER_SNAPSHOT),
        );
        let key = match message {
            true => ApiPath::<String>::from_request_parts(parts, &()).await.ok(),
            false => None,
        };
        let call = match key {
            Some(ApiPath(ref key)) => Call::Message { key, body },
            None if batch => Call::Batch { body },
            None if backup => Call::Backup,
            None => Call::Other,
        };
        may_wait(call, |key| {
            let shard = shard_of(key, self.count()).unwrap_or(META_SHARD);
            self.route(shard).state.read(|semaphores| {
                let config = semaphores.config(key);
                (config.round_wait_ms, config.round_period_ms)
            })
        })
    }
}

/// The shard [`headers::SHARD`] names, if any; a 400 when it names none of
/// the cluster's `count`.
pub fn named_shard(headers: &HeaderMap, count: u32) -> Result<Option<ShardId>, ApiError> {
    let Some(value) = headers.get(headers::SHARD) else {
        return Ok(None);
    };
    let shard = value
        .to_str()
        .ok()
        .and_then(|text| text.parse::<ShardId>().ok())
        .filter(|shard| *shard < count);
    match shard {
        Some(shard) => Ok(Some(shard)),
        None => Err(ApiError::BadRequest(format!(
            "{} must name a shard from 0 to {}",
            headers::SHARD,
            count.saturating_sub(1)
        ))),
    }
}

/// While this node follows some shard, asks each leader it does not hear
/// from's `/readyz` whenever no call answered within `timings.reach`, and at
/// once when the meta shard's leader changes ([`reach`]); a probe gets two
/// reaches (connecting, answering).
async fn probe_leaders(to: Arc<ToLeader>) {
    let mut meta = to.shards[0].leadership.clone();
    loop {
        meta.borrow_and_update();
        // Each other leader once, about the first shard it leads.
        let mut leaders: BTreeMap<NodeId, ShardId> = BTreeMap::new();
        for (shard, route) in (0..).zip(&to.shards) {
            let now = *route.leadership.borrow();
            if let Some(leader) = now.leader.filter(|_| !now.is_leader) {
                leaders.entry(leader).or_insert(shard);
            }
        }
        for (leader, shard) in leaders {
            if !to.reach.due(leader, to.timings.reach) {
                continue;
            }
            let timeout = 2 * to.timings.reach;
            let contact = match to.base_of(leader) {
                Some(base) => reach::probe(&to.transport, &base, shard, timeout).await,
                None => Contact::Unreached,
            };
            to.reach.record(leader, contact);
        }
        tokio::select! {
            changed = meta.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(to.timings.reach) => {}
        }
    }
}

/// Middleware: serve locally on the leader of the call's shard, forward to it
/// from any other node.
pub async fn to_leader(State(to): State<Arc<ToLeader>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let shard = match to.shard_of_call(&mut parts).await {
        Ok(shard) => shard,
        Err(error) => return error.into_response(),
    };
    parts.extensions.insert(RouteShard(shard));
    // Named for the leader too, should the call go on to it.
    parts
        .headers
        .insert(headers::SHARD, HeaderValue::from(shard));
    let request = Request::from_parts(parts, body);
    let mut response = route(&to, shard, request, next).await;
    let headers = response.headers_mut();
    headers.insert(headers::SHARD, HeaderValue::from(shard));
    if to.count() > 1 {
        headers.insert(headers::SHARDS, HeaderValue::from(to.count()));
    }
    response
}

async fn route(to: &Arc<ToLeader>, shard: ShardId, request: Request, next: Next) -> Response {
    let route = to.route(shard);
    let leadership = *route.leadership.borrow();
    if leadership.is_leader {
        let mut response = next.run(request).await;
        response
            .headers_mut()
            .insert(headers::LEADER, HeaderValue::from(to.id));
        return response;
    }
    let Some(leader) = leadership.leader else {
        return ApiError::NoQuorum.into_response();
    };
    if request.headers().contains_key(headers::FORWARDED) {
        return ApiError::NotLeader {
            leader: Some(leader),
        }
        .into_response();
    }
    let Some(base) = to.base_of(leader) else {
        return ApiError::NoQuorum.into_response();
    };
    let forwarded = forward(to, &base, request);
    // A leader this node stops naming (another won, or it fell silent past
    // the lease) will not answer in a way anyone waits for.
    let mut leadership = route.leadership.clone();
    let replaced = leadership.wait_for(|now| now.leader != Some(leader));
    let result = tokio::select! {
        result = forwarded => result,
        _ = replaced => Err(Failure::Replaced),
    };
    let contact = match &result {
        Ok(response) if response.status() == StatusCode::SERVICE_UNAVAILABLE => None,
        Ok(_) => Some(Contact::Answered),
        Err(Failure::Unreached) => Some(Contact::Unreached),
        Err(_) => None,
    };
    if let Some(contact) = contact {
        to.reach.record(leader, contact);
    }
    result.unwrap_or_else(|failure| failure.into_error(leader).into_response())
}

/// Why a forwarded call got no answer from the leader.
#[derive(Debug)]
enum Failure {
    /// This node could not reach the leader, or the leader did not answer
    /// within the call's deadline.
    Unreached,
    /// The leader took the call and then went away: it may have been waiting
    /// for a round that will now never answer.
    Dropped,
    /// This node stopped naming that leader.
    Replaced,
    /// Refused before it was sent.
    Refused(ApiError),
}

impl Failure {
    fn of(error: &TransportError) -> Self {
        match error.kind {
            TransportErrorKind::Timeout | TransportErrorKind::Connect => Self::Unreached,
            TransportErrorKind::Request | TransportErrorKind::Exchange => Self::Dropped,
        }
    }

    fn into_error(self, leader: NodeId) -> ApiError {
        match self {
            Self::Unreached => ApiError::LeaderUnreachable { leader },
            Self::Dropped | Self::Replaced => ApiError::LeaderChanged,
            Self::Refused(error) => error,
        }
    }
}

async fn forward(to: &ToLeader, base: &str, request: Request) -> Result<Response, Failure> {
    let (mut parts, body) = request.into_parts();
    let body = to_bytes(body, MAX_BODY_BYTES).await.map_err(|_| {
        Failure::Refused(ApiError::PayloadTooLarge {
            max: MAX_BODY_BYTES,
        })
    })?;
    let may_wait = to.may_wait(&mut parts, &body).await;
    let deadline = Deadline(deadline(&to.timings, may_wait, body.len()));
    let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let sent = match outgoing(&parts, format!("{base}{path}"), body, deadline) {
        Ok(outgoing) => to.transport.send(outgoing).await,
        Err(unbuildable) => Err(unbuildable),
    };
    let answer = sent.map_err(|error| {
        tracing::warn!(%error, base, "forwarding to the leader failed");
        Failure::of(&error)
    })?;
    relay(answer).await
}

/// The call as it goes to the leader: marked forwarded, with the headers
/// that travel ([`REQUEST_HEADERS`]), within `deadline`.
fn outgoing(
    parts: &Parts,
    uri: String,
    body: Bytes,
    deadline: Deadline,
) -> Result<axum::http::Request<Bytes>, TransportError> {
    let uri = Uri::try_from(uri)
        .map_err(|error| TransportError::new(TransportErrorKind::Request, error))?;
    let mut outgoing = axum::http::Request::new(body);
    *outgoing.method_mut() = parts.method.clone();
    *outgoing.uri_mut() = uri;
    let headers = outgoing.headers_mut();
    headers.insert(headers::FORWARDED, HeaderValue::from_static("1"));
    for name in REQUEST_HEADERS {
        if let Some(value) = parts.headers.get(*name) {
            headers.insert(*name, value.clone());
        }
    }
    outgoing.extensions_mut().insert(deadline);
    Ok(outgoing)
}

/// The leader's answer, as this node gives it: its status, the headers that
/// travel back ([`RESPONSE_HEADERS`], [`headers::LEADER`]) and its body, read
/// whole within the call's deadline. Read here rather than streamed through:
/// an answer cut off mid-body then fails the call with a 503, as a missing
/// answer does, instead of reaching the client truncated under a 200. (Only
/// leader-only calls are forwarded, whose answers are whole JSON documents;
/// `/v1/events` is answered by the node called.)
async fn relay(answer: axum::http::Response<permitd_transport::Body>) -> Result<Response, Failure> {
    let (parts, body) = answer.into_parts();
    let mut headers = Vec::new();
    for name in RESPONSE_HEADERS
        .iter()
        .chain([&HeaderName::from_static(headers::LEADER)])
    {
        if let Some(value) = parts.headers.get(name) {
            headers.push((name.clone(), value.clone()));
        }
    }
    let body = permitd_transport::collect(body)
        .await
        .map_err(|error| Failure::of(&error))?;
    let mut response = (parts.status, Body::from(body)).into_response();
    response.headers_mut().extend(headers);
    Ok(response)
}
