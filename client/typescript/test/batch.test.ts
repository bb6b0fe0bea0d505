/**
 * `SemaphoreClient.batch` without a cluster: a fake `fetch` answers, so the
 * mapping of each item's answer, the requestIds across retries and the checks
 * of the answer are seen exactly.
 */

import assert from "node:assert/strict";
import { test } from "node:test";

import { parseWire, RejectedError, SemaphoreClient, UnexpectedAnswerError, type BatchRequest } from "../src/index.js";

/** A client whose fetch answers each call with the next of `answers` and records the bodies sent. */
function fakeClient(answers: { status: number; body: unknown }[]): { client: SemaphoreClient; sent: BatchRequest[] } {
  const sent: BatchRequest[] = [];
  const fetch = async (_url: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    sent.push(parseWire("BatchRequest", JSON.parse(String(init?.body))));
    const next = answers.shift();
    if (!next) throw new Error("no more answers");
    return new Response(JSON.stringify(next.body), { status: next.status, headers: { "content-type": "application/json" } });
  };
  const client = new SemaphoreClient({ endpoints: "http://127.0.0.1:1", fetch, backoffInitialMs: 1, backoffMaxMs: 2 });
  return { client, sent };
}

const grant = { type: "grant", v: 1, grants: [], blocked: [], grantResults: [], nextRequestAt: Date.now() + 5_000 };
const synced = { type: "synced", v: 1, grantResults: [] };

test("each batch item gets its own answer or RejectedError, and a retry replays the same requestIds", async () => {
  const { client, sent } = fakeClient([
    { status: 503, body: { error: { code: "no_quorum", message: "later" } } },
    {
      status: 200,
      body: {
        v: 1,
        items: [
          { status: 200, answer: grant },
          { status: 400, error: { code: "bad_request", message: "clientId is empty", field: "clientId" } },
          { status: 200, answer: synced },
          { status: 403, error: { code: "forbidden", message: "this token may not use this key" } },
        ],
      },
    },
  ]);
  const results = await client.batch([
    { key: "a", message: { type: "request", clientId: "c", demand: [{ group: "g", count: 1, oldestAt: 1 }] } },
    { key: "b", message: { type: "request", clientId: "", requestId: "mine" } },
    { key: "c", message: { type: "sync", clientId: "c", grants: [] } },
    { key: "d", message: { type: "sync", clientId: "c" } },
  ]);
  assert.equal(sent.length, 2, "retried once after the 503");
  const ids = sent.map((body) => body.items.map((item) => (item.message.type === "request" ? item.message.requestId : undefined)));
  assert.ok(ids[0]![0], "a requestId was set on the request without one");
  assert.equal(ids[0]![1], "mine", "a caller's requestId is kept");
  assert.deepEqual(ids[1], ids[0], "the retry carries the same requestIds");
  assert.ok(sent[0]!.items.every((item) => item.message.v === 1));

  assert.deepEqual(
    results.map((result) => (result.ok ? result.answer.type : result.error.status)),
    ["grant", 400, "synced", 403],
  );
  const bad = results[1]!;
  assert.ok(!bad.ok && bad.error instanceof RejectedError);
  assert.equal(!bad.ok && bad.error.code, "bad_request");
  assert.equal(!bad.ok && bad.error.field, "clientId");
  assert.equal(client.nextRequestAt("a"), grant.nextRequestAt, "a grant's nextRequestAt is remembered");
  assert.equal(client.nextRequestAt("b"), undefined);
});

test("an item with neither answer nor error is an internal error of that item only", async () => {
  const { client } = fakeClient([{ status: 200, body: { v: 1, items: [{ status: 500 }, { status: 200, answer: synced }] } }]);
  const [first, second] = await client.batch([
    { key: "a", message: { type: "sync", clientId: "c" } },
    { key: "b", message: { type: "sync", clientId: "c" } },
  ]);
  assert.ok(first && !first.ok && first.error.code === "internal" && first.error.status === 500);
  assert.ok(second?.ok);
});

test("a batch answer that does not match the items is refused whole", async () => {
  const one = [{ key: "a", message: { type: "sync" as const, clientId: "c" } }];
  const tooFew = fakeClient([{ status: 200, body: { v: 1, items: [] } }]);
  await assert.rejects(tooFew.client.batch(one), UnexpectedAnswerError);
  const wrongType = fakeClient([{ status: 200, body: { v: 1, items: [{ status: 200, answer: grant }] } }]);
  await assert.rejects(wrongType.client.batch(one), /a grant answer to a sync/);
  const envelope = fakeClient([{ status: 400, body: { error: { code: "bad_request", message: "too many", field: "items" } } }]);
  await assert.rejects(envelope.client.batch(one), (error: unknown) => error instanceof RejectedError && error.field === "items");
});
