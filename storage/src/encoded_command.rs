//! A log entry's command together with the bytes it encodes to.
//!
//! # Why
//!
//! A command used to be encoded and decoded again at every step of its way:
//! the leader encoded it for its own write-ahead log and once more for every
//! follower's append; each follower decoded the append, then encoded the same
//! command again for its own log; and every node decoded it once more from its
//! log to apply it. A profile of the contended bench (docs/scaling.md, "Where
//! an entry's CPU goes") put 29 % of a follower's CPU in that re-encoding.
//!
//! So the entry's payload is an [`EncodedCommand`]: the leader encodes the
//! command once, when it is proposed, and from then on the command travels and
//! is logged as those bytes. Serialising one writes them as a MessagePack byte
//! string (a copy, no encoding); deserialising one decodes the command from
//! the byte string and keeps the bytes, so a follower logs exactly what the
//! leader logged. Both halves sit behind an `Arc`: cloning an entry (the
//! log's cache of recent entries hands out clones) copies two pointers.
//!
//! # Format
//!
//! Inside an entry, the payload of `Normal` is a byte string holding the
//! command's MessagePack (storage format 5). Format 4 held the command's map
//! itself; a map is still read (a log written by format 4, or an append from
//! a peer that runs it), and encoded once on arrival.

use std::sync::Arc;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::codec::{self, CodecError};
use crate::Command;

/// A command, decoded, and the MessagePack bytes it was encoded to.
#[derive(Clone, PartialEq)]
pub struct EncodedCommand {
    command: Arc<Command>,
    bytes: Arc<[u8]>,
}

impl EncodedCommand {
    /// Encodes `command`, once: the bytes are what every log and every peer gets.
    pub fn new(command: Command) -> Result<Self, CodecError> {
        let bytes = codec::encode(&command)?;
        Ok(Self {
            command: Arc::new(command),
            bytes: bytes.into(),
        })
    }

    /// Decodes a command from the bytes a leader encoded it to, keeping them.
    pub fn decode(bytes: &[u8]) -> Result<Self, CodecError> {
        let command = codec::decode(bytes)?;
        Ok(Self {
            command: Arc::new(command),
            bytes: bytes.into(),
        })
    }

    /// The command's MessagePack encoding.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl std::ops::Deref for EncodedCommand {
    type Target = Command;

    fn deref(&self) -> &Command {
        &self.command
    }
}

impl std::fmt::Debug for EncodedCommand {
    /// The command; the bytes say nothing more.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.command.fmt(f)
    }
}

impl Serialize for EncodedCommand {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.bytes)
    }
}

impl<'de> Deserialize<'de> for EncodedCommand {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(EncodedOrMap)
    }
}

/// Takes the byte string of format 5, or the map of format 4.
struct EncodedOrMap;

impl<'de> Visitor<'de> for EncodedOrMap {
    type Value = EncodedCommand;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a command's MessagePack as a byte string, or a command's map")
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<EncodedCommand, E> {
        EncodedCommand::decode(bytes).map_err(E::custom)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<EncodedCommand, A::Error> {
        let command = Command::deserialize(de::value::MapAccessDeserializer::new(map))?;
        EncodedCommand::new(command).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

    use super::*;
    use crate::{KeyRound, TypeConfig};

    fn round() -> Command {
        Command::Round {
            now_ms: 1_700_000_000_123,
            syncs: Vec::new(),
            keys: vec![KeyRound {
                key: "account-7".into(),
                requests: vec![crate::command_decode::tests::a_request()],
            }],
        }
    }

    fn entry(payload: EntryPayload<TypeConfig>) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 1), 42),
            payload,
        }
    }

    #[test]
    fn an_entry_carries_the_command_bytes_as_they_were_encoded() {
        let command = EncodedCommand::new(round()).unwrap();
        let bytes = codec::encode(&entry(EntryPayload::Normal(command.clone()))).unwrap();
        let inner = command.bytes();
        assert!(
            bytes.windows(inner.len()).any(|window| window == inner),
            "the entry holds the command's bytes verbatim"
        );
        let back: Entry<TypeConfig> = codec::decode(&bytes).unwrap();
        let EntryPayload::Normal(decoded) = back.payload else {
            panic!("a normal entry stays normal");
        };
        assert_eq!(*decoded, round());
        assert_eq!(decoded.bytes(), inner);
        // And encoding it again gives the same bytes: a follower logs what the
        // leader logged.
        assert_eq!(
            codec::encode(&entry(EntryPayload::Normal(decoded))).unwrap(),
            bytes
        );
    }

    /// An entry as format 4 wrote it: the command's map in place of the bytes.
    #[derive(Serialize)]
    struct Format4Entry {
        log_id: LogId<crate::NodeId>,
        payload: Format4Payload,
    }

    #[derive(Serialize)]
    enum Format4Payload {
        Normal(Command),
    }

    #[test]
    fn an_entry_of_format_4_still_decodes() {
        let old = Format4Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 1), 42),
            payload: Format4Payload::Normal(round()),
        };
        let bytes = codec::encode(&old).unwrap();
        let back: Entry<TypeConfig> = codec::decode(&bytes).unwrap();
        assert_eq!(back.log_id, old.log_id);
        let EntryPayload::Normal(decoded) = back.payload else {
            panic!("a normal entry stays normal");
        };
        assert_eq!(*decoded, round());
        assert_eq!(decoded.bytes(), codec::encode(&round()).unwrap());
    }

    #[test]
    fn bytes_that_are_no_command_are_refused() {
        assert!(EncodedCommand::decode(b"\xc1garbage").is_err());
        let not_a_command = codec::encode(&serde_bytes_of(b"\x93\x01\x02\x03")).unwrap();
        assert!(codec::decode::<EncodedCommand>(&not_a_command).is_err());
    }

    /// `bytes` as a MessagePack byte string.
    fn serde_bytes_of(bytes: &'static [u8]) -> impl Serialize {
        struct Raw(&'static [u8]);
        impl Serialize for Raw {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_bytes(self.0)
            }
        }
        Raw(bytes)
    }
}
