//! Extractors whose every rejection answers in the API's JSON error shape.
//!
//! axum's own `Json` answers 422 and plain text on a schema mismatch; here every
//! malformed body is a 400, a wrong media type a 415 and an oversized body a 413,
//! all as [`ApiError`]s.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::{header, request::Parts, StatusCode};
use permitd_core::limits::MAX_BODY_BYTES;
use permitd_core::InvalidInput;
use permitd_storage::ShardId;
use serde::de::DeserializeOwned;

use crate::app::App;
use crate::edge::error::ApiError;
use crate::shard::Shard;

/// The shard a call was routed to, in the request's extensions for the
/// handler (`forward::to_leader`): the key's shard, else the one
/// `x-permitd-shard` names, else the meta shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteShard(pub ShardId);

/// Shard `id` of `app`'s node; a 400 for one the cluster does not have (the
/// router checks first).
pub fn routed(app: &App, id: ShardId) -> Result<&Shard, ApiError> {
    app.shard(id)
        .ok_or_else(|| ApiError::BadRequest(format!("no shard {id} in this cluster")))
}

/// A JSON body parsed into `T`.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

/// A JSON body kept as bytes, for parsers of their own (`validate::parse_request`).
#[derive(Debug)]
pub struct JsonBytes(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        if !is_json(request.headers().get(header::CONTENT_TYPE)) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(body_rejection)?;
        if !is_object(&bytes) {
            let reason = "the body must be a JSON object".to_owned();
            return Err(InvalidInput::Malformed(reason).into());
        }
        Ok(Self(bytes))
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let JsonBytes(bytes) = JsonBytes::from_request(request, state).await?;
        serde_json::from_slice(&bytes)
            .map(Self)
            .map_err(|error| InvalidInput::Malformed(error.to_string()).into())
    }
}

fn is_json(content_type: Option<&header::HeaderValue>) -> bool {
    let Some(value) = content_type.and_then(|value| value.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// Whether a body is shaped as a JSON object. Every body of the API is one,
/// and serde would otherwise read a struct from an array (`[null, null]` as a
/// configuration with every field omitted).
fn is_object(body: &[u8]) -> bool {
    let start = body.iter().find(|byte| !byte.is_ascii_whitespace());
    start == Some(&b'{')
}

fn body_rejection(rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge {
            max: MAX_BODY_BYTES,
        }
    } else {
        ApiError::BadRequest(rejection.body_text())
    }
}

/// Path parameters; a bad one (invalid percent-encoding, say) is a JSON 400.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| Self(value))
            .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_types() {
        let value = |text: &'static str| header::HeaderValue::from_static(text);
        assert!(is_json(Some(&value("application/json"))));
        assert!(is_json(Some(&value("Application/JSON; charset=utf-8"))));
        assert!(!is_json(Some(&value("text/plain"))));
        assert!(!is_json(None));
    }

    #[test]
    fn only_objects_are_bodies() {
        assert!(is_object(b" \n{\"limit\": 1}"));
        for body in [&b"[null, null]"[..], b"null", b"1", b"\"{}\"", b""] {
            assert!(!is_object(body), "{body:?}");
        }
    }
}
