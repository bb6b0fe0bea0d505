/**
 * The TypeScript wire types against the Rust ones: every sample the Rust test
 * `tests/tests/wire_samples.rs` serialised from the Rust types must parse with
 * the TypeScript validator of its type and come back unchanged, and every
 * validator must have samples (so a new Rust wire type needs a TS one).
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  ERROR_CODES,
  LEADER_HEADER,
  parse,
  parseWire,
  RETRYABLE_STATUSES,
  WireError,
  type ClusterStatus,
  type KeyConfig,
  type SemaphoreRequest,
  type SemaphoreResponse,
  type Usage,
  type WireTypeName,
} from "../src/index.js";

const fixtures = resolve(dirname(fileURLToPath(import.meta.url)), "../../test/fixtures/wire-samples.json");
const samples = JSON.parse(readFileSync(fixtures, "utf8")) as Record<string, unknown[]>;

test("every Rust sample round-trips through its TypeScript type", () => {
  for (const [name, values] of Object.entries(samples)) {
    if (name === "Contract") continue;
    assert.ok(name in parse, `no TypeScript validator for the Rust wire type ${name}`);
    assert.ok(values.length > 0, name);
    for (const value of values) {
      const parsed = parseWire(name as WireTypeName, value);
      assert.deepEqual(JSON.parse(JSON.stringify(parsed)), value, `${name} changed in the round trip`);
    }
  }
});

test("every TypeScript validator has Rust samples", () => {
  for (const name of Object.keys(parse)) {
    if (name === "PermitGrant" || name === "PermitSyncResult") continue; // inside SemaphoreResponse
    assert.ok(samples[name]?.length, `no Rust samples for ${name}`);
  }
});

test("the parsed samples have the declared TypeScript types", () => {
  // Compile-time: these assignments fail `tsc` if a type and its validator drift apart.
  const request: SemaphoreRequest = parseWire("SemaphoreRequest", samples.SemaphoreRequest![0]);
  const response: SemaphoreResponse = parseWire("SemaphoreResponse", samples.SemaphoreResponse![0]);
  const usage: Usage = parseWire("Usage", samples.Usage![0]);
  const config: KeyConfig = parseWire("KeyConfig", samples.KeyConfig![1]);
  const status: ClusterStatus = parseWire("ClusterStatus", samples.ClusterStatus![0]);
  assert.equal(request.type, "request");
  assert.equal(response.type === "grant" && response.grants[0]!.fence, 1042);
  assert.equal(usage.groups["wf-1"]!.limit, 20);
  assert.equal(config.leases?.provisioning.mode, "strict");
  assert.equal(status.leader, 2);
});

test("malformed values are refused with the path of the bad field", () => {
  const request = structuredClone(samples.SemaphoreRequest![0]) as Record<string, unknown>;
  const cases: [WireTypeName, unknown, string][] = [
    ["SemaphoreRequest", { ...request, v: 2 }, "SemaphoreRequest.v"],
    ["SemaphoreRequest", { ...request, type: "nope" }, "SemaphoreRequest.type"],
    ["SemaphoreRequest", { ...request, demand: [{ group: "g", count: -1, oldestAt: 0 }] }, "SemaphoreRequest.demand[0].count"],
    ["SemaphoreRequest", { ...request, demand: [{ group: "g", count: 1.5, oldestAt: 0 }] }, "SemaphoreRequest.demand[0].count"],
    ["Usage", { limit: 1, granted: 0, leased: 0, available: "1", groups: {} }, "Usage.available"],
    ["ErrorAnswer", { error: { code: 1, message: "m" } }, "ErrorAnswer.error.code"],
  ];
  for (const [name, value, path] of cases) {
    assert.throws(() => parseWire(name, value), (error: unknown) => error instanceof WireError && error.path === path, path);
  }
});

test("the header name and error codes match the Rust contract", () => {
  const contract = samples.Contract![0] as {
    leaderHeader: string;
    errorCodes: { code: string; status: number; retryAfter: boolean }[];
  };
  assert.equal(LEADER_HEADER, contract.leaderHeader);
  assert.deepEqual([...ERROR_CODES], contract.errorCodes.map((entry) => entry.code));
  // The client retries exactly the answers a node marks retryable (429, 503), plus gateway failures.
  for (const entry of contract.errorCodes) {
    assert.equal(RETRYABLE_STATUSES.includes(entry.status), entry.retryAfter, entry.code);
  }
});
