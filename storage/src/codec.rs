//! The one binary encoding of everything a node writes to disk or sends a peer:
//! the payloads of the write-ahead log's records (entries, the vote, the
//! committed and purged log ids), snapshots and Raft RPC bodies.
//!
//! MessagePack (rmp-serde), with structs as maps of their field names. Not
//! postcard or bincode: those formats are not self-describing, and the command
//! payload and the snapshot's state reuse the v1 API's types, which are defined once
//! for JSON and use serde features that need a self-describing format (fields
//! left out by `skip_serializing_if`, internally tagged and untagged enums). A
//! second, binary-only definition of those types would drift from the API's.
//! MessagePack keeps them as they are while dropping JSON's text: ids are 16
//! raw bytes, numbers are binary, snapshot data travels as raw bytes rather
//! than an array of numbers. Field names stay in the encoding, so an entry or a
//! snapshot written by this build stays readable when a later build adds an
//! optional field.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("cannot encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    #[error("cannot decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
}

/// The media type of encoded Raft RPC bodies.
pub const CONTENT_TYPE: &str = "application/msgpack";

/// Encodes `value`.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(rmp_serde::to_vec_named(value)?)
}

/// Encodes `value` into `writer` as it goes: no buffer of the whole value
/// (a snapshot of 100,000 keys is tens of MiB).
pub fn encode_into<W: std::io::Write, T: Serialize + ?Sized>(
    writer: &mut W,
    value: &T,
) -> Result<(), CodecError> {
    Ok(rmp_serde::encode::write_named(writer, value)?)
}

/// Decodes a `T` from `bytes`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    Ok(rmp_serde::from_slice(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, EncodedCommand, KeyRound, TypeConfig};
    use openraft::{Entry, EntryPayload, LogId};

    #[test]
    fn a_round_entry_round_trips_and_is_smaller_than_json() {
        let request = crate::command_decode::tests::a_request();
        let entry: Entry<TypeConfig> = Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(3, 1), 42),
            payload: EntryPayload::Normal(
                EncodedCommand::new(Command::Round {
                    now_ms: 1_700_000_000_123,
                    syncs: Vec::new(),
                    keys: vec![KeyRound {
                        key: "account-7".into(),
                        requests: vec![request],
                    }],
                })
                .unwrap(),
            ),
        };
        let bytes = encode(&entry).unwrap();
        let back: Entry<TypeConfig> = decode(&bytes).unwrap();
        assert_eq!(back.log_id, entry.log_id);
        assert_eq!(
            serde_json::to_vec(&back.payload).unwrap(),
            serde_json::to_vec(&entry.payload).unwrap()
        );
        assert!(bytes.len() < serde_json::to_vec(&entry).unwrap().len());
        assert!(decode::<Entry<TypeConfig>>(b"\xc1garbage").is_err());
    }
}
