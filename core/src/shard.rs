//! A key's shard: which of the cluster's S Raft groups holds a key.
//!
//! `shard(key) = jump_consistent_hash(mix64(fnv1a_64(key's UTF-8 bytes)), S)`
//! (docs/scaling.md, "A key's shard"). Why these functions:
//! - the clients route without asking, so the function is written again in
//!   TypeScript and Python, with no library: FNV-1a and jump hash are a dozen
//!   lines each, and their answers are fixed by their definitions. `std`'s
//!   `DefaultHasher` is not: its output may change between Rust releases;
//! - FNV-1a alone leaves the hashes of keys that differ only in their last
//!   bytes correlated, and jump hash passes that on: for the keys
//!   `"/h-qc0"`…`"/h-qc9999"`, growing from 264 to 265 shards moved 78 keys
//!   where 38 are expected. MurmurHash3's 64-bit finalizer ([`mix64`]) in
//!   between makes every input bit flip each output bit with probability
//!   about one half: 39 keys moved. It is five lines in every language too;
//! - jump consistent hash (Lamping and Veach, 2014) moves only `1/S'` of the
//!   keys when S grows to S', and a key that moves goes to a new shard, never
//!   from one old shard to another.
//!
//! The three implementations are held to the same vectors,
//! `core/tests/fixtures/shard_vectors.json`; a change to either function here
//! moves keys between shards of a running cluster.

/// Most shards a cluster may hold.
pub const MAX_SHARDS: u32 = 1024;

/// FNV-1a's 64-bit offset basis.
const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a's 64-bit prime.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// MurmurHash3's `fmix64` multipliers.
const MIX_MULTIPLIER_1: u64 = 0xff51_afd7_ed55_8ccd;
const MIX_MULTIPLIER_2: u64 = 0xc4ce_b9fe_1a85_ec53;
/// The multiplier of jump hash's linear congruential generator (the paper's).
const JUMP_MULTIPLIER: u64 = 2_862_933_555_777_941_757;
/// 2^31, as jump hash divides it in floating point.
const JUMP_SCALE: f64 = (1u64 << 31) as f64;

/// A shard count outside `1..=MAX_SHARDS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the shard count is {shards}; it must be between 1 and {MAX_SHARDS}")]
pub struct ShardCountOutOfRange {
    pub shards: u32,
}

/// The shard of `key` among `shards` shards, in `0..shards`.
pub fn shard_of(key: &str, shards: u32) -> Result<u32, ShardCountOutOfRange> {
    if !(1..=MAX_SHARDS).contains(&shards) {
        return Err(ShardCountOutOfRange { shards });
    }
    Ok(jump_hash(mix64(fnv1a_64(key.as_bytes())), shards))
}

/// MurmurHash3's 64-bit finalizer (`fmix64`): xor-shifts and two multiplies
/// (wrapping) that spread every input bit over the whole output.
pub fn mix64(mut key: u64) -> u64 {
    key ^= key >> 33;
    key = key.wrapping_mul(MIX_MULTIPLIER_1);
    key ^= key >> 33;
    key = key.wrapping_mul(MIX_MULTIPLIER_2);
    key ^ (key >> 33)
}

/// FNV-1a, 64 bits: for each byte, xor it in, then multiply by the prime
/// (wrapping).
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME)
    })
}

/// Jump consistent hash: the bucket of `key` among `buckets`, in
/// `0..buckets`, or 0 when `buckets` is 0.
///
/// A linear congruential generator seeded by the key draws the next bucket
/// index at which the key would jump; the last jump below `buckets` is its
/// bucket. The division is in `f64`, as the paper states it, so that every
/// implementation (TypeScript's and Python's included) computes the same.
pub fn jump_hash(mut key: u64, buckets: u32) -> u32 {
    let buckets = u64::from(buckets);
    let mut bucket = 0u64;
    let mut next = 0u64;
    while next < buckets {
        bucket = next;
        key = key.wrapping_mul(JUMP_MULTIPLIER).wrapping_add(1);
        next = next_jump(bucket, key);
    }
    // `bucket < buckets <= u32::MAX`.
    bucket as u32
}

/// The bucket a key in `bucket` jumps to next: `(b + 1) * 2^31 / ((key >> 33) + 1)`,
/// in `f64`, truncated. At most `2^31 * (b + 1)`, so no `u64` overflow for any `b < 2^32`.
fn next_jump(bucket: u64, key: u64) -> u64 {
    let draw = ((key >> 33) + 1) as f64;
    ((bucket + 1) as f64 * (JUMP_SCALE / draw)) as u64
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn fnv1a_64_matches_the_published_vectors() {
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// MurmurHash3's `fmix64` of these inputs, computed apart from this code.
    #[test]
    fn mix64_matches_murmur3s_finalizer() {
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0xb456_bcfc_34c2_cb2c);
        assert_eq!(mix64(0xdead_beef), 0xd24b_d59f_862a_1dac);
        assert_eq!(mix64(0xcbf2_9ce4_8422_2325), 0xefd0_1f60_ba99_2926);
    }

    /// The values other implementations of the paper's function give
    /// (ClickHouse's `jumpConsistentHash` tests, among others).
    #[test]
    fn jump_hash_matches_other_implementations() {
        assert_eq!(jump_hash(1, 1), 0);
        assert_eq!(jump_hash(42, 57), 43);
        assert_eq!(jump_hash(256, 1024), 520);
        assert_eq!(jump_hash(0xdead_10cc, 1), 0);
        assert_eq!(jump_hash(0xdead_10cc, 666), 361);
        assert_eq!(jump_hash(16_045_690_984_833_335_023, 255), 237);
    }

    #[test]
    fn one_shard_holds_every_key() {
        for key in ["", "account-7", "日本語キー"] {
            assert_eq!(shard_of(key, 1), Ok(0));
        }
    }

    #[test]
    fn a_shard_count_outside_its_range_is_refused() {
        for shards in [0, MAX_SHARDS + 1, u32::MAX] {
            assert_eq!(
                shard_of("account-7", shards),
                Err(ShardCountOutOfRange { shards })
            );
        }
        assert!(shard_of("account-7", MAX_SHARDS).is_ok());
        assert_eq!(
            ShardCountOutOfRange { shards: 0 }.to_string(),
            "the shard count is 0; it must be between 1 and 1024"
        );
    }

    #[test]
    fn the_key_is_hashed_as_its_utf8_bytes() {
        let key = "café";
        assert_eq!(key.len(), 5);
        assert_eq!(
            shard_of(key, 64),
            Ok(jump_hash(mix64(fnv1a_64("caf\u{e9}".as_bytes())), 64))
        );
    }

    /// Keys `"{prefix}{i}"` for `i` in `0..count`.
    fn keys(prefix: &str, count: usize) -> impl Iterator<Item = String> + '_ {
        (0..count).map(move |i| format!("{prefix}{i}"))
    }

    proptest! {
        #[test]
        fn a_key_lands_below_the_shard_count(key in ".{0,64}", shards in 1..=MAX_SHARDS) {
            let shard = shard_of(&key, shards).unwrap();
            prop_assert!(shard < shards);
        }

        /// Jump hash's monotonicity: one more shard takes keys from every old
        /// shard and gives none back.
        #[test]
        fn a_new_shard_only_takes_keys(key in ".{0,64}", shards in 1..MAX_SHARDS) {
            let before = shard_of(&key, shards).unwrap();
            let after = shard_of(&key, shards + 1).unwrap();
            prop_assert!(after == before || after == shards, "{before} -> {after} of {}", shards + 1);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Growing from S to S+1 shards moves about 1/(S+1) of the keys: within
        /// six standard deviations of the binomial count, among 10,000 keys.
        #[test]
        fn one_more_shard_moves_its_share_of_keys(prefix in "[a-z/-]{0,12}", shards in 1..MAX_SHARDS) {
            const KEYS: usize = 10_000;
            let moved = keys(&prefix, KEYS)
                .filter(|key| shard_of(key, shards).unwrap() != shard_of(key, shards + 1).unwrap())
                .count();
            let share = 1.0 / f64::from(shards + 1);
            let expected = KEYS as f64 * share;
            let deviation = (KEYS as f64 * share * (1.0 - share)).sqrt();
            prop_assert!(
                (moved as f64 - expected).abs() <= 6.0 * deviation + 1.0,
                "{moved} of {KEYS} keys moved from {shards} to {} shards; expected about {expected:.0}",
                shards + 1
            );
        }
    }
}
