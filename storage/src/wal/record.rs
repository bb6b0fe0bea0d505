//! One write-ahead log record: framing, CRC, and the typed payloads.
//!
//! ```text
//! +-------------+---------------+----------+-------------------+
//! | len: u32 LE | crc32: u32 LE | kind: u8 | payload: len bytes |
//! +-------------+---------------+----------+-------------------+
//! ```
//!
//! - `len` counts the payload only; a record takes [`HEADER_BYTES`] + `len` bytes.
//! - `crc32` (IEEE, crc32fast) covers `kind` and the payload, so a record whose
//!   header survived but whose body was torn, or whose kind byte flipped, fails.
//! - `kind` is one of [`Kind`]; 0 is never a kind, so a zero-filled tail (a file
//!   extended but never written) cannot pass as a record (nor can its CRC: the
//!   CRC of a zero kind byte is not zero).
//! - `len` over [`MAX_RECORD_PAYLOAD_BYTES`] is refused when writing and is
//!   damage when reading, so a corrupt length never makes us allocate 4 GiB.

use openraft::{Entry, LogId, Vote};

use crate::codec::{self, CodecError};
use crate::{NodeId, StorageError, TypeConfig};

/// Bytes before the payload: `len`, `crc32`, `kind`.
pub(crate) const HEADER_BYTES: usize = 4 + 4 + 1;

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
    pub(crate) fn verify(&self, payload: &[u8]) -> Result<Kind, RecordError> {
        let computed = crc(self.kind_byte, payload);
        if computed != self.crc {
            return Err(RecordError::Crc {
                stored: self.crc,
                computed,
            });
        }
        Kind::from_byte(self.kind_byte).ok_or(RecordError::UnknownKind(self.kind_byte))
    }
}

fn crc(kind_byte: u8, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[kind_byte]);
    hasher.update(payload);
    hasher.finalize()
}

/// Appends one record of `kind` to `out`, its payload written by `write_payload`.
/// On error `out` is left as it was.
fn push_record(
    out: &mut Vec<u8>,
    kind: Kind,
    write_payload: impl FnOnce(&mut Vec<u8>) -> Result<(), CodecError>,
) -> Result<(), StorageError> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
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
    let checksum = crc(kind as u8, &out[start + HEADER_BYTES..]);
    // Bounded by MAX_RECORD_PAYLOAD_BYTES just above: fits in a u32.
    let len = payload_len as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&checksum.to_le_bytes());
    out[start + 8] = kind as u8;
    Ok(())
}

pub(crate) fn push_entry(out: &mut Vec<u8>, entry: &Entry<TypeConfig>) -> Result<(), StorageError> {
    push_record(out, Kind::Entry, |out| codec::encode_into(out, entry))
}

pub(crate) fn push_vote(
    out: &mut Vec<u8>,
    vote: &Option<Vote<NodeId>>,
) -> Result<(), StorageError> {
    push_record(out, Kind::Vote, |out| codec::encode_into(out, vote))
}

pub(crate) fn push_committed(
    out: &mut Vec<u8>,
    committed: &Option<LogId<NodeId>>,
) -> Result<(), StorageError> {
    push_record(out, Kind::Committed, |out| {
        codec::encode_into(out, committed)
    })
}

pub(crate) fn push_purged(
    out: &mut Vec<u8>,
    purged: &Option<LogId<NodeId>>,
) -> Result<(), StorageError> {
    push_record(out, Kind::Purged, |out| codec::encode_into(out, purged))
}

pub(crate) fn push_truncate(out: &mut Vec<u8>, index: u64) -> Result<(), StorageError> {
    push_record(out, Kind::Truncate, |out| {
        out.extend_from_slice(&index.to_le_bytes());
        Ok(())
    })
}

/// Decodes a verified payload of `kind`.
pub(crate) fn decode(kind: Kind, payload: &[u8]) -> Result<Record, RecordError> {
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
/// back from its location), checking its length, CRC and kind.
pub(crate) fn decode_entry(bytes: &[u8]) -> Result<Entry<TypeConfig>, RecordError> {
    let (header, payload) = split_record(bytes)?;
    match header.verify(payload)? {
        Kind::Entry => Ok(codec::decode(payload)?),
        found => Err(RecordError::WrongKind {
            expected: Kind::Entry,
            found,
        }),
    }
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
    fn parse_all(mut bytes: &[u8]) -> Vec<Record> {
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
        push_entry(&mut bytes, &entry).unwrap();
        let entry_end = bytes.len();
        push_vote(&mut bytes, &vote).unwrap();
        push_vote(&mut bytes, &None).unwrap();
        push_committed(&mut bytes, &Some(log_id(2, 5))).unwrap();
        push_purged(&mut bytes, &None).unwrap();
        push_truncate(&mut bytes, 42).unwrap();
        assert_eq!(
            parse_all(&bytes),
            vec![
                Record::Entry(log_id(2, 7)),
                Record::Vote(vote),
                Record::Vote(None),
                Record::Committed(Some(log_id(2, 5))),
                Record::Purged(None),
                Record::Truncate(42),
            ]
        );
        assert_eq!(decode_entry(&bytes[..entry_end]).unwrap(), entry);
    }

    #[test]
    fn a_flipped_bit_fails_the_crc() {
        let mut bytes = Vec::new();
        push_truncate(&mut bytes, 42).unwrap();
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
        push_truncate(&mut bytes, 1).unwrap();
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
