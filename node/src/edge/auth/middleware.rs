//! The auth layer: authenticate the bearer token, map the route to an
//! [`Action`], and let the call through only if the caller may do it.
//!
//! It runs inside the forwarding layer, so on a follower a call is forwarded
//! with its own `Authorization` and the leader, whose registry has every applied
//! revocation, decides. A refusal is answered before the handler runs: nothing
//! is proposed, nothing changes. A batch's items are decided one by one in its
//! handler, by the [`ItemGate`] left here in the request's extensions.

use std::collections::BTreeMap;

use axum::body::{to_bytes, Body};
use axum::extract::{FromRequestParts, MatchedPath, Path, Query, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use permitd_core::contract::{paths, EventQuery};
use permitd_core::limits::MAX_BODY_BYTES;
use permitd_core::tokens::Role;
use serde::Deserialize;

use super::roles::{action_of, decide, Action, ItemGate};
use super::{authenticate, bearer_token, Principal};
use crate::app::App;
use crate::edge::error::ApiError;

/// Middleware for every public route but `/healthz`, `/readyz` and `/openapi.json`.
pub async fn require_token(State(app): State<App>, mut request: Request, next: Next) -> Response {
    if !app.auth.enabled {
        request.extensions_mut().insert(ItemGate::Open);
        return next.run(request).await;
    }
    let matched = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
        .unwrap_or_default();
    let (mut parts, body) = request.into_parts();
    let key = if matched == paths::EVENTS {
        event_stream_key(&parts)
    } else {
        Path::<BTreeMap<String, String>>::from_request_parts(&mut parts, &())
            .await
            .ok()
            .and_then(|Path(mut params)| params.remove("key"))
    };
    let Some(mut action) = action_of(&parts.method, &matched, key) else {
        return next.run(Request::from_parts(parts, body)).await;
    };
    let principal = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|value| bearer_token(value.as_bytes()))
        .and_then(|token| authenticate(&app, token));
    let token = match principal {
        None => return ApiError::Unauthorized("a valid bearer token is required").into_response(),
        Some(Principal::Anyone | Principal::Admin) => {
            parts.extensions.insert(ItemGate::Open);
            return next.run(Request::from_parts(parts, body)).await;
        }
        Some(Principal::Token(token)) => token,
    };
    if action == Action::Batch {
        parts.extensions.insert(ItemGate::Token(token.clone()));
    }
    // Only a runner's post needs its clientId read from the body.
    let mut body = body;
    if let (Role::Runner, Action::Post { client_id, .. }) = (token.spec.role, &mut action) {
        let bytes = match to_bytes(body, MAX_BODY_BYTES).await {
            Ok(bytes) => bytes,
            Err(_) => {
                return ApiError::PayloadTooLarge {
                    max: MAX_BODY_BYTES,
                }
                .into_response()
            }
        };
        *client_id = client_id_of(&bytes);
        body = Body::from(bytes);
    }
    match decide(&token, &action) {
        Ok(()) => next.run(Request::from_parts(parts, body)).await,
        Err(refusal) => {
            tracing::info!(token = token.id, ?refusal, path = %matched, "call refused");
            metrics::counter!("permitd_auth_refused_total", "status" => "403").increment(1);
            ApiError::Forbidden(refusal.message()).into_response()
        }
    }
}

/// The event stream's key, from its query (`None` when absent or malformed:
/// then a runner is refused, and the handler answers the malformed query).
fn event_stream_key(parts: &axum::http::request::Parts) -> Option<String> {
    Query::<EventQuery>::try_from_uri(&parts.uri)
        .ok()
        .and_then(|Query(query)| query.key)
}

/// The `clientId` of a request or sync body; `None` when the body is not a JSON
/// object with one string `clientId` (then a runner is refused: deny by default).
fn client_id_of(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct ClientIdOnly {
        #[serde(rename = "clientId")]
        client_id: String,
    }
    serde_json::from_slice::<ClientIdOnly>(body)
        .ok()
        .map(|only| only.client_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_read_strictly() {
        assert_eq!(
            client_id_of(br#"{"type":"sync","clientId":"eu-1","v":1}"#).as_deref(),
            Some("eu-1")
        );
        assert_eq!(client_id_of(br#"{"type":"sync"}"#), None);
        assert_eq!(client_id_of(br#"{"clientId":"a","clientId":"b"}"#), None);
        assert_eq!(client_id_of(b"not json"), None);
    }
}
