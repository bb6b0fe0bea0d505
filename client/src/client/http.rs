//! What one HTTP exchange with a node needs, as plain functions of the request
//! and the answer: the URL with its query, the key a call is about, the
//! answer's leader and shard hints and `Retry-After`, which statuses are worth a retry, and how a
//! body becomes a value or a [`ClientError`].
//!
//! They live in one place so that the call loop (`retry.rs`), the direct
//! status probes (`discovery.rs`) and the event stream (`stream.rs`) build
//! requests and read answers alike; the request itself is built and sent by
//! [`crate::outgoing`].

use http::header::{HeaderMap, RETRY_AFTER};
use http::StatusCode;
use permitd_core::contract::{headers, ErrorAnswer};
use serde::de::DeserializeOwned;
use url::Url;

use crate::error::ClientError;
use crate::leader::{Endpoint, LeaderHint};
use crate::shard_leaders::ShardHint;

/// The first segments of every call that names a key: `/v1/semaphores/{key}…`.
const KEYED_PREFIX: [&str; 2] = ["v1", "semaphores"];

/// Longest error body kept in an error message, in bytes.
const MAX_ERROR_BODY_BYTES: usize = 512;

/// The URL of `path` on `endpoint`, with `query` appended when there is one
/// (paging of listings, the event stream's filters).
pub(super) fn url_of(endpoint: &Endpoint, path: &[String], query: &[(&str, String)]) -> Url {
    let mut url = endpoint.url(path);
    if !query.is_empty() {
        url.query_pairs_mut().extend_pairs(query);
    }
    url
}

/// The leader the answering node named in `x-permitd-leader`.
pub(super) fn leader_hint(answer: &HeaderMap) -> Option<LeaderHint> {
    answer
        .get(headers::LEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(LeaderHint::parse)
}

/// The key a call of `path` (as [`permitd_core::contract::paths::segments`]
/// fills it) is about: the segment after `/v1/semaphores`. Listings, batches,
/// tokens and cluster calls name none.
pub(super) fn key_of(path: &[String]) -> Option<&str> {
    match path {
        [v1, semaphores, key, ..] if [v1, semaphores] == KEYED_PREFIX => Some(key),
        _ => None,
    }
}

/// What the answer's `x-permitd-shard` and `x-permitd-shards` say; `None`
/// when it carries neither (a node that did not route it by shard), or a
/// value that is not a number. A shard without a count is of a cluster of
/// one shard.
pub(super) fn shard_hint(answer: &HeaderMap) -> Option<ShardHint> {
    let number = |name: &str| -> Option<Option<u32>> {
        match answer.get(name) {
            None => Some(None),
            Some(value) => value.to_str().ok()?.trim().parse().ok().map(Some),
        }
    };
    let (shard, shards) = (number(headers::SHARD)?, number(headers::SHARDS)?);
    if shard.is_none() && shards.is_none() {
        return None;
    }
    Some(ShardHint {
        shard,
        shards: shards.unwrap_or(1),
    })
}

/// The answer's `Retry-After` in ms (the server sends whole seconds).
pub(super) fn retry_after_ms(answer: &HeaderMap) -> Option<u64> {
    answer
        .get(RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.trim().parse::<u64>().ok())
        .map(|seconds| seconds.saturating_mul(1_000))
}

/// Whether an answer with `status` is worth another attempt: the node is
/// overloaded (429), or it or its leader could not serve the call now
/// (502, 503, 504). Every other status is the call's final answer.
pub(super) fn is_retryable(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
    )
}

/// The error of a non-success answer: the contract's error body, or the status
/// and the start of the body when something else answered.
pub(super) fn rejected(status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorAnswer>(body) {
        Ok(ErrorAnswer { error }) => ClientError::Rejected {
            status: status.as_u16(),
            code: error.code,
            message: error.message,
            field: error.field,
        },
        Err(_) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(MAX_ERROR_BODY_BYTES)]);
            ClientError::Http {
                status: status.as_u16(),
                body: text.into_owned(),
            }
        }
    }
}

/// A success's body as `R`; a body that is not one is the server's fault,
/// named with the URL that answered it.
pub(super) fn decode<R: DeserializeOwned>(url: &Url, body: &[u8]) -> Result<R, ClientError> {
    serde_json::from_slice(body).map_err(|error| ClientError::UnexpectedAnswer {
        url: url.to_string(),
        reason: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use permitd_core::contract::{paths, ErrorCode};

    use super::*;

    #[test]
    fn error_bodies_map_to_codes_and_fields() {
        let body = br#"{"error":{"code":"bad_request","message":"demand.count is 2000000000; the maximum is 1000000000","field":"demand.count"}}"#;
        let error = rejected(StatusCode::BAD_REQUEST, body);
        assert_eq!(error.code(), Some(ErrorCode::BadRequest));
        assert_eq!(error.field(), Some("demand.count"));
        assert_eq!(
            error.to_string(),
            "400 bad_request: demand.count is 2000000000; the maximum is 1000000000"
        );
        let plain = rejected(StatusCode::NOT_FOUND, b"nope");
        assert_eq!(plain.code(), None);
        assert_eq!(plain.to_string(), "404: nope");
    }

    #[test]
    fn retryable_statuses() {
        for status in [429, 502, 503, 504] {
            assert!(
                is_retryable(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
        for status in [200, 400, 404, 409, 413, 500] {
            assert!(
                !is_retryable(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
    }

    #[test]
    fn paths_put_the_key_in_one_segment() {
        let endpoint = Endpoint::parse("http://n:1").unwrap();
        let path = paths::segments(paths::GROUP, &["acct/7", "wf 1"]);
        assert_eq!(
            endpoint.url(&path).as_str(),
            "http://n:1/v1/semaphores/acct%2F7/groups/wf%201"
        );
    }

    #[test]
    fn a_query_is_appended_encoded_and_only_when_there_is_one() {
        let endpoint = Endpoint::parse("http://n:1").unwrap();
        let path = paths::segments(paths::SEMAPHORES, &[]);
        assert_eq!(
            url_of(&endpoint, &path, &[]).as_str(),
            "http://n:1/v1/semaphores"
        );
        let query = [("after", "acct/7 b".to_owned()), ("limit", "2".to_owned())];
        assert_eq!(
            url_of(&endpoint, &path, &query).as_str(),
            "http://n:1/v1/semaphores?after=acct%2F7+b&limit=2"
        );
    }

    #[test]
    fn the_key_is_the_segment_after_v1_semaphores() {
        let key = |template: &str, params: &[&str]| {
            key_of(&paths::segments(template, params)).map(str::to_owned)
        };
        assert_eq!(key(paths::SEMAPHORE, &["acct/7"]), Some("acct/7".into()));
        assert_eq!(key(paths::USAGE, &["k"]), Some("k".into()));
        assert_eq!(key(paths::GROUP, &["k", "g"]), Some("k".into()));
        assert_eq!(key(paths::CLIENT_RELEASE, &["k", "c"]), Some("k".into()));
        for keyless in [
            paths::SEMAPHORES,
            paths::BATCH,
            paths::TOKENS,
            paths::CLUSTER_STATUS,
        ] {
            assert_eq!(key(keyless, &[]), None, "{keyless}");
        }
        assert_eq!(key(paths::TOKEN, &["3"]), None);
    }

    #[test]
    fn shard_headers_read_as_a_hint() {
        let mut answer = HeaderMap::new();
        assert_eq!(shard_hint(&answer), None);
        answer.insert(headers::SHARD, "2".parse().unwrap());
        let one = ShardHint {
            shard: Some(2),
            shards: 1,
        };
        assert_eq!(shard_hint(&answer), Some(one));
        answer.insert(headers::SHARDS, " 3 ".parse().unwrap());
        let three = ShardHint {
            shard: Some(2),
            shards: 3,
        };
        assert_eq!(shard_hint(&answer), Some(three));
        answer.remove(headers::SHARD);
        let every = ShardHint {
            shard: None,
            shards: 3,
        };
        assert_eq!(shard_hint(&answer), Some(every));
        answer.insert(headers::SHARDS, "many".parse().unwrap());
        assert_eq!(shard_hint(&answer), None);
    }

    #[test]
    fn retry_after_is_read_in_whole_seconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after_ms(&headers), None);
        headers.insert(RETRY_AFTER, " 2 ".parse().unwrap());
        assert_eq!(retry_after_ms(&headers), Some(2_000));
        headers.insert(RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after_ms(&headers), None);
    }
}
