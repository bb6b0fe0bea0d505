//! One write-ahead log record: framing, CRC, and the typed payloads.
//!
//! ```text
//! +-------------+---------------+----------+-------------------+
//! | len: u32 LE | crc32: u32 LE | kind: u8 | payload: len bytes |
//! +-------------+---------------+----------+-------------------+
//! ```
//!
//! - `len` counts the payload only; a record takes [`HEADER_BYTES`] + `len` bytes.
//! - Every record belongs to one shard (one Raft group; all of a node's shards
//!   share the log). Since storage format 5 the kind byte has [`SHARDED`] set
//!   and the payload starts with the shard id, u32 LE. A record of format 4
//!   (the bit clear, no shard id) belongs to shard 0: that is how a data dir of
//!   format 4 opens as one shard.
//! - `crc32` (IEEE, crc32fast) covers `kind` and the payload, so a record whose
//!   header survived but whose body was torn, or whose kind byte flipped, fails.
//! - `kind` is one of [`Kind`]; 0 is never a kind, so a zero-filled tail (a file
//!   extended but never written) cannot pass as a record (nor can its CRC: the
//!   CRC of a zero kind byte is not zero).
//! - `len` over [`MAX_RECORD_PAYLOAD_BYTES`] is refused when writing and is
//!   damage when reading, so a corrupt length never makes us allocate 4 GiB.

use openraft::{Entry, LogId, Vote};

use super::ShardId;
use crate::codec::{self, CodecError};
use crate::{NodeId, StorageError, TypeConfig};

/// Bytes before the payload: `len`, `crc32`, `kind`.
pub(crate) const HEADER_BYTES: usize = 4 + 4 + 1;

/// Set in the kind byte of a record whose payload starts with its shard id.
pub(crate) const SHARDED: u8 = 0x40;

/// Bytes of the shard id at the front of a sharded record's payload.
const SHARD_BYTES: usize = 4;

/// Largest payload a record may carry, in bytes. An entry is at most a few MiB
/// (the node bounds request bodies); a larger one is refused, not written.
pub(crate) const MAX_RECORD_PAYLOAD_BYTES: usize = 64 * 1024 * 1024;

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// An openraft entry, MessagePack ([`crate::codec`]); carries its log id.
    Entry = 1,
    /// `Option<Vote>`: the vote as of this record.
    Vote = 2,
    /// `Option<LogId>`: the committed log id as of this record.
    Committed = 3,
    /// `Option<LogId>`: the last purged log id; entries at or below it are gone.
    Purged = 4,
    /// u64 LE: a log index; entries at or after it are gone.
    Truncate = 5,
}

impl Kind {
    fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            1 => Kind::Entry,
            2 => Kind::Vote,
            3 => Kind::Committed,
            4 => Kind::Purged,
            5 => Kind::Truncate,
            _ => return None,
        })
    }
}

/// A record's kind, and whether its payload starts with its shard id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag {
    pub(crate) kind: Kind,
    sharded: bool,
}

impl Tag {
    fn from_byte(byte: u8) -> Option<Self> {
        let kind = Kind::from_byte(byte & !SHARDED)?;
        Some(Self {
            kind,
            sharded: byte & SHARDED != 0,
        })
    }

    /// The shard and the rest of the payload.
    fn split(self, payload: &[u8]) -> Result<(ShardId, &[u8]), RecordError> {
        if !self.sharded {
            return Ok((0, payload));
        }
        let (shard, rest) = payload
            .split_first_chunk::<SHARD_BYTES>()
            .ok_or(RecordError::NoShard(payload.len()))?;
        Ok((ShardId::from_le_bytes(*shard), rest))
    }
}

/// A decoded record. Entries are decoded only as far as their log id at
/// recovery; readers decode the whole entry ([`decode_entry`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    Entry(LogId<NodeId>),
    Vote(Option<Vote<NodeId>>),
    Committed(Option<LogId<NodeId>>),
    Purged(Option<LogId<NodeId>>),
    Truncate(u64),
}

/// Why bytes are not a valid record.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordError {
    /// A zero header: the space the writer zero-fills ahead of its records
    /// (or a write that never reached the disk there).
    #[error("zero-filled space where the next record would start")]
    Unwritten,
    #[error("the record is cut short: {needed} bytes needed, {available} there")]
    Short { needed: usize, available: usize },
    #[error("payload length {len} is over the limit of {MAX_RECORD_PAYLOAD_BYTES} bytes")]
    TooLong { len: usize },
    #[error("CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
    #[error("unknown record kind {0}")]
    UnknownKind(u8),
    #[error("expected a record of kind {expected:?}, found {found:?}")]
    WrongKind { expected: Kind, found: Kind },
    #[error("undecodable payload: {0}")]
    Payload(#[from] CodecError),
    #[error("a truncate payload of {0} bytes, not 8")]
    TruncateLength(usize),
    #[error("a sharded record's payload of {0} bytes has no room for its shard id")]
    NoShard(usize),
}

/// The fixed-size front of a record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub(crate) payload_len: usize,
    crc: u32,
    kind_byte: u8,
}

impl Header {
    /// Reads a header; a length over the limit is damage.
    pub(crate) fn parse(bytes: &[u8; HEADER_BYTES]) -> Result<Self, RecordError> {
        let [l0, l1, l2, l3, c0, c1, c2, c3, kind_byte] = *bytes;
        let payload_len = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
        if payload_len > MAX_RECORD_PAYLOAD_BYTES {
            return Err(RecordError::TooLong { len: payload_len });
        }
        Ok(Self {
            payload_len,
            crc: u32::from_le_bytes([c0, c1, c2, c3]),
            kind_byte,
        })
    }

    /// Checks the CRC of `payload` and the kind; returns the kind.
    pub(crate) fn verify(&self, payload: &[u8]) -> Result<Tag, RecordError> {
        let computed = crc(self.kind_byte, payload);
        if computed != self.crc {
            return Err(RecordError::Crc {
                stored: self.crc,
                computed,
            });
        }
        Tag::from_byte(self.kind_byte).ok_or(RecordError::UnknownKind(self.kind_byte))
    }
}

fn crc(kind_byte: u8, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[kind_byte]);
    hasher.update(payload);
    hasher.finalize()
}

/// Appends one record of `kind` of `shard` to `out`, the rest of its payload
/// written by `write_payload`. On error `out` is left as it was.
fn push_record(
    out: &mut Vec<u8>,
    kind: Kind,
    shard: ShardId,
    write_payload: impl FnOnce(&mut Vec<u8>) -> Result<(), CodecError>,
) -> Result<(), StorageError> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    out.extend_from_slice(&shard.to_le_bytes());
    if let Err(error) = write_payload(out) {
        out.truncate(start);
        return Err(error.into());
    }
    let payload_len = out.len() - start - HEADER_BYTES;
    if payload_len > MAX_RECORD_PAYLOAD_BYTES {
        out.truncate(start);
        return Err(StorageError::RecordTooLarge {
            bytes: payload_len,
            max: MAX_RECORD_PAYLOAD_BYTES,
        });
    }
    let kind_byte = kind as u8 | SHARDED;
    let checksum = crc(kind_byte, &out[start + HEADER_BYTES..]);
    // Bounded by MAX_RECORD_PAYLOAD_BYTES just above: fits in a u32.
    let len = payload_len as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&checksum.to_le_bytes());
    out[start + 8] = kind_byte;
    Ok(())
}

pub(crate) fn push_entry(
    out: &mut Vec<u8>,
    shard: ShardId,
    entry: &Entry<TypeConfig>,
) -> Result<(), StorageError> {
    push_record(out, Kind::Entry, shard, |out| {
        codec::encode_into(out, entry)
    })
}

pub(crate) fn push_vote(
    out: &mut Vec<u8>,
    shard: ShardId,
    vote: &Option<Vote<NodeId>>,
) -> Result<(), StorageError> {
    push_record(out, Kind::Vote, shard, |out| codec::encode_into(out, vote))
}

pub(crate) fn push_committed(
    out: &mut Vec<u8>,
    shard: ShardId,
    committed: &Option<LogId<NodeId>>,
) -> Result<(), StorageError> {
    push_record(out, Kind::Committed, shard, |out| {
        codec::encode_into(out, committed)
    })
}

pub(crate) fn push_purged(
    out: &mut Vec<u8>,
    shard: ShardId,
    purged: &Option<LogId<NodeId>>,
) -> Result<(), StorageError> {
    push_record(out, Kind::Purged, shard, |out| {
        codec::encode_into(out, purged)
    })
}

pub(crate) fn push_truncate(
    out: &mut Vec<u8>,
    shard: ShardId,
    index: u64,
) -> Result<(), StorageError> {
    push_record(out, Kind::Truncate, shard, |out| {
        out.extend_from_slice(&index.to_le_bytes());
        Ok(())
    })
}

/// Decodes a verified payload of `tag`: its shard and its record.
pub(crate) fn decode(tag: Tag, payload: &[u8]) -> Result<(ShardId, Record), RecordError> {
    let (shard, payload) = tag.split(payload)?;
    Ok((shard, decode_unsharded(tag.kind, payload)?))
}

fn decode_unsharded(kind: Kind, payload: &[u8]) -> Result<Record, RecordError> {
    Ok(match kind {
        Kind::Entry => Record::Entry(codec::decode::<Entry<TypeConfig>>(payload)?.log_id),
        Kind::Vote => Record::Vote(codec::decode(payload)?),
        Kind::Committed => Record::Committed(codec::decode(payload)?),
        Kind::Purged => Record::Purged(codec::decode(payload)?),
        Kind::Truncate => {
            let bytes: [u8; 8] = payload
                .try_into()
                .map_err(|_| RecordError::TruncateLength(payload.len()))?;
            Record::Truncate(u64::from_le_bytes(bytes))
        }
    })
}

/// Decodes one whole entry record (header and payload, as a reader reads it
/// back from its location), checking its length, CRC and kind; returns its
/// shard and the entry.
pub(crate) fn decode_entry(bytes: &[u8]) -> Result<(ShardId, Entry<TypeConfig>), RecordError> {
    let (header, payload) = split_record(bytes)?;
    let tag = header.verify(payload)?;
    if tag.kind != Kind::Entry {
        return Err(RecordError::WrongKind {
            expected: Kind::Entry,
            found: tag.kind,
        });
    }
    let (shard, payload) = tag.split(payload)?;
    Ok((shard, codec::decode(payload)?))
}

/// Splits exactly one record into its header and payload.
fn split_record(bytes: &[u8]) -> Result<(Header, &[u8]), RecordError> {
    let short = || RecordError::Short {
        needed: HEADER_BYTES,
        available: bytes.len(),
    };
    let (header, payload) = bytes
        .split_first_chunk::<HEADER_BYTES>()
        .ok_or_else(short)?;
    let header = Header::parse(header)?;
    if payload.len() != header.payload_len {
        return Err(RecordError::Short {
            needed: HEADER_BYTES + header.payload_len,
            available: bytes.len(),
        });
    }
    Ok((header, payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn log_id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    /// Parses every record in `bytes`, in order.
    fn parse_all(mut bytes: &[u8]) -> Vec<(ShardId, Record)> {
        let mut records = Vec::new();
        while !bytes.is_empty() {
            let (header, rest) = bytes.split_first_chunk::<HEADER_BYTES>().unwrap();
            let header = Header::parse(header).unwrap();
            let (payload, rest) = rest.split_at(header.payload_len);
            records.push(decode(header.verify(payload).unwrap(), payload).unwrap());
            bytes = rest;
        }
        records
    }

    #[test]
    fn every_kind_round_trips() {
        let entry: Entry<TypeConfig> = Entry {
            log_id: log_id(2, 7),
            payload: EntryPayload::Blank,
        };
        let vote = Some(Vote::new_committed(3, 1));
        let mut bytes = Vec::new();
        push_entry(&mut bytes, 3, &entry).unwrap();
        let entry_end = bytes.len();
        push_vote(&mut bytes, 0, &vote).unwrap();
        push_vote(&mut bytes, 1, &None).unwrap();
        push_committed(&mut bytes, 2, &Some(log_id(2, 5))).unwrap();
        push_purged(&mut bytes, 0, &None).unwrap();
        push_truncate(&mut bytes, ShardId::MAX, 42).unwrap();
        assert_eq!(
            parse_all(&bytes),
            vec![
                (3, Record::Entry(log_id(2, 7))),
                (0, Record::Vote(vote)),
                (1, Record::Vote(None)),
                (2, Record::Committed(Some(log_id(2, 5)))),
                (0, Record::Purged(None)),
                (ShardId::MAX, Record::Truncate(42)),
            ]
        );
        assert_eq!(decode_entry(&bytes[..entry_end]).unwrap(), (3, entry));
    }

    /// A record as format 4 wrote it: the kind byte without [`SHARDED`], the
    /// payload without a shard id.
    fn format_4_record(kind: Kind, payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc(kind as u8, payload).to_le_bytes());
        bytes.push(kind as u8);
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn a_record_of_format_4_belongs_to_shard_0() {
        let entry: Entry<TypeConfig> = Entry {
            log_id: log_id(2, 7),
            payload: EntryPayload::Blank,
        };
        let mut bytes = format_4_record(Kind::Entry, &codec::encode(&entry).unwrap());
        let entry_end = bytes.len();
        bytes.extend(format_4_record(Kind::Truncate, &9u64.to_le_bytes()));
        let vote = Some(Vote::new_committed(3, 1));
        bytes.extend(format_4_record(Kind::Vote, &codec::encode(&vote).unwrap()));
        assert_eq!(
            parse_all(&bytes),
            vec![
                (0, Record::Entry(log_id(2, 7))),
                (0, Record::Truncate(9)),
                (0, Record::Vote(vote)),
            ]
        );
        assert_eq!(decode_entry(&bytes[..entry_end]).unwrap(), (0, entry));
    }

    #[test]
    fn a_sharded_record_too_short_for_its_shard_id_is_refused() {
        let mut bytes = Vec::new();
        let kind_byte = Kind::Truncate as u8 | SHARDED;
        bytes.extend_from_slice(&2u32.to_le_bytes());
        bytes.extend_from_slice(&crc(kind_byte, &[1, 2]).to_le_bytes());
        bytes.push(kind_byte);
        bytes.extend_from_slice(&[1, 2]);
        let (header, payload) = split_record(&bytes).unwrap();
        let tag = header.verify(payload).unwrap();
        assert!(matches!(decode(tag, payload), Err(RecordError::NoShard(2))));
    }

    #[test]
    fn a_flipped_bit_fails_the_crc() {
        let mut bytes = Vec::new();
        push_truncate(&mut bytes, 5, 42).unwrap();
        for position in 4..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[position] ^= 0x10;
            let (header, payload) = split_record(&damaged).unwrap();
            let verified = header.verify(payload);
            assert!(
                matches!(verified, Err(RecordError::Crc { .. })),
                "flip at {position}: {verified:?}"
            );
        }
    }

    #[test]
    fn zeros_and_huge_lengths_are_not_records() {
        let zeros = [0u8; HEADER_BYTES];
        let header = Header::parse(&zeros).unwrap();
        assert!(header.verify(&[]).is_err(), "a zero-filled tail passes");
        let mut huge = [0u8; HEADER_BYTES];
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Header::parse(&huge),
            Err(RecordError::TooLong { .. })
        ));
    }

    #[test]
    fn an_entry_record_of_another_kind_or_length_is_refused() {
        let mut bytes = Vec::new();
        push_truncate(&mut bytes, 0, 1).unwrap();
        assert!(matches!(
            decode_entry(&bytes),
            Err(RecordError::WrongKind { .. })
        ));
        assert!(matches!(
            decode_entry(&bytes[..bytes.len() - 1]),
            Err(RecordError::Short { .. })
        ));
    }
}
