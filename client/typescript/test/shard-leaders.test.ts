/**
 * Routing by shard, without a cluster: the table of shard leaders (counting,
 * learning, forgetting), the shard headers, the key of a call's path, and the
 * leader tracker sending each key's calls to its shard's leader. The same
 * cases as the Rust client's `shard_leaders.rs` and `leader.rs` tests.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { keyOfPath, LeaderTracker, MAX_SHARDS, parseShardHint, shardOf, ShardLeaders, type ShardHint } from "../src/index.js";

test("the table counts one shard until told otherwise and ignores counts outside the protocol's range", () => {
  const table = new ShardLeaders();
  assert.equal(table.count(), 1);
  assert.equal(table.shardOf("any key"), 0);
  for (const bad of [0, -1, 2.5, MAX_SHARDS + 1, Number.MAX_SAFE_INTEGER]) assert.equal(table.learnCount(bad), false, String(bad));
  assert.equal(table.count(), 1);
  assert.ok(table.learnCount(MAX_SHARDS));
  assert.equal(table.count(), MAX_SHARDS);
  assert.ok(table.learnCount(3));
  assert.equal(table.learnCount(3), false, "the same count changes nothing");
  for (const key of ["a", "acct-1", "acct/7 b", ""]) assert.equal(table.shardOf(key), shardOf(key, 3), key);
});

test("the table learns, replaces and forgets leaders per shard, and a new count forgets them all", () => {
  const table = new ShardLeaders();
  table.learnCount(3);
  table.set(1, { nodeId: 2 });
  table.set(2, { index: 0 });
  table.set(3, { nodeId: 9 }); // no shard 3 of 3
  assert.deepEqual([0, 1, 2, 3].map((shard) => table.leader(shard)), [undefined, { nodeId: 2 }, { index: 0 }, undefined]);
  table.set(1, { nodeId: 3 });
  assert.deepEqual(table.leader(1), { nodeId: 3 });
  table.forget(1);
  assert.deepEqual(table.known(), [{ index: 0 }]);
  table.set(0, { nodeId: 1 });
  table.forgetWhere((leader) => "index" in leader);
  assert.deepEqual(table.known(), [{ nodeId: 1 }]);
  assert.ok(table.learnCount(5));
  assert.deepEqual(table.known(), []);
  table.set(4, { nodeId: 2 });
  table.learnCount(5_000);
  assert.deepEqual(table.leader(4), { nodeId: 2 }, "an ignored count keeps what is known");
});

test("shard headers read as a hint, and a call's key is the segment after /v1/semaphores", () => {
  assert.equal(parseShardHint(null, null), undefined);
  assert.deepEqual(parseShardHint("2", null), { shard: 2, shards: 1 });
  assert.deepEqual(parseShardHint("2", " 3 "), { shard: 2, shards: 3 });
  assert.deepEqual(parseShardHint(null, "3"), { shards: 3 });
  assert.equal(parseShardHint("2", "many"), undefined);
  assert.equal(keyOfPath(["v1", "semaphores", "acct/7"]), "acct/7");
  assert.equal(keyOfPath(["v1", "semaphores", "k", "groups", "g"]), "k");
  for (const keyless of [["v1", "semaphores"], ["v1", "batch"], ["v1", "tokens", "3"], ["cluster", "status"]]) {
    assert.equal(keyOfPath(keyless), undefined, keyless.join("/"));
  }
});

const [n1, n2, n3] = ["http://n1:1", "http://n2:2", "http://n3:3"] as const;
const of = (shard: number, shards: number): ShardHint => ({ shard, shards });

/** A tracker over nodes 1, 2 and 3 with their ids known, and a key of each of 3 shards. */
function threeNodes(): { tracker: LeaderTracker; keys: string[] } {
  const tracker = new LeaderTracker([n1, n2, n3]);
  [n1, n2, n3].forEach((endpoint, index) => tracker.learnNodeId(endpoint, index + 1));
  const keys = [0, 1, 2].map((shard) => {
    for (let n = 0; ; n++) if (shardOf(`key-${n}`, 3) === shard) return `key-${n}`;
  });
  return { tracker, keys };
}

test("each shard is asked at its own leader, and only the meta shard moves the keyless leader", () => {
  const { tracker, keys } = threeNodes();
  const [k0, k1, k2] = keys as [string, string, string];
  assert.equal(tracker.shardCount(), 1);
  tracker.answeredFor(n1, { nodeId: 2 }, of(1, 3));
  tracker.answeredFor(n3, { nodeId: 3 }, of(2, 3));
  assert.equal(tracker.shardCount(), 3);
  assert.equal(tracker.pickFor(k1), n2);
  assert.equal(tracker.pickFor(k2), n3);
  assert.equal(tracker.leader(), n1, "the first node that answered, while the meta shard's leader is unknown");
  assert.equal(tracker.pickFor(k0), n1);
  tracker.answeredFor(n1, { nodeId: 3 }, of(0, 3));
  assert.equal(tracker.pick(), n3);
  assert.equal(tracker.pickFor(undefined), n3);
  assert.equal(tracker.pickFor(k0), n3);
  tracker.answeredFor(n2, { nodeId: 2 }, of(1, 3));
  assert.equal(tracker.pick(), n3, "another shard's answer leaves the keyless leader");
  assert.equal(tracker.leaderOfKey(k2), n3);
});

test("one-shard answers, answers without shard headers and answers covering every shard work as before shards", () => {
  const { tracker, keys } = threeNodes();
  const [k0, k1] = keys as [string, string];
  tracker.answeredFor(n3, { nodeId: 2 }, of(0, 1));
  assert.equal(tracker.shardCount(), 1);
  assert.equal(tracker.pick(), n2);
  assert.equal(tracker.pickFor(k1), n2);
  tracker.answeredFor(n3, { nodeId: 3 }, undefined);
  assert.equal(tracker.pick(), n3);
  tracker.answeredFor(n1, undefined, { shards: 3 });
  assert.equal(tracker.shardCount(), 3);
  assert.equal(tracker.leaderOfKey(k0), undefined);
  assert.equal(tracker.pickFor(k0), n1, "the node that answered is asked first");
});

test("a new count forgets the shard leaders, and a count above MAX_SHARDS is ignored", () => {
  const { tracker, keys } = threeNodes();
  const k1 = keys[1]!;
  tracker.answeredFor(n1, { nodeId: 2 }, of(1, 3));
  assert.equal(tracker.leaderOfKey(k1), n2);
  tracker.answeredFor(n1, { nodeId: 1 }, of(7, MAX_SHARDS + 1));
  assert.equal(tracker.shardCount(), 3);
  assert.equal(tracker.leaderOfKey(k1), n2);
  tracker.answeredFor(n1, { nodeId: 1 }, of(0, 4));
  assert.equal(tracker.shardCount(), 4);
  assert.equal(tracker.leaderOfKey(k1) !== undefined, shardOf(k1, 4) === 0);
});

test("a shard leader named by an unknown id waits for node-id discovery", () => {
  const tracker = new LeaderTracker([n1, n2]);
  let key = "";
  for (let n = 0; shardOf(key, 2) !== 1; n++) key = `k${n}`;
  tracker.answeredFor(n1, { nodeId: 2 }, of(1, 2));
  assert.ok(tracker.wantsNodeIds());
  assert.equal(tracker.pickFor(key), n1);
  tracker.learnNodeId(n1, 1);
  assert.ok(tracker.wantsNodeIds(), "node 2 is still unknown");
  tracker.learnNodeId(n2, 2);
  assert.ok(!tracker.wantsNodeIds());
  assert.equal(tracker.pickFor(key), n2);
  assert.equal(tracker.pick(), n1, "shard 1 is not the meta shard");
});

test("a failing shard takes the leader it names or forgets its own; an unreachable node is forgotten everywhere", () => {
  const { tracker, keys } = threeNodes();
  const [k0, k1, k2] = keys as [string, string, string];
  tracker.answeredFor(n1, { nodeId: 1 }, of(0, 3));
  tracker.answeredFor(n2, { nodeId: 2 }, of(1, 3));
  tracker.answeredFor(n3, { nodeId: 3 }, of(2, 3));
  tracker.failedFor(n2, k1, { nodeId: 3 }, of(1, 3)); // not_leader naming node 3
  assert.equal(tracker.pickFor(k1), n3);
  assert.equal(tracker.pick(), n1, "the meta shard's leader stays");
  tracker.failedFor(n3, k2, { nodeId: 3 }, of(2, 3)); // leader_changed, naming itself
  assert.equal(tracker.leaderOfKey(k2), undefined);
  assert.equal(tracker.pickFor(k2), n1);
  assert.equal(tracker.pickFor(k1), n3, "shard 1 is another shard");
  tracker.failedFor(n1, k0, { nodeId: 2 }, of(0, 3));
  assert.equal(tracker.pick(), n2, "a meta shard failure naming node 2 moves the keyless leader");

  const other = threeNodes();
  const [o0, o1, o2] = other.keys as [string, string, string];
  other.tracker.answeredFor(n1, { nodeId: 1 }, of(0, 3));
  other.tracker.answeredFor(n1, { nodeId: 2 }, of(1, 3));
  other.tracker.answeredFor(n1, { nodeId: 2 }, of(2, 3));
  other.tracker.failedFor(n2, o1, undefined, undefined); // no answer at all
  assert.equal(other.tracker.leaderOfKey(o1), undefined);
  assert.equal(other.tracker.leaderOfKey(o2), undefined);
  assert.equal(other.tracker.leaderOfKey(o0), n1);
  other.tracker.failedFor(n1, o0, undefined, undefined);
  assert.equal(other.tracker.leader(), undefined);
  assert.equal(other.tracker.pickFor(o0), n2);
});
