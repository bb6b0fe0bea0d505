/**
 * The TypeScript client against a real three-node cluster (see `harness.ts`).
 *
 * - acquire/release: concurrent holders never exceed the limit (counted by the
 *   holders themselves), fences grow, usage returns to zero;
 * - leader kill: the leader is SIGKILLed while permits are held; release and
 *   the next acquisitions retry onto the new leader;
 * - the queue: jobs of several runners under a limit, counted by an
 *   independent counter; every job runs once; usage returns to zero.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { mkdtemp, rm } from "node:fs/promises";
import { join } from "node:path";

import {
  AcquireError,
  QueueStoreFailedError,
  RejectedError,
  SemaphoreClient,
  SemaphoreQueue,
  shardOf,
  type Admission,
  type AdmittedItem,
} from "../src/index.js";
import { FileStore } from "../src/node/index.js";
import { ADMIN_TOKEN, answerDroppingProxy, Cluster, eventually } from "./harness.js";

const DRAIN_TIMEOUT_MS = 30_000;
let cluster: Cluster;

before(async () => {
  cluster = await Cluster.start();
});

after(async () => {
  await cluster?.stop();
});

function client(): SemaphoreClient {
  return new SemaphoreClient({ endpoints: cluster.urls(), callTimeoutMs: 20_000, token: ADMIN_TOKEN });
}

async function drained(admin: SemaphoreClient, key: string): Promise<void> {
  await eventually(
    DRAIN_TIMEOUT_MS,
    async () => {
      const usage = await admin.usage(key);
      return usage.granted === 0 && usage.leased === 0;
    },
    `usage of ${key} back to zero`,
  );
}

const sleep = (ms: number) => new Promise((done) => setTimeout(done, ms));

/**
 * The independent counter: jobs run as timers for their body's ms, counted
 * here (running now, the most at once, runs per job), never by permitd.
 */
class Jobs {
  running = 0;
  most = 0;
  readonly runs = new Map<string, number>();
  readonly ended = new Set<string>();

  /** An application side whose finished jobs report to `release` (which may throw while a runner is down). */
  admission(release: (id: string) => void): Admission<number> {
    return {
      admit: (items: AdmittedItem<number>[]) => {
        for (const item of items) {
          if (this.runs.has(item.id)) continue; // a repeated admit is a no-op
          this.runs.set(item.id, 1);
          this.running += 1;
          this.most = Math.max(this.most, this.running);
          setTimeout(() => {
            this.running -= 1;
            this.ended.add(item.id);
            try {
              release(item.id);
            } catch {
              // The runner is down: `finished` recovers this release after its restart.
            }
          }, item.body);
        }
      },
      finished: (ids) => ids.filter((id) => this.ended.has(id)),
    };
  }
}

test("concurrent holders stay under the limit and fences grow", async () => {
  const admin = client();
  await admin.setKeyConfig("ts-acct-1", { limit: 3 });
  let running = 0;
  let most = 0;
  const fences: number[] = [];
  await Promise.all(
    Array.from({ length: 12 }, async (_, worker) => {
      const runner = client();
      await runner.withPermit("ts-acct-1", "wf", 1, async (fence) => {
        running += 1;
        most = Math.max(most, running);
        fences.push(fence);
        await sleep(20 + worker * 5);
        running -= 1;
      });
    }),
  );
  assert.ok(most >= 1 && most <= 3, `at most 3 at once, saw ${most}`);
  assert.equal(fences.length, 12);
  assert.ok(fences.every((fence) => fence > 0));
  // A permit of 2 under a limit of 3 while 2 are held: granted 1, then the rest.
  const first = await admin.acquire("ts-acct-1", "wf", 2);
  const timedOut = admin.acquire("ts-acct-1", "wf", 2, { timeoutMs: 500 });
  await assert.rejects(timedOut, (error: unknown) => error instanceof AcquireError && error.kind === "timeout");
  const waiting = admin.acquire("ts-acct-1", "wf", 3);
  await sleep(200);
  await first.release();
  const second = await waiting;
  assert.equal(second.count, 3);
  assert.ok(second.fence > first.fence, "fences grow");
  await second.release();
  await drained(admin, "ts-acct-1");
});

test("the shard map names the one shard served today, its voters and its leader", async () => {
  const map = await client().clusterShards();
  assert.deepEqual(
    map.shards.map((shard) => shard.shard),
    [0],
  );
  assert.deepEqual(map.shards[0]?.members, [1, 2, 3]);
  assert.equal(shardOf("ts-acct-1", map.shards.length), 0);
  await eventually(10_000, async () => (await client().clusterShards()).shards[0]?.leader != null, "a leader is known");
});

test("an aborted acquisition gives back what it was granted", async () => {
  const admin = client();
  // The claim deadline (60 s here) is longer than the checks wait: a request in
  // flight when the acquisition is aborted must give its grant back anyway.
  await admin.setKeyConfig("ts-acct-2", { limit: 2 });
  const held = await admin.acquire("ts-acct-2", "wf", 1);
  const controller = new AbortController();
  const aborted = admin.acquire("ts-acct-2", "wf", 2, { signal: controller.signal });
  await sleep(300);
  controller.abort();
  await assert.rejects(aborted, (error: unknown) => error instanceof AcquireError && error.kind === "aborted");
  await eventually(DRAIN_TIMEOUT_MS, async () => (await admin.usage("ts-acct-2")).granted === 1, "only the held permit left");
  await admin.setGroup("ts-acct-2", "closed", { permitted: false });
  await assert.rejects(admin.acquire("ts-acct-2", "closed", 1), (error: unknown) => error instanceof AcquireError && error.kind === "not_permitted");
  await held.release();
  await drained(admin, "ts-acct-2");
});

test("the queue keeps jobs of several runners under the limit, each run once", async () => {
  const admin = client();
  await admin.setKeyConfig("ts-queue", { limit: 4, leases: { provisioning: { mode: "strict" }, permitsPerLease: 2 } });
  const jobs = new Jobs();
  const queues: SemaphoreQueue<number>[] = [];
  for (let runner = 0; runner < 3; runner++) {
    const options = { clientId: `ts-runner-${runner}`, finishedIntervalMs: 1_000 };
    const admission = jobs.admission((id) => queues[runner]!.release(id));
    queues.push(await SemaphoreQueue.start<number>(client(), options, admission));
  }
  const total = 30;
  await Promise.all(
    queues.map((queue, runner) =>
      queue.enqueue(
        Array.from({ length: total / queues.length }, (_, index) => ({
          id: `job-${runner}-${index}`,
          key: "ts-queue",
          group: `wf-${index % 2}`,
          body: 20 + ((index * 7) % 30),
        })),
      ),
    ),
  );
  await eventually(60_000, async () => jobs.ended.size === total, `all ${total} jobs ended`);
  assert.ok(jobs.most <= 4, `never more than the limit at once, saw ${jobs.most}`);
  assert.ok(jobs.most >= 2, `jobs ran concurrently (saw ${jobs.most})`);
  assert.equal(jobs.runs.size, total);
  assert.equal(queues[0]!.status("job-0-0"), "released");
  for (const queue of queues) await queue.shutdown();
  await drained(admin, "ts-queue");
});

test("a runner restarted from its file store loses no job and leaks no permit", async () => {
  const admin = client();
  // A crash with a request in flight loses that round's answer: its grant
  // returns at its claim deadline, kept short here so the drain check sees it.
  await admin.setKeyConfig("ts-restart", { limit: 2, leases: null, grantTimeoutMs: 1_000 });
  const path = join(cluster.dir, "queue.json"); // removed with the cluster
  // The jobs outlive the runner (they are someone else's processes): each ends
  // after its body's ms and tells whichever queue is current.
  const jobs = new Jobs();
  let current: SemaphoreQueue<number> | undefined;
  const admission = jobs.admission((id) => current?.release(id));
  const options = { clientId: "ts-restarting-runner", finishedIntervalMs: 500 };
  current = await SemaphoreQueue.start(client(), { ...options, store: new FileStore(path) }, admission);
  await current.enqueue(Array.from({ length: 8 }, (_, index) => ({ id: `r-${index}`, key: "ts-restart", group: "wf", body: 300 })));
  await eventually(20_000, async () => jobs.runs.size >= 2, "two jobs admitted");
  current.halt();
  current = undefined;
  await sleep(400); // jobs end while the runner is down
  current = await SemaphoreQueue.start(client(), { ...options, store: new FileStore(path) }, admission);
  await eventually(60_000, async () => jobs.ended.size === 8, "all 8 jobs ended");
  assert.equal(jobs.runs.size, 8, "every job ran once");
  assert.ok(jobs.most <= 2, `never more than the limit, saw ${jobs.most}`);
  await eventually(DRAIN_TIMEOUT_MS, async () => current!.counts().admitted === 0, "every release recorded");
  await current.shutdown();
  await drained(admin, "ts-restart");
});

test("a queue whose store fails stops admitting, says why, and leaks no permit", async () => {
  const admin = client();
  // A short claim deadline: the grant the stopped queue never claims comes back soon.
  await admin.setKeyConfig("ts-store-fails", { limit: 2, leases: null, grantTimeoutMs: 1_000, roundWaitMs: 5, roundPeriodMs: 20 });
  await admin.setGroup("ts-store-fails", "wf", { permitted: false }); // nothing granted until the store is broken
  const folder = await mkdtemp(join(cluster.dir, "store-"));
  const errors: string[] = [];
  let admitted = 0;
  const admission: Admission<number> = { admit: (items) => void (admitted += items.length), finished: () => [] };
  const options = { clientId: "ts-failing-store", store: new FileStore(join(folder, "queue.json")), onError: (error: unknown) => errors.push(String(error)) };
  const queue = await SemaphoreQueue.start<number>(client(), options, admission);
  await queue.enqueue([{ id: "f-1", key: "ts-store-fails", group: "wf", body: 0 }]);
  await rm(folder, { recursive: true }); // every later write fails: its folder is gone
  await admin.setGroup("ts-store-fails", "wf", { permitted: true });
  await eventually(20_000, async () => queue.failure() !== undefined, "the queue stops on the failed write");
  assert.ok(queue.failure() instanceof QueueStoreFailedError);
  assert.match(String(queue.failure()), /ENOENT/, "the store's own error is surfaced");
  assert.ok(errors.some((error) => error.includes("store failed")), `onError heard it: ${errors.join("; ")}`);
  await drained(admin, "ts-store-fails"); // the unclaimed grant was taken back
  assert.equal(admitted, 0, "nothing was admitted");
  await assert.rejects(queue.enqueue([{ id: "f-2", key: "ts-store-fails", group: "wf", body: 0 }]), QueueStoreFailedError);
  assert.throws(() => queue.release("f-1"), QueueStoreFailedError);
  await assert.rejects(queue.shutdown(), QueueStoreFailedError);
  assert.equal(admitted, 0, "nothing was admitted");
});

test("a permit is released when its `await using` block ends", async () => {
  const admin = client();
  {
    await using permit = await admin.acquire("ts-using", "wf", 1);
    assert.equal((await admin.usage("ts-using")).granted, permit.count);
  }
  assert.equal((await admin.usage("ts-using")).granted, 0);
});

test("a retried request whose answer was lost gets the original answer", async () => {
  const admin = client();
  await admin.setKeyConfig("ts-retry", { limit: 5 });
  const proxy = await answerDroppingProxy(cluster.nodes[0]!.url);
  try {
    const runner = new SemaphoreClient({ endpoints: [proxy.url], backoffInitialMs: 10, token: ADMIN_TOKEN });
    const grant = await runner.request("ts-retry", {
      clientId: "ts-retrier",
      demand: [{ group: "wf", count: 2, oldestAt: Date.now() }],
    });
    assert.equal(proxy.dropped(), 1, "the first answer was lost");
    assert.equal(grant.grants.reduce((sum, granted) => sum + granted.permits, 0), 2);
    // The same requestId on the retry: the holder answered it again instead of granting twice.
    assert.equal((await admin.usage("ts-retry")).granted, 2);
    const reports = grant.grants.map((granted) => ({ grantId: granted.grantId, claimed: granted.permits, released: granted.permits }));
    await runner.sync("ts-retry", { clientId: "ts-retrier", grants: reports });
    await drained(admin, "ts-retry");
  } finally {
    proxy.close();
  }
});

test("a key delete is refused while in use, and a forced one whose answer was lost is retried and answered as the first time", async () => {
  const admin = client();
  await admin.setKeyConfig("ts-delete", { limit: 5 });
  const held = await admin.acquire("ts-delete", "wf", 2);
  await assert.rejects(
    admin.deleteKey("ts-delete"),
    (error: unknown) => error instanceof RejectedError && error.status === 409 && error.code === "key_in_use",
  );
  assert.equal((await admin.usage("ts-delete")).granted, 2, "a refusal changes nothing");
  const proxy = await answerDroppingProxy(cluster.nodes[0]!.url);
  try {
    const operator = new SemaphoreClient({ endpoints: [proxy.url], backoffInitialMs: 10, token: ADMIN_TOKEN });
    const deleted = await operator.deleteKey("ts-delete", { force: true });
    assert.equal(proxy.dropped(), 1, "the first answer was lost");
    // The retry carried the same requestId: the first answer, not `existed: false`.
    assert.equal(deleted.existed, true);
    assert.deepEqual(deleted.released, { grants: 1, leases: 0, permits: 2 });
  } finally {
    proxy.close();
  }
  assert.equal((await admin.usage("ts-delete")).granted, 0);
  assert.notEqual((await admin.keyConfig("ts-delete")).limit, 5, "the key follows the defaults");
  await held.release();
  const again = await admin.deleteKey("ts-delete");
  assert.equal(again.existed, false);
});

test("a leader kill is retried onto the new leader", async () => {
  const admin = client();
  await admin.setKeyConfig("ts-failover", { limit: 1 });
  const before = await admin.acquire("ts-failover", "wf", 1);
  const leader = await cluster.waitForLeader();
  await cluster.kill(leader);
  await before.release();
  const after = await admin.acquire("ts-failover", "wf", 1);
  assert.ok(after.fence > before.fence);
  const survivor = new SemaphoreClient({ endpoints: [cluster.other(leader).url], token: ADMIN_TOKEN });
  assert.equal((await survivor.usage("ts-failover")).granted, 1, "exactly the new permit");
  await after.release();
  await eventually(DRAIN_TIMEOUT_MS, async () => (await survivor.usage("ts-failover")).granted === 0, "released");
  assert.notEqual(admin.leader(), undefined);
});
