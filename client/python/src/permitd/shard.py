"""A key's shard: which of the cluster's S Raft groups holds a key, computed by
the client so it can route without asking.

``shard(key) = jump_consistent_hash(mix64(fnv1a_64(key's UTF-8 bytes)), S)``, the same
function as the Rust ``permitd_core::shard_of`` and the TypeScript ``shardOf``,
held to the same vectors (``core/tests/fixtures/shard_vectors.json``). Python's
integers are unbounded, so every 64-bit step is masked; jump hash's division is
in ``float`` (IEEE double), as the paper states it, so every implementation
computes the same.
"""

from __future__ import annotations

#: Most shards a cluster may hold.
MAX_SHARDS = 1024

_MASK_64 = (1 << 64) - 1
_FNV_OFFSET_BASIS = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
#: MurmurHash3's ``fmix64`` multipliers.
_MIX_MULTIPLIER_1 = 0xFF51AFD7ED558CCD
_MIX_MULTIPLIER_2 = 0xC4CEB9FE1A85EC53
#: The multiplier of jump hash's linear congruential generator (the paper's).
_JUMP_MULTIPLIER = 2862933555777941757
_JUMP_SCALE = float(1 << 31)


def shard_of(key: str, shards: int) -> int:
    """The shard of ``key`` among ``shards`` shards, in ``range(shards)``.

    Raises ``ValueError`` unless ``shards`` is an ``int`` in ``1..MAX_SHARDS``
    (and ``UnicodeEncodeError``, a ``ValueError``, for a key holding a lone
    surrogate, which has no UTF-8 bytes).
    """
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"the shard count is {shards!r}; it must be an integer between 1 and {MAX_SHARDS}")
    return jump_hash(mix64(fnv1a_64(key.encode("utf-8"))), shards)


def mix64(key: int) -> int:
    """MurmurHash3's 64-bit finalizer (``fmix64``): spreads every input bit over the whole output."""
    key ^= key >> 33
    key = (key * _MIX_MULTIPLIER_1) & _MASK_64
    key ^= key >> 33
    key = (key * _MIX_MULTIPLIER_2) & _MASK_64
    return key ^ (key >> 33)


def fnv1a_64(data: bytes) -> int:
    """FNV-1a, 64 bits: for each byte, xor it in, then multiply by the prime (mod 2^64)."""
    value = _FNV_OFFSET_BASIS
    for byte in data:
        value = ((value ^ byte) * _FNV_PRIME) & _MASK_64
    return value


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping and Veach, 2014): the bucket of the 64-bit
    ``key`` among ``buckets`` (at least 1), in ``range(buckets)``."""
    state = key & _MASK_64
    bucket = 0
    jump = 0
    while jump < buckets:
        bucket = jump
        state = (state * _JUMP_MULTIPLIER + 1) & _MASK_64
        # ``(state >> 33) + 1`` is at most 2^31: exact as a float.
        jump = int((bucket + 1) * (_JUMP_SCALE / float((state >> 33) + 1)))
    return bucket
