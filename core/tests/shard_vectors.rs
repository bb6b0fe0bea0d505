//! The shard vectors, `core/tests/fixtures/shard_vectors.json`: the answers
//! every implementation of a key's shard (this crate's, the TypeScript and the
//! Python client's) must give. Each vector is `{"key", "shards", "shard"}`.
//!
//! The file was written by `write_the_vectors` (ignored: it writes to the
//! target dir, and a person compares and copies) and a few of its values
//! checked by hand against a separate computation; this test keeps the
//! implementation to it.

use std::collections::BTreeSet;

use permitd_core::shard_of;
use serde::{Deserialize, Serialize};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/shard_vectors.json"
);

/// The shard counts the vectors cover: the edges, small counts, powers of two.
const SHARD_COUNTS: [u32; 7] = [1, 2, 3, 8, 16, 64, 1024];

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Vector {
    key: String,
    shards: u32,
    shard: u32,
}

/// The keys the vectors cover: empty, ASCII, non-ASCII UTF-8 of two, three and
/// four bytes a character, and the longest key the service accepts (256 bytes),
/// in ASCII and in two-byte characters.
fn keys() -> Vec<String> {
    vec![
        String::new(),
        "account-7".into(),
        "tenant-42/workflow-9".into(),
        "café".into(),
        "日本語キー".into(),
        "🦀 jobs".into(),
        "0123456789abcdef".repeat(16),
        "é".repeat(128),
    ]
}

fn fixture() -> Vec<Vector> {
    let text = std::fs::read_to_string(FIXTURE).expect("the shard vectors are readable");
    serde_json::from_str(&text).expect("the shard vectors parse")
}

#[test]
fn every_vector_holds() {
    let vectors = fixture();
    assert!(vectors.len() >= 40, "only {} vectors", vectors.len());
    let wrong: Vec<String> = vectors
        .iter()
        .filter_map(|vector| {
            let shard = shard_of(&vector.key, vector.shards).expect("a valid shard count");
            (shard != vector.shard).then(|| format!("{vector:?} gives {shard}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_vectors_cover_every_key_and_shard_count() {
    let vectors = fixture();
    let pairs: BTreeSet<(&str, u32)> = vectors
        .iter()
        .map(|vector| (vector.key.as_str(), vector.shards))
        .collect();
    let keys = keys();
    for key in &keys {
        for shards in SHARD_COUNTS {
            assert!(
                pairs.contains(&(key.as_str(), shards)),
                "no vector for {key:?} in {shards} shards"
            );
        }
    }
    assert!(keys.iter().any(|key| key.len() == 256));
}

/// Writes the vectors this implementation gives, one per line, to the target
/// dir: `cargo test -p permitd-core --test shard_vectors -- --ignored`.
#[test]
#[ignore = "writes a candidate fixture; compare it before copying it over the fixture"]
fn write_the_vectors() {
    let lines: Vec<String> = keys()
        .into_iter()
        .flat_map(|key| {
            SHARD_COUNTS.map(|shards| {
                let shard = shard_of(&key, shards).expect("a valid shard count");
                let vector = Vector {
                    key: key.clone(),
                    shards,
                    shard,
                };
                serde_json::to_string(&vector).expect("a vector serialises")
            })
        })
        .collect();
    let text = format!("[\n  {}\n]\n", lines.join(",\n  "));
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("shard_vectors.json");
    std::fs::write(&path, text).expect("the target dir is writable");
    println!("wrote {}", path.display());
}
