//! Followers forward leader-only calls to the leader: one hop, with a timeout.
//!
//! A forwarded call carries [`headers::FORWARDED`]; a node that receives one and
//! does not lead answers `not_leader` instead of forwarding again, so a call never
//! bounces around a cluster that is changing leaders. Every answer names the
//! leader in [`headers::LEADER`].

use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use permitd_core::contract::headers;
use permitd_core::limits::MAX_BODY_BYTES;

use super::error::ApiError;
use crate::app::App;

/// How long a follower waits for the leader's answer. A forwarded request waits
/// for its round, so this is generous.
pub const FORWARD_TIMEOUT_MS: u64 = 60_000;

/// Headers copied in both directions; everything else is hop-by-hop or ours.
const REQUEST_HEADERS: &[HeaderName] = &[header::CONTENT_TYPE, header::AUTHORIZATION];
const RESPONSE_HEADERS: &[HeaderName] = &[header::CONTENT_TYPE, header::RETRY_AFTER];

/// The HTTP client followers forward with; one connection pool per node.
#[derive(Debug, Clone)]
pub struct Forwarder {
    client: reqwest::Client,
}

impl Forwarder {
    pub fn new() -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(FORWARD_TIMEOUT_MS))
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .build()?;
        Ok(Self { client })
    }
}

/// Middleware: serve locally on the leader, forward from a follower.
pub async fn to_leader(State(app): State<App>, request: Request, next: Next) -> Response {
    let leadership = *app.leadership.borrow();
    if leadership.is_leader {
        let mut response = next.run(request).await;
        response
            .headers_mut()
            .insert(headers::LEADER, HeaderValue::from(app.id));
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
    let Some(peer) = app.peer(leader) else {
        return ApiError::NoQuorum.into_response();
    };
    forward(&app.forwarder, &peer.api_addr, request)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn forward(
    forwarder: &Forwarder,
    addr: &str,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let body = to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| ApiError::PayloadTooLarge {
            max: MAX_BODY_BYTES,
        })?;
    let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let mut outgoing = forwarder
        .client
        .request(parts.method.clone(), format!("http://{addr}{path}"))
        .header(headers::FORWARDED, "1")
        .body(body);
    for name in REQUEST_HEADERS {
        if let Some(value) = parts.headers.get(name) {
            outgoing = outgoing.header(name, value);
        }
    }
    let answer = outgoing.send().await.map_err(|error| {
        tracing::warn!(%error, addr, "forwarding to the leader failed");
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
