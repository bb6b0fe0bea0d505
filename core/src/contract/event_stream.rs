//! `GET /v1/events`: the lifecycle events of applied entries as Server-Sent
//! Events (docs/protocol.md, "Event stream").
//!
//! Each SSE message is one event: `event:` its type, `id:` the stream's
//! [`EventCursor`] after it, `data:` one [`EventRecord`] as JSON. A stream
//! covers one shard (a key's, or the one `x-permitd-shard` names) or, without
//! either, every shard of the cluster; the cursor holds one log index per
//! shard it covers, so a stream of one shard has the plain log index of the
//! event's entry as its id. The events of one entry share its index and are
//! written together; resuming after an id (`Last-Event-ID: id`, or
//! `cursor=id`) therefore neither repeats nor skips an entry of any shard.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::engine::lifecycle::Event;
use crate::limits::EVENT_CURSOR_BYTES_PER_SHARD;

/// The query of `GET /v1/events`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventQuery {
    /// Only this key's events; every key's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The first log index to send (inclusive), in every shard the stream
    /// covers; only new events when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<u64>,
    /// Resume after this [`EventCursor`] (a message's `id`): the same as
    /// `Last-Event-ID`; not with `from`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// Where a stream stands: per shard it covers, in shard order, the last log
/// index it has passed (every event of that shard's entries up to that index
/// was sent or filtered out). Written as the indexes in decimal joined by
/// commas (`12,0,7` for three shards; `12` for one, the plain log index), it
/// is every message's `id`; resuming after it asks each shard for the events
/// from its index + 1.
///
/// Invariant: never empty, at most [`crate::shard::MAX_SHARDS`] positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventCursor {
    positions: Vec<u64>,
}

/// Why a cursor's text is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    #[error("the cursor is {len} bytes long; the maximum is {max} for {shards} shard(s)")]
    TooLong { len: usize, max: usize, shards: u32 },
    #[error("the cursor has {found} position(s); this stream covers {shards} shard(s), one log index each, joined by commas")]
    WrongShardCount { found: usize, shards: u32 },
    #[error("the cursor's position {position} is not a log index (decimal digits, at most {max})", max = u64::MAX)]
    NotAnIndex { position: usize },
}

impl EventCursor {
    /// A cursor at `positions`, one per covered shard in shard order.
    ///
    /// # Panics
    /// When `positions` is empty or longer than [`crate::shard::MAX_SHARDS`]:
    /// the node builds cursors for the shards it has, 1 to that many.
    pub fn new(positions: Vec<u64>) -> Self {
        assert!(
            !positions.is_empty() && positions.len() <= crate::shard::MAX_SHARDS as usize,
            "a cursor covers 1 to MAX_SHARDS shards, not {}",
            positions.len()
        );
        Self { positions }
    }

    /// Reads a cursor of a stream that covers `shards` shards. Bounded work:
    /// the length is checked before anything is split.
    pub fn parse(text: &str, shards: u32) -> Result<Self, CursorError> {
        let shards = shards.clamp(1, crate::shard::MAX_SHARDS);
        let max = cursor_bytes(shards);
        if text.len() > max {
            return Err(CursorError::TooLong {
                len: text.len(),
                max,
                shards,
            });
        }
        let found = text.split(',').count();
        if found != shards as usize {
            return Err(CursorError::WrongShardCount { found, shards });
        }
        let positions = text
            .split(',')
            .enumerate()
            .map(|(position, part)| parse_index(part).ok_or(CursorError::NotAnIndex { position }))
            .collect::<Result<Vec<u64>, CursorError>>()?;
        Ok(Self { positions })
    }

    /// The last log index passed, per covered shard.
    pub fn positions(&self) -> &[u64] {
        &self.positions
    }

    /// The stream passed `log_index` of its `shard`-th covered shard.
    ///
    /// # Panics
    /// When `shard` is not one the cursor covers (the node's bug).
    pub fn pass(&mut self, shard: usize, log_index: u64) {
        let position = &mut self.positions[shard];
        *position = (*position).max(log_index);
    }
}

impl fmt::Display for EventCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shard, position) in self.positions.iter().enumerate() {
            if shard > 0 {
                f.write_str(",")?;
            }
            write!(f, "{position}")?;
        }
        Ok(())
    }
}

/// Longest cursor of a stream that covers `shards` shards.
fn cursor_bytes(shards: u32) -> usize {
    EVENT_CURSOR_BYTES_PER_SHARD * shards as usize - 1
}

/// A log index in plain decimal: digits only (no sign, no space), fitting a `u64`.
fn parse_index(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The SSE event name of a stream's last message when it ends because the
/// subscriber fell behind; its data is an [`super::ErrorAnswer`].
pub const STREAM_ERROR_EVENT: &str = "stream_error";

/// One event as the stream sends it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventRecord {
    /// The entry that produced it (also the SSE `id:`).
    pub log_index: u64,
    pub key: String,
    /// `type` and the event's own fields.
    #[serde(flatten)]
    pub event: Event,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_EVENT_CURSOR_BYTES;
    use crate::shard::MAX_SHARDS;

    #[test]
    fn a_cursor_of_one_shard_is_the_plain_log_index() {
        let cursor = EventCursor::parse("42", 1).unwrap();
        assert_eq!(cursor.positions(), [42]);
        assert_eq!(cursor.to_string(), "42");
    }

    #[test]
    fn a_cursor_is_its_positions_joined_by_commas_and_reads_back() {
        let mut cursor = EventCursor::new(vec![12, 0, 7]);
        assert_eq!(cursor.to_string(), "12,0,7");
        cursor.pass(1, 3);
        cursor.pass(0, 5);
        assert_eq!(cursor.to_string(), "12,3,7", "a position never moves back");
        assert_eq!(EventCursor::parse("12,3,7", 3).unwrap(), cursor);
        let widest = EventCursor::new(vec![u64::MAX; MAX_SHARDS as usize]);
        let text = widest.to_string();
        assert_eq!(text.len(), MAX_EVENT_CURSOR_BYTES);
        assert_eq!(EventCursor::parse(&text, MAX_SHARDS).unwrap(), widest);
    }

    #[test]
    fn a_cursor_must_have_one_index_per_covered_shard() {
        assert_eq!(
            EventCursor::parse("12,0", 3),
            Err(CursorError::WrongShardCount {
                found: 2,
                shards: 3
            })
        );
        assert_eq!(
            EventCursor::parse("12", 3),
            Err(CursorError::WrongShardCount {
                found: 1,
                shards: 3
            })
        );
        assert_eq!(
            EventCursor::parse("1,2", 1),
            Err(CursorError::WrongShardCount {
                found: 2,
                shards: 1
            })
        );
    }

    #[test]
    fn anything_but_decimal_indexes_is_refused() {
        for (text, position) in [
            (",,", 0),
            ("1,,3", 1),
            ("1,2,x", 2),
            ("+1,2,3", 0),
            ("1, 2,3", 1),
            ("-1,2,3", 0),
            ("1,2,18446744073709551616", 2),
            ("1,2,٣", 2),
        ] {
            assert_eq!(
                EventCursor::parse(text, 3),
                Err(CursorError::NotAnIndex { position }),
                "{text:?}"
            );
        }
        assert_eq!(
            EventCursor::parse("", 1),
            Err(CursorError::NotAnIndex { position: 0 })
        );
    }

    #[test]
    fn a_long_cursor_is_refused_before_it_is_split() {
        let long = "1".repeat(64);
        assert_eq!(
            EventCursor::parse(&long, 3),
            Err(CursorError::TooLong {
                len: 64,
                max: 62,
                shards: 3
            })
        );
        let endless = ",".repeat(10 * MAX_EVENT_CURSOR_BYTES);
        assert!(matches!(
            EventCursor::parse(&endless, MAX_SHARDS),
            Err(CursorError::TooLong { .. })
        ));
    }

    proptest::proptest! {
        /// Every cursor reads back as itself at its own shard count, and
        /// at no other.
        #[test]
        fn a_cursor_reads_back_as_itself(positions in proptest::collection::vec(proptest::num::u64::ANY, 1..40)) {
            let cursor = EventCursor::new(positions);
            let text = cursor.to_string();
            let shards = u32::try_from(cursor.positions().len()).unwrap();
            proptest::prop_assert_eq!(EventCursor::parse(&text, shards), Ok(cursor));
            proptest::prop_assert!(EventCursor::parse(&text, shards + 1).is_err());
        }
    }
}
