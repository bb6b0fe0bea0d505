"""``shard_of`` against the Rust core: every vector of
``core/tests/fixtures/shard_vectors.json`` (written by the Rust implementation),
the published FNV-1a and jump hash values, and the shard count's range."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List

import pytest

from permitd import MAX_SHARDS, shard_of
from permitd.shard import fnv1a_64, jump_hash, mix64

REPOSITORY = Path(__file__).resolve().parents[3]
FIXTURE = REPOSITORY / "core" / "tests" / "fixtures" / "shard_vectors.json"


def vectors() -> List[Any]:
    value = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert isinstance(value, list)
    return value


def test_every_shard_vector_of_the_rust_core_holds() -> None:
    loaded = vectors()
    assert len(loaded) >= 40
    answers = [(v["key"], v["shards"], v["shard"], shard_of(v["key"], v["shards"])) for v in loaded]
    wrong = [answer for answer in answers if answer[2] != answer[3]]
    assert wrong == []
    assert any(len(v["key"].encode("utf-8")) == 256 for v in loaded)


def test_fnv1a_64_and_jump_hash_give_the_published_values() -> None:
    assert fnv1a_64(b"") == 0xCBF29CE484222325
    assert fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64(b"foobar") == 0x85944171F73967E8
    assert [jump_hash(1, 1), jump_hash(42, 57), jump_hash(256, 1024)] == [0, 43, 520]
    assert [jump_hash(0xDEAD10CC, 666), jump_hash(16045690984833335023, 255)] == [361, 237]


def test_mix64_is_murmur3s_finalizer() -> None:
    assert [mix64(0), mix64(1)] == [0, 0xB456BCFC34C2CB2C]
    assert mix64(0xDEADBEEF) == 0xD24BD59F862A1DAC
    assert mix64(0xCBF29CE484222325) == 0xEFD01F60BA992926


@pytest.mark.parametrize("shards", [0, -1, MAX_SHARDS + 1, 2**64])
def test_a_shard_count_outside_its_range_is_a_value_error(shards: int) -> None:
    with pytest.raises(ValueError, match="shard count"):
        shard_of("account-7", shards)


def test_a_shard_count_must_be_an_int() -> None:
    for shards in [True, 2.0, "2"]:
        with pytest.raises(ValueError, match="shard count"):
            shard_of("account-7", shards)  # type: ignore[arg-type]
    assert MAX_SHARDS == 1024
    assert shard_of("account-7", 1) == 0
    assert 0 <= shard_of("account-7", MAX_SHARDS) < MAX_SHARDS


def test_one_more_shard_only_takes_keys_about_its_share() -> None:
    keys = [f"key-{i}" for i in range(2_000)]
    for shards in [1, 2, 7, 63, 1023]:
        moved = 0
        for key in keys:
            before, after = shard_of(key, shards), shard_of(key, shards + 1)
            assert after in (before, shards), (key, before, after)
            moved += after != before
        share = 1 / (shards + 1)
        deviation = (len(keys) * share * (1 - share)) ** 0.5
        assert abs(moved - len(keys) * share) <= 6 * deviation + 1, (shards, moved)
