/**
 * `POST /v1/batch` through the TypeScript client against a real three-node
 * cluster (see `harness.ts`):
 * - `batch` through a follower: good and bad items answered alone, in order;
 *   a request's requestId replays; the leader handled the items;
 * - the queue: items of several keys admitted, every sync in batch calls (a
 *   poll's releases of several keys in one), every request alone, counted by a
 *   fetch wrapper;
 * - a runner token whose patterns allow only some keys and client ids: item
 *   403s for the others, its neighbours answered; a queue under it admits the
 *   allowed key's items.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { RejectedError, SemaphoreClient, SemaphoreQueue, type Admission, type BatchResult, type SemaphoreRequest } from "../src/index.js";
import { ADMIN_TOKEN, Cluster, eventually } from "./harness.js";

const WAIT_MS = 30_000;
let cluster: Cluster;

before(async () => {
  cluster = await Cluster.start();
});

after(async () => {
  await cluster?.stop();
});

/** A fetch that records every call's URL and JSON body before passing it on. */
function countingFetch(): { fetch: typeof fetch; calls: { url: string; body: unknown }[] } {
  const calls: { url: string; body: unknown }[] = [];
  const counting: typeof fetch = (input, init) => {
    calls.push({ url: String(input), body: typeof init?.body === "string" ? JSON.parse(init.body) : undefined });
    return globalThis.fetch(input, init);
  };
  return { fetch: counting, calls };
}

function client(endpoints: string[] = cluster.urls(), token = ADMIN_TOKEN, fetch?: typeof globalThis.fetch): SemaphoreClient {
  return new SemaphoreClient({ endpoints, token, fetch, callTimeoutMs: 20_000 });
}

/** The sum of a Prometheus counter's series on one node (0 while absent). */
async function metric(url: string, name: string, labels = ""): Promise<number> {
  const text = await (await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).text();
  return text
    .split("\n")
    .filter((line) => line.startsWith(name) && line.includes(labels))
    .reduce((sum, line) => sum + Number(line.split(" ").pop()), 0);
}

const granted = (result: BatchResult | undefined) =>
  result?.ok && result.answer.type === "grant" ? result.answer.grants.reduce((sum, grant) => sum + grant.permits, 0) : -1;
const status = (result: BatchResult) => (result.ok ? 200 : result.error.status);

async function drained(admin: SemaphoreClient, keys: string[]): Promise<void> {
  await eventually(WAIT_MS, async () => (await Promise.all(keys.map((key) => admin.usage(key)))).every((usage) => usage.granted === 0 && usage.leased === 0), `${keys.join(", ")} drained`);
}

test("a batch through a follower answers each item alone, and a requestId replays", async () => {
  const leader = await cluster.waitForLeader();
  const follower = cluster.other(leader).url;
  const leaderUrl = cluster.nodes.find((node) => node.id === leader)!.url;
  const itemsBefore = await metric(leaderUrl, "permitd_batch_items_total");
  const counting = countingFetch();
  const viaFollower = client([follower], ADMIN_TOKEN, counting.fetch);
  const now = Date.now();
  const items = [
    { key: "tsb-1", message: { type: "request" as const, clientId: "tsb", requestId: "tsb-r-1", demand: [{ group: "g", count: 1, oldestAt: now }] } },
    { key: "tsb-2", message: { type: "request" as const, clientId: "tsb", demand: [{ group: "g", count: 2, oldestAt: now }] } },
    { key: "tsb-1", message: { type: "sync" as const, clientId: "tsb" } },
    { key: "tsb-3", message: { type: "request" as const, clientId: "tsb", demand: [{ group: "g", count: 2_000_000_000, oldestAt: now }] } },
    { key: "", message: { type: "sync" as const, clientId: "tsb" } },
  ];
  const results = await viaFollower.batch(items);
  assert.ok(counting.calls[0]!.url.startsWith(follower), "the call went to the follower");
  assert.deepEqual(results.map(status), [200, 200, 200, 400, 400]);
  assert.equal(granted(results[0]), 1);
  assert.equal(granted(results[1]), 2);
  assert.equal(results[2]!.ok && results[2]!.answer.type, "synced");
  const [tooMany, noKey] = [results[3]!, results[4]!];
  assert.ok(!tooMany.ok && tooMany.error instanceof RejectedError && tooMany.error.field === "demand.count", JSON.stringify(tooMany));
  assert.ok(!noKey.ok && noKey.error.code === "bad_request" && noKey.error.field === "key", JSON.stringify(noKey));
  assert.ok(viaFollower.nextRequestAt("tsb-1")! > 0, "nextRequestAt remembered from the grant");
  const admin = client();
  assert.equal((await admin.keys()).keys.some((key) => key.key === "tsb-3"), false, "the bad items changed nothing");
  // The same items again: the request with a requestId replays its grant; the one without is a new request.
  const again = await viaFollower.batch(items);
  assert.deepEqual(again[0], results[0], "replayed");
  assert.equal((await admin.usage("tsb-1")).granted, 1, "not granted twice");
  assert.equal((await admin.usage("tsb-2")).granted, 4, "a new requestId each call");
  // The leader handled both calls' items; the follower only forwarded.
  await eventually(WAIT_MS, async () => (await metric(leaderUrl, "permitd_batch_items_total")) >= itemsBefore + 2 * items.length, "the leader counted the items");
  assert.equal(await metric(follower, "permitd_batch_items_total"), 0);
  // Give everything back, in one batch.
  const grantsOf = (result: BatchResult | undefined) => (result?.ok && result.answer.type === "grant" ? result.answer.grants : []);
  const release = (key: string, grants: { grantId: string; permits: number }[]) => ({
    key,
    message: { type: "sync" as const, clientId: "tsb", grants: grants.map((grant) => ({ grantId: grant.grantId, claimed: grant.permits, released: grant.permits })) },
  });
  const releases = await admin.batch([release("tsb-1", grantsOf(results[0])), release("tsb-2", [...grantsOf(results[1]), ...grantsOf(again[1])])]);
  assert.deepEqual(releases.map(status), [200, 200]);
  await drained(admin, ["tsb-1", "tsb-2"]);
});

test("the queue sends every sync in batch calls, several keys' releases in one, and each request alone", async () => {
  const admin = client();
  const keys = ["tsq-1", "tsq-2", "tsq-3"];
  for (const key of keys) await admin.setKeyConfig(key, { limit: 2, leases: null });
  const counting = countingFetch();
  const admitted = new Set<string>();
  const admission: Admission<number> = { admit: (items) => items.forEach((item) => admitted.add(item.id)), finished: () => [] };
  const queue = await SemaphoreQueue.start<number>(client(cluster.urls(), ADMIN_TOKEN, counting.fetch), { clientId: "tsq-runner" }, admission);
  const ids = keys.flatMap((key) => [`${key}-a`, `${key}-b`]);
  await queue.enqueue(ids.map((id) => ({ id, key: id.slice(0, 5), group: "wf", body: 0 })));
  await eventually(WAIT_MS, async () => admitted.size === ids.length, "every item admitted");
  // All at once: the next poll reports every key's releases, in one batch call.
  for (const id of ids) assert.equal(queue.release(id), "released");
  await drained(admin, keys);
  await queue.shutdown();

  const posts = counting.calls.filter((call) => call.body !== undefined);
  const batches = posts.filter((call) => call.url.endsWith("/v1/batch")).map((call) => (call.body as { items: { key: string; message: SemaphoreRequest }[] }).items);
  const single = posts.filter((call) => call.url.includes("/v1/semaphores/")).map((call) => call.body as SemaphoreRequest);
  assert.ok(single.length >= keys.length && single.every((message) => message.type === "request"), "each key's demand in its own request call, no sync alone");
  assert.ok(batches.flat().every((item) => item.message.type === "sync"), "batch calls carry syncs only");
  const releasing = batches.filter((items) => items.some((item) => item.message.grants?.some((grant) => grant.released > 0)));
  assert.ok(
    releasing.some((items) => new Set(items.map((item) => item.key)).size === keys.length),
    `one batch call carried the releases of all ${keys.length} keys: ${JSON.stringify(releasing.map((items) => items.map((item) => item.key)))}`,
  );
});

test("a runner token allowed some keys gets item 403s for the others, and its queue admits what it may", async () => {
  const admin = client();
  const created = await fetch(`${cluster.urls()[0]}/v1/tokens`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${ADMIN_TOKEN}` },
    body: JSON.stringify({ name: "ts-runner", role: "runner", keys: ["tsr-ok-*"], clientIds: ["tsr-*"] }),
  });
  assert.equal(created.status, 201, await created.clone().text());
  const { token } = (await created.json()) as { token: string };
  const runner = client(cluster.urls(), token);
  const demand = [{ group: "g", count: 1, oldestAt: Date.now() }];
  // A new token reaches every node with its log entry: retry until this node knows it.
  let results: BatchResult[] = [];
  await eventually(
    WAIT_MS,
    async () => {
      results = await runner.batch([
        { key: "tsr-ok-1", message: { type: "request", clientId: "tsr-1", requestId: "tsr-r-1", demand } },
        { key: "tsr-other", message: { type: "request", clientId: "tsr-1", demand } },
        { key: "tsr-ok-1", message: { type: "sync", clientId: "someone-else" } },
        { key: "tsr-ok-2", message: { type: "sync", clientId: "tsr-2" } },
      ]);
      return true;
    },
    "the runner token accepted",
  );
  assert.deepEqual(results.map(status), [200, 403, 403, 200]);
  assert.equal(granted(results[0]), 1);
  assert.ok(!results[1]!.ok && results[1]!.error.code === "forbidden");
  assert.equal((await admin.keys()).keys.some((key) => key.key === "tsr-other"), false, "a refused item changes nothing");
  const grant = results[0]!.ok && results[0]!.answer.type === "grant" ? results[0]!.answer.grants[0]! : undefined;
  const [released] = await runner.batch([{ key: "tsr-ok-1", message: { type: "sync", clientId: "tsr-1", grants: [{ grantId: grant!.grantId, claimed: 1, released: 1 }] } }]);
  assert.ok(released?.ok);

  // A queue under the token: the allowed key's items are admitted; the other key's requests are refused and reported.
  const errors: unknown[] = [];
  const admitted = new Set<string>();
  const admission: Admission<number> = { admit: (items) => items.forEach((item) => admitted.add(item.id)), finished: () => [] };
  const queue = await SemaphoreQueue.start<number>(runner, { clientId: "tsr-queue", onError: (error) => errors.push(error) }, admission);
  await queue.enqueue([
    { id: "ok-a", key: "tsr-ok-q", group: "wf", body: 0 },
    { id: "ok-b", key: "tsr-ok-q", group: "wf", body: 0 },
    { id: "no-a", key: "tsr-no-q", group: "wf", body: 0 },
  ]);
  await eventually(WAIT_MS, async () => admitted.has("ok-a") && admitted.has("ok-b"), "the allowed key's items admitted");
  await eventually(WAIT_MS, async () => errors.some((error) => error instanceof RejectedError && error.status === 403), "the other key refused");
  assert.equal(queue.status("no-a"), "queued");
  queue.release("ok-a");
  queue.release("ok-b");
  queue.release("no-a");
  await drained(admin, ["tsr-ok-1", "tsr-ok-q"]);
  await queue.shutdown();
});
