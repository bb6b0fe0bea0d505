//! Followers forward leader-only calls to the leader: one hop, with a timeout.
//!
//! The caller's own `Authorization` goes along and the leader decides: a
//! follower never vouches for a caller, so its registry lagging a revocation
//! cannot let a revoked token through.
//!
//! A forwarded call carries [`headers::FORWARDED`]; a node that receives one and
//! does not lead answers `not_leader` instead of forwarding again, so a call never
//! bounces around a cluster that is changing leaders. Every answer names the
//! leader in [`headers::LEADER`].

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use permitd_core::contract::headers;
use permitd_core::limits::MAX_BODY_BYTES;

use permitd_storage::{NodeId, PeerNode};
use tokio::sync::watch;

use crate::edge::error::ApiError;
use crate::leader::leadership::Leadership;
use crate::raft::Raft;

/// Headers copied in both directions; everything else is hop-by-hop or ours.
const REQUEST_HEADERS: &[HeaderName] = &[header::CONTENT_TYPE, header::AUTHORIZATION];
const RESPONSE_HEADERS: &[HeaderName] = &[header::CONTENT_TYPE, header::RETRY_AFTER];

/// What forwarding needs from the node, handed over by the router that mounts
/// it, so this module does not depend on the node's whole state. Shared behind
/// an `Arc`: every forwarded call clones it, and one reference count is cheaper
/// than one per field (see `App`).
#[derive(Clone)]
pub struct ToLeader {
    /// This node, named in [`headers::LEADER`] when it leads.
    pub id: NodeId,
    pub leadership: watch::Receiver<Leadership>,
    /// Where the current membership says the leader listens.
    pub raft: Raft,
    /// `http` or `https`: how this node reaches its peers' listeners.
    pub scheme: &'static str,
    /// The node's pooled client to the leader (TLS-configured when the cluster
    /// uses TLS; built in `app.rs` with the forwarding timeout).
    pub client: reqwest::Client,
}

impl std::fmt::Debug for ToLeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToLeader")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ToLeader {
    /// The peer entry of `id` in the current membership.
    fn peer(&self, id: NodeId) -> Option<PeerNode> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics
            .membership_config
            .membership()
            .get_node(&id)
            .cloned()
    }
}

/// Middleware: serve locally on the leader, forward from a follower.
pub async fn to_leader(State(to): State<Arc<ToLeader>>, request: Request, next: Next) -> Response {
    let leadership = *to.leadership.borrow();
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
    let Some(peer) = to.peer(leader) else {
        return ApiError::NoQuorum.into_response();
    };
    let base = format!("{}://{}", to.scheme, peer.api_addr);
    forward(&to.client, &base, request)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn forward(
    client: &reqwest::Client,
    base: &str,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let body = to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| ApiError::PayloadTooLarge {
            max: MAX_BODY_BYTES,
        })?;
    let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let mut outgoing = client
        .request(parts.method.clone(), format!("{base}{path}"))
        .header(headers::FORWARDED, "1")
        .body(body);
    for name in REQUEST_HEADERS {
        if let Some(value) = parts.headers.get(name) {
            outgoing = outgoing.header(name, value);
        }
    }
    let answer = outgoing.send().await.map_err(|error| {
        tracing::warn!(%error, base, "forwarding to the leader failed");
        if error.is_timeout() {
            ApiError::Timeout
        } else if error.is_connect() {
            ApiError::NoQuorum
        } else {
            // The leader took the call and then went away: it may have been
            // waiting for a round that will now never answer.
            ApiError::LeaderChanged
        }
    })?;
    relay(answer).await
}

async fn relay(answer: reqwest::Response) -> Result<Response, ApiError> {
    let status = StatusCode::from_u16(answer.status().as_u16())
        .map_err(|error| ApiError::Internal(error.to_string()))?;
    let mut headers = Vec::new();
    for name in RESPONSE_HEADERS
        .iter()
        .chain([&HeaderName::from_static(headers::LEADER)])
    {
        if let Some(value) = answer.headers().get(name) {
            headers.push((name.clone(), value.clone()));
        }
    }
    let body = answer.bytes().await.map_err(|error| {
        if error.is_timeout() {
            ApiError::Timeout
        } else {
            ApiError::LeaderChanged
        }
    })?;
    let mut response = (status, Body::from(body)).into_response();
    response.headers_mut().extend(headers);
    Ok(response)
}
