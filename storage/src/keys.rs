//! Byte layout of every sled key this crate writes (the Raft log and vote are
//! not in sled: see `wal/`).
//!
//! Keys are built so that sled's byte order is the order we read in:
//! - `state` tree: a one-byte tag, then:
//!   - [`TAG_SYSTEM`] + ASCII name: the last applied log id, the membership, the
//!     cluster row (defaults and clock) and the current snapshot's metadata;
//!   - [`TAG_KEY`] + key length (u32 BE) + key bytes + a row kind, then:
//!     - [`ROW_META`]: nothing more (the key's settings and flags);
//!     - [`ROW_GRANT`] / [`ROW_LEASE`]: the 16 bytes of the id's UUID;
//!     - [`ROW_ANSWER`]: clientId length (u32 BE) + clientId + requestId.
//!
//! The length prefixes make every key's rows one contiguous range that no other
//! key's rows can fall into (`"a"` is never a prefix of `"ab"`'s rows), so a key's
//! rows can be found or deleted with one prefix scan.

use permitd_core::{GrantId, LeaseId};

/// The default tree's row holding the on-disk format version.
pub const FORMAT_VERSION: &[u8] = b"permitd_format_version";

pub const TAG_SYSTEM: u8 = 0x00;
pub const TAG_KEY: u8 = 0x01;

pub const ROW_META: u8 = 0x00;
pub const ROW_GRANT: u8 = 0x01;
pub const ROW_LEASE: u8 = 0x02;
pub const ROW_ANSWER: u8 = 0x03;

/// System rows of the `state` tree.
pub const LAST_APPLIED: &[u8] = b"\x00last_applied";
pub const MEMBERSHIP: &[u8] = b"\x00membership";
pub const CLUSTER: &[u8] = b"\x00cluster";
pub const SNAPSHOT_META: &[u8] = b"\x00snapshot_meta";

fn push_text(out: &mut Vec<u8>, text: &str) {
    // Texts come from a log entry of at most a few MiB: a u32 always holds the length.
    let len = u32::try_from(text.len()).expect("a row key text over 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// The prefix every row of `key` starts with.
pub fn key_prefix(key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 4 + key.len() + 1 + 16);
    out.push(TAG_KEY);
    push_text(&mut out, key);
    out
}

pub fn meta_row(key: &str) -> Vec<u8> {
    let mut out = key_prefix(key);
    out.push(ROW_META);
    out
}

pub fn grant_row(key: &str, id: GrantId) -> Vec<u8> {
    let mut out = key_prefix(key);
    out.push(ROW_GRANT);
    out.extend_from_slice(id.0.as_bytes());
    out
}

pub fn lease_row(key: &str, id: LeaseId) -> Vec<u8> {
    let mut out = key_prefix(key);
    out.push(ROW_LEASE);
    out.extend_from_slice(id.0.as_bytes());
    out
}

pub fn answer_row(key: &str, client_id: &str, request_id: &str) -> Vec<u8> {
    let mut out = key_prefix(key);
    out.push(ROW_ANSWER);
    push_text(&mut out, client_id);
    out.extend_from_slice(request_id.as_bytes());
    out
}

/// A decoded `TAG_KEY` row key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Row {
    Meta {
        key: String,
    },
    Grant {
        key: String,
        id: GrantId,
    },
    Lease {
        key: String,
        id: LeaseId,
    },
    Answer {
        key: String,
        client_id: String,
        request_id: String,
    },
}

impl Row {
    pub fn key(&self) -> &str {
        match self {
            Row::Meta { key }
            | Row::Grant { key, .. }
            | Row::Lease { key, .. }
            | Row::Answer { key, .. } => key,
        }
    }
}

/// Splits a u32-length-prefixed string off the front of `bytes`.
fn take_text(bytes: &[u8]) -> Option<(String, &[u8])> {
    let (len, rest) = bytes.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
    if rest.len() < len {
        return None;
    }
    let (text, rest) = rest.split_at(len);
    Some((String::from_utf8(text.to_vec()).ok()?, rest))
}

fn take_uuid(bytes: &[u8]) -> Option<uuid::Uuid> {
    uuid::Uuid::from_slice(bytes).ok()
}

/// Decodes a `TAG_KEY` row key; `None` when it is malformed.
pub fn parse_row(bytes: &[u8]) -> Option<Row> {
    let (&tag, rest) = bytes.split_first()?;
    if tag != TAG_KEY {
        return None;
    }
    let (key, rest) = take_text(rest)?;
    let (&kind, rest) = rest.split_first()?;
    match kind {
        ROW_META if rest.is_empty() => Some(Row::Meta { key }),
        ROW_GRANT => Some(Row::Grant {
            key,
            id: GrantId(take_uuid(rest)?),
        }),
        ROW_LEASE => Some(Row::Lease {
            key,
            id: LeaseId(take_uuid(rest)?),
        }),
        ROW_ANSWER => {
            let (client_id, rest) = take_text(rest)?;
            let request_id = String::from_utf8(rest.to_vec()).ok()?;
            Some(Row::Answer {
                key,
                client_id,
                request_id,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use permitd_core::IdAllocator;

    #[test]
    fn rows_round_trip() {
        let mut ids = IdAllocator::new(7);
        let grant = ids.grant_id();
        let lease = ids.lease_id();
        let cases = [
            (meta_row("k"), Row::Meta { key: "k".into() }),
            (
                grant_row("k", grant),
                Row::Grant {
                    key: "k".into(),
                    id: grant,
                },
            ),
            (
                lease_row("k", lease),
                Row::Lease {
                    key: "k".into(),
                    id: lease,
                },
            ),
            (
                answer_row("k", "client", "request"),
                Row::Answer {
                    key: "k".into(),
                    client_id: "client".into(),
                    request_id: "request".into(),
                },
            ),
        ];
        for (bytes, row) in cases {
            assert_eq!(parse_row(&bytes), Some(row));
        }
    }

    #[test]
    fn one_key_prefix_never_covers_another_key() {
        let short = key_prefix("a");
        assert!(!meta_row("ab").starts_with(&short));
        assert!(meta_row("a").starts_with(&short));
    }

    #[test]
    fn malformed_rows_are_rejected() {
        assert_eq!(parse_row(b""), None);
        assert_eq!(parse_row(&[TAG_KEY, 0, 0, 0, 5, b'a']), None);
        assert_eq!(parse_row(&[TAG_SYSTEM, 0, 0, 0, 1, b'a', ROW_META]), None);
        let mut bad_grant = key_prefix("k");
        bad_grant.extend_from_slice(&[ROW_GRANT, 1, 2, 3]);
        assert_eq!(parse_row(&bad_grant), None);
    }
}
