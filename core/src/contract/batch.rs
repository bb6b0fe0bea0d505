//! `POST /v1/batch`: many semaphore messages, for many keys, in one call
//! (docs/protocol.md, "Batches").
//!
//! A batch is only a carrier. Every item is the message `POST
//! /v1/semaphores/{key}` would take, with its own validation, `requestId`
//! replay, permission check and answer; a bad item never fails its neighbours.
//! Only the envelope can fail the whole call: a body that is not a batch, or
//! one past [`MAX_BATCH_ITEMS`] or [`MAX_BATCH_KEYS`].

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::contract::protocol::{SemaphoreRequest, SemaphoreResponse, V1};
use crate::contract::validate::{validate_key, validate_request, InvalidInput};
use crate::contract::{ErrorAnswer, ErrorBody};
use crate::limits::{MAX_BATCH_ITEMS, MAX_BATCH_KEYS};

/// The body of `POST /v1/batch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchRequest {
    pub v: V1,
    /// 1 to `MAX_BATCH_ITEMS` messages, answered in this order.
    #[schema(min_items = 1)]
    pub items: Vec<BatchItem>,
}

/// One message of a batch and the key it is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchItem {
    /// The semaphore key (1 to 256 bytes).
    pub key: String,
    pub message: SemaphoreRequest,
}

/// The answer to a batch: one item per item asked, in the same order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchResponse {
    pub v: V1,
    pub items: Vec<BatchItemAnswer>,
}

/// One item's answer: the status its own call would have had, and either the
/// answer (200) or the error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchItemAnswer {
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<SemaphoreResponse>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl BatchItemAnswer {
    /// A success.
    pub fn answered(answer: SemaphoreResponse) -> Self {
        Self {
            status: 200,
            answer: Some(answer),
            error: None,
        }
    }

    /// A failure, with the status its error code implies.
    pub fn failed(error: ErrorAnswer) -> Self {
        Self {
            status: error.error.code.status(),
            answer: None,
            error: Some(error.error),
        }
    }

    /// The item's answer, or its error.
    pub fn into_result(self) -> Result<SemaphoreResponse, ErrorBody> {
        match (self.answer, self.error) {
            (Some(answer), _) => Ok(answer),
            (None, Some(error)) => Err(error),
            (None, None) => Err(ErrorBody {
                code: crate::contract::ErrorCode::Internal,
                message: "batch item answered neither an answer nor an error".into(),
                field: None,
            }),
        }
    }
}

/// One item as parsed: its key and checked message, or why it was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedItem {
    /// The item's bytes as received: what it weighs in a round entry.
    pub bytes: usize,
    pub message: Result<(String, SemaphoreRequest), InvalidInput>,
}

/// The envelope, with every item still unparsed so that one bad item stays
/// that item's error.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[allow(dead_code)] // checked by parsing: only `1` parses
    v: V1,
    #[serde(borrow)]
    items: Vec<&'a RawValue>,
}

/// Parses a batch body: the envelope and its limits fail the call, each item
/// fails alone.
pub fn parse_batch(body: &[u8]) -> Result<Vec<ParsedItem>, InvalidInput> {
    let envelope: Envelope<'_> =
        serde_json::from_slice(body).map_err(|error| InvalidInput::Malformed(error.to_string()))?;
    count_items(envelope.items.len())?;
    let items: Vec<ParsedItem> = envelope.items.into_iter().map(parse_item).collect();
    count_keys(&items)?;
    Ok(items)
}

fn count_items(len: usize) -> Result<(), InvalidInput> {
    if len == 0 {
        return Err(InvalidInput::Empty {
            field: "items".into(),
        });
    }
    if len > MAX_BATCH_ITEMS {
        return Err(InvalidInput::TooMany {
            field: "items".into(),
            len,
            max: MAX_BATCH_ITEMS,
        });
    }
    Ok(())
}

/// Distinct keys among the items that parsed: each may hold the call until
/// its round, so they bound one call's fan-out.
fn count_keys(items: &[ParsedItem]) -> Result<(), InvalidInput> {
    let keys: BTreeSet<&str> = items
        .iter()
        .filter_map(|item| item.message.as_ref().ok())
        .map(|(key, _)| key.as_str())
        .collect();
    if keys.len() > MAX_BATCH_KEYS {
        return Err(InvalidInput::TooMany {
            field: "items.key".into(),
            len: keys.len(),
            max: MAX_BATCH_KEYS,
        });
    }
    Ok(())
}

fn parse_item(raw: &RawValue) -> ParsedItem {
    let message = serde_json::from_str::<BatchItem>(raw.get())
        .map_err(|error| InvalidInput::Malformed(error.to_string()))
        .and_then(|item| {
            validate_key(&item.key)?;
            validate_request(&item.message)?;
            Ok((item.key, item.message))
        });
    ParsedItem {
        bytes: raw.get().len(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ErrorCode;

    fn sync(key: &str, client_id: &str) -> String {
        format!(r#"{{"key":"{key}","message":{{"type":"sync","v":1,"clientId":"{client_id}"}}}}"#)
    }

    fn batch(items: &[String]) -> Vec<u8> {
        format!(r#"{{"v":1,"items":[{}]}}"#, items.join(",")).into_bytes()
    }

    #[test]
    fn a_bad_item_fails_alone() {
        let body = batch(&[
            sync("a", "c1"),
            sync("", "c1"),
            r#"{"key":"b","message":{"type":"nope"}}"#.into(),
            sync("b", "c2"),
        ]);
        let items = parse_batch(&body).unwrap();
        assert_eq!(items.len(), 4);
        assert!(items[0].message.is_ok());
        assert_eq!(items[1].message.as_ref().unwrap_err().field(), Some("key"));
        assert!(matches!(items[2].message, Err(InvalidInput::Malformed(_))));
        assert_eq!(items[3].message.as_ref().unwrap().0, "b");
        assert_eq!(items[0].bytes, sync("a", "c1").len());
    }

    #[test]
    fn the_envelope_and_its_limits_fail_the_call() {
        assert!(matches!(
            parse_batch(b"[]"),
            Err(InvalidInput::Malformed(_))
        ));
        assert!(matches!(
            parse_batch(br#"{"v":2,"items":[]}"#),
            Err(InvalidInput::Malformed(_))
        ));
        assert_eq!(parse_batch(&batch(&[])).unwrap_err().field(), Some("items"));
        let full: Vec<String> = (0..MAX_BATCH_ITEMS)
            .map(|i| sync(&format!("k{}", i % MAX_BATCH_KEYS), "c"))
            .collect();
        assert!(parse_batch(&batch(&full)).is_ok());
        let over: Vec<String> = (0..=MAX_BATCH_ITEMS).map(|_| sync("k", "c")).collect();
        assert!(matches!(
            parse_batch(&batch(&over)),
            Err(InvalidInput::TooMany { len, .. }) if len == MAX_BATCH_ITEMS + 1
        ));
        let keys: Vec<String> = (0..=MAX_BATCH_KEYS)
            .map(|i| sync(&format!("k{i}"), "c"))
            .collect();
        assert_eq!(
            parse_batch(&batch(&keys)).unwrap_err().field(),
            Some("items.key")
        );
    }

    #[test]
    fn answers_carry_their_own_status() {
        let failed = BatchItemAnswer::failed(ErrorAnswer::new(ErrorCode::TooManyPending, "full"));
        assert_eq!(failed.status, 429);
        let text = serde_json::to_string(&failed).unwrap();
        assert!(!text.contains("answer"), "{text}");
        let back: BatchItemAnswer = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back.into_result().unwrap_err().code,
            ErrorCode::TooManyPending
        );
    }
}
