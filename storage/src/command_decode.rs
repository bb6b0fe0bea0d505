//! Decoding a [`crate::Command`] without serde's buffering of internally tagged
//! enums.
//!
//! A command is written as one map whose first entry is its `op` (serde's
//! internally tagged form: the tag goes first). serde's derived decoder for
//! that form cannot know where the tag is, so it first copies the whole map
//! into a tree of its own (every string and number boxed), then decodes the
//! variant from the copy. Every entry is decoded several times (each node
//! decodes it off the wire or back from its log for each follower and for
//! apply), and that copy made a round entry of the contended bench (~3.6 KB)
//! cost 38 µs to decode against 14 µs for the same fields read straight.
//!
//! [`commands!`] takes the enum's one definition and also generates, per
//! variant, a private struct of its fields (same names, types and serde
//! attributes, so it decodes what the variant encodes, unknown fields ignored
//! as before). The decoder reads the `op`, then the rest of the map straight
//! into that variant's struct. The format does not change; a map whose first
//! field is not `op` (written by no version of permitd) is refused.

/// Defines the command enum, with `Serialize` derived as written and
/// `Deserialize` by the fast decoder described in the module docs.
macro_rules! commands {
    (
        $(#[$enum_attr:meta])*
        pub enum $name:ident {
            $(
                $(#[$variant_attr:meta])*
                $variant:ident { $( $(#[$field_attr:meta])* $field:ident : $ty:ty ),* $(,)? }
            ),* $(,)?
        }
    ) => {
        $(#[$enum_attr])*
        pub enum $name {
            $(
                $(#[$variant_attr])*
                $variant { $( $(#[$field_attr])* $field: $ty ),* }
            ),*
        }

        /// Each variant's fields, decoded straight from the rest of its map.
        #[allow(non_snake_case)]
        mod variant_fields {
            use super::*;
            $(
                #[derive(serde::Deserialize)]
                #[serde(rename_all = "camelCase")]
                pub(super) struct $variant { $( $(#[$field_attr])* pub(super) $field: $ty ),* }
            )*
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_map(OpFirstVisitor)
            }
        }

        /// Reads `op`, then the variant's fields from the rest of the map.
        struct OpFirstVisitor;

        impl<'de> serde::de::Visitor<'de> for OpFirstVisitor {
            type Value = $name;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a command: a map whose first field is `op`")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<$name, A::Error> {
                use serde::de::Error;
                let first: Option<std::borrow::Cow<'de, str>> = map.next_key()?;
                if first.as_deref() != Some("op") {
                    return Err(A::Error::custom("a command's first field must be `op`"));
                }
                let op: std::borrow::Cow<'de, str> = map.next_value()?;
                let rest = serde::de::value::MapAccessDeserializer::new(map);
                $(
                    if $crate::command_decode::names(&op, stringify!($variant)) {
                        let fields = <variant_fields::$variant as serde::Deserialize>::deserialize(rest)?;
                        return Ok($name::$variant { $( $field: fields.$field ),* });
                    }
                )*
                const OPS: &[&str] = &[$(stringify!($variant)),*];
                Err(A::Error::unknown_variant(&op, OPS))
            }
        }
    };
}

pub(crate) use commands;

/// Whether `op` is the camelCase name of `variant` (`setKeyConfig` for
/// `SetKeyConfig`), as the enum's `rename_all = "camelCase"` writes it.
pub(crate) fn names(op: &str, variant: &str) -> bool {
    let (mut op_chars, mut variant_chars) = (op.chars(), variant.chars());
    match (op_chars.next(), variant_chars.next()) {
        (Some(o), Some(v)) => o == v.to_ascii_lowercase() && op_chars.eq(variant_chars),
        _ => false,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use permitd_core::config::{GroupConfig, KeyConfig, KeyConfigUpdate};
    use permitd_core::contract::protocol::{Demand, PermitRequest, PermitSync, V1};
    use permitd_core::engine::restore::Backup;
    use permitd_core::tokens::{Role, TokenSpec};
    use serde::Serialize;

    use super::names;
    use crate::codec::{decode, encode};
    use crate::{Command, KeyRound, KeySync};

    fn sync(client: &str) -> PermitSync {
        PermitSync {
            v: V1,
            client_id: client.into(),
            ..PermitSync::default()
        }
    }

    /// A request with every field a round entry carries.
    pub(crate) fn a_request() -> PermitRequest {
        PermitRequest {
            v: V1,
            client_id: "worker-1".into(),
            request_id: Some("r-1".into()),
            demand: vec![Demand {
                group: "g".into(),
                count: 2,
                oldest_at_ms: 1_700_000_000_000,
            }],
            grants: Vec::new(),
            leases: None,
            wait_ms: Some(250),
        }
    }

    /// One command of every kind, with every field set to something.
    fn every_kind() -> Vec<Command> {
        vec![
            Command::Round {
                now_ms: 1,
                syncs: vec![KeySync {
                    key: "k".into(),
                    sync: sync("worker-2"),
                }],
                keys: vec![KeyRound {
                    key: "k".into(),
                    requests: vec![a_request()],
                }],
            },
            Command::Round {
                now_ms: 2,
                syncs: Vec::new(),
                keys: Vec::new(),
            },
            Command::Sync {
                now_ms: 3,
                key: "k".into(),
                sync: sync("worker-3"),
            },
            Command::Reclaim {
                now_ms: 4,
                keys: vec!["a".into(), "b".into()],
            },
            Command::SetKeyConfig {
                key: "k".into(),
                update: KeyConfigUpdate::default(),
            },
            Command::SetGroup {
                key: "k".into(),
                group: "g".into(),
                config: GroupConfig::default(),
            },
            Command::RemoveGroup {
                key: "k".into(),
                group: "g".into(),
            },
            Command::SetDefaults {
                defaults: KeyConfig::default(),
            },
            Command::RemoveKey { key: "k".into() },
            Command::CreateToken {
                now_ms: 5,
                hash: "h".into(),
                spec: TokenSpec {
                    name: "runner".into(),
                    role: Role::Runner,
                    keys: vec!["k*".into()],
                    client_ids: vec!["w*".into()],
                },
            },
            Command::RevokeToken { id: 7 },
            Command::ForceRelease {
                now_ms: 6,
                key: "k".into(),
                client_id: "worker-1".into(),
            },
            Command::DeleteKey {
                now_ms: 7,
                key: "k".into(),
                force: true,
                request_id: Some("delete-1".into()),
            },
            Command::DeleteKey {
                now_ms: 8,
                key: "k".into(),
                force: false,
                request_id: None,
            },
            Command::Restore {
                backup: Backup {
                    defaults: KeyConfig::default(),
                    last_now_ms: 8,
                    keys: BTreeMap::new(),
                },
            },
        ]
    }

    #[test]
    fn every_kind_of_command_decodes_to_what_was_encoded() {
        for command in every_kind() {
            let bytes = encode(&command).expect("encodes");
            let decoded: Command = decode(&bytes).expect("decodes");
            assert_eq!(decoded, command);
            // The same through JSON, which keeps the fields in written order.
            let text = serde_json::to_string(&command).expect("JSON");
            assert!(text.starts_with(r#"{"op":"#), "{text}");
            let from_json: Command = serde_json::from_str(&text).expect("from JSON");
            assert_eq!(from_json, command);
        }
    }

    /// A map written field by field, in the given order.
    fn map_of(fields: &[(&str, serde_json::Value)]) -> Vec<u8> {
        struct Ordered<'a>(&'a [(&'a str, serde_json::Value)]);
        impl Serialize for Ordered<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut map = serializer.serialize_map(Some(self.0.len()))?;
                for (key, value) in self.0 {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
        encode(&Ordered(fields)).expect("encodes")
    }

    #[test]
    fn fields_a_later_version_added_are_ignored_and_defaults_fill_in() {
        let bytes = map_of(&[
            ("op", "round".into()),
            ("nowMs", 9.into()),
            ("keys", serde_json::json!([])),
            ("addedLater", true.into()),
        ]);
        let decoded: Command = decode(&bytes).expect("decodes");
        assert_eq!(
            decoded,
            Command::Round {
                now_ms: 9,
                syncs: Vec::new(),
                keys: Vec::new()
            }
        );
    }

    #[test]
    fn a_map_without_op_first_or_with_an_unknown_op_is_refused() {
        let op_later = map_of(&[("key", "k".into()), ("op", "removeKey".into())]);
        let error = decode::<Command>(&op_later).unwrap_err().to_string();
        assert!(error.contains("first field must be `op`"), "{error}");
        let unknown = map_of(&[("op", "launchRockets".into())]);
        let error = decode::<Command>(&unknown).unwrap_err().to_string();
        assert!(error.contains("launchRockets"), "{error}");
        let missing = map_of(&[("op", "removeKey".into())]);
        assert!(decode::<Command>(&missing).is_err(), "a field is missing");
    }

    #[test]
    fn an_op_names_its_variant_in_camel_case_only() {
        assert!(names("round", "Round"));
        assert!(names("setKeyConfig", "SetKeyConfig"));
        assert!(!names("SetKeyConfig", "SetKeyConfig"));
        assert!(!names("setkeyconfig", "SetKeyConfig"));
        assert!(!names("set", "SetKeyConfig"));
        assert!(!names("", "Round"));
    }
}
