/**
 * `shardOf` against the Rust core: every vector of
 * `core/tests/fixtures/shard_vectors.json` (written by the Rust implementation),
 * the published FNV-1a and jump hash values, and the shard count's range.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { fnv1a64, jumpHash, MAX_SHARDS, mix64, shardOf } from "../src/index.js";

interface ShardVector {
  key: string;
  shards: number;
  shard: number;
}

// Compiled to build/test/: the repository root is four folders up.
const fixture = resolve(dirname(fileURLToPath(import.meta.url)), "../../../../core/tests/fixtures/shard_vectors.json");
const vectors = JSON.parse(readFileSync(fixture, "utf8")) as ShardVector[];

test("every shard vector of the Rust core holds", () => {
  assert.ok(vectors.length >= 40, `only ${vectors.length} vectors`);
  const wrong = vectors
    .map((vector) => ({ ...vector, got: shardOf(vector.key, vector.shards) }))
    .filter(({ shard, got }) => shard !== got);
  assert.deepEqual(wrong, []);
  assert.ok(vectors.some(({ key }) => new TextEncoder().encode(key).length === 256));
});

test("mix64 is MurmurHash3's 64-bit finalizer", () => {
  assert.equal(mix64(0n), 0n);
  assert.equal(mix64(1n), 0xb456bcfc34c2cb2cn);
  assert.equal(mix64(0xdeadbeefn), 0xd24bd59f862a1dacn);
  assert.equal(mix64(0xcbf29ce484222325n), 0xefd01f60ba992926n);
});

test("fnv1a64 and jumpHash give the published values", () => {
  assert.equal(fnv1a64(new Uint8Array()), 0xcbf29ce484222325n);
  assert.equal(fnv1a64(new TextEncoder().encode("a")), 0xaf63dc4c8601ec8cn);
  assert.equal(fnv1a64(new TextEncoder().encode("foobar")), 0x85944171f73967e8n);
  assert.equal(jumpHash(1n, 1), 0);
  assert.equal(jumpHash(42n, 57), 43);
  assert.equal(jumpHash(256n, 1024), 520);
  assert.equal(jumpHash(0xdead10ccn, 666), 361);
  assert.equal(jumpHash(16045690984833335023n, 255), 237);
});

test("a shard count outside 1..MAX_SHARDS is a RangeError", () => {
  assert.equal(MAX_SHARDS, 1024);
  for (const shards of [0, -1, 1.5, MAX_SHARDS + 1, Number.NaN, Number.POSITIVE_INFINITY]) {
    assert.throws(() => shardOf("account-7", shards), RangeError, String(shards));
  }
  assert.equal(shardOf("account-7", 1), 0);
  assert.ok(shardOf("account-7", MAX_SHARDS) < MAX_SHARDS);
});

test("one more shard only takes keys, about 1/(S+1) of them", () => {
  for (const shards of [1, 2, 7, 63, 1023]) {
    let moved = 0;
    for (let i = 0; i < 2_000; i++) {
      const before = shardOf(`key-${i}`, shards);
      const after = shardOf(`key-${i}`, shards + 1);
      assert.ok(after === before || after === shards, `key-${i}: ${before} -> ${after}`);
      if (after !== before) moved++;
    }
    const share = 1 / (shards + 1);
    const deviation = Math.sqrt(2_000 * share * (1 - share));
    assert.ok(Math.abs(moved - 2_000 * share) <= 6 * deviation + 1, `${moved} of 2000 moved at ${shards}`);
  }
});
