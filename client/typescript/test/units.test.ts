/**
 * Pure pieces without a cluster: backoff, leader tracking, `Retry-After`,
 * grant claiming, the queue's accounting, and the stores.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import {
  Backoff,
  believedNextRequestAt,
  changes,
  DeadlineExceededError,
  MAX_NEXT_REQUEST_AHEAD_MS,
  SemaphoreClient,
  claimAmounts,
  ClientIdMismatchError,
  LeaderTracker,
  loadQueue,
  MemoryStore,
  parseEndpoints,
  parseRetryAfter,
  QueueState,
  DEFAULT_STATE_CONFIG,
  type SemaphoreRequest,
  type QueueStore,
} from "../src/index.js";
import { FileStore } from "../src/node/index.js";

test("backoff doubles up to the cap, jitters within half and full, honours Retry-After", () => {
  const backoff = new Backoff(100, 1_000);
  const ceilings = Array.from({ length: 6 }, () => {
    const ceiling = backoff.ceilingMs();
    assert.equal(backoff.nextDelayMs(0), ceiling / 2);
    return ceiling;
  });
  assert.deepEqual(ceilings, [100, 200, 400, 800, 1_000, 1_000]);
  assert.equal(new Backoff(10, 100).nextDelayMs(0.5, 1_000), 1_000);
  assert.equal(new Backoff(10, 100).nextDelayMs(Number.NaN), 5);
});

test("Retry-After reads seconds and dates", () => {
  assert.equal(parseRetryAfter("1"), 1_000);
  assert.equal(parseRetryAfter(null), undefined);
  const inTwoSeconds = new Date(Date.now() + 2_000).toUTCString();
  assert.ok(parseRetryAfter(inTwoSeconds)! <= 2_000);
});

test("the leader tracker follows hints, maps node ids and rotates on failure", () => {
  assert.deepEqual(parseEndpoints("http://a:1, b:2 http://a:1/"), ["http://a:1", "http://b:2"]);
  assert.throws(() => parseEndpoints(" , "));
  const tracker = new LeaderTracker(["http://a:1", "http://b:2", "http://c:3"]);
  tracker.answered("http://a:1", { nodeId: 3 });
  assert.equal(tracker.pick(), "http://a:1", "unknown id: the answering node stays first");
  assert.ok(tracker.wantsNodeIds());
  tracker.learnNodeId("http://c:3", 3);
  assert.equal(tracker.pick(), "http://c:3");
  tracker.failed("http://c:3", undefined);
  assert.equal(tracker.leader(), undefined);
  assert.equal(tracker.pick(), "http://a:1");
  tracker.answered("http://a:1", { url: "http://d:4" });
  assert.equal(tracker.pick(), "http://d:4", "a URL hint adds the endpoint");
});

test("claims cover what is needed and no more", () => {
  const grant = (grantId: string, permits: number) => ({ grantId, group: "g", permits, fence: 7 });
  assert.deepEqual(
    claimAmounts([grant("a", 2), grant("b", 5)], 4).map((held) => held.claimed),
    [2, 2],
  );
  assert.deepEqual(claimAmounts([grant("a", 2)], 0), []);
});

const KEY = "acct-1";
const item = (id: string, group = "wf") => ({ id, key: KEY, group, body: id });
function only(messages: { key: string; message: SemaphoreRequest }[]): SemaphoreRequest {
  assert.equal(messages.length, 1, JSON.stringify(messages));
  return messages[0]!.message;
}

test("a grant is claimed first and admitted once the claim is confirmed", () => {
  const state = new QueueState<string>("runner-1");
  state.enqueue([item("a"), item("b"), item("c")], 100);
  const request = only(state.poll(100));
  assert.equal(request.type, "request");
  assert.deepEqual(request.type === "request" && request.demand, [{ group: "wf", count: 3, oldestAt: 100 }]);
  assert.deepEqual(state.poll(100), [], "one message in flight per key");
  state.onAnswer(KEY, { type: "grant", v: 1, grants: [{ grantId: "G", group: "wf", permits: 2, fence: 9 }], blocked: [], grantResults: [], nextRequestAt: 2_000 }, 200);
  const claim = only(state.poll(200));
  assert.equal(claim.type, "sync");
  assert.deepEqual(claim.grants, [{ grantId: "G", claimed: 2, released: 0 }]);
  assert.deepEqual(state.takeAdmits(), [], "nothing runs before the claim is confirmed");
  state.onAnswer(KEY, { type: "synced", v: 1, grantResults: [{ grantId: "G", claimed: 2, status: "ok" }] }, 300);
  assert.deepEqual(state.takeAdmits().map((admitted) => [admitted.id, admitted.permit]), [
    ["a", { kind: "grant", grantId: "G", fence: 9 }],
    ["b", { kind: "grant", grantId: "G", fence: 9 }],
  ]);
  assert.equal(state.status("c"), "queued");
  assert.equal(state.release("a"), "released");
  assert.equal(state.release("a"), "already_released");
  const report = only(state.poll(400));
  assert.deepEqual(report.grants, [{ grantId: "G", claimed: 2, released: 1 }]);
});

test("nextRequestAt is believed at most MAX_NEXT_REQUEST_AHEAD_MS ahead, by the client and the queue", () => {
  assert.equal(believedNextRequestAt(1_005, 1_000), 1_005);
  assert.equal(believedNextRequestAt(1_000 + 86_400_000, 1_000), 1_000 + MAX_NEXT_REQUEST_AHEAD_MS);
  const state = new QueueState<string>("runner-1");
  state.enqueue([item("a")], 0);
  only(state.poll(0));
  // A node whose clock runs a day ahead.
  state.onAnswer(KEY, { type: "grant", v: 1, grants: [], blocked: [], grantResults: [], nextRequestAt: 1_000 + 86_400_000 }, 1_000);
  const believed = 1_000 + MAX_NEXT_REQUEST_AHEAD_MS;
  assert.equal(state.nextWakeupMs(1_000), believed);
  assert.deepEqual(state.poll(believed - 1), []);
  assert.equal(only(state.poll(believed)).type, "request");
});

/** A client of a port nothing listens on. */
async function unreachableClient(callTimeoutMs: number): Promise<SemaphoreClient> {
  const { createServer } = await import("node:net");
  const server = createServer();
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  const { port } = server.address() as { port: number };
  await new Promise((done) => server.close(done));
  return new SemaphoreClient({ endpoints: `http://127.0.0.1:${port}`, callTimeoutMs, backoffInitialMs: 10, backoffMaxMs: 20 });
}

test("a request never sleeps past its deadline for nextRequestAt, and the wait counts against it", async () => {
  const far = await unreachableClient(300);
  far["rememberNextRequestAt"]("k", Date.now() + 10_000);
  let started = Date.now();
  await assert.rejects(far.request("k", { clientId: "c", demand: [], grants: [] }), (error: unknown) => error instanceof DeadlineExceededError && error.attempts === 0);
  assert.ok(Date.now() - started < 300, "failed at once");
  far["rememberNextRequestAt"]("k", Number.MAX_SAFE_INTEGER);
  assert.ok(far.nextRequestAt("k")! <= Date.now() + MAX_NEXT_REQUEST_AHEAD_MS, "capped when remembered");
  const near = await unreachableClient(600);
  near["rememberNextRequestAt"]("k", Date.now() + 400);
  started = Date.now();
  await assert.rejects(near.request("k", { clientId: "c", demand: [], grants: [] }), DeadlineExceededError);
  // 400 ms of waiting, then retries until the same 600 ms deadline: not 400 + 600.
  assert.ok(Date.now() - started < 900, `took ${Date.now() - started} ms`);
});

test("a lease is confirmed before it is drawn from, and heartbeats at half its lifetime", () => {
  const state = new QueueState<string>("runner-1");
  state.enqueue([item("a"), item("b")], 0);
  only(state.poll(0));
  const lease = { leaseId: "L", group: "wf", permits: 4, expiresAt: 10_000 };
  state.onAnswer(KEY, { type: "grant", v: 1, grants: [], blocked: [], grantResults: [], leases: [lease], nextRequestAt: 0 }, 0);
  assert.deepEqual(state.takeAdmits(), [], "no draw before confirmation");
  const claim = only(state.poll(0));
  assert.deepEqual(claim.leases, [{ leaseId: "L", drawn: 0, released: 0, retired: false }]);
  state.onAnswer(KEY, { type: "synced", v: 1, grantResults: [], leases: [{ ...lease, expiresAt: 10_001 }] }, 1);
  assert.deepEqual(state.takeAdmits().map((admitted) => admitted.id), ["a", "b"]);
  const drawn = only(state.poll(1));
  assert.deepEqual(drawn.leases, [{ leaseId: "L", drawn: 2, released: 0, retired: false }]);
  state.onAnswer(KEY, { type: "synced", v: 1, grantResults: [], leases: [{ ...lease, expiresAt: 10_001 }] }, 2);
  assert.deepEqual(state.poll(4_999), []);
  assert.equal(state.nextWakeupMs(4_999), 5_001);
  assert.equal(only(state.poll(5_001)).type, "sync", "the heartbeat");
});

test("contended returns leases whose group has nothing queued", () => {
  const state = new QueueState<string>("runner-1");
  state.enqueue([item("a")], 0);
  only(state.poll(0));
  const lease = { leaseId: "L", group: "wf", permits: 4, expiresAt: 60_000 };
  state.onAnswer(KEY, { type: "grant", v: 1, grants: [], blocked: [], grantResults: [], leases: [lease], nextRequestAt: 0 }, 0);
  only(state.poll(0));
  state.onAnswer(KEY, { type: "synced", v: 1, grantResults: [], leases: [lease] }, 1);
  assert.deepEqual(state.takeAdmits().map((admitted) => admitted.id), ["a"]);
  assert.deepEqual(only(state.poll(2)).leases, [{ leaseId: "L", drawn: 1, released: 0, retired: false }]);
  state.onAnswer(KEY, { type: "synced", v: 1, grantResults: [], leases: [lease], contended: true }, 3);
  const report = only(state.poll(3));
  assert.deepEqual(report.leases, [{ leaseId: "L", drawn: 1, released: 0, retired: true }]);
});

async function storeRoundTrip(store: QueueStore): Promise<void> {
  await loadQueue(store, "runner-1");
  const state = new QueueState<string>("runner-1");
  state.enqueue([item("a"), item("b")], 10);
  state.release("a");
  const changed = changes(state, state.takeDirty())!;
  await store.write(changed.puts, changed.deletes);
  const loaded = await loadQueue<string>(store, "runner-1");
  assert.deepEqual(loaded.items.map((record) => record.id), ["b"]);
  assert.equal(loaded.released.length, 1);
  const restored = QueueState.restore("runner-1", DEFAULT_STATE_CONFIG, loaded.items, loaded.keys, loaded.released);
  assert.equal(restored.status("a"), "released");
  assert.equal(restored.status("b"), "queued");
  await assert.rejects(loadQueue(store, "runner-2"), ClientIdMismatchError);
}

test("the memory store keeps records and refuses another client id", () => storeRoundTrip(new MemoryStore()));

test("the file store survives a reopen", async () => {
  const dir = mkdtempSync(join(tmpdir(), "permitd-ts-store-"));
  const path = join(dir, "queue.json");
  try {
    await storeRoundTrip(new FileStore(path));
    const reopened = await loadQueue<string>(new FileStore(path), "runner-1");
    assert.deepEqual(reopened.items.map((record) => record.id), ["b"]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
