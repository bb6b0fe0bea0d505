/**
 * The queue's two lanes per key (`state.ts`), as the Rust client's
 * `queue/state/messages.rs` tests and `lane_properties.rs` check them: a few
 * scenarios, then seeded random runs against a small holder, checking after
 * every poll:
 * - at most one request and one sync in flight per key;
 * - requests carry demand, and reports only of releases of confirmed claims
 *   of a key without leases (they ride instead of a sync);
 * - a report never waits behind a request: a key whose report lane is free
 *   (and not waiting out a failure) has nothing left to report;
 * - no request leaves in a poll that hands out admits of its key;
 * - the state's in-flight count is the driver's;
 * - never more items admitted than permits handed out.
 * And the split of a poll's reports into batch calls.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  laneOf,
  MAX_BATCH_KEYS,
  QueueState,
  reportBatches,
  DEFAULT_STATE_CONFIG,
  type GrantedPermits,
  type GrantReport,
  type LeaseGrant,
  type Outgoing,
  type PermitSync,
  type SemaphoreRequest,
  type SemaphoreResponse,
} from "../src/index.js";

const KEY = "acct-1";
const item = (id: string, key = KEY, group = "wf") => ({ id, key, group, body: id });
const grantAnswer = (grants: GrantedPermits[], leases: LeaseGrant[], nextRequestAt: number): SemaphoreResponse => ({
  type: "grant",
  v: 1,
  grants,
  blocked: [],
  grantResults: [],
  leases,
  nextRequestAt,
});
const claimAnswer = (grantId: string, claimed: number): SemaphoreResponse => ({
  type: "synced",
  v: 1,
  grantResults: [{ grantId, claimed, status: "ok" }],
});
function only(messages: Outgoing[]): SemaphoreRequest {
  assert.equal(messages.length, 1, JSON.stringify(messages));
  return messages[0]!.message;
}
const lanes = (messages: Outgoing[]) => messages.map((outgoing) => laneOf(outgoing.message));

/** a, b, c queued at 0; a grant of 2 (nextRequestAt 2,100) claimed for a and b, confirmed at 1,200. */
function twoOfThreeAdmitted(): QueueState<string> {
  const state = new QueueState<string>("runner-1");
  state.enqueue([item("a"), item("b"), item("c")], 0);
  assert.equal(only(state.poll(0)).type, "request");
  state.onAnswer(KEY, grantAnswer([{ grantId: "G", group: "wf", permits: 2, fence: 1 }], [], 2_100), 1_000);
  assert.deepEqual(only(state.poll(1_000)).grants, [{ grantId: "G", claimed: 2, released: 0 }]);
  state.onAnswer(KEY, claimAnswer("G", 2), 1_200);
  assert.deepEqual(state.takeAdmits().map((admitted) => admitted.id), ["a", "b"]);
  return state;
}

test("a release is reported while a request waits for its round; one message per lane", () => {
  const state = twoOfThreeAdmitted();
  const request = only(state.poll(2_100));
  assert.equal(request.type, "request");
  assert.equal(request.grants, undefined, "requests carry demand only");
  assert.deepEqual(request.type === "request" && request.demand, [{ group: "wf", count: 1, oldestAt: 0 }]);
  state.release("a");
  assert.deepEqual(only(state.poll(2_101)).grants, [{ grantId: "G", claimed: 2, released: 1 }]);
  state.release("b");
  assert.deepEqual(state.poll(2_102), [], "the second release waits for the first's answer");
  assert.equal(state.inFlight(), 2);
  // The lanes are answered in either order.
  state.onAnswer(KEY, claimAnswer("G", 2), 2_103);
  assert.deepEqual(only(state.poll(2_103)).grants, [{ grantId: "G", claimed: 2, released: 2 }]);
  state.onAnswer(KEY, grantAnswer([], [], 4_000), 2_104);
  assert.equal(state.inFlight(), 1);
});

/** a and b queued at 0; a grant of 1 answered at 1,000 with nextRequestAt passed: the next poll claims it and asks for b. */
function claimWithDemandDue(): QueueState<string> {
  const state = new QueueState<string>("runner-1");
  state.enqueue([item("a"), item("b")], 0);
  assert.equal(only(state.poll(0)).type, "request");
  state.onAnswer(KEY, grantAnswer([{ grantId: "G", group: "wf", permits: 1, fence: 1 }], [], 900), 1_000);
  return state;
}

test("both lanes leave in one poll and fail apart; a claim never rides in a request", () => {
  const state = claimWithDemandDue();
  const messages = state.poll(2_100);
  assert.deepEqual(lanes(messages), ["report", "demand"]);
  assert.deepEqual(messages[0]!.message.grants, [{ grantId: "G", claimed: 1, released: 0 }]);
  assert.equal(messages[1]!.message.grants, undefined, "admission waits for no round");
  state.onFailure(KEY, "report", 2_200);
  assert.deepEqual(state.poll(2_300), [], "the report lane waits out its retry; the request is still in flight");
  assert.equal(state.nextWakeupMs(2_300), 2_200 + DEFAULT_STATE_CONFIG.failureRetryMs);
  assert.equal(only(state.poll(3_200)).type, "sync");
  state.onFailure(KEY, "demand", 3_300);
  assert.deepEqual(state.poll(3_301), [], "the demand lane waits out its own retry");
  assert.equal(only(state.poll(4_300)).type, "request");
});

test("releases ride in the request of the same poll; a later release leaves at once as a sync", () => {
  const state = twoOfThreeAdmitted();
  state.release("a");
  const request = only(state.poll(2_100));
  assert.equal(request.type, "request");
  assert.deepEqual(request.grants, [{ grantId: "G", claimed: 2, released: 1 }]);
  assert.equal(state.inFlight(), 1, "the report lane stays free");
  assert.deepEqual(state.poll(2_101), [], "the release is on its way");
  state.release("b");
  assert.deepEqual(only(state.poll(2_102)).grants, [{ grantId: "G", claimed: 2, released: 2 }]);
  const answer = grantAnswer([], [], 4_000);
  state.onAnswer(KEY, { ...answer, grantResults: [{ grantId: "G", claimed: 2, status: "ok" }] } as SemaphoreResponse, 2_103);
  assert.equal(state.keyRecord(KEY)?.grants["G"]?.ackedReleased, 1, "the request's answer acknowledged its release");
});

test("the releases of a failed request go out on the report lane", () => {
  const state = twoOfThreeAdmitted();
  state.release("a");
  assert.equal(only(state.poll(2_100)).type, "request");
  state.onFailure(KEY, "demand", 2_200);
  const sync = only(state.poll(2_200));
  assert.equal(sync.type, "sync");
  assert.deepEqual(sync.grants, [{ grantId: "G", claimed: 2, released: 1 }]);
});

test("no request while a lease awaits confirmation, nor in the poll that drew its permits", () => {
  const state = new QueueState<string>("runner-1");
  state.enqueue([item("a"), item("b"), item("c")], 0);
  only(state.poll(0));
  const lease = { leaseId: "L", group: "wf", permits: 2, expiresAt: 60_000 };
  state.onAnswer(KEY, grantAnswer([], [lease], 100), 100);
  // nextRequestAt passed, but the lease's permits may serve the items.
  assert.deepEqual(lanes(state.poll(5_000)), ["report"]);
  assert.deepEqual(state.poll(5_001), []);
  state.onAnswer(KEY, { type: "synced", v: 1, grantResults: [], leases: [lease] }, 5_002);
  assert.deepEqual(state.takeAdmits().map((admitted) => admitted.id), ["a", "b"]);
  const messages = state.poll(5_003);
  assert.deepEqual(lanes(messages), ["report", "demand"], "the draws, and c's demand");
  const request = messages[1]!.message;
  assert.deepEqual(request.type === "request" && request.demand, [{ group: "wf", count: 1, oldestAt: 0 }]);

  // A lease of 2 with a drawn; b and c come: b draws the last permit, so c's request waits for the next poll.
  const drawing = new QueueState<string>("runner-1");
  drawing.enqueue([item("a")], 0);
  only(drawing.poll(0));
  drawing.onAnswer(KEY, grantAnswer([], [lease], 100), 100);
  only(drawing.poll(100));
  drawing.onAnswer(KEY, { type: "synced", v: 1, grantResults: [], leases: [lease] }, 100);
  assert.deepEqual(drawing.takeAdmits().map((admitted) => admitted.id), ["a"]);
  assert.deepEqual(lanes(drawing.poll(100)), ["report"]);
  drawing.onAnswer(KEY, { type: "synced", v: 1, grantResults: [], leases: [lease] }, 100);
  drawing.enqueue([item("b"), item("c")], 3_000);
  const drawn = drawing.poll(3_000);
  assert.deepEqual(drawing.takeAdmits().map((admitted) => admitted.id), ["b"]);
  assert.deepEqual(lanes(drawn), ["report"]);
  const next = drawing.poll(3_001);
  assert.deepEqual(lanes(next), ["demand"], "c's demand in the next poll");
  assert.deepEqual(next[0]!.message.type === "request" && next[0]!.message.demand, [{ group: "wf", count: 1, oldestAt: 3_000 }]);
});

test("a poll's reports are split into batch calls within the envelope's limits", () => {
  const sync = (key: string, reports = 0): Outgoing => ({
    key,
    message: { type: "sync", v: 1, clientId: "c", grants: Array.from({ length: reports }, (_, index) => ({ grantId: `g-${index}`, claimed: 1, released: 1 })) },
  });
  const many = Array.from({ length: 300 }, (_, index) => sync(`k-${index}`));
  assert.deepEqual(reportBatches(many).map((batch) => batch.length), [MAX_BATCH_KEYS, MAX_BATCH_KEYS, 300 - 2 * MAX_BATCH_KEYS]);
  assert.deepEqual(reportBatches([]), []);
  const big = [sync("a"), sync("b", 100), sync("c")];
  const size = JSON.stringify(big[1]).length;
  assert.deepEqual(reportBatches(big, size).map((batch) => batch.map((report) => report.key)), [["a"], ["b"], ["c"]], "an item over the budget goes alone");
});

// ---- random runs -----------------------------------------------------------

/** mulberry32: a seeded draw in [0, 1), so a failing run can be replayed from its seed. */
function seeded(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

const KEYS = ["acct-1", "acct-2"];
const GROUPS = ["wf-a", "wf-b"];
const LEASE_TTL_MS = 60_000;

/** The holder's answer to grant reports: every claim confirmed as sent. */
const confirmed = (reports: GrantReport[]) => reports.map((report) => ({ grantId: report.grantId, claimed: report.claimed, status: "ok" as const }));

/** The test's side: what is in flight per key and lane, and a small holder that grants, lends and echoes. */
class Driver {
  nowMs = 0;
  private nextItem = 0;
  private nextGrant = 0;
  /** Per key: the request in flight (its demanded groups, its grant reports). */
  private readonly demand = new Map<string, { groups: string[]; reports: GrantReport[] }>();
  private readonly reports = new Map<string, PermitSync>();
  private readonly reportRetryAtMs = new Map<string, number>();
  private readonly lent = new Map<string, LeaseGrant>();
  private readonly admitted: string[] = [];
  private permitsHandedOut = 0;
  private admitsSeen = 0;

  constructor(
    private readonly state: QueueState<number>,
    private readonly draw: () => number,
  ) {}

  private pick<T>(values: readonly T[]): T {
    return values[Math.floor(this.draw() * values.length)]!;
  }

  step(): void {
    const roll = this.draw() * 15;
    const key = this.pick(KEYS);
    if (roll < 1) {
      const items = Array.from({ length: 1 + Math.floor(this.draw() * 4) }, () => ({ id: `item-${++this.nextItem}`, key, group: this.pick(GROUPS), body: 0 }));
      this.state.enqueue(items, this.nowMs);
    } else if (roll < 4) {
      if (this.admitted.length > 0) this.state.release(this.admitted.splice(Math.floor(this.draw() * this.admitted.length), 1)[0]!);
    } else if (roll < 8) {
      this.nowMs += Math.floor(this.draw() * 30);
      this.poll();
    } else if (roll < 11) {
      this.answerDemand(key, this.draw() < 0.5, Math.floor(this.draw() * 4), Math.floor(this.draw() * 20));
    } else if (roll < 14) {
      this.answerReport(key, this.draw() < 0.5);
    } else if (this.draw() < 0.5) {
      if (this.demand.delete(key)) this.state.onFailure(key, "demand", this.nowMs);
    } else if (this.reports.delete(key)) {
      this.state.onFailure(key, "report", this.nowMs);
      this.reportRetryAtMs.set(key, this.nowMs + DEFAULT_STATE_CONFIG.failureRetryMs);
    }
  }

  private answerDemand(key: string, asLease: boolean, permits: number, periodMs: number): void {
    const { groups, reports } = this.demand.get(key) ?? {};
    if (!groups || !reports) return;
    this.demand.delete(key);
    const grants: GrantedPermits[] = [];
    const leases: LeaseGrant[] = [];
    const group = groups[0];
    if (group !== undefined && permits > 0) {
      this.permitsHandedOut += permits;
      this.nextGrant += 1;
      if (asLease) {
        const lease = { leaseId: `lease-${this.nextGrant}`, group, permits, expiresAt: this.nowMs + LEASE_TTL_MS };
        this.lent.set(lease.leaseId, lease);
        leases.push(lease);
      } else {
        grants.push({ grantId: `grant-${this.nextGrant}`, group, permits, fence: this.nextGrant });
      }
    }
    const answer = grantAnswer(grants, leases, this.nowMs + periodMs);
    this.state.onAnswer(key, { ...answer, grantResults: confirmed(reports) } as SemaphoreResponse, this.nowMs);
  }

  /** Every claim confirmed, every lease echoed (a retired lease keeps only its drawn permits). */
  private answerReport(key: string, contended: boolean): void {
    const sync = this.reports.get(key);
    if (!sync) return;
    this.reports.delete(key);
    const grantResults = confirmed(sync.grants ?? []);
    const leases = (sync.leases ?? []).map((report) => {
      const lent = this.lent.get(report.leaseId)!;
      return { ...lent, permits: report.retired ? report.drawn : lent.permits };
    });
    this.state.onAnswer(key, { type: "synced", v: 1, grantResults, leases, contended }, this.nowMs);
  }

  poll(): void {
    const messages = this.state.poll(this.nowMs);
    const admits = this.state.takeAdmits();
    for (const { key, message } of messages) {
      if (message.type === "request") {
        assert.ok(!this.demand.has(key), "two requests in flight");
        const record = this.state.keyRecord(key);
        for (const report of message.grants ?? []) {
          assert.ok(record?.grants[report.grantId]?.claimConfirmed, "a request carries a claim");
        }
        assert.ok(!message.grants?.length || Object.keys(record?.leases ?? {}).length === 0, "a request carries reports of a key with leases");
        assert.ok(!admits.some((admitted) => admitted.key === key), "a request left in a poll that admitted items of its key");
        this.demand.set(key, { groups: (message.demand ?? []).map((demand) => demand.group), reports: message.grants ?? [] });
      } else {
        assert.ok(!this.reports.has(key), "two syncs in flight");
        this.reports.set(key, message);
      }
    }
    this.admitsSeen += admits.length;
    this.admitted.push(...admits.map((admitted) => admitted.id));
    assert.ok(this.admitsSeen <= this.permitsHandedOut, `${this.admitsSeen} admitted under ${this.permitsHandedOut} permits`);
    assert.equal(this.state.inFlight(), this.demand.size + this.reports.size);
    for (const key of KEYS) {
      const reportFree = !this.reports.has(key) && this.nowMs >= (this.reportRetryAtMs.get(key) ?? 0);
      assert.ok(!reportFree || !this.state.reportsDue(key, this.nowMs), `a report of ${key} waits with its lane free`);
    }
  }
}

test("random runs keep the lanes' rules", () => {
  for (let seed = 1; seed <= 300; seed++) {
    const draw = seeded(seed);
    const driver = new Driver(new QueueState<number>("runner-1"), draw);
    const steps = 1 + Math.floor(draw() * 120);
    try {
      for (let step = 0; step < steps; step++) driver.step();
    } catch (error) {
      throw new Error(`seed ${seed}: ${error instanceof Error ? error.message : String(error)}`, { cause: error });
    }
  }
});
