//! `POST /v1/batch` in MessagePack (`Content-Type: application/msgpack`): the
//! same batch as the JSON one (docs/protocol.md, "Batches"), each value a
//! MessagePack map with the JSON field names, as `rmp_serde::to_vec_named`
//! writes it.
//!
//! As with JSON, one bad item fails alone: the envelope is walked by hand and
//! each item is first skipped over as a whole value, whatever it holds, so its
//! bytes are known before it is decoded as a [`BatchItem`].

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};

use crate::batch::{checked_item, count_items, count_keys, BatchItem, ParsedItem};
use crate::protocol::V1;
use crate::validate::InvalidInput;

/// The media type of a MessagePack batch and of its answer.
pub const MEDIA_TYPE: &str = "application/msgpack";

/// Parses a MessagePack batch body: the envelope and its limits fail the call,
/// each item fails alone.
pub fn parse_batch(body: &[u8]) -> Result<Vec<ParsedItem>, InvalidInput> {
    let items = envelope_items(body)?;
    count_items(items.len())?;
    let items: Vec<ParsedItem> = items.into_iter().map(parse_item).collect();
    count_keys(&items)?;
    Ok(items)
}

/// A value as MessagePack (maps with field names).
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(value).expect("protocol values always serialise")
}

/// A value from MessagePack.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, String> {
    rmp_serde::from_slice(bytes).map_err(|error| error.to_string())
}

/// Each item's bytes, from a `{"v": 1, "items": […]}` map and nothing after it.
fn envelope_items(body: &[u8]) -> Result<Vec<&[u8]>, InvalidInput> {
    let mut rest = body;
    let fields = rmp::decode::read_map_len(&mut rest).map_err(malformed)?;
    let (mut version, mut items) = (None, None);
    for _ in 0..fields {
        let mut name = [0u8; 8];
        let name = rmp::decode::read_str(&mut rest, &mut name).map_err(malformed)?;
        match name {
            "v" => version = Some(next_value::<V1>(&mut rest)?),
            "items" => items = Some(item_slices(&mut rest)?),
            other => return Err(malformed(format!("unknown field `{other}`"))),
        }
    }
    if !rest.is_empty() {
        return Err(malformed("trailing bytes after the batch"));
    }
    version.ok_or_else(|| malformed("missing field `v`"))?;
    items.ok_or_else(|| malformed("missing field `items`"))
}

/// The array of items, each as its own slice of the body.
fn item_slices<'a>(rest: &mut &'a [u8]) -> Result<Vec<&'a [u8]>, InvalidInput> {
    let len = rmp::decode::read_array_len(rest).map_err(malformed)? as usize;
    // Bounded before anything is allocated for it.
    count_items(len)?;
    let mut items = Vec::with_capacity(len);
    for _ in 0..len {
        let start = *rest;
        next_value::<IgnoredAny>(rest)?;
        items.push(&start[..start.len() - rest.len()]);
    }
    Ok(items)
}

/// Decodes one whole value at the front of `rest` and moves past it.
fn next_value<T: DeserializeOwned>(rest: &mut &[u8]) -> Result<T, InvalidInput> {
    let mut deserializer = rmp_serde::Deserializer::new(std::io::Cursor::new(*rest));
    let value = T::deserialize(&mut deserializer).map_err(malformed)?;
    let read = usize::try_from(deserializer.position()).unwrap_or(usize::MAX);
    *rest = &rest[read.min(rest.len())..];
    Ok(value)
}

fn malformed(error: impl std::fmt::Display) -> InvalidInput {
    InvalidInput::Malformed(error.to_string())
}

fn parse_item(bytes: &[u8]) -> ParsedItem {
    checked_item(decode::<BatchItem>(bytes), bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchRequest;
    use crate::protocol::{PermitSync, SemaphoreRequest};

    fn sync(key: &str, client_id: &str) -> BatchItem {
        BatchItem {
            key: key.into(),
            message: SemaphoreRequest::Sync(PermitSync {
                v: V1,
                client_id: client_id.into(),
                grants: Vec::new(),
                leases: None,
            }),
        }
    }

    /// A batch whose items are the given MessagePack values.
    fn batch(items: &[Vec<u8>]) -> Vec<u8> {
        let mut body = Vec::new();
        rmp::encode::write_map_len(&mut body, 2).unwrap();
        rmp::encode::write_str(&mut body, "v").unwrap();
        rmp::encode::write_uint(&mut body, 1).unwrap();
        rmp::encode::write_str(&mut body, "items").unwrap();
        rmp::encode::write_array_len(&mut body, items.len() as u32).unwrap();
        items.iter().for_each(|item| body.extend_from_slice(item));
        body
    }

    #[test]
    fn a_batch_round_trips() {
        let request = BatchRequest {
            v: V1,
            items: vec![sync("a", "c1"), sync("b", "c2")],
        };
        let items = parse_batch(&encode(&request)).unwrap();
        let keys: Vec<&str> = items
            .iter()
            .map(|item| item.message.as_ref().unwrap().0.as_str())
            .collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(items[0].bytes, encode(&sync("a", "c1")).len());
    }

    #[test]
    fn a_bad_item_fails_alone() {
        let wrong_shape = encode(&serde_json::json!({"key": "b", "message": {"type": "nope"}}));
        let body = batch(&[
            encode(&sync("a", "c1")),
            encode(&sync("", "c1")),
            wrong_shape,
            encode(&[1, 2, 3]),
            encode(&sync("b", "c2")),
        ]);
        let items = parse_batch(&body).unwrap();
        assert_eq!(items.len(), 5);
        assert!(items[0].message.is_ok());
        assert_eq!(items[1].message.as_ref().unwrap_err().field(), Some("key"));
        assert!(matches!(items[2].message, Err(InvalidInput::Malformed(_))));
        assert!(matches!(items[3].message, Err(InvalidInput::Malformed(_))));
        assert_eq!(items[4].message.as_ref().unwrap().0, "b");
    }

    #[test]
    fn the_envelope_and_its_limits_fail_the_call() {
        let one = batch(&[encode(&sync("a", "c"))]);
        let mut trailing = one.clone();
        trailing.push(0xc0);
        let malformed = [
            encode(&serde_json::json!({"v": 2, "items": [1]})),
            encode(&serde_json::json!({"items": [1]})),
            encode(&serde_json::json!({"v": 1, "items": [1], "more": 1})),
            encode(&[1]),
            trailing,
            one[..one.len() - 1].to_vec(),
        ];
        for body in malformed {
            assert!(
                matches!(parse_batch(&body), Err(InvalidInput::Malformed(_))),
                "{body:?}"
            );
        }
        assert_eq!(parse_batch(&batch(&[])).unwrap_err().field(), Some("items"));
        let over: Vec<Vec<u8>> = (0..=crate::limits::MAX_BATCH_ITEMS)
            .map(|_| encode(&sync("k", "c")))
            .collect();
        assert!(matches!(
            parse_batch(&batch(&over)),
            Err(InvalidInput::TooMany { len, .. }) if len == crate::limits::MAX_BATCH_ITEMS + 1
        ));
    }
}
