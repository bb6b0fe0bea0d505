/**
 * The TypeScript client against a real three-node cluster of three shards
 * (see `harness.ts`). Once the shards' leaders settled (spread over their
 * preferred nodes, as the nodes hand shards over) and the client learned
 * them, every call about a key goes to its shard's leader:
 * - each answer names the node called as the leader (`x-permitd-leader`) of
 *   the key's shard (`x-permitd-shard`);
 * - each node's API counted exactly the keyed calls of the shards it leads
 *   (`permitd_http_requests_total`): a forwarded call counts on the node
 *   called and again on the leader.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { SemaphoreClient, shardOf, type ShardMap } from "../src/index.js";
import { ADMIN_TOKEN, Cluster, eventually } from "./harness.js";

const SHARDS = 3;
/** How long the shards' leaders are given to spread over their preferred nodes. */
const SPREAD_TIMEOUT_MS = 30_000;
/** How long the shards' leaders may take to settle, and the client to learn them. */
const SETTLE_TIMEOUT_MS = 60_000;
const auth = { authorization: `Bearer ${ADMIN_TOKEN}` };
let cluster: Cluster;

before(async () => {
  cluster = await Cluster.start({ shards: SHARDS });
});

after(async () => {
  await cluster?.stop();
});

/** Each shard's leader as every node names it (`/cluster/shards`) when all agree and every shard has one, else `undefined`; and whether each is its shard's preferred leader (`voters[shard mod N]`, docs/scaling.md). */
async function shardLeaders(): Promise<{ leaders: number[] | undefined; preferred: boolean }> {
  const maps: ShardMap[] = [];
  for (const url of cluster.urls()) {
    const answer = await fetch(`${url}/cluster/shards`, { headers: auth, signal: AbortSignal.timeout(2_000) });
    maps.push((await answer.json()) as ShardMap);
  }
  const first = maps[0]!.shards.map((shard) => shard.leader);
  const agreed = maps.every((map) => map.shards.map((shard) => shard.leader).join() === first.join());
  const complete = first.length === SHARDS && first.every((leader) => leader !== null);
  const preferred = maps[0]!.shards.every((shard) => shard.leader === shard.members[shard.shard % shard.members.length]);
  return { leaders: agreed && complete ? (first as number[]) : undefined, preferred };
}

/**
 * The shards' leaders once each shard is led by its preferred node (the node
 * hands shards over once the preferred node has caught up).
 */
async function settledShardLeaders(): Promise<number[]> {
  let spread: number[] | undefined;
  await eventually(
    SPREAD_TIMEOUT_MS,
    async () => {
      const now = await shardLeaders();
      spread = now.preferred ? now.leaders : undefined;
      return spread !== undefined;
    },
    "spread shard leaders",
  );
  return spread!;
}

/** Per node, the keyed calls (`/v1/semaphores/{key}…`) its API listener counted. */
async function keyedCallsServed(): Promise<number[]> {
  const served: number[] = [];
  for (const url of cluster.urls()) {
    const text = await (await fetch(`${url}/metrics`, { headers: auth })).text();
    const total = text
      .split("\n")
      .filter((line) => line.startsWith("permitd_http_requests_total{"))
      .filter((line) => line.includes('listener="api"') && line.includes('route="/v1/semaphores/{key}'))
      .reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(" ") + 1)), 0);
    served.push(total);
  }
  return served;
}

/** Keys `routed-N`, two of each shard, with their shard. */
function keysOfEachShard(): { key: string; shard: number }[] {
  const keys: { key: string; shard: number }[] = [];
  const taken = new Array<number>(SHARDS).fill(0);
  for (let n = 0; keys.length < 2 * SHARDS; n++) {
    const key = `routed-${n}`;
    const shard = shardOf(key, SHARDS);
    if (taken[shard]! < 2) {
      taken[shard]! += 1;
      keys.push({ key, shard });
    }
  }
  return keys;
}

/** One answer as the client's fetch saw it. */
interface Seen {
  url: string;
  leader: string | null;
  shard: string | null;
}

test("keyed calls go to their shard's leader without a forwarding hop", async (t) => {
  const seen: Seen[] = [];
  const recording: typeof fetch = async (input, init) => {
    const answer = await fetch(input, init);
    seen.push({ url: String(input), leader: answer.headers.get("x-permitd-leader"), shard: answer.headers.get("x-permitd-shard") });
    return answer;
  };
  const client = new SemaphoreClient({ endpoints: cluster.urls(), token: ADMIN_TOKEN, callTimeoutMs: 20_000, fetch: recording });
  const keys = keysOfEachShard();
  const urlOf = (id: number) => cluster.nodes.find((node) => node.id === id)!.url;
  const idOf = (url: string) => cluster.nodes.find((node) => url.startsWith(`${node.url}/`))!.id;

  // A leader that moves during the calls (a stalled machine's election)
  // sends some to another node: the calls are made again, up to this often.
  for (let attempt = 1; ; attempt++) {
    const leaders = await settledShardLeaders();
    if (new Set(leaders).size === 1) t.diagnostic(`the shards' leaders did not spread: node ${leaders[0]} leads every shard`);

    // Warm-up: the answers teach the client the count and each shard's
    // leader, and node-id discovery which endpoint each leader is.
    await eventually(
      SETTLE_TIMEOUT_MS,
      async () => {
        for (const { key } of keys) await client.usage(key);
        return keys.every(({ key, shard }) => client.leaderOfKey(key) === urlOf(leaders[shard]!));
      },
      `the client learning ${leaders}`,
    );
    assert.equal(client.shardCount(), SHARDS);
    // Calls naming no key follow the meta shard's leader.
    await client.call("GET", ["v1", "tokens"], undefined, undefined);
    assert.equal(client.leader(), urlOf(leaders[0]!));

    seen.length = 0;
    const before = await keyedCallsServed();
    const expected = cluster.nodes.map(() => 0);
    for (let round = 0; round < 3; round++) {
      for (const { key, shard } of keys) {
        const grant = await client.request(key, { clientId: "routed", demand: [{ group: "g", count: 1, oldestAt: 1 }] });
        assert.equal(grant.grants.length, 1, key);
        const { grantId, permits } = grant.grants[0]!;
        await client.sync(key, { clientId: "routed", grants: [{ grantId, claimed: permits, released: permits }] });
        assert.equal((await client.usage(key)).granted, 0, key);
        expected[cluster.nodes.findIndex((node) => node.id === leaders[shard])]! += 3;
      }
    }
    const after = await keyedCallsServed();
    const calls = seen.map((call) => ({ ...call }));
    const moved = (await shardLeaders()).leaders?.join() !== leaders.join();
    if (moved && attempt < 3) continue;

    assert.equal(calls.length, 3 * 3 * keys.length, "one attempt per call");
    for (const call of calls) {
      const key = decodeURIComponent(new URL(call.url).pathname.split("/")[3]!);
      assert.equal(call.shard, String(shardOf(key, SHARDS)), call.url);
      assert.equal(call.leader, String(idOf(call.url)), `${call.url} was answered by its shard's leader`);
    }
    const served = after.map((count, index) => count - before[index]!);
    assert.deepEqual(served, expected, `keyed calls each node served (shard leaders ${leaders})`);
    return;
  }
});
