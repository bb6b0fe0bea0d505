/**
 * A key's shard: which of the cluster's S Raft groups holds a key, computed by
 * the client so it can route without asking.
 *
 * `shard(key) = jumpConsistentHash(mix64(fnv1a64(key's UTF-8 bytes)), S)`, the same
 * function as the Rust `permitd_core::shard_of` and the Python `shard_of`, held
 * to the same vectors (`core/tests/fixtures/shard_vectors.json`). The 64-bit
 * arithmetic is in `BigInt`; jump hash's division is in `number` (IEEE double),
 * as the paper states it, so every implementation computes the same.
 */

/** Most shards a cluster may hold. */
export const MAX_SHARDS = 1024;

const MASK_64 = (1n << 64n) - 1n;
const FNV_OFFSET_BASIS = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;
/** MurmurHash3's `fmix64` multipliers. */
const MIX_MULTIPLIER_1 = 0xff51afd7ed558ccdn;
const MIX_MULTIPLIER_2 = 0xc4ceb9fe1a85ec53n;
/** The multiplier of jump hash's linear congruential generator (the paper's). */
const JUMP_MULTIPLIER = 2862933555777941757n;
const JUMP_SCALE = 2 ** 31;

const utf8 = new TextEncoder();

/**
 * The shard of `key` among `shards` shards, in `[0, shards)`. Throws a
 * `RangeError` unless `shards` is an integer in `[1, MAX_SHARDS]`.
 */
export function shardOf(key: string, shards: number): number {
  if (!Number.isInteger(shards) || shards < 1 || shards > MAX_SHARDS) {
    throw new RangeError(`the shard count is ${shards}; it must be an integer between 1 and ${MAX_SHARDS}`);
  }
  return jumpHash(mix64(fnv1a64(utf8.encode(key))), shards);
}

/** MurmurHash3's 64-bit finalizer (`fmix64`): spreads every input bit over the whole output. */
export function mix64(key: bigint): bigint {
  let value = key & MASK_64;
  value ^= value >> 33n;
  value = (value * MIX_MULTIPLIER_1) & MASK_64;
  value ^= value >> 33n;
  value = (value * MIX_MULTIPLIER_2) & MASK_64;
  return value ^ (value >> 33n);
}

/** FNV-1a, 64 bits: for each byte, xor it in, then multiply by the prime (mod 2^64). */
export function fnv1a64(bytes: Uint8Array): bigint {
  let hash = FNV_OFFSET_BASIS;
  for (const byte of bytes) {
    hash = ((hash ^ BigInt(byte)) * FNV_PRIME) & MASK_64;
  }
  return hash;
}

/**
 * Jump consistent hash (Lamping and Veach, 2014): the bucket of the 64-bit
 * `key` among `buckets` (an integer >= 1), in `[0, buckets)`.
 */
export function jumpHash(key: bigint, buckets: number): number {
  let state = key & MASK_64;
  let bucket = 0;
  let next = 0;
  while (next < buckets) {
    bucket = next;
    state = (state * JUMP_MULTIPLIER + 1n) & MASK_64;
    // `(state >> 33) + 1` is at most 2^31: exact as a number.
    next = Math.floor((bucket + 1) * (JUMP_SCALE / (Number(state >> 33n) + 1)));
  }
  return bucket;
}
