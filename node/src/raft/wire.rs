//! The bodies of Raft RPCs on the wire: every request and answer in the storage
//! codec ([`permitd_storage::codec`], MessagePack), and a snapshot chunk's data
//! as one raw byte string (openraft's request type would send it as a list of
//! numbers).

use openraft::raft::InstallSnapshotRequest;
use openraft::{SnapshotMeta, Vote};
use permitd_storage::{NodeId, PeerNode, TypeConfig};
use serde::{Deserialize, Serialize};

/// [`InstallSnapshotRequest`] with its data as a byte string.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotChunk {
    vote: Vote<NodeId>,
    meta: SnapshotMeta<NodeId, PeerNode>,
    offset: u64,
    #[serde(with = "raw_bytes")]
    data: Vec<u8>,
    done: bool,
}

impl From<InstallSnapshotRequest<TypeConfig>> for SnapshotChunk {
    fn from(request: InstallSnapshotRequest<TypeConfig>) -> Self {
        Self {
            vote: request.vote,
            meta: request.meta,
            offset: request.offset,
            data: request.data,
            done: request.done,
        }
    }
}

impl From<SnapshotChunk> for InstallSnapshotRequest<TypeConfig> {
    fn from(chunk: SnapshotChunk) -> Self {
        Self {
            vote: chunk.vote,
            meta: chunk.meta,
            offset: chunk.offset,
            data: chunk.data,
            done: chunk.done,
        }
    }
}

/// `Vec<u8>` as a serde byte string.
mod raw_bytes {
    use serde::de::{Error, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(data: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(data)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_byte_buf(BytesVisitor)
    }

    struct BytesVisitor;

    impl<'de> Visitor<'de> for BytesVisitor {
        type Value = Vec<u8>;

        fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
            formatter.write_str("a byte string")
        }

        fn visit_bytes<E: Error>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
            Ok(bytes.to_vec())
        }

        fn visit_byte_buf<E: Error>(self, bytes: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(bytes)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
            while let Some(byte) = seq.next_element()? {
                bytes.push(byte);
            }
            Ok(bytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use permitd_storage::codec;

    #[test]
    fn snapshot_data_travels_as_raw_bytes() {
        let request = InstallSnapshotRequest::<TypeConfig> {
            vote: Vote::new(3, 1),
            meta: SnapshotMeta::default(),
            offset: 0,
            data: vec![0xff; 4_096],
            done: true,
        };
        let bytes = codec::encode(&SnapshotChunk::from(request.clone())).unwrap();
        assert!(bytes.len() < 4_096 + 256, "{} bytes", bytes.len());
        let back: SnapshotChunk = codec::decode(&bytes).unwrap();
        assert_eq!(InstallSnapshotRequest::from(back), request);
    }
}
